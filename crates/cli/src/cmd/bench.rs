//! `tessera bench sensitivity` and `tessera bench select`: the driver's timing
//! sweep and finalist comparison, printed.

use clap::Args;
use serde::Serialize;
use tessera_driver::{
    BoundRow, FinalistReport, LayerDims, Machine, ModelSpec, SensitivityRow, Variant,
    median_estimate_error,
};

use super::args::{ModelArgs, ModelKind, Size};
use super::compile::{compile_or_report, prepare};
use super::report::print_report;
use crate::Outcome;

#[derive(Args)]
pub struct BenchSensitivityArgs {
    /// The model whose cycles are measured: the So400m MLP block (the default) or
    /// the vision tower with one encoder layer.
    #[arg(long, value_enum, default_value = "mlp")]
    pub model: ModelKind,
    /// Model dimensions (`tiny` for quick checks).
    #[arg(long, value_enum, default_value = "so400m")]
    pub size: Size,
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    /// Machine preset or TOML file whose assumptions are varied.
    #[arg(long, default_value = "c600")]
    pub machine: String,
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct SensitivityJson<'a> {
    model: &'static str,
    batch: usize,
    machine: String,
    baseline_cycles: u64,
    rows: &'a [SensitivityRow],
    exchange_rule_bounds: &'a [BoundRow],
    exchange_code_bounds: &'a [BoundRow],
}

/// `tessera bench sensitivity`: for each assumption of the timing model, the
/// model's cycles with that value halved and doubled, everything else as is; then
/// the model at the two ends of the shared-bus exchange rule, and with exchange
/// code and bytes fully overlapped.
pub fn sensitivity(a: BenchSensitivityArgs) -> anyhow::Result<Outcome> {
    if a.batch == 0 {
        anyhow::bail!("--batch must be at least 1");
    }
    let base = Machine::load(&a.machine)?;
    let spec = ModelSpec {
        kind: match a.model {
            ModelKind::Mlp => tessera_driver::ModelKind::Mlp(a.size.into()),
            ModelKind::Layer => tessera_driver::ModelKind::Layer {
                dims: LayerDims::Preset(a.size.into()),
                tokens: false,
                layers: None,
            },
        },
        batch: a.batch,
        seed: 1,
    };
    let s = tessera_driver::sensitivity(&base, &spec, &|k, total, what| {
        eprintln!("[{k}/{total}] {what}");
    })?;
    if a.json {
        return super::print_json(&SensitivityJson {
            model: a.model.name(),
            batch: a.batch,
            machine: base.name.clone(),
            baseline_cycles: s.baseline_cycles,
            rows: &s.rows,
            exchange_rule_bounds: &s.exchange_rule_bounds,
            exchange_code_bounds: &s.exchange_code_bounds,
        })
        .map(|()| Outcome::Ok);
    }
    let what = match a.model {
        ModelKind::Mlp => "MLP block",
        ModelKind::Layer => "vision tower with one encoder layer",
    };
    println!(
        "{:?} {what}, batch {}, on {}: {} cycles per inference",
        a.size, a.batch, base.name, s.baseline_cycles
    );
    println!(
        "{:32} {:>6} {:>8} {:>10} {:>8} {:>8} {:>10} {:>8}",
        "assumption", "value", "halved", "cycles", "change", "doubled", "cycles", "change"
    );
    let cell = |v: &Variant| match (v.cycles, v.change) {
        (Some(c), Some(d)) => format!("{c:>10} {:>+7.1}%", 100.0 * d),
        _ => format!("{:>10} {:>8}", "refused", ""),
    };
    for r in &s.rows {
        println!(
            "{:32} {:>6} {:>8} {} {:>8} {}",
            r.field,
            r.value,
            r.halved.value,
            cell(&r.halved),
            r.doubled.value,
            cell(&r.doubled)
        );
    }
    let bound = |b: &BoundRow| {
        let v = &b.variant;
        let result = match (v.cycles, v.change, &v.note) {
            (Some(c), Some(d), _) => format!("{c} cycles ({:+.1} %)", 100.0 * d),
            (_, _, note) => format!("refused: {}", note.as_deref().unwrap_or("")),
        };
        println!("  {} = {}: {result}; {}", b.field, v.value, b.reading);
    };
    println!(
        "the shared-bus exchange rule (poplibs states it, no measurement confirms it) at its ends:"
    );
    s.exchange_rule_bounds.iter().for_each(bound);
    println!(
        "exchange code and bytes, charged one after the other (an assumption), at the other end:"
    );
    s.exchange_code_bounds.iter().for_each(bound);
    Ok(Outcome::Ok)
}

#[derive(Args)]
pub struct BenchSelectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Serialize)]
struct SelectJson<'a> {
    finalists: &'a [FinalistReport],
    selected: Option<usize>,
    selection_ms: Option<f64>,
    /// Median over the simulated finalists of |estimated - simulated| / simulated.
    median_abs_error: Option<f64>,
}

/// `tessera bench select`: builds the finalists (`--finalists`, 8 when not given
/// more than 1), simulates every feasible one, and reports each one's estimated and
/// simulated cycles and the median absolute estimation error.
pub fn bench_select(a: BenchSelectArgs) -> anyhow::Result<Outcome> {
    let mut m = a.model;
    if m.finalists <= 1 {
        m.finalists = 8;
    }
    if m.simulate_finalists > 0 {
        anyhow::bail!("--simulate-finalists: `bench select` simulates every feasible finalist");
    }
    m.simulate_finalists = m.finalists;
    let p = prepare(&m, false, &[])?;
    let (c, _) = match compile_or_report(&m, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    let r = &c.report;
    let median = median_estimate_error(&r.finalists);
    if m.json {
        super::print_json(&SelectJson {
            finalists: &r.finalists,
            selected: r.selected,
            selection_ms: r.selection_ms,
            median_abs_error: median,
        })?;
    } else {
        print_report(r);
        if let Some(e) = median {
            eprintln!("median absolute estimation error: {:.2} %", e * 100.0);
        }
    }
    Ok(Outcome::Ok)
}

//! `tessera run`: compile a model, simulate it, validate it against the
//! references and report where its cycles went.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use tessera_driver::{
    Attribution, Fault, FinalistReport, Interval, Mismatch, OpCheck, OpRow, OutputCheck, Perturbed,
    SimulateOptions, Status, ULPS,
};

use super::args::ModelArgs;
use super::compile::{compile_or_report, compile_time, prepare};
use super::progress::Bars;
use super::report::{
    count, print_report, render_checks, render_checks_summed, render_layers, render_ops,
    render_summed,
};
use crate::Outcome;

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Write the run as a Chrome trace-event file (Perfetto UI, chrome://tracing)
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the run as one self-contained HTML page: timeline, per-operation table,
    /// per-tile heat maps, SRAM viewer, faults (docs/profile.md)
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Write the embeddings: FILE.npy the pooled `[batch, width]` as f32,
    /// FILE.safetensors `pooled` and, with --tokens, `tokens` `[batch, tokens,
    /// width]` (docs/import.md)
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Validation test hook: scale one tile's part of this plan operation's output
    /// by 1.01 in tile memory where the operation ends (the simulator's
    /// `Perturb`); the run must then report a mismatch at that operation.
    #[arg(long, hide = true)]
    pub perturb: Option<String>,
}

/// One row of the operation table: its cycles and floor, and its check.
#[derive(Serialize)]
struct OpJson<'a> {
    #[serde(flatten)]
    row: &'a OpRow,
    /// Its tensors compared with the reference where it ends (`max_abs_error`,
    /// `tolerance`, `worst_tile`, `passed`, `tensors`).
    #[serde(flatten)]
    check: &'a OpCheck,
}

#[derive(Serialize)]
struct RunJson<'a> {
    status: &'static str,
    /// The embeddings file written (`--output`).
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<String>,
    /// One inference: from the end of weight streaming to the end of the run.
    cycles: u64,
    milliseconds: f64,
    /// Streaming the weights once, at initialisation.
    init_cycles: u64,
    /// The whole run, weight streaming included: the simulator's cycle count, which
    /// is also the profile's total.
    total_cycles: u64,
    supersteps: u32,
    /// The output furthest from the reference relative to its tolerance.
    max_abs_error: Option<f32>,
    tolerance: f32,
    /// The largest error of any output against the pure f32 reference.
    max_abs_error_f32: Option<f32>,
    /// The smallest cosine similarity of any output with its reference.
    cosine: Option<f64>,
    outputs: &'a [OutputCheck],
    /// The first operation, in program order, whose tensors differ from the
    /// reference beyond their tolerance (`ops[].passed` false), with its worst tile.
    mismatch: Option<&'a Mismatch>,
    /// The test hook's perturbation (`--perturb`), when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    perturbed: Option<&'a Perturbed>,
    /// The encoder layers' operations (`layers.<i>.*`), from the first layer's
    /// first operation to the end of the sync after the last layer's last.
    encoder: Option<&'a Interval>,
    /// Encoder layers in the plan.
    layers: usize,
    /// Per encoder layer, in layer order: the `encoder` cycles charged to its
    /// operations; they add up to `encoder.cycles` (docs/profile.md).
    layer_cycles: Vec<u64>,
    /// How linears' weights were stored: `f16` or `fp8`.
    weight_dtype: &'static str,
    /// Iterations of the layer loop, when the layers ran as one loop body.
    loop_count: Option<u32>,
    /// The loop's linears whose weights stayed resident in their layout.
    resident_weights: &'a [String],
    ops: Vec<OpJson<'a>>,
    /// The plan's cycle estimate (tile work without host transfers: compare with
    /// `cycles - host_transfer_cycles`).
    estimated: &'a tessera_driver::PlanEstimate,
    finalists: &'a [FinalistReport],
    selected: Option<usize>,
    selection_ms: Option<f64>,
    /// Weight bytes per tile the lowering settled on.
    weight_budget: Option<u64>,
    /// Lowerings placement refused before the one built (each retried with an
    /// eighth less weight budget).
    placement_retries: u32,
    compile_ms: f64,
    /// Final tensor placement of every tile.
    placement_ms: f64,
    simulate_ms: f64,
    /// Of `simulate_ms`, the wall time outside the simulator's parallel per-tile
    /// work (loading, exchanges, host transfers, syncs, trace and profile).
    simulate_serial_ms: f64,
    reference_ms: f64,
    tiles_used: u32,
    flop: u64,
    flop_per_cycle: f64,
    peak_share: f64,
    simulated_instructions: u64,
    host_transfer_cycles: u64,
    profile: &'a tessera_profile::Profile,
    placement: &'a tessera_driver::PlacementSummary,
    /// Code bytes by category (exchange code among them).
    code: &'a tessera_driver::CodeSummary,
    host: &'a tessera_driver::HostReport,
    decisions: &'a [String],
    faults: &'a [Fault],
}

pub fn run(args: RunArgs) -> anyhow::Result<Outcome> {
    let a = &args.model;
    let mut outputs: Vec<(&str, &Path)> = Vec::new();
    if let Some(path) = &args.trace {
        outputs.push(("--trace", path));
    }
    if let Some(path) = &args.profile {
        outputs.push(("--profile", path));
    }
    if let Some(path) = &args.output {
        check_output_extension(path)?;
        outputs.push(("--output", path));
    }
    let p = prepare(a, args.profile.is_some(), &outputs)?;
    let (c, whole_ms) = match compile_or_report(a, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    if !a.json {
        eprintln!(
            "compiled in {} on {}",
            compile_time(&c, whole_ms),
            count(c.report.tiles_used, "tile")
        );
        print_report(&c.report);
    }
    let bars = Bars::new(a.json);
    let sim_opts = SimulateOptions {
        probes: true,
        perturb: args.perturb.clone(),
    };
    let run = tessera_driver::simulate(&p.model, &c, &sim_opts, &bars)?;
    let v = tessera_driver::validate(&p.model, &c, &run, &bars)?;
    let at = tessera_driver::attribute(&p.machine, &p.model.graph, &c, &run);
    let worst = v.worst_output().context("the model has no output")?;
    if let Some(path) = &args.trace {
        let json = tessera_driver::chrome_trace(&p.machine, &run, &at);
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.profile {
        let html = tessera_driver::profile_html(&p.machine, &p.spec, &c, &run, &at, v.status)?;
        std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.output {
        // A faulted run produced nothing worth writing; its report says why.
        if run.status() == Status::Ok {
            let (pooled, tokens) = p.model.embeddings(&run, p.spec.batch)?;
            tessera_driver::write_output(path, pooled.as_ref(), tokens.as_ref())?;
        }
    }
    let report = &run.report;
    if a.json {
        super::print_json(&RunJson {
            status: v.status.as_str(),
            output: args.output.as_ref().map(|p| p.display().to_string()),
            cycles: run.run_cycles,
            milliseconds: p.machine.cycles_to_seconds(run.run_cycles) * 1e3,
            init_cycles: run.init_cycles,
            total_cycles: report.cycles,
            supersteps: report.supersteps,
            max_abs_error: worst.max_abs_error,
            tolerance: worst.tolerance,
            max_abs_error_f32: v.max_abs_error_f32(),
            cosine: v.min_cosine(),
            outputs: &v.outputs,
            mismatch: v.mismatch.as_ref(),
            perturbed: run.perturbed(),
            encoder: at.encoder.as_ref(),
            layers: at.layers.len(),
            layer_cycles: at.layers.iter().map(|l| l.cycles).collect(),
            weight_dtype: c.report.weight_dtype.name(),
            loop_count: c.report.loop_count,
            resident_weights: &c.report.resident_weights,
            ops: at
                .ops
                .iter()
                .zip(&v.ops)
                .map(|(row, check)| OpJson { row, check })
                .collect(),
            estimated: &c.report.estimated,
            finalists: &c.report.finalists,
            selected: c.report.selected,
            selection_ms: c.report.selection_ms,
            weight_budget: c.report.weight_budget,
            placement_retries: c.report.placement_retries,
            compile_ms: c.report.compile_ms,
            placement_ms: c.report.placement.place_ms,
            simulate_ms: run.simulate_ms,
            simulate_serial_ms: run.simulate_serial_ms,
            reference_ms: v.reference_ms,
            tiles_used: c.report.tiles_used,
            flop: at.flop,
            flop_per_cycle: at.flop_per_cycle,
            peak_share: at.peak_share,
            simulated_instructions: report.instructions,
            host_transfer_cycles: run.host_cycles,
            profile: &run.profile,
            placement: &c.report.placement,
            code: &c.report.code,
            host: &c.report.host,
            decisions: &c.report.decisions,
            faults: &report.faults,
        })?;
    } else {
        print_text(&p.machine, &c, &run, &v, &at);
        if let Some(path) = &args.output
            && run.status() == Status::Ok
        {
            println!("embeddings written to {}", path.display());
        }
    }
    Ok(if v.passed() {
        Outcome::Ok
    } else {
        Outcome::Failed
    })
}

/// `--output` names a format by its extension: refused before any work otherwise.
fn check_output_extension(path: &Path) -> anyhow::Result<()> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("npy" | "safetensors") => Ok(()),
        _ => anyhow::bail!(
            "--output {}: the embeddings are written as .npy or .safetensors",
            path.display()
        ),
    }
}

fn print_text(
    machine: &tessera_driver::Machine,
    c: &tessera_driver::Compiled,
    run: &tessera_driver::Run,
    v: &tessera_driver::Validation,
    at: &Attribution,
) {
    let report = &run.report;
    if report.status == Status::Fault {
        println!(
            "fault: the run stopped at cycle {} with {}",
            report.cycles,
            count(report.faults.len(), "fault")
        );
    } else {
        println!(
            "{}: {} cycles per inference ({:.3} ms; weights streamed once before it in {} cycles), {:.1} FLOP/cycle = {:.1}% of f16 peak; simulated in {:.0} ms ({:.0} ms outside the parallel per-tile work)",
            if v.passed() { "ok" } else { "MISMATCH" },
            run.run_cycles,
            machine.cycles_to_seconds(run.run_cycles) * 1e3,
            run.init_cycles,
            at.flop_per_cycle,
            100.0 * at.peak_share,
            run.simulate_ms,
            run.simulate_serial_ms
        );
    }
    println!(
        "host transfers of the inference (inputs and outputs): {} cycles",
        run.host_cycles
    );
    println!(
        "whole run: {} cycles in {} supersteps (weights streamed, then one inference)",
        report.cycles, report.supersteps
    );
    if let Some(e) = &at.encoder {
        println!(
            "encoder interval: {} cycles, {:.2} GFLOP, {:.1}% of f16 peak",
            e.cycles,
            e.flop as f64 / 1e9,
            100.0 * e.peak_share
        );
    }
    // With several layers, one row per layer and the operations summed over
    // them; one layer keeps the table of every operation.
    if at.layers.len() > 1 {
        print!("{}", render_layers(&at.layers, run.run_cycles));
        print!("{}", render_summed(&at.summed));
    } else {
        print!("{}", render_ops(&at.ops));
    }
    print!("{}", tessera_profile::render(&run.profile));
    for o in &v.outputs {
        match (o.max_abs_error, o.max_abs_error_f32, o.cosine) {
            (Some(e), Some(e32), Some(cos)) => println!(
                "output `{}`: max abs error {e:.6} against the f16-storage reference (tolerance {:.6}, {ULPS} ulps at output scale {:.3}{}); {e32:.6} against f32; cosine {cos:.6}{}",
                o.name,
                o.tolerance,
                o.scale,
                if at.layers.len() > 1 {
                    format!(" times the square root of {} layers", at.layers.len())
                } else {
                    String::new()
                },
                if o.passed { "" } else { "  MISMATCH" }
            ),
            _ => println!("output `{}`: none, the run faulted", o.name),
        }
    }
    if at.layers.len() > 1 {
        print!("{}", render_checks_summed(c, &v.ops));
    } else {
        print!("{}", render_checks(c, &v.ops));
    }
    if let Some(pt) = run.perturbed() {
        println!(
            "perturbed (test hook): `{}` of `{}` on tile {}, times {}",
            pt.tensor, pt.op, pt.tile, pt.factor
        );
    }
    if let Some(m) = &v.mismatch {
        println!(
            "MISMATCH at operation `{}`: tensor `{}`, max abs error {:.6} on tile {} (tolerance {:.6})",
            m.op,
            m.tensor,
            m.max_abs_error.unwrap_or(f32::NAN),
            m.worst_tile.map_or("-".to_string(), |t| t.to_string()),
            m.tolerance.unwrap_or(f32::NAN)
        );
    }
    for f in report.faults.iter().take(24) {
        println!("  {f}");
    }
    if report.faults.len() > 24 {
        println!("  ... {} faults in all", report.faults.len());
    }
}

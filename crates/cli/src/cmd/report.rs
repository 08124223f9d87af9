//! The text forms of the driver's results: the compile report (on stderr), the
//! layer and operation tables and the per-operation checks (on stdout), summed
//! over the encoder layers when there are several.

use std::collections::HashMap;

use tessera_driver::{
    CompileReport, Compiled, LayerRow, OpCheck, OpRow, SummedOp, TensorCheck, layer_of,
};

pub fn print_report(r: &CompileReport) {
    for d in &r.decisions {
        eprintln!("  {d}");
    }
    if !r.finalists.is_empty() {
        eprintln!(
            "  finalists ({} lowered, {} built, best estimate first, in {:.0} ms; selected rank {}):",
            r.finalists.len(),
            r.finalists.iter().filter(|f| f.built).count(),
            r.selection_ms.unwrap_or(0.0),
            r.selected.unwrap_or(0)
        );
        eprintln!(
            "    rank feasible failing missing_bytes peak_bytes estimated_cycles simulated_cycles build_ms  choices"
        );
        for f in &r.finalists {
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            let choices: Vec<String> = f.choices.iter().map(|(k, v)| format!("{k}={v}")).collect();
            eprintln!(
                "    {:>4} {:>8} {:>7} {:>13} {:>10} {:>16} {:>16} {:>8.0}  {}{}",
                f.rank,
                match (f.built, f.feasible) {
                    (false, _) => "-",
                    (true, true) => "yes",
                    (true, false) => "no",
                },
                f.failing_tiles,
                opt(f.missing_bytes),
                opt(f.peak_bytes),
                opt(f.estimated_cycles),
                opt(f.simulated_cycles),
                f.build_ms,
                if choices.is_empty() {
                    "defaults".to_string()
                } else {
                    choices.join(" ")
                },
                f.error
                    .as_ref()
                    .map_or(String::new(), |e| format!(" ({e})"))
            );
        }
    }
    eprintln!(
        "  host: {}, {} in, {} out; {} packets in {} records; bound {} bytes/tile before deduplication, reserved {} bytes/tile at {:#x}..{:#x}, final at most {} bytes/tile ({} records deduplicated)",
        count(r.host.weight_phases, "weight phase"),
        r.host.input_phases,
        r.host.output_phases,
        r.host.packets,
        r.host.records,
        r.host.bound_bytes_max,
        r.host.reserved_bytes_per_tile,
        r.host.reserved_range.0,
        r.host.reserved_range.1,
        r.host.final_bytes_max,
        r.host.records_deduplicated
    );
    eprintln!(
        "  placement: peak {} bytes on tile {} ({} by lifetime order, {} by retry, {} by search) in {:.0} ms",
        r.placement.peak_bytes,
        r.placement.worst_tile,
        count(r.placement.lifetime_mode, "tile"),
        r.placement.retry_mode,
        r.placement.search_mode,
        r.placement.place_ms
    );
    let (m, t) = (&r.code.max_per_tile, &r.code.total);
    eprintln!(
        "  code per tile at most: supervisor {} bytes, kernels {}, exchange code {} (tile {}, {} messages); over all tiles: {}, {}, {}",
        m.supervisor,
        m.kernels,
        m.exchange_code,
        r.code.exchange_code_tile,
        r.code.exchange_messages_on_that_tile,
        t.supervisor,
        t.kernels,
        t.exchange_code
    );
    if let Some(n) = r.loop_count
        && r.weight_dtype == tessera_driver::WeightDtype::Fp8
    {
        if r.resident_weights.is_empty() {
            eprintln!(
                "  layer loop: every weight staged each iteration (no linear's FP8 weights resident in their layout)"
            );
        } else {
            eprintln!(
                "  layer loop: {}'s FP8 weights resident in their layout ({n} instances each); every other weight, bias and LayerNorm parameter staged each iteration",
                r.resident_weights.join(", ")
            );
        }
    }
}

/// The operation table, one row per operation.
pub fn render_ops(ops: &[OpRow]) -> String {
    op_table(ops.iter().map(|o| (o, None)))
}

/// The operation table summed over the layers, with how many operations each
/// row sums.
pub fn render_summed(ops: &[SummedOp]) -> String {
    op_table(ops.iter().map(|s| (&s.row, Some(s.count))))
}

fn op_table<'a>(rows: impl Iterator<Item = (&'a OpRow, Option<usize>)>) -> String {
    let rows: Vec<_> = rows.collect();
    let counted = rows.iter().any(|r| r.1.is_some());
    let count = |n: Option<usize>| {
        if counted {
            format!(" {:>5}", n.map_or(String::new(), |n| n.to_string()))
        } else {
            String::new()
        }
    };
    let mut out = format!(
        "{:44}{} {:>11} {:>8} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10} {:>8} {:>7}\n",
        "operation",
        if counted {
            format!(" {:>5}", "count")
        } else {
            String::new()
        },
        "kind",
        "partials",
        "cycles",
        "compute",
        "exchange",
        "peak",
        "host",
        "floor",
        "bound",
        "floor%"
    );
    for (o, n) in rows {
        out += &format!(
            "{:44}{} {:>11} {:>8} {:>10} {:>10} {:>10} {:>7.1}% {:>9} {:>10} {:>8} {:>6.1}%\n",
            o.name,
            count(n),
            o.kind,
            o.partials.unwrap_or(""),
            o.cycles,
            o.compute,
            o.exchange,
            100.0 * o.peak_share,
            o.host,
            o.floor_cycles,
            o.bound,
            100.0 * o.floor_share
        );
    }
    out
}

/// One row per encoder layer: its cycles and their share of the inference's.
pub fn render_layers(layers: &[LayerRow], run_cycles: u64) -> String {
    let mut out = format!("{:>5} {:>10} {:>10}\n", "layer", "cycles", "share");
    for l in layers {
        out += &format!(
            "{:>5} {:>10} {:>9.1}%\n",
            l.layer,
            l.cycles,
            100.0 * l.cycles as f64 / run_cycles.max(1) as f64
        );
    }
    out
}

/// The text report: one line per graph tensor of every operation.
pub fn render_checks(c: &Compiled, checks: &[OpCheck]) -> String {
    let mut out = checks_header();
    for (o, ch) in c.plan_ops.iter().zip(checks) {
        for t in &ch.tensors {
            out += &check_line(&o.name, &t.tensor, t, None, t.passed == Some(false));
        }
    }
    out
}

/// The checks summed over the layers: one line per operation `layers.*.X` and
/// tensor, from the layer whose error is the largest share of its tolerance,
/// marked a mismatch when any layer's is.
pub fn render_checks_summed(c: &Compiled, checks: &[OpCheck]) -> String {
    struct Worst<'a> {
        op: String,
        tensor: String,
        check: &'a TensorCheck,
        layer: Option<u32>,
        count: usize,
        failed: bool,
    }
    let summed = |name: &str| match layer_of(name) {
        Some((_, rest)) => format!("layers.*.{rest}"),
        None => name.to_string(),
    };
    // Unchecked tensors (no error or no tolerance) rank below every checked one.
    let ratio = |t: &TensorCheck| match (t.max_abs_error, t.tolerance) {
        (Some(e), Some(tol)) => e / tol,
        _ => f32::NEG_INFINITY,
    };
    let mut rows: Vec<Worst> = Vec::new();
    let mut at: HashMap<(String, String), usize> = HashMap::new();
    for (o, ch) in c.plan_ops.iter().zip(checks) {
        let layer = layer_of(&o.name).map(|l| l.0);
        for t in &ch.tensors {
            let key = (summed(&o.name), summed(&t.tensor));
            let failed = t.passed == Some(false);
            match at.get(&key) {
                Some(&i) => {
                    let w = &mut rows[i];
                    w.count += 1;
                    w.failed |= failed;
                    if ratio(t) > ratio(w.check) {
                        (w.check, w.layer) = (t, layer);
                    }
                }
                None => {
                    at.insert(key.clone(), rows.len());
                    rows.push(Worst {
                        op: key.0,
                        tensor: key.1,
                        check: t,
                        layer,
                        count: 1,
                        failed,
                    });
                }
            }
        }
    }
    let mut out = checks_header();
    for w in rows {
        let (worst, check) = match (w.count, w.layer) {
            (n, Some(l)) if n > 1 => {
                let checked = ratio(w.check).is_finite();
                // The note names the layer's own operations; the row is all of them.
                let mut t = w.check.clone();
                t.note = t
                    .note
                    .map(|n| n.replace(&format!("layers.{l}."), "layers.*."));
                let worst = if checked {
                    format!("worst of {n}: layer {l}")
                } else {
                    format!("in {n} layers")
                };
                (Some(worst), std::borrow::Cow::Owned(t))
            }
            _ => (None, std::borrow::Cow::Borrowed(w.check)),
        };
        out += &check_line(&w.op, &w.tensor, &check, worst, w.failed);
    }
    out
}

fn checks_header() -> String {
    format!(
        "{:44} {:44} {:>10} {:>10} {:>6} {:>6}  read at / note\n",
        "operation", "tensor", "max_err", "tolerance", "ratio", "tile"
    )
}

fn check_line(
    op: &str,
    tensor: &str,
    t: &TensorCheck,
    worst: Option<String>,
    failed: bool,
) -> String {
    let num = |v: Option<f32>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
    let ratio = match (t.max_abs_error, t.tolerance) {
        (Some(e), Some(tol)) => format!("{:.2}", e / tol),
        _ => "-".to_string(),
    };
    let place = [worst, t.read_at.clone(), t.note.clone()]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "{:44} {:44} {:>10} {:>10} {:>6} {:>6}  {}{}\n",
        op,
        tensor,
        num(t.max_abs_error),
        num(t.tolerance),
        ratio,
        t.worst_tile.map_or("-".to_string(), |t| t.to_string()),
        place,
        if failed { "  MISMATCH" } else { "" }
    )
}

/// `n` and `noun`, the noun in the plural unless `n` is one.
pub fn count(n: impl std::fmt::Display, noun: &str) -> String {
    let n = n.to_string();
    if n == "1" {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

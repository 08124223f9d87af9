//! `tessera compile` and `tessera run`: the compiler driver's front end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tessera_compile::{CompileError, CompileOptions, CompileReport, Compiled, compile_model};
use tessera_graph::{
    EncoderLayerConfig, Graph, HostTensor, Inputs, MlpConfig, OpKind, Weights, encoder_layer,
    init_weights, mlp, random_inputs,
};
use tessera_machine::Machine;
use tessera_sim::{Fault, SimOptions, Simulator, Status};

use crate::Outcome;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// The vision tower with one encoder layer: patch projection, attention, MLP,
    /// post-LayerNorm and the attention-pooling head.
    Layer,
    /// The MLP block alone: LayerNorm, fc1, GELU, fc2, residual.
    Mlp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Size {
    /// So400m/14 at 378 px (729 tokens, width 1152, 16 heads, MLP 4304).
    So400m,
    /// SigLIP B/16 at 224 px (196 tokens, width 768, 12 heads, MLP 3072).
    Base,
    /// 16 tokens, width 32, 4 heads, MLP 64 (the MLP block alone: hidden 96): for
    /// quick checks.
    Tiny,
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    #[arg(long, value_enum, default_value = "layer")]
    pub model: ModelKind,
    #[arg(long, value_enum, default_value = "so400m")]
    pub size: Size,
    /// Layer dimensions from a TOML file (`image_size`, `channels`, `patch`,
    /// `width`, `heads`, `mlp_hidden`, `layers`, `eps`, and `token_output` as
    /// `--tokens`; the rest as So400m). Only with `--model layer`; replaces `--size`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Machine preset or TOML file.
    #[arg(long, default_value = "c600")]
    pub machine: String,
    /// Override the machine's tile count.
    #[arg(long)]
    pub tiles: Option<u32>,
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    /// Also send the post-LayerNorm tokens `[batch*tokens, width]` to the host and
    /// check them (`--model layer`; the layer's result is `pooled`, `[batch, width]`).
    /// At So400m they are 1.7 MB an image, about 80,000 cycles of host link.
    #[arg(long)]
    pub tokens: bool,
    /// Usable SRAM bytes per tile from the first SRAM address, for placement (at
    /// most the machine's): squeezes a compile without editing the machine.
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Seed of the weights (inputs use seed + 1, wrapping).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Declare the rearrangement's operands 2-byte aligned, as the seed's bug did,
    /// and move those buffers off 8-byte alignment where placement allows: the
    /// simulator must then fault at the kernel's 64-bit load.
    #[arg(long)]
    pub weaken_rearrange_contract: bool,
    /// Validation test hook: scale one constant of this kernel kind by 1.01
    /// (`gelu`, `layernorm`, `softmax`, `amp_matmul`); the run must then report a
    /// mismatch.
    #[arg(long, hide = true)]
    pub mutate_kernel: Option<String>,
    /// Validation test hook: scale one tile's part of this plan operation's output
    /// by 1.01 in tile memory where the operation ends (the simulator's
    /// `Perturb`); the run must then report a mismatch at that operation.
    #[arg(long, hide = true)]
    pub perturb: Option<String>,
    /// Test hook: lower every multi-query attention with scores `Q K^T` and the row
    /// softmax, the path otherwise taken only where the transposed one does not
    /// apply.
    #[arg(long, hide = true)]
    pub row_attention: bool,
    /// Give every transposed attention's tiles whole keys, also where its groups
    /// are an odd number of tiles and the key cut would apply (for comparisons).
    #[arg(long, hide = true)]
    pub whole_keys: bool,
    /// Test hook: lower an attention with a constant query (the pooling head) with
    /// its projections as they are, not absorbed.
    #[arg(long, hide = true)]
    pub unabsorbed_head: bool,
    /// Whole-model plans to build completely before selecting one (1: the rules'
    /// defaults, no search; at most 64, docs/limits.md)
    #[arg(long, default_value_t = 8, value_parser = finalists_in_range)]
    pub finalists: usize,
    /// Write the run as a Chrome trace-event file (Perfetto UI, chrome://tracing)
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the run as one self-contained HTML page: timeline, per-operation table,
    /// per-tile heat maps, SRAM viewer, faults (docs/profile.md)
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Simulate the N best-estimated feasible finalists and select the fewest
    /// simulated cycles among them (with `--finalists`)
    #[arg(long, default_value_t = 0)]
    pub simulate_finalists: usize,
    #[arg(long)]
    pub json: bool,
}

/// The most finalists a compile builds: each is a whole compile, so a larger
/// count runs for hours without a word.
pub const MAX_FINALISTS: usize = 64;

fn finalists_in_range(text: &str) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|e| format!("`{text}`: {e}"))?;
    if n > MAX_FINALISTS {
        return Err(format!(
            "{n} is above the largest accepted, {MAX_FINALISTS}"
        ));
    }
    Ok(n)
}

#[derive(Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

struct Prepared {
    machine: Machine,
    graph: Graph,
    weights: Weights,
    inputs: Inputs,
}

fn progress(json: bool, msg: &str) -> ProgressBar {
    let pb = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("valid template"),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

fn prepare(a: &ModelArgs) -> anyhow::Result<Prepared> {
    if let Some(kind) = &a.mutate_kernel
        && !tessera_kernels::set_mutation(Some((kind, 1.01)))
    {
        bail!(
            "--mutate-kernel: `{kind}` has no constant to mutate (one of {})",
            tessera_kernels::MUTABLE.join(", ")
        );
    }
    let mut machine = Machine::load(&a.machine)?;
    if let Some(t) = a.tiles {
        machine = machine.with_tiles(t);
        machine.validate()?;
    }
    prepare_on(a, machine)
}

/// The model, weights and inputs of `a`, for `machine`.
fn prepare_on(a: &ModelArgs, machine: Machine) -> anyhow::Result<Prepared> {
    if a.batch == 0 {
        bail!("--batch must be at least 1");
    }
    let graph = match a.model {
        ModelKind::Mlp => {
            if a.config.is_some() {
                bail!("--config sets layer dimensions; it applies to --model layer only");
            }
            if a.tokens {
                bail!("--tokens adds the layer's token output; it applies to --model layer only");
            }
            mlp(&match a.size {
                Size::So400m => MlpConfig::so400m(a.batch),
                Size::Base => MlpConfig::base(a.batch),
                Size::Tiny => MlpConfig::tiny(a.batch),
            })?
        }
        ModelKind::Layer => {
            let mut cfg = match &a.config {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    EncoderLayerConfig::from_toml(&text, &path.display().to_string(), a.batch)?
                }
                None => match a.size {
                    Size::So400m => EncoderLayerConfig::so400m(a.batch),
                    Size::Base => EncoderLayerConfig::base(a.batch),
                    Size::Tiny => EncoderLayerConfig::tiny(a.batch),
                },
            };
            cfg.token_output |= a.tokens;
            encoder_layer(&cfg)?
        }
    };
    // Refuse what cannot fit before generating gigabytes of weights.
    tessera_plan::precheck(&machine, &graph)?;
    let weights = init_weights(&graph, a.seed);
    // Any u64 is a seed: the largest one wraps rather than overflowing.
    let inputs = random_inputs(&graph, a.seed.wrapping_add(1));
    Ok(Prepared {
        machine,
        graph,
        weights,
        inputs,
    })
}

fn do_compile(a: &ModelArgs, p: &Prepared) -> anyhow::Result<Compiled> {
    let pb = progress(a.json, "compiling (plan, place, emit)");
    let mut opts = CompileOptions::default();
    opts.place.capacity = a.capacity;
    opts.place.check_capacity(&p.machine)?;
    if a.weaken_rearrange_contract {
        opts.lower.rearrange_declared_align = Some(2);
        opts.lower.rearrange_inputs = true;
        opts.exploit_declared_alignment = true;
    }
    opts.lower.row_attention = a.row_attention;
    opts.lower.whole_keys = a.whole_keys;
    opts.lower.unabsorbed = a.unabsorbed_head;
    opts.keep_layouts = a.profile.is_some();
    if a.finalists <= 1 {
        let r = compile_model(&p.machine, &p.graph, &p.weights, &opts);
        pb.finish_and_clear();
        return Ok(r?);
    }
    pb.finish_and_clear();
    let bar = if a.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(a.finalists as u64)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} {pos}/{len} ({elapsed})").expect("valid template"),
    );
    bar.set_message("building finalists");
    bar.enable_steady_tick(Duration::from_millis(120));
    let r = tessera_compile::finalists::select(
        &p.machine,
        &p.graph,
        &p.weights,
        &opts,
        a.finalists,
        &|done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    );
    bar.finish_and_clear();
    let mut sel = r?;
    simulate_finalists(a, p, &mut sel, a.simulate_finalists)?;
    let i = sel.selected;
    Ok(sel.take(i))
}

/// Simulates the `n` best-estimated feasible finalists, records each one's
/// simulated cycles (tile work, as the estimate counts them) and selects the
/// fewest among those that ran without a fault.
fn simulate_finalists(
    a: &ModelArgs,
    p: &Prepared,
    sel: &mut tessera_compile::finalists::Selection,
    n: usize,
) -> anyhow::Result<()> {
    let order: Vec<usize> = sel.feasible_by_estimate().into_iter().take(n).collect();
    let mut best: Option<(u64, usize)> = None;
    for (j, &i) in order.iter().enumerate() {
        let c = sel.built[i].as_ref().expect("feasible finalists are built");
        let s = simulate(a.json, p, c)?;
        let cycles = s.run_cycles.saturating_sub(s.host_cycles);
        let f = &mut sel.finalists[i];
        f.simulated_cycles = Some(cycles);
        f.simulate_ms = Some(s.simulate_ms);
        if !a.json {
            eprintln!(
                "simulated finalist {}/{} (rank {}): {cycles} cycles",
                j + 1,
                order.len(),
                f.rank
            );
        }
        if s.report.status == Status::Ok && best.is_none_or(|(b, _)| cycles < b) {
            best = Some((cycles, i));
        }
    }
    if let Some((_, i)) = best {
        sel.selected = i;
    }
    Ok(())
}

fn print_report(r: &CompileReport) {
    for d in &r.decisions {
        eprintln!("  {d}");
    }
    if !r.finalists.is_empty() {
        eprintln!(
            "  finalists ({} built in {:.0} ms; selected rank {}):",
            r.finalists.len(),
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
                if f.feasible { "yes" } else { "no" },
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
        "  host: {} weight phases, {} in, {} out; {} packets in {} records; bound {} bytes/tile before deduplication, reserved {} bytes/tile at {:#x}..{:#x}, final at most {} bytes/tile ({} records deduplicated)",
        r.host.weight_phases,
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
        "  placement: peak {} bytes on tile {} ({} tiles by lifetime order, {} by retry, {} by search) in {:.0} ms",
        r.placement.peak_bytes,
        r.placement.worst_tile,
        r.placement.lifetime_mode,
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
}

#[derive(Serialize)]
struct CompileJson<'a> {
    output: String,
    /// The report carries `package_bytes`: a field here too would print the key twice.
    #[serde(flatten)]
    report: &'a CompileReport,
}

/// A compile that did not fit (no finalist did, with `--finalists`) is a result,
/// not a tool error: its out-of-memory report, then exit 1, as `tessera place`.
fn compile_or_report(a: &ModelArgs, p: &Prepared) -> anyhow::Result<Result<Compiled, Outcome>> {
    match do_compile(a, p) {
        Ok(c) => Ok(Ok(c)),
        Err(e) if matches!(e.downcast_ref(), Some(CompileError::DoesNotFit(_))) => {
            eprintln!("error: {e:#}");
            Ok(Err(Outcome::Failed))
        }
        Err(e) => Err(e),
    }
}

pub fn compile(a: CompileArgs) -> anyhow::Result<Outcome> {
    let p = prepare(&a.model)?;
    let mut c = match compile_or_report(&a.model, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    let bytes = tessera_package::write_package(&c.package);
    c.report.package_bytes = bytes.len();
    std::fs::write(&a.output, &bytes).with_context(|| format!("writing {}", a.output.display()))?;
    if a.model.json {
        super::print_json(&CompileJson {
            output: a.output.display().to_string(),
            report: &c.report,
        })?;
    } else {
        eprintln!(
            "wrote {} ({} bytes, {} tiles) in {:.0} ms",
            a.output.display(),
            bytes.len(),
            c.report.tiles_used,
            c.report.compile_ms
        );
        print_report(&c.report);
    }
    Ok(Outcome::Ok)
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| f16::from_f32(*x).to_le_bytes())
        .collect()
}

fn f16_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

#[derive(Serialize)]
struct RunJson<'a> {
    status: &'static str,
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
    mismatch: Option<&'a super::validate::Mismatch>,
    /// The test hook's perturbation (`--perturb`), when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    perturbed: Option<&'a super::validate::Perturbed>,
    /// The encoder layers' operations (`layers.*`), as the seed's encoder interval.
    encoder: Option<Interval>,
    ops: &'a [OpRow],
    /// The plan's cycle estimate (tile work without host transfers: compare with
    /// `cycles - host_transfer_cycles`).
    estimated: tessera_plan::PlanEstimate,
    finalists: &'a [tessera_compile::finalists::FinalistReport],
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
    placement: &'a tessera_compile::PlacementSummary,
    /// Code bytes by category (exchange code among them).
    code: &'a tessera_compile::CodeSummary,
    host: &'a tessera_compile::HostReport,
    decisions: &'a [String],
    faults: &'a [Fault],
}

/// f16 ulps, at the output's largest magnitude, that a run may differ from the
/// reference rounding where the program stores f16: the kernels' own roundings
/// (GELU in f16 arithmetic, softmax's f16 exponentials, LayerNorm's reciprocal
/// square root) and the order of f32 sums. See docs/compile.md for how it was set.
pub const ULPS: f32 = 4.0;

/// The validation tolerance for an output of magnitude up to `scale`.
pub fn tolerance(scale: f32) -> f32 {
    ULPS * tessera_reference::f16_ulp(scale.max(1.0))
}

/// One output compared with the f32 reference.
#[derive(Serialize)]
struct OutputCheck {
    name: String,
    /// Against the reference that rounds to f16 where the program stores f16.
    max_abs_error: Option<f32>,
    /// [`ULPS`] f16 ulps at the output's scale.
    tolerance: f32,
    /// Against the pure f32 reference.
    max_abs_error_f32: Option<f32>,
    /// Largest `|reference|`.
    scale: f32,
    cosine: Option<f64>,
    passed: bool,
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(f64::MIN_POSITIVE)
}

/// Cycles charged to one lowered operation.
#[derive(Serialize)]
struct OpRow {
    name: String,
    kind: String,
    /// Compute plus exchange cycles charged to it.
    cycles: u64,
    compute: u64,
    exchange: u64,
    flop: u64,
    peak_share: f64,
    /// A linear's partial sums between chunks of K: the AMP mode whose rate the
    /// f16 peak is (absent for other operations).
    #[serde(skip_serializing_if = "Option::is_none")]
    partials: Option<&'static str>,
    /// Bytes its exchanges deliver (once per destination tile).
    exchange_bytes: u64,
    /// Tiles that run its kernels.
    tiles: u32,
    /// Host-transfer cycles of the inference charged to it (its supersteps' host
    /// phases after the weights are streamed): the input to the first operation,
    /// the outputs to the output operations. Not part of `cycles`.
    host: u64,
    /// This machine's floor for the operation: the most of its AMP-bound cycles
    /// (its FLOP at the whole chip's f16 peak), exchange-bound cycles (its
    /// exchange bytes over every tile's receive port at once) and host-bound
    /// cycles (its host input or output over the link).
    floor_cycles: u64,
    /// Which of the three sets the floor: `amp`, `exchange`, `host` (`none`
    /// when all are 0).
    bound: &'static str,
    /// `floor_cycles / (cycles + host)`: how close the operation comes to its floor.
    floor_share: f64,
    /// Its tensors compared with the reference where it ends (`max_abs_error`,
    /// `tolerance`, `worst_tile`, `passed`, `tensors`).
    #[serde(flatten)]
    check: super::validate::OpCheck,
}

#[derive(Serialize)]
struct Interval {
    cycles: u64,
    flop: u64,
    peak_share: f64,
    /// From the start of the first superstep charged to it to the end of the sync
    /// after the last.
    start: u64,
    end: u64,
}

/// FLOP of one graph operation (matrix products only: two per multiply-add).
fn op_flop(g: &Graph, op: &tessera_graph::Op) -> u64 {
    match &op.kind {
        OpKind::MatMul { a, .. } => {
            2 * g.shape(op.output).numel() as u64 * g.shape(*a).last() as u64
        }
        _ => 0,
    }
}

/// Charges each superstep's compute to the operation of the compute steps it ran
/// and its exchange to the operation of the exchange program, then sums per
/// operation. A superstep ends at a sync before an exchange, so its compute is
/// the plan's compute steps since the previous exchange. The encoder interval is
/// every cycle charged to a `layers.*` operation, with the syncs that follow them.
fn op_table(
    machine: &Machine,
    g: &Graph,
    c: &Compiled,
    profile: &tessera_profile::Profile,
    peak: f64,
    init_cycles: u64,
) -> (Vec<OpRow>, Option<Interval>, Vec<Option<String>>) {
    let index: std::collections::HashMap<&str, usize> = c
        .plan_ops
        .iter()
        .enumerate()
        .map(|(i, o)| (o.name.as_str(), i))
        .collect();
    let mut rows: Vec<OpRow> = c
        .plan_ops
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let stats = c.op_stats.get(i).cloned().unwrap_or_default();
            OpRow {
                name: o.name.clone(),
                kind: o.kind.clone(),
                cycles: 0,
                compute: 0,
                exchange: 0,
                flop: 0,
                peak_share: 0.0,
                partials: (o.kind == "linear").then_some(tessera_kernels::AmpMatmul::PARTIALS),
                exchange_bytes: stats.exchange_bytes,
                tiles: stats.tiles,
                host: 0,
                floor_cycles: 0,
                bound: "none",
                floor_share: 0.0,
                check: Default::default(),
            }
        })
        .collect();
    for op in g.ops() {
        let owner = index.get(op.name.as_str()).copied().or_else(|| {
            c.plan_ops
                .iter()
                .position(|o| o.fused.iter().any(|f| f == &op.name))
        });
        if let Some(i) = owner
            && c.plan_ops[i].flop.is_none()
        {
            rows[i].flop += op_flop(g, op);
        }
    }
    for (row, o) in rows.iter_mut().zip(&c.plan_ops) {
        if let Some(f) = o.flop {
            row.flop = f;
        }
    }
    let compute_op = |from: u32, to: u32| -> Option<usize> {
        (from..to)
            .filter_map(|s| c.step_ops.get(s as usize))
            .find(|n| !n.is_empty())
            .and_then(|n| index.get(n.as_str()).copied())
    };
    let is_encoder = |i: Option<usize>| i.is_some_and(|i| is_encoder_op(&c.plan_ops[i].name));
    let mut enc = 0u64;
    let mut enc_span: Option<(u64, u64)> = None;
    let last_step = c.step_ops.len() as u32;
    let first_exchange = c.exchange_steps.first().copied().unwrap_or(last_step);
    let mut seen_exchange = false;
    let mut last_owner: Option<usize> = None;
    // Per superstep, the operation its compute (else its exchange) is charged to.
    let mut labels = Vec::with_capacity(profile.supersteps.len());
    for (k, ss) in profile.supersteps.iter().enumerate() {
        // A superstep runs an exchange, then compute until the next sync: the
        // plan's compute steps up to the next exchange.
        let (cop, xop) = match ss.exchanges.first() {
            Some(&id) => {
                seen_exchange = true;
                let xs = c
                    .exchange_steps
                    .get(id as usize)
                    .copied()
                    .unwrap_or(last_step);
                let next = c
                    .exchange_steps
                    .get(id as usize + 1)
                    .copied()
                    .unwrap_or(last_step);
                let xop = c
                    .step_ops
                    .get(xs as usize)
                    .and_then(|n| index.get(n.as_str()).copied());
                (compute_op(xs + 1, next), xop)
            }
            None if !seen_exchange && ss.compute > 0 => (compute_op(1, first_exchange), None),
            None => (None, None),
        };
        labels.push(cop.or(xop).map(|i| c.plan_ops[i].name.clone()));
        if let Some(i) = cop {
            rows[i].compute += ss.compute;
        }
        if let Some(i) = xop {
            rows[i].exchange += ss.exchange;
        }
        // A superstep that only moves host bytes belongs to the operation before
        // it (the outputs, after their gathering exchange), or to the first
        // operation when none came before (the inputs, which it reads).
        let owner = cop
            .or(xop)
            .or(last_owner)
            .or((!rows.is_empty()).then_some(0));
        last_owner = owner;
        if ss.start >= init_cycles
            && let Some(i) = owner
        {
            rows[i].host += ss.host;
        }
        if is_encoder(cop) {
            enc += ss.compute;
        }
        if is_encoder(xop) {
            enc += ss.exchange;
        }
        if is_encoder(cop) || is_encoder(xop) {
            let next = profile.supersteps.get(k + 1);
            if let Some(next) = next {
                enc += next.start.saturating_sub(ss.end);
            }
            let end = next.map_or(ss.end, |n| n.start);
            enc_span = Some((enc_span.map_or(ss.start, |s| s.0), end));
        }
    }
    // Host I/O: the inputs (sent in f16) to the first operation, which reads
    // them; each output to its output operation.
    let mut host_bytes = vec![0u64; rows.len()];
    if let Some(first) = host_bytes.first_mut() {
        *first += g
            .input_specs()
            .map(|(_, shape, _)| shape.numel() as u64 * 2)
            .sum::<u64>();
    }
    // Outputs bound straight to a tensor's buffers have no operation of their
    // own; their transfer shares the last output operation's host phase.
    let last_output = rows.iter().rposition(|r| r.kind == "output");
    for out in g.outputs() {
        let own = index.get(format!("output.{}", out.name).as_str()).copied();
        if let Some(i) = own.or(last_output) {
            host_bytes[i] += g.shape(out.tensor).numel() as u64 * 2;
        }
    }
    let m = machine;
    // Every tile receiving at once, at the shared-bus rate (a transfer all tiles
    // of a bus group receive arrives at group-size times the port rate).
    let lanes = u64::from(m.tiles)
        * u64::from(m.timing.exchange_bytes_per_cycle.max(1))
        * u64::from(m.timing.tiles_per_shared_exchange_bus.max(1));
    for (r, host) in rows.iter_mut().zip(host_bytes) {
        r.cycles = r.compute + r.exchange;
        r.peak_share = r.flop as f64 / (r.cycles.max(1) as f64 * peak);
        let amp = (r.flop as f64 / peak).ceil() as u64;
        let exchange = r.exchange_bytes.div_ceil(lanes);
        let link = if r.kind == "output" {
            m.chip_to_host_bytes_per_cycle()
        } else {
            m.host_to_chip_bytes_per_cycle()
        };
        let host = (host as f64 / link.max(1e-9)).ceil() as u64;
        (r.floor_cycles, r.bound) = [(amp, "amp"), (exchange, "exchange"), (host, "host")]
            .into_iter()
            .filter(|b| b.0 > 0)
            .max_by_key(|b| b.0)
            .unwrap_or((0, "none"));
        r.floor_share = r.floor_cycles as f64 / (r.cycles + r.host).max(1) as f64;
    }
    let enc_flop: u64 = rows
        .iter()
        .filter(|r| is_encoder_op(&r.name))
        .map(|r| r.flop)
        .sum();
    let (start, end) = enc_span.unwrap_or_default();
    let encoder = (enc > 0).then(|| Interval {
        cycles: enc,
        flop: enc_flop,
        peak_share: enc_flop as f64 / (enc as f64 * peak),
        start,
        end,
    });
    (rows, encoder, labels)
}

fn is_encoder_op(name: &str) -> bool {
    name.starts_with("layers.")
}

fn render_ops(ops: &[OpRow]) -> String {
    let mut out = format!(
        "{:44} {:>11} {:>8} {:>10} {:>10} {:>10} {:>8} {:>9} {:>10} {:>8} {:>7}\n",
        "operation",
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
    for o in ops {
        out += &format!(
            "{:44} {:>11} {:>8} {:>10} {:>10} {:>10} {:>7.1}% {:>9} {:>10} {:>8} {:>6.1}%\n",
            o.name,
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

/// What `run` measured, for the HTML profile.
struct HtmlRun<'a> {
    status: &'static str,
    profile: &'a tessera_profile::Profile,
    labels: Vec<Option<String>>,
    ops: &'a [OpRow],
    encoder: Option<&'a Interval>,
    init_cycles: u64,
    run_cycles: u64,
    host_cycles: u64,
}

/// One tile's placed buffers as the HTML profile draws them: the plan's buffer
/// names without the request's `@bufN` suffix, so that tiles holding the same
/// buffers at the same addresses share one stored layout.
fn tile_layout(l: &tessera_compile::TileLayout) -> tessera_profile::html::Layout {
    use tessera_profile::html::{Layout, PlacedBuffer};
    let at: std::collections::HashMap<&str, &tessera_place::Allocation> = l
        .placement
        .allocations
        .iter()
        .map(|a| (a.id.as_str(), a))
        .collect();
    let display = |name: &str| -> String {
        match name.rsplit_once('@') {
            Some((n, id)) if id.starts_with("buf") => n.to_string(),
            _ => name.to_string(),
        }
    };
    let mut buffers = Vec::new();
    let mut steps = 1;
    for r in &l.problem.requests {
        steps = steps.max(r.last + 1);
        let Some(a) = at.get(r.name.as_str()) else {
            continue;
        };
        buffers.push(PlacedBuffer {
            name: display(&r.name),
            category: r
                .category
                .clone()
                .unwrap_or_else(|| r.class.name().to_string()),
            addr: a.offset,
            size: r.size,
            first: r.first,
            last: r.last,
            align: r.align,
            class: r.class.name().to_string(),
            tail: r.tail,
            loaded: r.loaded,
        });
    }
    for q in &l.problem.sequences {
        steps = steps.max(q.last + 1);
        let Some(a) = at.get(q.name.as_str()) else {
            continue;
        };
        for i in 0..q.count {
            buffers.push(PlacedBuffer {
                name: format!("{}[{i}]", display(&q.name)),
                category: q
                    .category
                    .clone()
                    .unwrap_or_else(|| q.class.name().to_string()),
                addr: a.offset + i * a.stride.unwrap_or(q.size),
                size: q.size,
                first: q.first,
                last: q.last,
                align: q.align,
                class: q.class.name().to_string(),
                tail: q.tail,
                loaded: q.loaded,
            });
        }
    }
    Layout {
        steps,
        peak: l.placement.peak,
        buffers,
        reservations: l
            .problem
            .reservations
            .iter()
            .map(|r| (r.name.clone(), r.start, r.end))
            .collect(),
    }
}

fn html_report(
    a: &ModelArgs,
    machine: &Machine,
    c: &Compiled,
    report: &tessera_sim::SimReport,
    run: HtmlRun,
) -> tessera_profile::html::HtmlReport {
    use tessera_profile::html;
    let layouts = c.layouts.as_deref().unwrap_or_default();
    let sram_start = u64::from(machine.sram_start());
    let (layouts_distinct, index) = html::dedup_layouts(
        (0..machine.tiles as usize)
            .map(|t| layouts.get(t).map(tile_layout))
            .collect(),
    );
    let busy = tessera_profile::tile_busy(&report.trace, machine.tiles);
    let tiles = (0..machine.tiles)
        .map(|t| html::TileRow {
            tile: t,
            busy: busy[t as usize],
            peak_bytes: layouts
                .get(t as usize)
                .map(|l| l.placement.peak.saturating_sub(sram_start)),
            layout: index[t as usize],
        })
        .collect();
    let model = match (a.model, &a.config) {
        (ModelKind::Mlp, _) => "MLP block",
        (ModelKind::Layer, Some(_)) => "encoder layer (config file)",
        (ModelKind::Layer, None) => "vision tower with one encoder layer",
    };
    let size = match (a.size, &a.config) {
        (_, Some(p)) => p.display().to_string(),
        (Size::So400m, _) => "So400m".into(),
        (Size::Base, _) => "base".into(),
        (Size::Tiny, _) => "tiny".into(),
    };
    let (rs, re) = c.report.host.reserved_range;
    html::HtmlReport {
        title: format!(
            "{model} ({size}), batch {}, on {} ({} tiles)",
            a.batch, machine.name, machine.tiles
        ),
        status: run.status.to_string(),
        clock_hz: machine.clock_hz,
        total_cycles: report.cycles,
        init_cycles: run.init_cycles,
        weight_phases: c.report.host.weight_phases,
        run_cycles: run.run_cycles,
        host_cycles: run.host_cycles,
        encoder: run.encoder.map(|e| html::Interval {
            start: e.start,
            end: e.end,
            cycles: e.cycles,
            flop: e.flop,
            peak_share: e.peak_share,
        }),
        profile: run.profile.clone(),
        phases: tessera_profile::phases(&report.trace),
        labels: run.labels,
        ops: run
            .ops
            .iter()
            .map(|o| html::OpRow {
                name: o.name.clone(),
                kind: o.kind.clone(),
                cycles: o.cycles,
                compute: o.compute,
                exchange: o.exchange,
                flop: o.flop,
                peak_share: o.peak_share,
                exchange_bytes: o.exchange_bytes,
                tiles: o.tiles,
            })
            .collect(),
        tiles,
        sram: html::SramMap {
            start: sram_start,
            end: machine
                .regions
                .last()
                .map_or(sram_start, |r| u64::from(r.end)),
            loader_limit: u64::from(machine.loader_limit),
            regions: machine
                .regions
                .iter()
                .map(|r| html::Region {
                    start: u64::from(r.start),
                    end: u64::from(r.end),
                    interleaved: r.interleaved,
                    executable: r.executable,
                    element_bytes: u64::from(r.element_bytes),
                })
                .collect(),
            host_reserved: (re > rs).then_some((u64::from(rs), u64::from(re))),
        },
        layouts: layouts_distinct,
        faults: report.faults.clone(),
    }
}

/// A simulated run of a compiled model, split into weight streaming and one
/// inference.
pub(crate) struct Simulated {
    pub report: tessera_sim::SimReport,
    pub profile: tessera_profile::Profile,
    /// Cycles streaming the weights, once, before the inference.
    pub init_cycles: u64,
    /// One inference: from the end of weight streaming to the end of the run.
    pub run_cycles: u64,
    /// Host transfers of the inference (inputs and outputs).
    pub host_cycles: u64,
    pub simulate_ms: f64,
    /// Of `simulate_ms`, the part outside the parallel per-tile work.
    pub simulate_serial_ms: f64,
    pub sim: Simulator,
}

fn simulate(json: bool, p: &Prepared, c: &Compiled) -> anyhow::Result<Simulated> {
    simulate_with(json, p, c, Vec::new(), Vec::new())
}

/// [`simulate`], with tile memory copied out (and perturbed, a test hook) at
/// superstep boundaries.
fn simulate_with(
    json: bool,
    p: &Prepared,
    c: &Compiled,
    captures: Vec<tessera_sim::Capture>,
    perturb: Vec<tessera_sim::Perturb>,
) -> anyhow::Result<Simulated> {
    let pb = progress(json, "simulating");
    let t = Instant::now();
    let mut sim = Simulator::new(&c.package).context("loading the package")?;
    let x = p
        .inputs
        .iter()
        .next()
        .map(|(_, t)| t.data())
        .context("the model has no input")?;
    let input_name = p
        .graph
        .input_specs()
        .next()
        .map(|s| s.0.to_string())
        .context("no input")?;
    sim.set_binding(&input_name, &f16_bytes(x))?;
    let report = sim.run(&SimOptions {
        preload_bindings: false,
        trace: true,
        captures,
        perturb,
        ..SimOptions::default()
    });
    // The first host phases stream the weights once; what follows is one inference.
    let profile = tessera_profile::profile(&report.trace);
    let weight_phases = c.report.host.weight_phases;
    let init_cycles = weight_phases
        .checked_sub(1)
        .and_then(|last| profile.host_phases.get(last))
        .map_or(0, |p| p.1);
    let run_cycles = report.cycles.saturating_sub(init_cycles);
    let host_cycles: u64 = profile
        .host_phases
        .iter()
        .skip(weight_phases)
        .map(|(s, e)| e - s)
        .sum();
    let simulate_ms = t.elapsed().as_secs_f64() * 1e3;
    pb.finish_and_clear();

    Ok(Simulated {
        report,
        profile,
        init_cycles,
        run_cycles,
        host_cycles,
        simulate_ms,
        simulate_serial_ms: (simulate_ms - sim.parallel_ms()).max(0.0),
        sim,
    })
}

pub fn run(a: RunArgs) -> anyhow::Result<Outcome> {
    let a = a.model;
    let p = prepare(&a)?;
    let c = match compile_or_report(&a, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    if !a.json {
        eprintln!(
            "compiled in {:.0} ms on {} tiles",
            c.report.compile_ms, c.report.tiles_used
        );
        print_report(&c.report);
    }
    let req = super::validate::requests(&c, a.perturb.as_deref(), 1.01)?;
    let Simulated {
        report,
        profile,
        init_cycles,
        run_cycles,
        host_cycles,
        simulate_ms,
        simulate_serial_ms,
        sim,
    } = simulate_with(a.json, &p, &c, req.captures.clone(), req.perturb.clone())?;

    let pb = progress(a.json, "reference");
    let t = Instant::now();
    // Every tensor an operation leaves on the tiles is kept for its check.
    let keep = super::validate::wanted(&p.graph, &c)?;
    let (want32, kept32) = tessera_reference::evaluate_keeping(
        &p.graph,
        &p.weights,
        &p.inputs,
        &tessera_reference::EvalOptions::default(),
        &keep,
    )?;
    // The reference that stores f16 where the program does (chunk partials, the
    // plan's inner groups, every f16 tensor): the program may differ from it only
    // by the kernels' own roundings, a few ulps.
    let mut f16_opts = tessera_reference::EvalOptions::f16_machine();
    for op in &c.plan_ops {
        if let Some(chunks) = op.inner_chunks {
            // Sibling projections fused into one matmul share its inner groups.
            for name in std::iter::once(&op.name).chain(&op.fused) {
                let is_matmul = p
                    .graph
                    .ops()
                    .iter()
                    .any(|o| &o.name == name && matches!(o.kind, OpKind::MatMul { .. }));
                if is_matmul {
                    f16_opts = f16_opts.with_matmul_groups(name.clone(), chunks);
                }
            }
        }
    }
    let (want16, kept16) =
        tessera_reference::evaluate_keeping(&p.graph, &p.weights, &p.inputs, &f16_opts, &keep)?;
    let reference_ms = t.elapsed().as_secs_f64() * 1e3;
    pb.finish_and_clear();
    let mut outputs = Vec::new();
    for out in p.graph.outputs() {
        let want = want16.get(&out.name).context("reference output")?;
        let want32 = want32.get(&out.name).context("reference output")?;
        let scale = want32.data().iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let tol = tolerance(scale);
        let (max_err, max_err32, cosine) = if report.status == Status::Ok {
            let got = f16_values(sim.binding(&out.name).context("output binding")?);
            let got = HostTensor::new(want.shape().clone(), got)?;
            (
                Some(tessera_reference::max_abs_error(&got, want)?),
                Some(tessera_reference::max_abs_error(&got, want32)?),
                Some(cosine(got.data(), want32.data())),
            )
        } else {
            (None, None, None)
        };
        outputs.push(OutputCheck {
            name: out.name.clone(),
            max_abs_error: max_err,
            tolerance: tol,
            max_abs_error_f32: max_err32,
            scale,
            cosine,
            passed: max_err.is_some_and(|e| e <= tol),
        });
    }
    let checks = super::validate::check(&c, &req, sim.captured(), &kept16, &kept32);
    let mismatch = super::validate::first_mismatch(&c, &checks);
    let passed =
        report.status == Status::Ok && outputs.iter().all(|o| o.passed) && mismatch.is_none();
    // The worst output against its own tolerance speaks for the run.
    let worst = outputs
        .iter()
        .max_by(|x, y| {
            let r = |o: &OutputCheck| o.max_abs_error.map_or(f32::INFINITY, |e| e / o.tolerance);
            r(x).total_cmp(&r(y))
        })
        .context("the model has no output")?;
    let peak = p.machine.peak_f16_flop_per_cycle() as f64;
    let (mut ops, encoder, labels) =
        op_table(&p.machine, &p.graph, &c, &profile, peak, init_cycles);
    for (row, check) in ops.iter_mut().zip(&checks) {
        row.check = check.clone();
    }
    // What the tiles execute, as the rows count it: the graph's products would also
    // credit projections a rule absorbed, which no tile runs.
    let flop: u64 = ops.iter().map(|o| o.flop).sum();
    let fpc = flop as f64 / run_cycles.max(1) as f64;
    let share = fpc / peak;
    if let Some(path) = &a.trace {
        let json = tessera_profile::chrome_trace(
            &report.trace,
            &profile,
            &labels,
            p.machine.clock_hz as f64,
        );
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
    }
    let status = if passed {
        "ok"
    } else if report.status == Status::Fault {
        "fault"
    } else {
        "mismatch"
    };
    if let Some(path) = &a.profile {
        let r = html_report(
            &a,
            &p.machine,
            &c,
            &report,
            HtmlRun {
                status,
                profile: &profile,
                labels,
                ops: &ops,
                encoder: encoder.as_ref(),
                init_cycles,
                run_cycles,
                host_cycles,
            },
        );
        let html = tessera_profile::html::render_html(&r)?;
        std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))?;
    }
    if a.json {
        super::print_json(&RunJson {
            status,
            cycles: run_cycles,
            milliseconds: p.machine.cycles_to_seconds(run_cycles) * 1e3,
            init_cycles,
            total_cycles: report.cycles,
            supersteps: report.supersteps,
            max_abs_error: worst.max_abs_error,
            tolerance: worst.tolerance,
            max_abs_error_f32: outputs
                .iter()
                .filter_map(|o| o.max_abs_error_f32)
                .reduce(f32::max),
            cosine: outputs.iter().filter_map(|o| o.cosine).reduce(f64::min),
            outputs: &outputs,
            mismatch: mismatch.as_ref(),
            perturbed: req.perturbed.as_ref(),
            encoder,
            ops: &ops,
            estimated: c.report.estimated,
            finalists: &c.report.finalists,
            selected: c.report.selected,
            selection_ms: c.report.selection_ms,
            weight_budget: c.report.weight_budget,
            placement_retries: c.report.placement_retries,
            compile_ms: c.report.compile_ms,
            placement_ms: c.report.placement.place_ms,
            simulate_ms,
            simulate_serial_ms,
            reference_ms,
            tiles_used: c.report.tiles_used,
            flop,
            flop_per_cycle: fpc,
            peak_share: share,
            simulated_instructions: report.instructions,
            host_transfer_cycles: host_cycles,
            profile: &profile,
            placement: &c.report.placement,
            code: &c.report.code,
            host: &c.report.host,
            decisions: &c.report.decisions,
            faults: &report.faults,
        })?;
    } else {
        if report.status == Status::Fault {
            println!(
                "fault: the run stopped at cycle {} with {} faults",
                report.cycles,
                report.faults.len()
            );
        } else {
            println!(
                "{}: {} cycles per inference ({:.3} ms; weights streamed once before it in {} cycles), {:.1} FLOP/cycle = {:.1}% of f16 peak; simulated in {:.0} ms ({:.0} ms outside the parallel per-tile work)",
                if passed { "ok" } else { "MISMATCH" },
                run_cycles,
                p.machine.cycles_to_seconds(run_cycles) * 1e3,
                init_cycles,
                fpc,
                100.0 * share,
                simulate_ms,
                simulate_serial_ms
            );
        }
        println!("host transfers of the inference (inputs and outputs): {host_cycles} cycles");
        println!(
            "whole run: {} cycles in {} supersteps (weights streamed, then one inference)",
            report.cycles, report.supersteps
        );
        if let Some(e) = &encoder {
            println!(
                "encoder interval: {} cycles, {:.2} GFLOP, {:.1}% of f16 peak",
                e.cycles,
                e.flop as f64 / 1e9,
                100.0 * e.peak_share
            );
        }
        print!("{}", render_ops(&ops));
        print!("{}", tessera_profile::render(&profile));
        for o in &outputs {
            match (o.max_abs_error, o.max_abs_error_f32, o.cosine) {
                (Some(e), Some(e32), Some(cos)) => println!(
                    "output `{}`: max abs error {e:.6} against the f16-storage reference (tolerance {:.6}, {ULPS} ulps at output scale {:.3}); {e32:.6} against f32; cosine {cos:.6}{}",
                    o.name,
                    o.tolerance,
                    o.scale,
                    if o.passed { "" } else { "  MISMATCH" }
                ),
                _ => println!("output `{}`: none, the run faulted", o.name),
            }
        }
        print!("{}", super::validate::render(&c, &checks));
        if let Some(pt) = &req.perturbed {
            println!(
                "perturbed (test hook): `{}` of `{}` on tile {}, times {}",
                pt.tensor, pt.op, pt.tile, pt.factor
            );
        }
        if let Some(m) = &mismatch {
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
    Ok(if passed { Outcome::Ok } else { Outcome::Failed })
}

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
    #[arg(long)]
    pub json: bool,
}

/// A timing figure of the machine model that is ours rather than a public figure
/// (or a public figure we hold with little confidence): docs/machine.md says why.
struct Assumption {
    field: &'static str,
    get: fn(&mut tessera_machine::Timing) -> &mut u32,
}

/// One [`Assumption`] per named `Timing` field.
macro_rules! assumptions {
    ($($field:ident),* $(,)?) => {
        &[$(Assumption {
            field: stringify!($field),
            get: |t| &mut t.$field,
        }),*]
    };
}

const ASSUMPTIONS: &[Assumption] = assumptions!(
    supervisor_result_latency,
    f32_transcendental_issues,
    f32_tanh_issues,
    f16_exp_issues,
    host_transfer_overhead_cycles,
    sync_cycles,
    exchange_overhead_cycles,
    exchange_bytes_per_cycle,
    tiles_per_shared_exchange_bus,
);

/// The two ends of the shared-bus rule (two tiles of a bus pair receiving the same
/// data both get it at twice the port rate): poplibs' estimators state it, no
/// measurement we have confirms it, so the model's answer is reported at both
/// readings of it. Field, value, and the reading it stands for.
const EXCHANGE_RULE_BOUNDS: &[(&str, u32, &str)] = &[
    (
        "tiles_per_shared_exchange_bus",
        1,
        "the rule off: data both tiles of a pair receive comes no faster than other data",
    ),
    (
        "exchange_bytes_per_cycle",
        2,
        "the rule kept, the port at half the 4 B/cycle poplibs charges: a pair receiving \
         the same data gets 4 B/cycle each, a tile alone 2",
    ),
];

#[derive(Serialize, Clone)]
struct Variant {
    value: u32,
    /// Cycles of one inference; `None` when the machine refuses the value.
    cycles: Option<u64>,
    change: Option<f64>,
    note: Option<String>,
}

#[derive(Serialize)]
struct SensitivityRow {
    field: &'static str,
    value: u32,
    halved: Variant,
    doubled: Variant,
}

/// The model at one end of the shared-bus rule ([`EXCHANGE_RULE_BOUNDS`]).
#[derive(Serialize)]
struct BoundRow {
    field: &'static str,
    reading: &'static str,
    #[serde(flatten)]
    variant: Variant,
}

#[derive(Serialize)]
struct SensitivityJson {
    model: &'static str,
    batch: usize,
    machine: String,
    baseline_cycles: u64,
    rows: Vec<SensitivityRow>,
    exchange_rule_bounds: Vec<BoundRow>,
}

/// Cycles of one inference of the model on `machine`, compiled for it.
fn inference_cycles(a: &ModelArgs, machine: Machine) -> anyhow::Result<u64> {
    let p = prepare_on(a, machine)?;
    let c = do_compile(a, &p)?;
    let s = simulate(true, &p, &c)?;
    if s.report.status != Status::Ok {
        bail!("the run faulted: {}", s.report.faults.len());
    }
    Ok(s.run_cycles)
}

/// `tessera bench sensitivity`: for each assumption of the timing model, the
/// model's cycles with that value halved and doubled, everything else as is; then
/// the model at the two ends of the shared-bus exchange rule.
pub fn sensitivity(a: BenchSensitivityArgs) -> anyhow::Result<Outcome> {
    let base = Machine::load(&a.machine)?;
    let args = ModelArgs {
        model: a.model,
        size: a.size,
        config: None,
        machine: a.machine.clone(),
        tiles: None,
        batch: a.batch,
        capacity: None,
        seed: 1,
        weaken_rearrange_contract: false,
        mutate_kernel: None,
        perturb: None,
        row_attention: false,
        whole_keys: false,
        unabsorbed_head: false,
        tokens: false,
        // Each variant keeps the rules' defaults, so that only the assumption moves.
        finalists: 1,
        simulate_finalists: 0,
        trace: None,
        profile: None,
        json: true,
    };
    let assumption = |field: &str| {
        ASSUMPTIONS
            .iter()
            .find(|asm| asm.field == field)
            .expect("every bound of the exchange rule is an assumption")
    };
    // Every (field, value) measured, in order, each once: a bound that is also a
    // halved or doubled value is not compiled twice.
    let mut wanted: Vec<(&Assumption, u32)> = Vec::new();
    for asm in ASSUMPTIONS {
        let value = *(asm.get)(&mut base.timing.clone());
        for v in [value / 2, value.saturating_mul(2)] {
            wanted.push((asm, v));
        }
    }
    for &(field, v, _) in EXCHANGE_RULE_BOUNDS {
        wanted.push((assumption(field), v));
    }
    let mut distinct: Vec<(&str, u32)> = wanted.iter().map(|(asm, v)| (asm.field, *v)).collect();
    distinct.sort();
    distinct.dedup();
    let total = 1 + distinct.len();
    let step = |k: usize, what: &str| eprintln!("[{k}/{total}] {what}");
    step(1, "baseline");
    let baseline = inference_cycles(&args, base.clone())?;
    let mut measured: std::collections::BTreeMap<(&str, u32), Variant> = Default::default();
    for &(asm, v) in &wanted {
        if measured.contains_key(&(asm.field, v)) {
            continue;
        }
        step(measured.len() + 2, &format!("{} = {v}", asm.field));
        let mut m = base.clone();
        *(asm.get)(&mut m.timing) = v;
        let variant = match m.validate() {
            Err(e) => Variant {
                value: v,
                cycles: None,
                change: None,
                note: Some(e.to_string()),
            },
            Ok(()) => {
                let c = inference_cycles(&args, m)?;
                Variant {
                    value: v,
                    cycles: Some(c),
                    change: Some(c as f64 / baseline as f64 - 1.0),
                    note: None,
                }
            }
        };
        measured.insert((asm.field, v), variant);
    }
    let get = |field: &str, v: u32| measured[&(field, v)].clone();
    let rows: Vec<SensitivityRow> = ASSUMPTIONS
        .iter()
        .map(|asm| {
            let value = *(asm.get)(&mut base.timing.clone());
            SensitivityRow {
                field: asm.field,
                value,
                halved: get(asm.field, value / 2),
                doubled: get(asm.field, value.saturating_mul(2)),
            }
        })
        .collect();
    let bounds: Vec<BoundRow> = EXCHANGE_RULE_BOUNDS
        .iter()
        .map(|&(field, v, reading)| BoundRow {
            field,
            reading,
            variant: get(field, v),
        })
        .collect();
    let model = match a.model {
        ModelKind::Mlp => "mlp",
        ModelKind::Layer => "layer",
    };
    if a.json {
        super::print_json(&SensitivityJson {
            model,
            batch: a.batch,
            machine: base.name.clone(),
            baseline_cycles: baseline,
            rows,
            exchange_rule_bounds: bounds,
        })?;
    } else {
        let what = match a.model {
            ModelKind::Mlp => "MLP block",
            ModelKind::Layer => "vision tower with one encoder layer",
        };
        println!(
            "{:?} {what}, batch {}, on {}: {baseline} cycles per inference",
            a.size, a.batch, base.name
        );
        println!(
            "{:32} {:>6} {:>8} {:>10} {:>8} {:>8} {:>10} {:>8}",
            "assumption", "value", "halved", "cycles", "change", "doubled", "cycles", "change"
        );
        let cell = |v: &Variant| match (v.cycles, v.change) {
            (Some(c), Some(d)) => format!("{c:>10} {:>+7.1}%", 100.0 * d),
            _ => format!("{:>10} {:>8}", "refused", ""),
        };
        for r in &rows {
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
        println!(
            "the shared-bus exchange rule (poplibs states it, no measurement confirms it) at its ends:"
        );
        for b in &bounds {
            let v = &b.variant;
            let result = match (v.cycles, v.change, &v.note) {
                (Some(c), Some(d), _) => format!("{c} cycles ({:+.1} %)", 100.0 * d),
                (_, _, note) => format!("refused: {}", note.as_deref().unwrap_or("")),
            };
            println!("  {} = {}: {result}; {}", b.field, v.value, b.reading);
        }
    }
    Ok(Outcome::Ok)
}

#[derive(Args)]
pub struct BenchSelectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
}

#[derive(Serialize)]
struct SelectJson<'a> {
    finalists: &'a [tessera_compile::finalists::FinalistReport],
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
    m.simulate_finalists = m.finalists;
    let p = prepare(&m)?;
    let c = match compile_or_report(&m, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    let r = &c.report;
    let mut errors: Vec<f64> = r
        .finalists
        .iter()
        .filter_map(|f| match (f.estimated_cycles, f.simulated_cycles) {
            (Some(e), Some(s)) if s > 0 => Some((e as f64 - s as f64).abs() / s as f64),
            _ => None,
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    let median = (!errors.is_empty()).then(|| {
        let n = errors.len();
        if n % 2 == 1 {
            errors[n / 2]
        } else {
            (errors[n / 2 - 1] + errors[n / 2]) / 2.0
        }
    });
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

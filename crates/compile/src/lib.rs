//! The compiler driver: a tile plan becomes a package. It owns the construction
//! order after planning: size code, turn every buffer and code segment into a
//! placement request, place all tiles (in parallel), emit kernel code, vertex states
//! and supervisor programs at the placed addresses, translate exchanges and host
//! bindings to addresses, and validate the package before anyone sees it.
//!
//! It must never decide a mapping (the planner does), never choose an address itself
//! (placement does), and never return a package that failed the placement checker or
//! package validation.

mod emit;
mod exploit;
pub mod finalists;
pub mod probe;
mod requests;

use std::time::Instant;

use serde::Serialize;
use tessera_graph::{Graph, TensorMap};
use tessera_host::HostPlan;
use tessera_machine::Machine;
use tessera_package::Package;
use tessera_place::{Diagnosis, Options as PlaceOptions};
use tessera_plan::{LowerOptions, PlanError, PlanOp, TilePlan, placement_retry_budget};

pub use requests::tile_problems;

/// `e` and its sources, outermost first, joined by `: `: the one-line form of an
/// error whose cause is kept as a source rather than in its message.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out += ": ";
        out += &s.to_string();
        source = s.source();
    }
    out
}

/// Everything that can stop a compile.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// The refused tiles, and those placement did not try after enough refusals
    /// (`not_attempted`, see [`CompileOptions`]).
    #[error("{}", does_not_fit(.0))]
    DoesNotFit(Vec<Diagnosis>),
    /// A finalist whose busiest tile holds more live bytes than the fit loop's
    /// bound: not placed (placement's search proves such a tile infeasible only
    /// slowly, and the bound is what the default lowering was held to).
    #[error(
        "not built: a finalist with a smaller estimate placed, and selection compares estimates"
    )]
    NotBuilt,
    #[error(
        "tile {tile} holds {live} bytes of live buffers at step {step} ({op}), above the fit limit of {limit}: not placed"
    )]
    OverFitLimit {
        tile: u32,
        step: u32,
        op: String,
        live: u64,
        limit: u64,
    },
    #[error("placement failed on tile {tile}")]
    Place {
        tile: u32,
        #[source]
        source: tessera_place::PlaceError,
    },
    /// A placement the checker refused after the alignment demonstration moved
    /// its buffers.
    #[error("placement failed on tile {tile}: checker rejected the placement: {violation}")]
    PlacementRejected { tile: u32, violation: String },
    #[error("placement failed on tile {tile}: no placement and no diagnosis")]
    NoPlacement { tile: u32 },
    #[error("kernel `{kernel}` on tile {tile}")]
    Kernel {
        tile: u32,
        kernel: String,
        #[source]
        source: tessera_kernels::KernelError,
    },
    /// Code that does not encode (a compiler bug).
    #[error("kernel `{what}` on tile {tile}")]
    Encode {
        tile: u32,
        what: String,
        #[source]
        source: tessera_isa::EncodeError,
    },
    #[error("host transfer planning")]
    Host(#[source] tessera_host::HostError),
    /// The finalist search built nothing to select from.
    #[error("no finalist was built")]
    NoFinalist,
    /// The threads a mutated compile runs on could not be started.
    #[error("starting the threads of a mutated compile")]
    Threads(#[source] rayon::ThreadPoolBuildError),
    /// A tile sends or lands more messages of one source in one exchange phase
    /// than the 16-bit message field of `recv` can name.
    #[error(
        "exchange #{exchange} ({name}) on tile {tile}: {messages} messages of one tile, above the {max} a `recv` can name"
    )]
    ExchangeMessages {
        tile: u32,
        exchange: u16,
        name: String,
        messages: usize,
        max: usize,
    },
    #[error("the assembled package is invalid (a compiler bug)")]
    Package(#[source] tessera_package::PackageError),
}

fn does_not_fit(d: &[Diagnosis]) -> String {
    let (tried, skipped): (Vec<&Diagnosis>, Vec<&Diagnosis>) =
        d.iter().partition(|d| !d.not_attempted);
    let mut out = format!("{} tile(s) do not fit", tried.len());
    if !skipped.is_empty() {
        // Tiles already started when the limit was reached still finish, so
        // `tried` can exceed the limit; the limit itself is in each skipped
        // tile's summary.
        out += &format!(
            " ({} more not attempted: placement stopped starting tiles once enough were refused)",
            skipped.len()
        );
    }
    out += ":";
    let (total, over) = missing_in_all(d);
    if over > 0 {
        out += &format!(
            "\n  in all: {over} tile(s) hold more live bytes than their capacity, {total} bytes over in total (no placement needs less; each tile tried says below what it misses)"
        );
    }
    for d in tried {
        out += &format!("\n  {}", shortfall(d));
    }
    out
}

/// What a chip that does not fit misses at least, and on how many tiles: the
/// sum of every tile's live bytes over its capacity (the tiles placement did
/// not try included), a bound no placement beats. A tile tried also says what
/// its engine would need, fragmentation included, in its own line.
pub fn missing_in_all(d: &[Diagnosis]) -> (u64, usize) {
    d.iter()
        .map(|d| d.live_bound_missing)
        .filter(|&b| b > 0)
        .fold((0, 0), |(bytes, tiles), b| (bytes + b, tiles + 1))
}

/// One line per tile: the bytes missing for the whole tile (the host descriptor
/// reservation included, since it shrinks what tensors may use) and what was live,
/// by category, rather than the size of the request that happened to fail.
pub fn shortfall(d: &Diagnosis) -> String {
    let missing = match d.missing_bytes {
        Some(b) => format!("{b} bytes missing"),
        None => "more capacity does not help".to_string(),
    };
    let mut line = format!(
        "tile {}: {missing}, host descriptors included (live-bytes bound: {} bytes over a capacity of {})",
        d.tile, d.live_bound_missing, d.capacity
    );
    if let Some(f) = &d.first_failure {
        let live: Vec<String> = f
            .live
            .iter()
            .map(|c| {
                let name = if c.category == "reserved" {
                    "host descriptors (reserved)"
                } else {
                    &c.category
                };
                format!("{name} {}", c.bytes)
            })
            .collect();
        line += &format!(
            "; live at step {}: {}; first request refused: `{}` ({} bytes, {})",
            f.step,
            live.join(", "),
            f.request,
            f.size,
            f.rule.name()
        );
    }
    line
}

/// Compile-time knobs.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    pub lower: LowerOptions,
    pub place: PlaceOptions,
    /// Keep every tile's placement problem and result in [`Compiled::layouts`], for
    /// an SRAM viewer; off by default, since a whole chip's layouts cost memory.
    pub keep_layouts: bool,
    /// Told when each stage of a compile starts, for a caller showing progress
    /// (the finalist search's builds run in parallel and tell it too).
    pub on_stage: Option<StageHook>,
}

/// A stage of one compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The graph to the tile plan, with the fit loop.
    Lower,
    /// Host sizing, code sizing and the placement problems.
    Prepare,
    /// Placement of this many tiles.
    Place { tiles: usize },
    /// Host planning at the placed addresses.
    Host,
    /// Code, vertex states and supervisor programs.
    Emit,
    /// Package validation and the plan estimate.
    Check,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stage::Lower => f.write_str("lowering"),
            Stage::Prepare => f.write_str("sizing code and host transfers"),
            Stage::Place { tiles: 1 } => f.write_str("placing 1 tile"),
            Stage::Place { tiles } => write!(f, "placing {tiles} tiles"),
            Stage::Host => f.write_str("planning host transfers"),
            Stage::Emit => f.write_str("emitting code"),
            Stage::Check => f.write_str("checking the package"),
        }
    }
}

/// Receives a compile's [`Stage`]s.
#[derive(Clone)]
pub struct StageHook(pub std::sync::Arc<dyn Fn(Stage) + Send + Sync>);

impl std::fmt::Debug for StageHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StageHook")
    }
}

impl CompileOptions {
    fn stage(&self, stage: Stage) {
        if let Some(hook) = &self.on_stage {
            (hook.0)(stage);
        }
    }
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            lower: LowerOptions::default(),
            // A whole chip can have hundreds of tiles that do not fit; the search
            // rescues near misses only, so a compile keeps its budget small and
            // reports the shortfall in seconds rather than minutes.
            // It also stops after a few refused tiles: each costs a search and a
            // diagnosis, and one refusal already decides that the plan does not
            // fit (the retry and the finalist search need no more).
            place: PlaceOptions {
                node_budget: 50_000,
                stop_after_refusals: Some(STOP_AFTER_REFUSALS),
                ..PlaceOptions::default()
            },
            keep_layouts: false,
            on_stage: None,
        }
    }
}

impl CompileOptions {
    /// The lowering's options, with placement's squeezed capacity (if any): the
    /// fit loop and growth aim at what placement has (`LowerOptions::capacity`).
    pub fn lowering(&self) -> LowerOptions {
        LowerOptions {
            capacity: self.place.capacity.or(self.lower.capacity),
            ..self.lower.clone()
        }
    }
}

/// Refused tiles after which a compile's placement stops trying the others.
pub const STOP_AFTER_REFUSALS: usize = 8;

/// Lowerings a compile retries after placement refuses one, each with an eighth
/// less weight budget: a plan the fit loop let through misses by a few elements,
/// not by a third of the tile (the So400m layer at batch 2 needs three), and a
/// model that cannot fit is refused in a few rounds rather than a dozen.
pub const MAX_PLACEMENT_RETRIES: u32 = 4;

/// Placement figures over all tiles.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PlacementSummary {
    /// Largest bytes used on one tile (highest end address minus SRAM start).
    pub peak_bytes: u64,
    pub worst_tile: u32,
    /// Tiles placed by each mode: lifetime order, retry, search.
    pub lifetime_mode: u32,
    pub retry_mode: u32,
    pub search_mode: u32,
    pub place_ms: f64,
    /// Buffers moved off 8-byte alignment by `Experimental::exploit_declared_alignment`.
    pub exploited_buffers: usize,
}

/// Host descriptor storage: the bound counted before deduplication, the common
/// reservation made before tensor placement, and what the final plan used.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HostReport {
    /// The common reservation on every tile (the largest bound, 4-byte rounded).
    pub reserved_bytes_per_tile: u32,
    pub reserved_range: (u32, u32),
    /// The largest per-tile bound (provisional sizing, before deduplication).
    pub bound_bytes_max: u32,
    /// The most descriptor bytes any tile uses in the final package.
    pub final_bytes_max: u32,
    /// Link packets over all tiles (payload-sized pieces of the transfers).
    pub packets: u64,
    /// Descriptor records over all tiles: one per transfer, whatever its packets.
    pub records: u64,
    pub records_deduplicated: u64,
    /// The tile whose bound sizes the reservation, and where its bytes go.
    pub busiest: Option<tessera_host::TileUsage>,
    /// Phases that stream the weights once, at initialisation.
    pub weight_phases: usize,
    pub input_phases: usize,
    pub output_phases: usize,
    /// Host-link cycles of all phases by the simulator's model (overhead included).
    pub link_cycles: u64,
}

/// What a compile reports besides the package.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompileReport {
    pub tiles_used: u32,
    pub placement: PlacementSummary,
    pub host: HostReport,
    pub decisions: Vec<String>,
    /// The plan's cycle estimate (tile work, host transfers excluded).
    pub estimated: tessera_plan::PlanEstimate,
    pub exchange_copies: usize,
    pub kernel_calls: usize,
    /// Code bytes by category: the largest on one tile, and over all tiles.
    pub code: CodeSummary,
    /// Size of the written package; 0 until someone writes it (`tessera compile`).
    pub package_bytes: usize,
    pub compile_ms: f64,
    /// Where `compile_ms` went, stage by stage.
    pub stage_ms: StageTimes,
    /// Every finalist of the search, when there was one (`finalists::select`).
    pub finalists: Vec<finalists::FinalistReport>,
    /// Rank of the selected finalist.
    pub selected: Option<usize>,
    /// The whole search: the default lowering, the beam, every finalist's build.
    pub selection_ms: Option<f64>,
    /// Weight bytes per tile the lowering settled on (its fit loop, then any
    /// placement retries), when this compile lowered the model itself.
    pub weight_budget: Option<u64>,
    /// Lowerings placement refused before this one (each retried with an eighth
    /// less weight budget).
    pub placement_retries: u32,
    /// How linears' weights are stored (`LowerOptions::weight_dtype`).
    pub weight_dtype: tessera_plan::WeightDtype,
    /// The layer loop's iterations (encoder layers run as one body), if any.
    pub loop_count: Option<u32>,
    /// The layer loop's linears whose weights stay resident in their compute
    /// layout, an instance a layer (`LowerOptions::resident`), by body name;
    /// the others are staged each iteration.
    pub resident_weights: Vec<String>,
}

/// Code bytes by category, as placed in the tiles' executable region.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CodeSummary {
    /// The most on one tile, category by category (not necessarily one tile's).
    pub max_per_tile: CodeBytes,
    /// Over all tiles.
    pub total: CodeBytes,
    /// The tile holding the most exchange code.
    pub exchange_code_tile: u32,
    /// Messages sent and landed by that tile, over all exchange phases.
    pub exchange_messages_on_that_tile: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CodeBytes {
    pub supervisor: u64,
    pub kernels: u64,
    pub exchange_code: u64,
}

impl CodeSummary {
    fn of(sized: &emit::SizedCode) -> CodeSummary {
        let mut s = CodeSummary::default();
        for (tile, c) in sized.tiles.iter().enumerate() {
            let kernels: u64 = c.kernels.iter().map(|(_, b)| u64::from(*b)).sum();
            let (m, t) = (&mut s.max_per_tile, &mut s.total);
            m.supervisor = m.supervisor.max(u64::from(c.supervisor_bytes));
            m.kernels = m.kernels.max(kernels);
            t.supervisor += u64::from(c.supervisor_bytes);
            t.kernels += kernels;
            t.exchange_code += u64::from(c.exchange_bytes);
            if u64::from(c.exchange_bytes) > m.exchange_code {
                m.exchange_code = u64::from(c.exchange_bytes);
                s.exchange_code_tile = tile as u32;
            }
        }
        s.exchange_messages_on_that_tile = sized
            .exchange_parts
            .iter()
            .filter_map(|parts| parts.get(s.exchange_code_tile as usize))
            .map(|p| (p.sends.len() + p.recvs.len()) as u64)
            .sum();
        s
    }
}

/// Wall time of each compile stage, in milliseconds. The stages from `lower`
/// to `check` are of this package's own build (a finalist's, when selected
/// from several); the finalist search adds the stages around it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StageTimes {
    /// The finalist search's fit loop and growth: the lowerings, each of the
    /// whole model's shape, judged by their live bytes before any placement
    /// (0 without the search).
    pub fit: f64,
    /// Building every finalist, wall time (they build in parallel; 0 without
    /// the search).
    pub finalists: f64,
    /// Filling in the selected finalist's later layers' weights (a lowering of
    /// every layer; 0 when none were pending).
    pub layer_weights: f64,
    /// Lowering the graph to the tile plan (0 when the plan came lowered).
    pub lower: f64,
    /// Provisional host sizing, code sizing and the placement problems.
    pub prepare: f64,
    pub place: f64,
    /// Final host planning and the host descriptors of every tile.
    pub host: f64,
    pub emit: f64,
    /// Package validation and the plan estimate.
    pub check: f64,
}

/// A package and its report.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub package: Package,
    pub report: CompileReport,
    /// The plan's operations, the operation of each step and the step of each
    /// exchange the program runs, in the order it runs them (a layer loop's body
    /// once a layer, named for it: `tessera_plan::unroll`): what a profile needs
    /// to charge cycles to operations.
    pub plan_ops: Vec<PlanOp>,
    pub step_ops: Vec<String>,
    pub exchange_steps: Vec<u32>,
    /// Per entry of `plan_ops`: what the plan moves and where it runs.
    pub op_stats: Vec<OpStats>,
    /// Every tile's placement problem and placement, in tile order, when
    /// [`CompileOptions::keep_layouts`] asked for them.
    pub layouts: Option<Vec<TileLayout>>,
    /// Every graph tensor the plan's operations compute, in lowering order, and
    /// where a run leaves those that exist on the tiles (per-operation validation).
    pub results: Vec<probe::ResultProbe>,
    /// Products whose weights the tiles hold as FP8, and the scale each weight
    /// is rounded at (`TilePlan::fp8_weights`).
    pub fp8_weights: Vec<(String, i8, f32)>,
    /// Compiled from a plan lowered for its shape only: the later layers'
    /// weight bindings hold the first layer's bytes until
    /// [`complete_layer_weights`] lowers the plan again with these options.
    pub layer_weights_pending: Option<LowerOptions>,
}

/// Fills in the later layers' weights of a finalist compiled for its shape
/// (`Compiled::layer_weights_pending`): the plan is lowered again with every
/// layer's weights, and the package's weight bindings take its images. The
/// placement, code and host plan depend on the bindings' sizes and slices only,
/// and those are checked to be the same. `on_layer` is told of each layer
/// whose weights are made (from the threads making them), for progress.
pub fn complete_layer_weights(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    c: &mut Compiled,
    on_layer: &(dyn Fn() + Sync),
) -> Result<(), CompileError> {
    let Some(o) = c.layer_weights_pending.take() else {
        return Ok(());
    };
    let start = Instant::now();
    // The later layers split over the threads, one lowering making each
    // part's weights (from their parameters by the body's recipes, or by
    // replaying the body where it has none): each binding then comes from the
    // lowering that made it.
    let count = c.report.loop_count.unwrap_or(1).max(2);
    let parts = (rayon::current_num_threads() as u32).clamp(1, count - 1);
    let per = (count - 1).div_ceil(parts);
    let ranges: Vec<std::ops::Range<u32>> = (0..parts)
        .map(|p| 1 + p * per..(1 + (p + 1) * per).min(count))
        .filter(|r| !r.is_empty())
        .collect();
    use rayon::prelude::*;
    let fulls = ranges
        .par_iter()
        .map(|r| {
            tessera_plan::lower_layer_weights(machine, graph, weights, &o, r.clone(), on_layer)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let lp = fulls.first().and_then(|f| f.layer_loop.clone());
    let layer_of = |name: &str| lp.as_ref().and_then(|lp| lp.layer_of(name));
    // The products rounded to FP8 in the whole lowering's order: what comes
    // before the layers, the layers in order, what comes after.
    // (before, in or after the layers; layer; rank in its lowering), product.
    type Ranked = ((u8, u32, usize), (String, i8, f32));
    let mut fp8_weights: Vec<Ranked> = Vec::new();
    let mut named = std::collections::HashSet::new();
    // Moved, not copied: at 27 So400m layers the images are 0.4 GB in FP8.
    let mut images: Vec<std::collections::BTreeMap<String, tessera_plan::Binding>> = Vec::new();
    for full in fulls {
        let mut after = false;
        for (i, w) in full.fp8_weights.into_iter().enumerate() {
            let key = match layer_of(&w.0) {
                Some(l) => {
                    after = true;
                    (1, l, i)
                }
                None => (if after { 2 } else { 0 }, 0, i),
            };
            if named.insert(w.0.clone()) {
                fp8_weights.push((key, w));
            }
        }
        images.push(
            full.bindings
                .into_iter()
                .map(|b| (b.name.clone(), b))
                .collect(),
        );
    }
    fp8_weights.sort_by_key(|w| w.0);
    for b in &mut c.package.bindings {
        if b.kind != tessera_package::BindingKind::Weight {
            continue;
        }
        let layer = b.name.strip_prefix("weights/").and_then(layer_of);
        let from = layer
            .and_then(|l| ranges.iter().position(|r| r.contains(&l)))
            .unwrap_or(0);
        let f = images[from]
            .remove(&b.name)
            .unwrap_or_else(|| panic!("weight binding `{}` in the full lowering", b.name));
        assert_eq!(
            f.data.len(),
            b.data.len(),
            "weight binding `{}`'s size",
            b.name
        );
        b.data = f.data;
    }
    c.fp8_weights = fp8_weights.into_iter().map(|w| w.1).collect();
    c.report.stage_ms.layer_weights = start.elapsed().as_secs_f64() * 1e3;
    Ok(())
}

/// What one lowered operation moves and where it runs, read off the plan.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct OpStats {
    /// Bytes its exchanges deliver (a copy to several tiles counts once per
    /// destination).
    pub exchange_bytes: u64,
    /// Distinct tiles that run one of its kernel calls.
    pub tiles: u32,
}

/// One tile's placement problem and the placement the package was emitted at.
#[derive(Debug, Clone)]
pub struct TileLayout {
    pub problem: tessera_place::TileProblem,
    pub placement: tessera_place::TilePlacement,
}

/// Charges every exchange and kernel call to the plan operation of its step (or
/// the operation that fused the step's graph operation).
fn op_stats(plan: &TilePlan) -> Vec<OpStats> {
    let mut index: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, o) in plan.ops.iter().enumerate() {
        for f in &o.fused {
            index.entry(f.as_str()).or_insert(i);
        }
    }
    for (i, o) in plan.ops.iter().enumerate() {
        index.insert(o.name.as_str(), i);
    }
    let op_of = |step: u32| {
        plan.step_ops
            .get(step as usize)
            .and_then(|n| index.get(n.as_str()).copied())
    };
    let mut stats = vec![OpStats::default(); plan.ops.len()];
    for x in &plan.exchanges {
        if let Some(i) = op_of(x.step) {
            stats[i].exchange_bytes += x
                .copies
                .iter()
                .map(|c| u64::from(c.bytes) * c.dsts.len() as u64)
                .sum::<u64>();
        }
    }
    let mut tiles = vec![std::collections::BTreeSet::new(); plan.ops.len()];
    for c in &plan.calls {
        if let Some(i) = op_of(c.step) {
            tiles[i].insert(c.tile);
        }
    }
    for (s, t) in stats.iter_mut().zip(tiles) {
        s.tiles = t.len() as u32;
    }
    stats
}

/// Lowers `graph` with the per-operation rules and compiles it.
pub fn compile_model(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &CompileOptions,
) -> Result<Compiled, CompileError> {
    mutated(opts, || {
        let start = Instant::now();
        let (mut compiled, fitted, retries, lower_ms) =
            compile_fitting(machine, graph, weights, opts, opts.lowering(), 0)?;
        compiled.report.weight_budget = Some(fitted.weight_bytes);
        compiled.report.placement_retries = retries;
        compiled.report.stage_ms.lower = lower_ms;
        compiled.report.compile_ms = start.elapsed().as_secs_f64() * 1e3;
        Ok(compiled)
    })
}

/// Runs `f` under the kernel mutation `opts` asks for (none in normal use), on
/// every thread that works for it.
pub(crate) fn mutated<R: Send>(
    opts: &CompileOptions,
    f: impl FnOnce() -> Result<R, CompileError> + Send,
) -> Result<R, CompileError> {
    tessera_kernels::mutated(opts.lower.experimental.mutate_kernel, f)
        .map_err(CompileError::Threads)?
}

/// Lowers from `lower` with the fit loop and compiles; while placement refuses the
/// plan, lowers again with an eighth less weight budget, until `retries` (those
/// already spent) reaches [`MAX_PLACEMENT_RETRIES`]. The fit loop bounds live
/// bytes; placement also knows the memory elements that streamed operands must
/// keep apart. Returns the package, the options it was lowered with, the retries
/// spent, and the last lowering's milliseconds.
pub(crate) fn compile_fitting(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &CompileOptions,
    mut lower: LowerOptions,
    mut retries: u32,
) -> Result<(Compiled, LowerOptions, u32, f64), CompileError> {
    loop {
        opts.stage(Stage::Lower);
        let t = Instant::now();
        let (plan, fitted) = tessera_plan::lower_fitted(machine, graph, weights, &lower)?;
        let lower_ms = t.elapsed().as_secs_f64() * 1e3;
        match compile_lowered(machine, &plan, opts) {
            Ok(compiled) => return Ok((compiled, fitted, retries, lower_ms)),
            Err(CompileError::DoesNotFit(f)) => match placement_retry_budget(&fitted) {
                Some(smaller) if retries < MAX_PLACEMENT_RETRIES => {
                    lower = smaller;
                    retries += 1;
                }
                _ => return Err(CompileError::DoesNotFit(f)),
            },
            Err(e) => return Err(e),
        }
    }
}

/// Compiles a plan already lowered (the finalist search lowers its own), with
/// `opts`' placement and alignment settings.
pub fn compile_lowered(
    machine: &Machine,
    plan: &TilePlan,
    opts: &CompileOptions,
) -> Result<Compiled, CompileError> {
    mutated(opts, || {
        compile_plan_with(
            machine,
            plan,
            &opts.place,
            opts.lower.experimental.exploit_declared_alignment,
            opts.keep_layouts,
            &|stage| opts.stage(stage),
        )
    })
}

/// Places and emits a tile plan.
pub fn compile_plan(
    machine: &Machine,
    plan: &TilePlan,
    place: &PlaceOptions,
) -> Result<Compiled, CompileError> {
    compile_plan_with(machine, plan, place, false, false, &|_| {})
}

fn compile_plan_with(
    machine: &Machine,
    plan: &TilePlan,
    place: &PlaceOptions,
    exploit: bool,
    keep_layouts: bool,
    stage: &dyn Fn(Stage),
) -> Result<Compiled, CompileError> {
    stage(Stage::Prepare);
    let start = Instant::now();
    let host_err = CompileError::Host;
    // Provisional host sizing: slicing and phases depend only on binding sizes and
    // tiles, so the bound counted here (before deduplication) holds for any tensor
    // addresses placement picks.
    let provisional =
        HostPlan::new(machine, &emit::binding_specs(plan, &|_| 0)).map_err(host_err)?;
    let reserved = provisional.max_bound().next_multiple_of(4);
    let res_end = machine.loader_limit & !7;
    let res_start = res_end.saturating_sub(reserved) & !7;
    let sized = emit::size_code(plan, &provisional)?;
    let mut problems = tile_problems(plan, &sized);
    if reserved > 0 {
        for p in &mut problems.problems {
            p.reservations.push(tessera_place::Reservation {
                name: "host.descriptors".into(),
                start: u64::from(res_start),
                end: u64::from(res_end),
            });
        }
    }
    let prepare_ms = start.elapsed().as_secs_f64() * 1e3;
    stage(Stage::Place {
        tiles: problems.problems.len(),
    });
    let t = Instant::now();
    let outcomes = tessera_place::place_tiles(machine, &problems.problems, place);
    let place_ms = t.elapsed().as_secs_f64() * 1e3;
    let mut failures = Vec::new();
    let mut placements = Vec::with_capacity(outcomes.len());
    let mut summary = PlacementSummary {
        place_ms,
        ..PlacementSummary::default()
    };
    for (problem, outcome) in problems.problems.iter().zip(outcomes) {
        let outcome = outcome.map_err(|source| CompileError::Place {
            tile: problem.tile,
            source,
        })?;
        match (outcome.placement, outcome.diagnosis) {
            (Some(mut p), _) => {
                // Every placement `place_tiles` returns has passed the independent
                // checker; one moved afterwards is checked again.
                if exploit {
                    summary.exploited_buffers +=
                        exploit::exploit_alignment(machine, problem, &mut p, place.capacity);
                    let violations =
                        tessera_place::check_placement(machine, problem, &p, place.capacity);
                    if let Some(v) = violations.first() {
                        return Err(CompileError::PlacementRejected {
                            tile: problem.tile,
                            violation: v.to_string(),
                        });
                    }
                }
                let used = p.peak - u64::from(machine.sram_start());
                if used > summary.peak_bytes {
                    summary.peak_bytes = used;
                    summary.worst_tile = problem.tile;
                }
                match p.mode_used {
                    tessera_place::Mode::Lifetime => summary.lifetime_mode += 1,
                    tessera_place::Mode::Retry => summary.retry_mode += 1,
                    tessera_place::Mode::Search => summary.search_mode += 1,
                }
                placements.push(p);
            }
            (None, Some(d)) => failures.push(d),
            (None, None) => {
                return Err(CompileError::NoPlacement { tile: problem.tile });
            }
        }
    }
    if !failures.is_empty() {
        return Err(CompileError::DoesNotFit(failures));
    }
    let place_ms = t.elapsed().as_secs_f64() * 1e3;
    // Final host planning at the placed addresses, into the reservation.
    stage(Stage::Host);
    let t = Instant::now();
    let addrs = emit::addresses(plan, &problems, &placements);
    let final_plan = HostPlan::new(
        machine,
        &emit::binding_specs(plan, &|b| addrs.0[b.0 as usize]),
    )
    .map_err(host_err)?;
    final_plan.check_addresses().map_err(host_err)?;
    let hosts = (0..plan.tiles)
        .map(|t| {
            tessera_host::emit_tile(
                &final_plan,
                t,
                provisional.bound(t),
                &[(res_start, res_end)],
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(host_err)?;
    let hs = tessera_host::HostSummary::of(&hosts);
    let host = HostReport {
        reserved_bytes_per_tile: res_end - res_start,
        reserved_range: (res_start, res_end),
        bound_bytes_max: provisional.max_bound(),
        final_bytes_max: hs.max_tile_bytes_used,
        packets: final_plan.packet_total(),
        records: final_plan.record_total(),
        records_deduplicated: hs.records_deduplicated,
        busiest: provisional.usage(provisional.busiest_tile()),
        weight_phases: final_plan
            .phases_of(tessera_package::BindingKind::Weight)
            .len(),
        input_phases: final_plan
            .phases_of(tessera_package::BindingKind::Input)
            .len(),
        output_phases: final_plan
            .phases_of(tessera_package::BindingKind::Output)
            .len(),
        link_cycles: final_plan.link_cycles(machine, 0..final_plan.phases().len()),
    };
    let host_ms = t.elapsed().as_secs_f64() * 1e3;
    stage(Stage::Emit);
    let t = Instant::now();
    let package = emit::emit(
        machine,
        plan,
        &sized,
        &addrs,
        &emit::FinalHost {
            plan: final_plan,
            tiles: hosts,
        },
    )?;
    let emit_ms = t.elapsed().as_secs_f64() * 1e3;
    stage(Stage::Check);
    let t = Instant::now();
    tessera_package::validate(&package).map_err(CompileError::Package)?;
    let estimated = tessera_plan::estimate(machine, plan);
    let report = CompileReport {
        tiles_used: plan.tiles,
        placement: summary,
        host,
        decisions: plan.decisions.clone(),
        estimated,
        exchange_copies: plan.exchanges.iter().map(|x| x.copies.len()).sum(),
        kernel_calls: plan.calls.len(),
        code: CodeSummary::of(&sized),
        package_bytes: 0,
        compile_ms: start.elapsed().as_secs_f64() * 1e3,
        stage_ms: StageTimes {
            prepare: prepare_ms,
            place: place_ms,
            host: host_ms,
            emit: emit_ms,
            check: t.elapsed().as_secs_f64() * 1e3,
            ..StageTimes::default()
        },
        finalists: Vec::new(),
        selected: None,
        selection_ms: None,
        weight_budget: None,
        placement_retries: 0,
        weight_dtype: if plan.fp8_weights.is_empty() {
            tessera_plan::WeightDtype::F16
        } else {
            tessera_plan::WeightDtype::Fp8
        },
        loop_count: plan.layer_loop.as_ref().map(|lp| lp.count),
        resident_weights: plan.resident_linears(),
    };
    // Profiles and validation see the program as it runs: a layer loop's body
    // once a layer.
    let unrolled = tessera_plan::unroll(plan);
    let stats = op_stats(plan);
    Ok(Compiled {
        package,
        report,
        op_stats: unrolled
            .origin
            .iter()
            .map(|&(i, _)| stats[i].clone())
            .collect(),
        plan_ops: unrolled.ops,
        step_ops: unrolled.step_ops,
        exchange_steps: unrolled.exchange_steps,
        results: probe::probes(plan, &|b| addrs.0[b.0 as usize]),
        fp8_weights: plan.fp8_weights.clone(),
        layer_weights_pending: None,
        layouts: keep_layouts.then(|| {
            problems
                .problems
                .into_iter()
                .zip(placements)
                .map(|(problem, placement)| TileLayout { problem, placement })
                .collect()
        }),
    })
}

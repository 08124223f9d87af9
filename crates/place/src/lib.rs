//! SRAM placement: decides, per tile, the address of every buffer a compiled program
//! needs, under the tile's hardware rules (regions and memory classes, alignment and
//! end rounding, access tails, the loader limit, element separation, aliases,
//! strided sequences, fixed reservations), and explains the tiles that do not fit.
//! It owns the problem model, the allocator ladder (lifetime order, the retry order,
//! a bounded search), an independent checker, the diagnostics and the benchmark
//! runner. It depends only on `tessera-machine`; it must never depend on the
//! compiler or simulator crates, and never relaxes a rule to make something fit.

mod alloc;
pub mod bench;
pub mod check;
pub mod csv;
pub mod diag;
mod flat;
mod model;
pub mod problem;
mod search;
mod shape;
pub mod svg;

pub use alloc::BlockingRule;
pub use check::{Violation, check_flat, check_placement};
pub use csv::{FlatBuffer, FlatProblem, parse_csv};
pub use diag::{CategoryBytes, Diagnosis};
pub use problem::{
    Alias, Allocation, MemClass, Mode, Problem, Request, Reservation, Sequence, TilePlacement,
    TileProblem,
};

use model::{Instance, SpaceLimit};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use tessera_machine::Machine;

/// Errors of the placement library. A tile that does not fit is not an error: it is
/// an outcome with a diagnosis.
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("cannot parse {what}: {message}")]
    Parse { what: String, message: String },
    #[error("invalid problem: {0}")]
    Invalid(String),
    #[error("cannot read {path}: {message}")]
    Io { path: String, message: String },
    #[error(
        "--capacity {capacity} is out of range: a `{machine}` tile has {sram} bytes of SRAM \
         (accepted: 1 to {sram}); a capacity can only narrow the space"
    )]
    Capacity {
        capacity: u64,
        machine: String,
        sram: u64,
    },
}

/// Which modes to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeSelect {
    /// Lifetime order, then the retry, then the search.
    #[default]
    Ladder,
    Only(Mode),
}

/// Placement options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub modes: ModeSelect,
    /// Usable bytes from the start of the space: for tiles, from the first SRAM
    /// address (narrower than the machine only); for flat problems, the arena size.
    /// Without it a flat problem's peak is minimised.
    pub capacity: Option<u64>,
    /// Search nodes per search order.
    pub node_budget: u64,
    /// Work out the missing bytes of failing tiles (a search over the capacity).
    pub diagnose: bool,
    /// [`place_tiles`] stops starting tiles once this many have been refused; the
    /// rest come back refused as not attempted. A whole-chip plan that does not fit
    /// is then refused in seconds, where searching and diagnosing each of its
    /// refusing tiles takes minutes (the So400m layer at batch 4 with `attn.q` in
    /// one pass: 972 of them, 150 s). Which tiles are reported then depends on the
    /// threads' timing; whether the plan fits does not.
    pub stop_after_refusals: Option<usize>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            modes: ModeSelect::Ladder,
            capacity: None,
            node_budget: 2_000_000,
            diagnose: true,
            stop_after_refusals: None,
        }
    }
}

/// How the search ended, when it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchVerdict {
    Found,
    /// Live bytes at some step exceed the capacity: no placement exists.
    InfeasibleLiveBytes,
    /// Every canonical placement was ruled out (a proof for flat problems).
    Exhausted,
    /// The node budget ran out.
    GaveUp,
}

/// The result of one tile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TileOutcome {
    pub tile: u32,
    pub fits: bool,
    /// Highest end address used (absolute), when placed.
    pub peak: Option<u64>,
    /// Largest live bytes at one step (alias groups once, reservations excluded).
    pub lower_bound: u64,
    /// Bytes the tile can hold outside reservations.
    pub capacity: u64,
    pub mode_used: Option<Mode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchVerdict>,
    pub search_nodes: u64,
    pub time_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<TilePlacement>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
}

impl Options {
    /// A tile capacity narrows the machine's SRAM and cannot widen it: refused
    /// outside `1..=` one tile's SRAM bytes, rather than clamped without a word.
    pub fn check_capacity(&self, m: &Machine) -> Result<(), PlaceError> {
        let sram = u64::from(m.sram_bytes());
        match self.capacity {
            Some(capacity) if capacity == 0 || capacity > sram => Err(PlaceError::Capacity {
                capacity,
                machine: m.name.clone(),
                sram,
            }),
            _ => Ok(()),
        }
    }
}

/// What the ladder produced on one instance.
#[derive(Debug, Clone)]
pub(crate) struct LadderRun {
    pub bases: Option<Vec<u64>>,
    pub mode: Option<Mode>,
    /// The first failure of the first greedy mode that ran.
    pub failure: Option<alloc::Failure>,
    pub verdict: Option<SearchVerdict>,
    pub nodes: u64,
}

pub(crate) fn run_ladder(
    inst: &Instance,
    modes: ModeSelect,
    budget: u64,
    race: search::Race,
) -> LadderRun {
    let mut run = LadderRun {
        bases: None,
        mode: None,
        failure: None,
        verdict: None,
        nodes: 0,
    };
    let want = |m: Mode| modes == ModeSelect::Ladder || modes == ModeSelect::Only(m);
    for (mode, order) in [
        (
            Mode::Lifetime,
            alloc::lifetime_order as fn(&Instance) -> Vec<usize>,
        ),
        (Mode::Retry, alloc::retry_order),
    ] {
        if !want(mode) {
            continue;
        }
        match alloc::greedy(inst, &order(inst)) {
            Ok(b) => {
                run.bases = Some(b);
                run.mode = Some(mode);
                return run;
            }
            Err(f) => {
                run.failure.get_or_insert(f);
            }
        }
    }
    if want(Mode::Search) {
        let (live, _) = inst.live_peak();
        if live > inst.usable_bytes() {
            run.verdict = Some(SearchVerdict::InfeasibleLiveBytes);
            return run;
        }
        run_search(&mut run, inst, budget, race);
    }
    run
}

/// Runs the bounded search and records its outcome in `run`.
pub(crate) fn run_search(run: &mut LadderRun, inst: &Instance, budget: u64, race: search::Race) {
    match search::search(inst, budget, race) {
        search::SearchResult::Found { bases, nodes } => {
            run.bases = Some(bases);
            run.mode = Some(Mode::Search);
            run.verdict = Some(SearchVerdict::Found);
            run.nodes = nodes;
        }
        search::SearchResult::Exhausted { nodes } => {
            run.verdict = Some(SearchVerdict::Exhausted);
            run.nodes = nodes;
        }
        search::SearchResult::GaveUp { nodes } => {
            run.verdict = Some(SearchVerdict::GaveUp);
            run.nodes = nodes;
        }
    }
}

pub(crate) fn peak_of(inst: &Instance, bases: &[u64]) -> u64 {
    inst.units
        .iter()
        .zip(bases)
        .map(|(u, &b)| b + u.extent)
        .max()
        .unwrap_or(inst.base)
        .max(inst.base)
}

/// The space a tile is placed in under `opts`: its capacity, nothing added.
fn space(opts: &Options) -> SpaceLimit {
    SpaceLimit {
        capacity: opts.capacity,
        extra: 0,
    }
}

/// Places one tile. Every placement returned has passed [`check_placement`].
pub fn place_tile(m: &Machine, t: &TileProblem, opts: &Options) -> Result<TileOutcome, PlaceError> {
    place_tile_in(m, t, opts, search::Race::Threads)
}

fn place_tile_in(
    m: &Machine,
    t: &TileProblem,
    opts: &Options,
    race: search::Race,
) -> Result<TileOutcome, PlaceError> {
    let start = Instant::now();
    let inst = Instance::from_tile(m, t, space(opts))?;
    let run = run_ladder(&inst, opts.modes, opts.node_budget, race);
    let (lower_bound, _) = inst.live_peak();
    let mut out = TileOutcome {
        tile: t.tile,
        fits: false,
        peak: None,
        lower_bound,
        capacity: inst.usable_bytes(),
        mode_used: run.mode,
        search: run.verdict,
        search_nodes: run.nodes,
        time_ms: 0.0,
        placement: None,
        diagnosis: None,
    };
    if let (Some(bases), Some(mode)) = (&run.bases, run.mode) {
        let placement = TilePlacement {
            tile: t.tile,
            mode_used: mode,
            peak: peak_of(&inst, bases),
            allocations: model::allocations_of(&inst, Some(t), None, bases),
        };
        let violations = check_placement(m, t, &placement, opts.capacity);
        if !violations.is_empty() {
            return Err(PlaceError::Invalid(format!(
                "internal error: the {} mode produced a placement the checker rejects: {}",
                mode.name(),
                violations[0]
            )));
        }
        out.fits = true;
        out.peak = Some(placement.peak);
        out.placement = Some(placement);
    } else {
        out.diagnosis = Some(diag::diagnose(m, t, &inst, &run, opts));
    }
    out.time_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}

/// The outcome of a tile [`place_tiles`] did not start (see
/// [`Options::stop_after_refusals`]), with its live-bytes bound: no placement,
/// but what the tile holds at its busiest step against its capacity, which
/// costs next to nothing and lets a report total what the chip misses.
fn not_attempted(m: &Machine, t: &TileProblem, opts: &Options) -> TileOutcome {
    let after = opts.stop_after_refusals.unwrap_or(0);
    let inst = Instance::from_tile(m, t, space(opts)).ok();
    let d = diag::not_attempted(t.tile, after, inst.as_ref());
    TileOutcome {
        tile: t.tile,
        fits: false,
        peak: None,
        lower_bound: d.worst_live,
        capacity: d.capacity,
        mode_used: None,
        search: None,
        search_nodes: 0,
        time_ms: 0.0,
        placement: None,
        diagnosis: Some(d),
    }
}

/// Places every tile, in parallel; results keep the input order. A tile with the
/// same shape as an earlier one (the same problem but for names, see `shape`)
/// takes that tile's addresses under its own names, which the checker then
/// verifies on the tile itself; a shape that does not fit is placed and diagnosed
/// tile by tile, so every report names its own tile and buffers.
pub fn place_tiles(
    m: &Machine,
    tiles: &[TileProblem],
    opts: &Options,
) -> Vec<Result<TileOutcome, PlaceError>> {
    let keys: Vec<Option<Vec<u64>>> = tiles.par_iter().map(shape::shape_key).collect();
    let mut first_of: HashMap<&[u64], usize> = HashMap::new();
    let rep: Vec<usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| match k {
            Some(k) => *first_of.entry(k.as_slice()).or_insert(i),
            None => i,
        })
        .collect();
    let reps: Vec<usize> = (0..tiles.len()).filter(|&i| rep[i] == i).collect();
    let refused = AtomicUsize::new(0);
    let attempt = |t: &TileProblem| {
        if opts
            .stop_after_refusals
            .is_some_and(|n| refused.load(Ordering::Relaxed) >= n)
        {
            return Ok(not_attempted(m, t, opts));
        }
        // The tiles keep every core busy: a tile's search orders take turns.
        let r = place_tile_in(m, t, opts, search::Race::InTurn);
        if matches!(&r, Ok(o) if !o.fits) {
            refused.fetch_add(1, Ordering::Relaxed);
        }
        r
    };
    let placed: Vec<(usize, Result<TileOutcome, PlaceError>)> =
        reps.par_iter().map(|&i| (i, attempt(&tiles[i]))).collect();
    let by_rep: HashMap<usize, &Result<TileOutcome, PlaceError>> =
        placed.iter().map(|(i, r)| (*i, r)).collect();
    let others: Vec<(usize, Result<TileOutcome, PlaceError>)> = (0..tiles.len())
        .into_par_iter()
        .filter(|&i| rep[i] != i)
        .map(|i| {
            let r = rep[i];
            let shared = match by_rep[&r] {
                Ok(o) if o.fits => same_shape(m, &tiles[r], o, &tiles[i], opts),
                _ => None,
            };
            (i, shared.unwrap_or_else(|| attempt(&tiles[i])))
        })
        .collect();
    let mut out: Vec<Option<Result<TileOutcome, PlaceError>>> =
        (0..tiles.len()).map(|_| None).collect();
    for (i, r) in placed.into_iter().chain(others) {
        out[i] = Some(r);
    }
    out.into_iter().flatten().collect()
}

/// `rep`'s outcome for `t`, a tile of the same shape, checked on `t` itself.
fn same_shape(
    m: &Machine,
    rep: &TileProblem,
    outcome: &TileOutcome,
    t: &TileProblem,
    opts: &Options,
) -> Option<Result<TileOutcome, PlaceError>> {
    let start = Instant::now();
    let placement = shape::rename(outcome.placement.as_ref()?, rep, t)?;
    let violations = check_placement(m, t, &placement, opts.capacity);
    if let Some(v) = violations.first() {
        return Some(Err(PlaceError::Invalid(format!(
            "internal error: tile {}'s placement, shared with tile {} of the same shape, is rejected by the checker: {v}",
            t.tile, rep.tile
        ))));
    }
    Some(Ok(TileOutcome {
        tile: t.tile,
        peak: Some(placement.peak),
        placement: Some(placement),
        time_ms: start.elapsed().as_secs_f64() * 1e3,
        ..outcome.clone()
    }))
}

/// The result of a flat (CSV) problem.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlatOutcome {
    pub fits: bool,
    /// Highest end offset used.
    pub peak: Option<u64>,
    pub lower_bound: u64,
    pub capacity: Option<u64>,
    pub mode_used: Option<Mode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchVerdict>,
    pub search_nodes: u64,
    pub time_ms: f64,
    pub allocations: Vec<Allocation>,
    /// Peak of the first greedy stage, for comparison with one-shot heuristics.
    pub first_peak: Option<u64>,
    pub first_ms: f64,
}

/// Places a flat problem: feasibility at `opts.capacity`, or the lowest peak found
/// within the budget when there is no capacity. Results pass [`check_flat`].
pub fn place_flat(p: &FlatProblem, opts: &Options) -> Result<FlatOutcome, PlaceError> {
    let start = Instant::now();
    let inst = Instance::from_flat(p, opts.capacity)?;
    let lower_bound = p.live_lower_bound();
    let mut out = FlatOutcome {
        fits: false,
        peak: None,
        lower_bound,
        capacity: opts.capacity,
        mode_used: None,
        search: None,
        search_nodes: 0,
        time_ms: 0.0,
        allocations: Vec::new(),
        first_peak: None,
        first_ms: 0.0,
    };
    let (bases, mode) = match opts.capacity {
        Some(_) => {
            let run = flat::ladder(&inst, opts.modes, opts.node_budget, &mut out);
            out.search = run.verdict;
            out.search_nodes = run.nodes;
            match (run.bases, run.mode) {
                (Some(b), Some(m)) => (b, m),
                _ => {
                    out.time_ms = start.elapsed().as_secs_f64() * 1e3;
                    return Ok(out);
                }
            }
        }
        None => flat::minimize(&inst, lower_bound, opts, &mut out),
    };
    let offsets: Vec<u64> = bases.clone();
    let violations = check_flat(p, &offsets, opts.capacity);
    if !violations.is_empty() {
        return Err(PlaceError::Invalid(format!(
            "internal error: the {} mode produced a placement the checker rejects: {}",
            mode.name(),
            violations[0]
        )));
    }
    out.fits = true;
    out.mode_used = Some(mode);
    out.peak = Some(peak_of(&inst, &bases));
    out.allocations = model::allocations_of(&inst, None, Some(p), &bases);
    out.time_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}

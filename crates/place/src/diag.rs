//! Diagnostics for tiles that do not fit: how many bytes are missing for the whole
//! tile (found by searching over extra capacity, not the size of the next request),
//! the live-bytes bound beside it, the first request that failed and why, and what
//! was live at that step.

use crate::model::{Instance, SpaceLimit};
use crate::{BlockingRule, LadderRun, Mode, Options, SearchVerdict, TileProblem, run_ladder};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_machine::Machine;

/// Live bytes of one category at a step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryBytes {
    pub category: String,
    pub bytes: u64,
    pub count: u32,
}

/// The first request the default mode could not place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstFailure {
    pub request: String,
    pub mode: Mode,
    /// The step at which it becomes live.
    pub step: i64,
    pub size: u64,
    pub rule: BlockingRule,
    /// Everything live at that step, by category (reservations as `reserved`).
    pub live: Vec<CategoryBytes>,
}

/// Why a tile does not fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnosis {
    pub tile: u32,
    /// Smallest extra capacity (appended to the last region) with which the engine
    /// succeeds; `None` when no amount helps (a class, tail or loader-limit rule
    /// blocks) or the search over capacity gave up.
    pub missing_bytes: Option<u64>,
    /// Live bytes at the worst step minus the capacity: no engine needs less.
    pub live_bound_missing: u64,
    pub worst_step: i64,
    pub worst_live: u64,
    pub capacity: u64,
    pub first_failure: Option<FirstFailure>,
    pub search: Option<SearchVerdict>,
    /// The one-line summary.
    pub summary: String,
    /// The tile was not tried: placement had stopped after enough refusals
    /// (`Options::stop_after_refusals`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_attempted: bool,
}

/// A tile's live bytes at its busiest step, that step, its capacity, and the
/// bytes the first exceeds the second by: a bound no placement beats, and cheap.
fn live_bound(inst: &Instance) -> (u64, i64, u64, u64) {
    let (worst_live, worst_step) = inst.live_peak();
    let capacity = inst.usable_bytes();
    (
        worst_live,
        worst_step,
        capacity,
        worst_live.saturating_sub(capacity),
    )
}

/// The diagnosis of a tile not tried after `after` refusals, with the live-bytes
/// bound of its instance where it has one, so that a report can total what the
/// chip misses without placing it.
pub(crate) fn not_attempted(tile: u32, after: usize, inst: Option<&Instance>) -> Diagnosis {
    let (worst_live, worst_step, capacity, live_bound_missing) =
        inst.map_or((0, 0, 0, 0), live_bound);
    Diagnosis {
        tile,
        missing_bytes: None,
        live_bound_missing,
        worst_step,
        worst_live,
        capacity,
        first_failure: None,
        search: None,
        summary: format!(
            "tile {tile}: not attempted (placement stopped after {after} refused tiles)"
        ),
        not_attempted: true,
    }
}

fn live_at(inst: &Instance, step: i64) -> Vec<CategoryBytes> {
    let mut by: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
    for u in &inst.units {
        if u.lo <= step && step < u.hi {
            let e = by.entry(u.category.as_str()).or_default();
            e.0 += u.extent;
            e.1 += 1;
        }
    }
    let mut out: Vec<CategoryBytes> = by
        .into_iter()
        .map(|(c, (bytes, count))| CategoryBytes {
            category: c.to_string(),
            bytes,
            count,
        })
        .collect();
    if inst.fixed_bytes > 0 {
        out.push(CategoryBytes {
            category: "reserved".into(),
            bytes: inst.fixed_bytes,
            count: inst.fixed.len() as u32,
        });
    }
    out
}

pub(crate) fn diagnose(
    m: &Machine,
    t: &TileProblem,
    inst: &Instance,
    run: &LadderRun,
    opts: &Options,
) -> Diagnosis {
    let (worst_live, worst_step, capacity, live_bound_missing) = live_bound(inst);
    let first_failure = run.failure.as_ref().map(|f| {
        let u = &inst.units[f.unit];
        FirstFailure {
            request: u.label.clone(),
            mode: if opts.modes == crate::ModeSelect::Only(Mode::Retry) {
                Mode::Retry
            } else {
                Mode::Lifetime
            },
            step: u.lo,
            size: u.extent,
            rule: f.rule,
            live: live_at(inst, u.lo),
        }
    });
    // A class or tail rule blocks for good on the whole machine; under a capacity
    // narrower than the machine the cut may be what starved a region, and more
    // capacity can help, so the search finds out.
    let narrowed = opts.capacity.is_some_and(|c| c < u64::from(m.sram_bytes()));
    let hopeless = match first_failure.as_ref().map(|f| f.rule) {
        Some(BlockingRule::LoaderLimit) => true,
        Some(BlockingRule::Class | BlockingRule::Tail) => !narrowed,
        _ => false,
    };
    let missing_bytes = if opts.diagnose && !hopeless {
        missing_capacity(
            m,
            t,
            opts,
            live_bound_missing,
            u64::from(m.sram_bytes()) * 4,
        )
    } else {
        None
    };
    let mut summary = format!("tile {}: does not fit", t.tile);
    match missing_bytes {
        Some(b) => summary += &format!("; missing {b} bytes"),
        None if hopeless => summary += "; more capacity does not help",
        None => summary += "; missing bytes unknown",
    }
    summary += &format!(
        " (live-bytes bound {live_bound_missing}: {worst_live} live at step {worst_step}, capacity {capacity})"
    );
    if let Some(f) = &first_failure {
        summary += &format!(
            "; first failure `{}` ({} bytes) at step {}: {}",
            f.request,
            f.size,
            f.step,
            f.rule.name()
        );
    }
    Diagnosis {
        tile: t.tile,
        missing_bytes,
        live_bound_missing,
        worst_step,
        worst_live,
        capacity,
        first_failure,
        search: run.verdict,
        summary,
        not_attempted: false,
    }
}

/// Smallest extra capacity with which the ladder succeeds, by doubling then
/// bisection. Each probe uses a tenth of the node budget.
fn missing_capacity(
    m: &Machine,
    t: &TileProblem,
    opts: &Options,
    lower: u64,
    limit: u64,
) -> Option<u64> {
    let budget = (opts.node_budget / 10).max(10_000);
    let probe = |extra: u64| -> bool {
        let limit = SpaceLimit {
            capacity: opts.capacity,
            extra,
        };
        match Instance::from_tile(m, t, limit) {
            Ok(inst) => run_ladder(&inst, opts.modes, budget, crate::search::Race::Threads)
                .bases
                .is_some(),
            Err(_) => false,
        }
    };
    if lower > 0 && probe(lower) {
        return Some(lower);
    }
    let mut lo = lower;
    let mut hi = lower.saturating_mul(2).max(64);
    while !probe(hi) {
        lo = hi;
        hi = hi.saturating_mul(2);
        if hi > limit {
            return None;
        }
    }
    let mut steps = 0;
    while hi - lo > 1 && steps < 40 {
        steps += 1;
        let mid = lo + (hi - lo) / 2;
        if probe(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

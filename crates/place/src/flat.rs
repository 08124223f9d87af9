//! Flat problems (one arena, lifetimes, sizes and alignments only): a fast greedy
//! for large instances, the ladder at a capacity, and peak minimisation without one.
//!
//! The fast greedy applies the same rules as the tile engine (lowest aligned offset
//! clear of every placed buffer whose lifetime overlaps, within the arena), so the
//! lifetime and retry modes give identical results through either path.

use crate::model::{Instance, align_up_phase};
use crate::{FlatOutcome, LadderRun, ModeSelect, Options, SearchVerdict, alloc, search};
use crate::{Mode, peak_of};
use rayon::prelude::*;
use std::time::Instant;

/// Where a gap is chosen among those that fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fit {
    /// The lowest offset.
    First,
    /// The smallest gap that holds the buffer, else the lowest offset above all.
    Best,
}

/// Places units in `order`; `None` if one does not fit in the arena.
pub(crate) fn greedy_flat(inst: &Instance, order: &[usize], fit: Fit) -> Option<Vec<u64>> {
    let n = inst.units.len();
    let cap = inst.space_end();
    let mut base = vec![0u64; n];
    // Placed buffers as parallel arrays: the conflict scan is the hot loop.
    let mut p_lo: Vec<i64> = Vec::with_capacity(n);
    let mut p_hi: Vec<i64> = Vec::with_capacity(n);
    let mut p_off: Vec<u64> = Vec::with_capacity(n);
    let mut p_end: Vec<u64> = Vec::with_capacity(n);
    let mut conf: Vec<(u64, u64)> = Vec::new();
    for &u in order {
        let x = &inst.units[u];
        conf.clear();
        if x.lo < x.hi && x.extent > 0 {
            for k in 0..p_lo.len() {
                if p_lo[k] < x.hi && x.lo < p_hi[k] {
                    conf.push((p_off[k], p_end[k]));
                }
            }
        }
        conf.sort_unstable();
        let size = x.extent;
        let place = |p: u64| align_up_phase(p, x.align, x.phase);
        let mut chosen: Option<u64> = None;
        let mut best_gap = u64::MAX;
        let mut p = place(0)?;
        for &(lo, hi) in &conf {
            if lo >= p.checked_add(size)? {
                match fit {
                    Fit::First => {
                        chosen = Some(p);
                        break;
                    }
                    Fit::Best => {
                        let gap = lo - p;
                        if gap < best_gap {
                            best_gap = gap;
                            chosen = Some(p);
                        }
                    }
                }
            }
            if hi > p {
                p = place(hi)?;
            }
        }
        let p = match chosen {
            Some(c) => c,
            None => p,
        };
        if p.checked_add(x.reach)? > cap {
            return None;
        }
        base[u] = p;
        if x.lo < x.hi && x.extent > 0 {
            p_lo.push(x.lo);
            p_hi.push(x.hi);
            p_off.push(p);
            p_end.push(p + size);
        }
    }
    Some(base)
}

/// The ladder at a capacity: lifetime order, retry order, then the search.
pub(crate) fn ladder(
    inst: &Instance,
    modes: ModeSelect,
    budget: u64,
    out: &mut FlatOutcome,
) -> LadderRun {
    let want = |m: Mode| modes == ModeSelect::Ladder || modes == ModeSelect::Only(m);
    let mut run = LadderRun {
        bases: None,
        mode: None,
        failure: None,
        verdict: None,
        nodes: 0,
    };
    let t0 = Instant::now();
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
        let ord = order(inst);
        if let Some(b) = greedy_flat(inst, &ord, Fit::First) {
            out.first_peak.get_or_insert(peak_of(inst, &b));
            out.first_ms = t0.elapsed().as_secs_f64() * 1e3;
            run.bases = Some(b);
            run.mode = Some(mode);
            return run;
        }
    }
    out.first_ms = t0.elapsed().as_secs_f64() * 1e3;
    if want(Mode::Search) {
        if out.lower_bound > inst.space_end() {
            run.verdict = Some(SearchVerdict::InfeasibleLiveBytes);
            return run;
        }
        crate::run_search(&mut run, inst, budget, search::Race::Threads);
    }
    run
}

/// Extra orders tried when minimising the peak.
fn orders(inst: &Instance) -> Vec<(Mode, Vec<usize>, Fit)> {
    let n = inst.units.len();
    let len = |u: usize| (inst.units[u].hi - inst.units[u].lo).max(0) as u128;
    let size = |u: usize| inst.units[u].extent as u128;
    let by = |key: &dyn Fn(usize) -> (u128, u128)| {
        let mut o: Vec<usize> = (0..n).collect();
        o.sort_by_key(|&u| (std::cmp::Reverse(key(u)), u));
        o
    };
    // Measured on the idealloc suite: the lifetime order and length orders never
    // gave the lowest peak, so they run only when asked for by name.
    vec![
        (Mode::Lifetime, alloc::lifetime_order(inst), Fit::First),
        (Mode::Retry, alloc::retry_order(inst), Fit::First),
        (Mode::Search, alloc::retry_order(inst), Fit::Best),
        (
            Mode::Search,
            by(&|u| (size(u) * len(u), size(u))),
            Fit::First,
        ),
        (
            Mode::Search,
            by(&|u| (size(u) * len(u), size(u))),
            Fit::Best,
        ),
    ]
}

/// Lowest peak found within the budget, with no capacity. Returns bases and the
/// mode that produced them.
pub(crate) fn minimize(
    inst: &Instance,
    lower_bound: u64,
    opts: &Options,
    out: &mut FlatOutcome,
) -> (Vec<u64>, Mode) {
    let t0 = Instant::now();
    let mut cands = orders(inst);
    match opts.modes {
        ModeSelect::Only(Mode::Search) => cands.retain(|c| c.0 != Mode::Lifetime),
        ModeSelect::Only(m) => cands.retain(|c| c.0 == m),
        ModeSelect::Ladder => cands.retain(|c| c.0 != Mode::Lifetime),
    }
    let results: Vec<Option<(u64, Vec<u64>, Mode)>> = cands
        .par_iter()
        .map(|(mode, order, fit)| {
            greedy_flat(inst, order, *fit).map(|b| (peak_of(inst, &b), b, *mode))
        })
        .collect();
    out.first_peak = results.iter().flatten().map(|r| r.0).min();
    out.first_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (mut peak, mut bases, mut mode) = results
        .into_iter()
        .flatten()
        .min_by_key(|r| r.0)
        .unwrap_or((0, vec![0; inst.units.len()], Mode::Lifetime));
    // Lower the peak with the search while the instance is small enough for it.
    let searchable =
        opts.modes == ModeSelect::Ladder || opts.modes == ModeSelect::Only(Mode::Search);
    if searchable && peak > lower_bound && inst.units.len() <= 2000 {
        let mut lo = lower_bound;
        let mut hi = peak;
        let mut tries = 0;
        while lo < hi && tries < 12 {
            tries += 1;
            let target = if tries == 1 { lo } else { lo + (hi - lo) / 2 };
            let mut capped = inst.clone();
            if let Some(z) = capped.zones.last_mut() {
                z.end = target;
            }
            match search::search(&capped, opts.node_budget / 8, search::Race::Threads) {
                search::SearchResult::Found { bases: b, nodes } => {
                    out.search_nodes += nodes;
                    let p = peak_of(inst, &b);
                    peak = p;
                    bases = b;
                    mode = Mode::Search;
                    hi = p;
                }
                search::SearchResult::Exhausted { nodes } => {
                    out.search_nodes += nodes;
                    lo = target + 1;
                }
                search::SearchResult::GaveUp { nodes } => {
                    out.search_nodes += nodes;
                    lo = target + 1;
                }
            }
        }
        out.search = Some(SearchVerdict::Found);
    }
    debug_assert!(peak >= lower_bound);
    (bases, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csv::{FlatBuffer, FlatProblem};
    use rand::{Rng, SeedableRng};

    /// The fast flat path and the tile rule engine agree on both greedy orders.
    #[test]
    fn fast_greedy_matches_rule_engine() {
        for seed in 0..50u64 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let n = rng.random_range(1..80);
            let p = FlatProblem {
                buffers: (0..n)
                    .map(|i| {
                        let lower = rng.random_range(0..30i64);
                        FlatBuffer {
                            id: i.to_string(),
                            lower,
                            upper: lower + rng.random_range(0..10i64),
                            size: rng.random_range(0..500),
                            align: [1, 2, 8, 64][rng.random_range(0..4)],
                        }
                    })
                    .collect(),
            };
            let cap = Some(p.live_lower_bound() + rng.random_range(0..400));
            let inst = Instance::from_flat(&p, cap).unwrap();
            for order in [alloc::lifetime_order(&inst), alloc::retry_order(&inst)] {
                let fast = greedy_flat(&inst, &order, Fit::First);
                let rules = alloc::greedy(&inst, &order).ok();
                assert_eq!(fast, rules, "seed {seed}");
            }
        }
    }
}

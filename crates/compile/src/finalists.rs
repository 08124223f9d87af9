//! The finalist search: several whole-model plans lowered and estimated, built
//! best estimate first until one places, that one selected.
//!
//! The default lowering records, for every operation with a choice (the linears),
//! the strategies its rule offered: none beaten by another on both estimated cycles
//! and busiest-tile bytes, the rule's default first. A beam over those operations,
//! in lowering order, keeps the `k` assignments with the smallest sum of the rules'
//! estimates (ties: the assignment closer to the default lowering's choices, then
//! the lexicographic order of the choices, so the same inputs give the same
//! finalists). The default lowering's choices are the rules' defaults except where
//! the fit loop's growth phase kept a strategy beyond the activation budget; a
//! finalist's choices are laid over them. Each finalist
//! is then lowered under the budgets the default lowering's fit loop settled on
//! (without a fit loop of its own: a finalist that does not fit is reported as
//! such), in parallel, and estimated from its plan (`tessera_plan::estimate`,
//! which charges its redistributions and is what selection compares). Then they
//! are compiled completely (host sizing and the common reservation, placement
//! of every tile, emission and package validation) best estimate first, until
//! one places (or as many as the caller will simulate): the first to place is
//! the feasible one with the smallest estimate, so building the rest could not
//! change the selection, only cost the placements that dominate a search near
//! capacity.
//!
//! Policy, not fact: nothing here may change what a plan means, only which plan is
//! built.

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;
use tessera_graph::{Graph, TensorMap};
use tessera_machine::Machine;
use tessera_plan::{
    Candidate, LowerOptions, OpCandidates, TilePlan, busiest, fit_limit_within, lower_fitted_shape,
    lower_shape, placement_retry_budget,
};

use crate::{CompileError, CompileOptions, Compiled, compile_lowered};

/// One finalist's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FinalistReport {
    /// 1-based, in the beam's order (smallest summed estimate first).
    pub rank: usize,
    /// The strategy index chosen per operation, where it is not the rule's
    /// default (the fit loop's growth phase's choices included).
    pub choices: BTreeMap<String, usize>,
    /// Whether it was built: lowered and placed, or refused by the fit limit.
    /// A finalist is left unbuilt when one with a smaller estimate placed
    /// first (its `estimated_cycles` is then its plan's).
    pub built: bool,
    pub feasible: bool,
    /// Tiles placement refused (0 when feasible; it stops after
    /// `STOP_AFTER_REFUSALS`, so a few more than that at most).
    pub failing_tiles: usize,
    /// The out-of-memory report's missing bytes for its worst tile.
    pub missing_bytes: Option<u64>,
    /// Largest bytes used on one tile (feasible finalists).
    pub peak_bytes: Option<u64>,
    /// The whole plan's estimate (tile work, host transfers excluded).
    pub estimated_cycles: Option<u64>,
    /// The simulator's cycles for the same span, when the finalist was simulated.
    pub simulated_cycles: Option<u64>,
    /// Why a finalist that is not feasible was not (other than memory).
    pub error: Option<String>,
    pub build_ms: f64,
    pub simulate_ms: Option<f64>,
}

/// The search's outcome: every finalist, and the selected one's package.
pub struct Selection {
    pub finalists: Vec<FinalistReport>,
    /// Index into `finalists` of the selected one.
    pub selected: usize,
    /// Every finalist's package, `None` where it did not fit (same order as
    /// `finalists`), for a caller that simulates them.
    pub built: Vec<Option<Compiled>>,
    pub selection_ms: f64,
}

impl Selection {
    /// Feasible finalists' indices, fewest estimated cycles first (ties: rank).
    pub fn feasible_by_estimate(&self) -> Vec<usize> {
        let mut v: Vec<usize> = (0..self.finalists.len())
            .filter(|&i| self.finalists[i].feasible)
            .collect();
        v.sort_by_key(|&i| (self.finalists[i].estimated_cycles, i));
        v
    }

    /// Takes finalist `i`'s package as the result, its report carrying the search's.
    pub fn take(mut self, i: usize) -> Compiled {
        let mut c = self.built[i].take().expect("a feasible finalist");
        c.report.selected = Some(self.finalists[i].rank);
        c.report.selection_ms = Some(self.selection_ms);
        c.report.finalists = self.finalists;
        c
    }
}

/// The `k` assignments of strategies to operations with the smallest estimated
/// cycles, best first: each operation's own estimate plus, where an operation
/// reads another's output directly (`input_from`), what the producer's layout adds
/// to that redistribution (see [`layout_cost`]). Operations linked that way are
/// searched together, every combination of their strategies as one choice, so
/// the beam over the groups stays exact: every cost depends on one group only.
pub fn beam(
    ops: &[OpCandidates],
    k: usize,
    exchange_bytes_per_cycle: u32,
) -> Vec<BTreeMap<String, usize>> {
    let producers: Vec<Option<usize>> = (0..ops.len()).map(|i| producer(ops, i)).collect();
    let groups = linked_groups(ops, &producers);
    // (summed estimate, strategies off their default, choices per operation)
    let mut states: Vec<(u64, usize, Vec<usize>)> = vec![(0, 0, vec![0; ops.len()])];
    for members in &groups {
        let combos = combinations(ops, members);
        let mut next = Vec::with_capacity(states.len() * combos.len());
        for (cost, off, ch) in &states {
            for combo in &combos {
                let mut ch = ch.clone();
                let mut c = *cost;
                let mut o = *off;
                // Members are in lowering order and a producer comes before its
                // consumer, so its choice is set by the time the link is charged.
                for (&op, &i) in members.iter().zip(combo) {
                    ch[op] = i;
                    c += ops[op].candidates[i].estimated_cycles;
                    o += usize::from(i != ops[op].chosen);
                    if let Some(p) = producers[op] {
                        c += layout_cost(
                            &ops[p].candidates[ch[p]],
                            &ops[op].candidates[i],
                            exchange_bytes_per_cycle,
                        );
                    }
                }
                next.push((c, o, ch));
            }
        }
        next.sort();
        next.truncate(k.max(1));
        states = next;
    }
    states
        .into_iter()
        .map(|(_, _, ch)| {
            ops.iter()
                .zip(ch)
                .filter(|(op, i)| *i != op.chosen)
                .map(|(op, i)| (op.op.clone(), i))
                .collect()
        })
        .collect()
}

/// Cycles a producer's layout adds to its consumer's input redistribution, per
/// pass: the consumer's estimate already counts receiving its input, and an
/// exchange lasts as long as its busiest sender or receiver, so only the bytes the
/// producer's busiest tile sends beyond what the consumer's busiest tile receives
/// cost more.
pub fn layout_cost(
    producer: &Candidate,
    consumer: &Candidate,
    exchange_bytes_per_cycle: u32,
) -> u64 {
    let excess = producer
        .out_bytes_per_tile
        .saturating_sub(consumer.in_bytes_per_tile);
    u64::from(consumer.passes.max(1)) * excess.div_ceil(u64::from(exchange_bytes_per_cycle.max(1)))
}

fn producer(ops: &[OpCandidates], op: usize) -> Option<usize> {
    let from = ops[op].input_from.as_ref()?;
    ops[..op].iter().position(|o| &o.op == from)
}

/// Operations joined by `input_from` links, each group in lowering order, groups
/// in the order of their first operation.
fn linked_groups(ops: &[OpCandidates], producers: &[Option<usize>]) -> Vec<Vec<usize>> {
    // A group's combinations are its members' strategy counts multiplied; past
    // this many a link is still charged but its operations are searched apart
    // (the beam is then no longer exact for them).
    const MAX_COMBINATIONS: usize = 4096;
    let mut group_of: Vec<usize> = (0..ops.len()).collect();
    let mut size: Vec<usize> = ops.iter().map(|o| o.candidates.len().max(1)).collect();
    for i in 0..ops.len() {
        if let Some(p) = producers[i] {
            let g = group_of[p];
            let joined = size[g].saturating_mul(ops[i].candidates.len().max(1));
            if joined <= MAX_COMBINATIONS {
                group_of[i] = g;
                size[g] = joined;
            }
        }
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut index: BTreeMap<usize, usize> = BTreeMap::new();
    for (i, &g) in group_of.iter().enumerate() {
        let slot = *index.entry(g).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[slot].push(i);
    }
    groups
}

/// Every combination of the members' strategies, in lexicographic order. A
/// strategy beyond the activation budget is one only where the default lowering
/// chose it (its fit loop's growth phase checked that plan's bytes; a finalist is
/// not fitted, and placement proves a tile infeasible only slowly).
fn combinations(ops: &[OpCandidates], members: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    for &m in members {
        let op = &ops[m];
        let allowed: Vec<usize> = (0..op.candidates.len().max(1))
            .filter(|&i| {
                op.candidates
                    .get(i)
                    .is_none_or(|c| !c.beyond_budget || i == op.chosen)
            })
            .collect();
        out = out
            .into_iter()
            .flat_map(|c| {
                allowed.iter().map(move |&i| {
                    let mut c = c.clone();
                    c.push(i);
                    c
                })
            })
            .collect();
    }
    out
}

/// Lowers `k` finalists, builds them best estimate first until `wanted` (at
/// least one) have placed, and selects the feasible one with the fewest
/// estimated cycles: the first to place. Those not built for that are
/// reported so (`CompileError::NotBuilt`), with their estimates. `progress` is
/// called after each build with (built, total). When no
/// finalist places (the fit loop's live-byte bound let through plans whose
/// streamed operands find no separate memory elements), smaller weight budgets
/// (an eighth less each, at most `MAX_PLACEMENT_RETRIES`) are probed with the
/// defaults alone, and the search runs again at the first that places.
pub fn select(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &CompileOptions,
    k: usize,
    wanted: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Selection, CompileError> {
    crate::mutated(opts, || {
        select_mutated(machine, graph, weights, opts, k, wanted, progress)
    })
}

/// [`select`], under the kernel mutation its options ask for.
fn select_mutated(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &CompileOptions,
    k: usize,
    wanted: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Selection, CompileError> {
    let start = Instant::now();
    let mut lower = opts.lowering();
    let mut retries = 0;
    loop {
        let (result, fitted) =
            select_once(machine, graph, weights, opts, &lower, (k, wanted), progress)?;
        match result {
            Err(CompileError::DoesNotFit(f)) => {
                // Smaller budgets are probed with the defaults alone (one build
                // each, not `k`); the search runs again at the first that places.
                let smaller = placement_retry_budget(&fitted)
                    .filter(|_| retries < crate::MAX_PLACEMENT_RETRIES);
                let Some(smaller) = smaller else {
                    return Err(CompileError::DoesNotFit(f));
                };
                match crate::compile_fitting(machine, graph, weights, opts, smaller, retries + 1) {
                    Ok((_, placed, spent, _)) => {
                        lower = placed;
                        retries = spent;
                    }
                    // The first search's best-ranked failure is the report.
                    Err(CompileError::DoesNotFit(_)) => return Err(CompileError::DoesNotFit(f)),
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
            Ok(mut sel) => {
                sel.selection_ms = start.elapsed().as_secs_f64() * 1e3;
                for c in sel.built.iter_mut().flatten() {
                    c.report.weight_budget = Some(fitted.weight_bytes);
                    c.report.placement_retries = retries;
                }
                return Ok(sel);
            }
        }
    }
}

/// One finalist search under `lower`'s budgets, with the options its fit loop
/// settled on.
fn select_once(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &CompileOptions,
    lower: &LowerOptions,
    (k, wanted): (usize, usize),
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<(Result<Selection, CompileError>, LowerOptions), CompileError> {
    let start = Instant::now();
    // The defaults, lowered with the fit loop; every finalist keeps the budgets it
    // settled on, so that the recorded strategies are the ones a choice picks.
    // For its shape: the later layers' weights of the finalist selected are
    // filled in after (`complete_layer_weights`).
    let (base, fitted) = lower_fitted_shape(machine, graph, weights, lower)?;
    let fit_ms = start.elapsed().as_secs_f64() * 1e3;
    let assignments = beam(&base.candidates, k, machine.timing.exchange_bytes_per_cycle);
    let total = assignments.len();
    // Every finalist lowered, in parallel, and estimated from its plan alone
    // (the estimate a build reports is the same function of the same plan).
    let lowered: Vec<Lowered> = assignments
        .into_par_iter()
        .map(|choices| {
            let t = Instant::now();
            // On top of the choices the fit loop's growth phase kept.
            let mut o = fitted.clone();
            o.choices.extend(choices.clone());
            let plan = if choices.is_empty() {
                Ok(None)
            } else {
                lower_shape(machine, graph, weights, &o)
                    .map_err(CompileError::from)
                    .and_then(|plan| within_fit_limit(machine, o.capacity, plan))
                    .map(Some)
            };
            let estimate = match &plan {
                Ok(p) => Some(tessera_plan::estimate(machine, p.as_ref().unwrap_or(&base)).cycles),
                Err(_) => None,
            };
            Lowered {
                o,
                plan,
                estimate,
                lower_ms: t.elapsed().as_secs_f64() * 1e3,
            }
        })
        .collect();
    // Then built best estimate first (ties: rank), until `wanted` are
    // feasible.
    let estimates: Vec<Option<u64>> = lowered.iter().map(|l| l.estimate).collect();
    let mut outcomes: Vec<Option<(Result<Compiled, CompileError>, f64)>> =
        (0..lowered.len()).map(|_| None).collect();
    let mut built_count = 0;
    build_best_first(&estimates, wanted, |i| {
        let l = &lowered[i];
        let t = Instant::now();
        // Only finalists with a plan have an estimate.
        let Ok(plan) = &l.plan else {
            return false;
        };
        let plan = plan.as_ref().unwrap_or(&base);
        let result = compile_lowered(machine, plan, opts).map(|mut c| {
            c.layer_weights_pending = plan.layer_weights_pending.then(|| l.o.clone());
            c
        });
        let placed = result.is_ok();
        built_count += 1;
        progress(built_count, total);
        outcomes[i] = Some((result, l.lower_ms + t.elapsed().as_secs_f64() * 1e3));
        placed
    });
    progress(total, total);
    let built: Vec<(FinalistReport, Result<Compiled, CompileError>)> = lowered
        .into_iter()
        .zip(outcomes)
        .enumerate()
        .map(|(i, (l, outcome))| {
            let (result, build_ms) = match (l.plan, outcome) {
                (_, Some((result, ms))) => (result, ms),
                (Err(e), None) => (Err(e), l.lower_ms),
                (Ok(_), None) => (Err(CompileError::NotBuilt), l.lower_ms),
            };
            let result = result.map(|mut c| {
                c.report.compile_ms = build_ms;
                c
            });
            let mut report = report(i + 1, l.o.choices, &result, build_ms);
            report.estimated_cycles = report.estimated_cycles.or(l.estimate);
            (report, result)
        })
        .collect();
    let finalists_ms = start.elapsed().as_secs_f64() * 1e3 - fit_ms;
    let (finalists, results): (Vec<FinalistReport>, Vec<_>) = built.into_iter().unzip();
    let mut built = Vec::with_capacity(results.len());
    let mut first_err = None;
    let mut first_unplaced = None;
    for r in results {
        match r {
            Ok(mut c) => {
                c.report.stage_ms.fit = fit_ms;
                c.report.stage_ms.finalists = finalists_ms;
                built.push(Some(c));
            }
            Err(e) => {
                if matches!(e, CompileError::DoesNotFit(_)) {
                    first_unplaced.get_or_insert(e);
                } else {
                    first_err.get_or_insert(e);
                }
                built.push(None);
            }
        }
    }
    // When none fits, a finalist placement refused is the report before one the
    // fit limit kept from placement: smaller budgets (the caller's retry) help
    // the first, and the best-ranked finalist may be only the second.
    let first_err = first_unplaced.or(first_err);
    let mut sel = Selection {
        finalists,
        selected: 0,
        built,
        selection_ms: start.elapsed().as_secs_f64() * 1e3,
    };
    let result = match sel.feasible_by_estimate().first() {
        Some(&i) => {
            sel.selected = i;
            Ok(sel)
        }
        // None fits: the best-ranked finalist's error is the report.
        None => Err(first_err.unwrap_or(CompileError::NoFinalist)),
    };
    Ok((result, fitted))
}

fn report(
    rank: usize,
    choices: BTreeMap<String, usize>,
    result: &Result<Compiled, CompileError>,
    build_ms: f64,
) -> FinalistReport {
    let mut r = FinalistReport {
        rank,
        choices,
        built: !matches!(result, Err(CompileError::NotBuilt)),
        feasible: false,
        failing_tiles: 0,
        missing_bytes: None,
        peak_bytes: None,
        estimated_cycles: None,
        simulated_cycles: None,
        error: None,
        build_ms,
        simulate_ms: None,
    };
    match result {
        Ok(c) => {
            r.feasible = true;
            r.peak_bytes = Some(c.report.placement.peak_bytes);
            r.estimated_cycles = Some(c.report.estimated.cycles);
        }
        Err(CompileError::DoesNotFit(d)) => {
            r.failing_tiles = d.iter().filter(|d| !d.not_attempted).count();
            r.missing_bytes = d.iter().filter_map(|d| d.missing_bytes).max();
        }
        Err(e @ CompileError::OverFitLimit { live, limit, .. }) => {
            r.failing_tiles = 1;
            r.missing_bytes = Some(live - limit);
            r.error = Some(crate::error_chain(e));
        }
        Err(e) => r.error = Some(crate::error_chain(e)),
    }
    r
}

/// Calls `build(i)` (true when finalist `i` placed) for the finalists with an
/// estimate, smallest estimate first (ties: index), until `wanted` (at least
/// one) have placed. The selection compares estimates among feasible
/// finalists, so the first to place is the one selected, and placing the
/// others (the most of a search's time near capacity) would change nothing.
fn build_best_first(
    estimates: &[Option<u64>],
    wanted: usize,
    mut build: impl FnMut(usize) -> bool,
) {
    let mut order: Vec<usize> = (0..estimates.len())
        .filter(|&i| estimates[i].is_some())
        .collect();
    order.sort_by_key(|&i| (estimates[i], i));
    let mut placed = 0;
    for i in order {
        if placed >= wanted.max(1) {
            break;
        }
        placed += usize::from(build(i));
    }
}

/// A finalist lowered and estimated, before it is built.
struct Lowered {
    o: LowerOptions,
    /// Its plan (`None`: the default lowering's own), or why it has none.
    plan: Result<Option<TilePlan>, CompileError>,
    estimate: Option<u64>,
    lower_ms: f64,
}

/// `plan` if its busiest tile's live bytes are within the fit loop's bound
/// ([`fit_limit_within`] the squeezed capacity, if any), otherwise the error that
/// says where.
fn within_fit_limit(
    machine: &Machine,
    capacity: Option<u64>,
    plan: TilePlan,
) -> Result<TilePlan, CompileError> {
    let limit = fit_limit_within(machine, capacity);
    let (tile, step, live) = busiest(&plan);
    if live <= limit {
        return Ok(plan);
    }
    Err(CompileError::OverFitLimit {
        tile,
        step,
        op: plan.step_ops[step as usize].clone(),
        live,
        limit,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Finalists are built smallest estimate first (ties: rank), those without
    /// a plan never, until as many as wanted have placed.
    #[test]
    fn finalists_are_built_best_estimate_first_until_enough_place() {
        let estimates = [Some(5), None, Some(3), Some(3), Some(9), Some(4)];
        let places = |i: usize| matches!(i, 0 | 3 | 4);
        let built = |wanted: usize| {
            let mut order = Vec::new();
            build_best_first(&estimates, wanted, |i| {
                order.push(i);
                places(i)
            });
            order
        };
        assert_eq!(built(0), vec![2, 3], "at least one");
        assert_eq!(built(1), vec![2, 3]);
        assert_eq!(built(2), vec![2, 3, 5, 0]);
        assert_eq!(built(9), vec![2, 3, 5, 0, 4]);
    }

    fn cand(cycles: u64, in_bytes: u64, out_bytes: u64) -> Candidate {
        Candidate {
            estimated_cycles: cycles,
            bytes_per_tile: 0,
            grid: String::new(),
            passes: 1,
            in_bytes_per_tile: in_bytes,
            out_bytes_per_tile: out_bytes,
            beyond_budget: false,
        }
    }

    fn ops(costs: &[Vec<u64>]) -> Vec<OpCandidates> {
        costs
            .iter()
            .enumerate()
            .map(|(i, c)| OpCandidates {
                op: format!("op{i}"),
                input_from: None,
                candidates: c.iter().map(|&e| cand(e, 0, 0)).collect(),
                chosen: 0,
            })
            .collect()
    }

    /// A fixed-seed xorshift generator: `next(m)` is below `m`.
    fn below(mut state: u64) -> impl FnMut(u64) -> u64 {
        move |m| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        }
    }

    /// Every assignment's summed estimate, by brute force.
    fn all_sums(costs: &[Vec<u64>]) -> Vec<u64> {
        let mut sums = vec![0u64];
        for c in costs {
            sums = sums
                .iter()
                .flat_map(|s| c.iter().map(move |e| s + e))
                .collect();
        }
        sums.sort();
        sums
    }

    #[test]
    fn beam_keeps_the_k_smallest_sums_against_brute_force() {
        // A fixed-seed generator: 200 random problems of up to 5 operations with
        // up to 4 strategies each.
        let mut next = below(0x2545_f491_4f6c_dd1d);
        for _ in 0..200 {
            let n_ops = 1 + next(5) as usize;
            let costs: Vec<Vec<u64>> = (0..n_ops)
                .map(|_| (0..1 + next(4)).map(|_| next(50)).collect())
                .collect();
            let k = 1 + next(10) as usize;
            let finalists = beam(&ops(&costs), k, 4);
            let sum = |ch: &BTreeMap<String, usize>| -> u64 {
                costs
                    .iter()
                    .enumerate()
                    .map(|(i, c)| c[ch.get(&format!("op{i}")).copied().unwrap_or(0)])
                    .sum()
            };
            let got: Vec<u64> = finalists.iter().map(sum).collect();
            let want: Vec<u64> = all_sums(&costs).into_iter().take(k).collect();
            assert_eq!(got, want, "{costs:?} k={k}");
            // Distinct assignments, the same on a second run.
            let mut uniq = finalists.clone();
            uniq.dedup();
            assert_eq!(uniq.len(), finalists.len());
            assert_eq!(finalists, beam(&ops(&costs), k, 4));
        }
    }

    #[test]
    fn ties_prefer_the_defaults() {
        let f = beam(&ops(&[vec![10, 10], vec![5, 5]]), 2, 4);
        assert_eq!(f[0], BTreeMap::new());
        assert_eq!(f[1].len(), 1);
    }

    /// With layout costs between linked operations, the beam still keeps the `k`
    /// cheapest whole assignments: brute force over every assignment, charging
    /// each link its producer's excess bytes, agrees on 200 fixed-seed problems.
    #[test]
    fn layout_costs_between_linked_operations_against_brute_force() {
        let mut next = below(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let n_ops = 1 + next(5) as usize;
            let mut list: Vec<OpCandidates> = Vec::new();
            for i in 0..n_ops {
                let n = 1 + next(4) as usize;
                list.push(OpCandidates {
                    op: format!("op{i}"),
                    input_from: (i > 0 && next(2) == 0).then(|| format!("op{}", next(i as u64))),
                    candidates: (0..n)
                        .map(|_| cand(next(50), next(200), next(200)))
                        .collect(),
                    chosen: 0,
                });
            }
            let total = |ch: &[usize]| -> u64 {
                let mut c = 0;
                for (i, op) in list.iter().enumerate() {
                    c += op.candidates[ch[i]].estimated_cycles;
                    if let Some(from) = &op.input_from {
                        let p = list.iter().position(|o| &o.op == from).unwrap();
                        let excess = list[p].candidates[ch[p]]
                            .out_bytes_per_tile
                            .saturating_sub(op.candidates[ch[i]].in_bytes_per_tile);
                        c += excess.div_ceil(4);
                    }
                }
                c
            };
            let mut all: Vec<Vec<usize>> = vec![Vec::new()];
            for op in &list {
                all = all
                    .into_iter()
                    .flat_map(|c| {
                        (0..op.candidates.len()).map(move |i| {
                            let mut c = c.clone();
                            c.push(i);
                            c
                        })
                    })
                    .collect();
            }
            let mut sums: Vec<u64> = all.iter().map(|c| total(c)).collect();
            sums.sort();
            let k = 1 + next(10) as usize;
            let got: Vec<u64> = beam(&list, k, 4)
                .iter()
                .map(|m| {
                    let ch: Vec<usize> = list
                        .iter()
                        .map(|o| m.get(&o.op).copied().unwrap_or(0))
                        .collect();
                    total(&ch)
                })
                .collect();
            let want: Vec<u64> = sums.into_iter().take(k).collect();
            assert_eq!(got, want);
        }
    }
}

//! The finalist search: several whole-model plans built completely, each one's
//! feasibility reported, the best feasible one selected.
//!
//! The default lowering records, for every operation with a choice (the linears),
//! the strategies its rule offered: none beaten by another on both estimated cycles
//! and busiest-tile bytes, the rule's default first. A beam over those operations,
//! in lowering order, keeps the `k` assignments with the smallest sum of the rules'
//! estimates (ties: the assignment closer to the defaults, then the lexicographic
//! order of the choices, so the same inputs give the same finalists). Each finalist
//! is then lowered under the budgets the default lowering's fit loop settled on
//! (without a fit loop of its own: a finalist that does not fit is reported as
//! such) and compiled completely, in parallel: host sizing and the common
//! reservation, placement of every tile, emission and package validation. Its
//! redistributions are charged there, by the plan estimate of the whole plan
//! (`tessera_plan::estimate`), which is what selection compares.
//!
//! Policy, not fact: nothing here may change what a plan means, only which plan is
//! built.

use std::collections::BTreeMap;
use std::time::Instant;

use rayon::prelude::*;
use serde::Serialize;
use tessera_graph::{Graph, TensorMap};
use tessera_machine::Machine;
use tessera_plan::{OpCandidates, lower_exact, lower_fitted};

use crate::{CompileError, CompileOptions, Compiled, compile_lowered};

/// One finalist's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct FinalistReport {
    /// 1-based, in the beam's order (smallest summed estimate first).
    pub rank: usize,
    /// The strategy index chosen per operation.
    pub choices: BTreeMap<String, usize>,
    pub feasible: bool,
    /// Tiles placement could not fit (0 when feasible).
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

/// The `k` assignments of strategies to operations with the smallest sum of
/// estimated cycles, best first.
pub fn beam(ops: &[OpCandidates], k: usize) -> Vec<BTreeMap<String, usize>> {
    // (summed estimate, strategies off their default, choices)
    let mut states: Vec<(u64, usize, Vec<usize>)> = vec![(0, 0, Vec::new())];
    for op in ops {
        let mut next = Vec::with_capacity(states.len() * op.candidates.len());
        for (cost, off, ch) in &states {
            for (i, c) in op.candidates.iter().enumerate() {
                let mut ch = ch.clone();
                ch.push(i);
                next.push((cost + c.estimated_cycles, off + usize::from(i > 0), ch));
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
                .filter(|(_, i)| *i > 0)
                .map(|(op, i)| (op.op.clone(), i))
                .collect()
        })
        .collect()
}

/// Builds `k` finalists and selects the feasible one with the fewest estimated
/// cycles. `progress` is called after each build with (built, total).
pub fn select(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &CompileOptions,
    k: usize,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Selection, CompileError> {
    let start = Instant::now();
    // The defaults, lowered with the fit loop; every finalist keeps the budgets it
    // settled on, so that the recorded strategies are the ones a choice picks.
    let (base, fitted) = lower_fitted(machine, graph, weights, &opts.lower)?;
    let assignments = beam(&base.candidates, k);
    let total = assignments.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let built: Vec<(FinalistReport, Result<Compiled, CompileError>)> = assignments
        .into_par_iter()
        .enumerate()
        .map(|(i, choices)| {
            let t = Instant::now();
            let result = if choices.is_empty() {
                compile_lowered(machine, &base, opts)
            } else {
                let mut o = fitted.clone();
                o.choices = choices.clone();
                lower_exact(machine, graph, weights, &o)
                    .map_err(CompileError::from)
                    .and_then(|plan| compile_lowered(machine, &plan, opts))
            };
            let build_ms = t.elapsed().as_secs_f64() * 1e3;
            let result = result.map(|mut c| {
                c.report.compile_ms = build_ms;
                c
            });
            let report = report(i + 1, choices, &result, build_ms);
            progress(
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1,
                total,
            );
            (report, result)
        })
        .collect();
    let (finalists, results): (Vec<FinalistReport>, Vec<_>) = built.into_iter().unzip();
    let mut built = Vec::with_capacity(results.len());
    let mut first_err = None;
    for r in results {
        match r {
            Ok(c) => built.push(Some(c)),
            Err(e) => {
                first_err.get_or_insert(e);
                built.push(None);
            }
        }
    }
    let mut sel = Selection {
        finalists,
        selected: 0,
        built,
        selection_ms: start.elapsed().as_secs_f64() * 1e3,
    };
    match sel.feasible_by_estimate().first() {
        Some(&i) => {
            sel.selected = i;
            Ok(sel)
        }
        // None fits: the best-ranked finalist's error is the report.
        None => {
            Err(first_err.unwrap_or_else(|| CompileError::Host("no finalist was built".into())))
        }
    }
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
            r.failing_tiles = d.len();
            r.missing_bytes = d.iter().filter_map(|d| d.missing_bytes).max();
        }
        Err(e) => r.error = Some(e.to_string()),
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_plan::Candidate;

    fn ops(costs: &[Vec<u64>]) -> Vec<OpCandidates> {
        costs
            .iter()
            .enumerate()
            .map(|(i, c)| OpCandidates {
                op: format!("op{i}"),
                candidates: c
                    .iter()
                    .map(|&e| Candidate {
                        estimated_cycles: e,
                        bytes_per_tile: 0,
                        grid: String::new(),
                    })
                    .collect(),
                chosen: 0,
            })
            .collect()
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
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % m
        };
        for _ in 0..200 {
            let n_ops = 1 + next(5) as usize;
            let costs: Vec<Vec<u64>> = (0..n_ops)
                .map(|_| (0..1 + next(4)).map(|_| next(50)).collect())
                .collect();
            let k = 1 + next(10) as usize;
            let finalists = beam(&ops(&costs), k);
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
            assert_eq!(finalists, beam(&ops(&costs), k));
        }
    }

    #[test]
    fn ties_prefer_the_defaults() {
        let f = beam(&ops(&[vec![10, 10], vec![5, 5]]), 2);
        assert_eq!(f[0], BTreeMap::new());
        assert_eq!(f[1].len(), 1);
    }
}

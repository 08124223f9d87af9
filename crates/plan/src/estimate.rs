//! A whole-plan cycle estimate, read off a finished tile plan: each compute step
//! costs its busiest tile's kernel estimates, each exchange step the simulator's
//! exchange rule (fixed overhead, then the tile whose exchange code and send or
//! receive bytes take longest, with whole shared-bus groups receiving at the
//! group's rate), and every step a
//! sync. Host transfers are left out: they are the same for every plan of a model.
//! What the finalist search ranks plans by, and what `bench select` checks against
//! the simulator.

use std::collections::HashMap;

use serde::Serialize;
use tessera_machine::Machine;

use crate::ir::{StepKind, TilePlan};

/// Estimated cycles of a plan's tile work, split by kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct PlanEstimate {
    pub cycles: u64,
    pub compute: u64,
    pub exchange: u64,
    pub sync: u64,
}

pub fn estimate(machine: &Machine, plan: &TilePlan) -> PlanEstimate {
    estimate_steps(machine, plan).0
}

/// [`estimate`] and each step's estimated cycles (its busiest tile's compute, or
/// its exchange), in step order: where two plans' estimates part.
pub fn estimate_steps(machine: &Machine, plan: &TilePlan) -> (PlanEstimate, Vec<u64>) {
    let t = &machine.timing;
    let mut steps = vec![0; plan.steps.len()];
    let mut per_step: Vec<HashMap<u32, u64>> = vec![HashMap::new(); plan.steps.len()];
    for c in &plan.calls {
        let cycles = c.kernel.kernel().estimate_cycles_with(t);
        *per_step[c.step as usize].entry(c.tile).or_default() += cycles;
    }
    let mut e = PlanEstimate::default();
    // A layer loop's body runs once a layer.
    let runs = |s: usize| {
        plan.layer_loop
            .as_ref()
            .filter(|lp| lp.contains(s as u32))
            .map_or(1, |lp| u64::from(lp.count))
    };
    for (s, kind) in plan.steps.iter().enumerate() {
        let n = runs(s);
        match kind {
            StepKind::Compute => {
                let busiest = per_step[s].values().copied().max().unwrap_or(0);
                steps[s] = busiest;
                if busiest > 0 {
                    e.compute += n * busiest;
                    e.sync += n * u64::from(t.sync_cycles);
                }
            }
            StepKind::Exchange(id) => {
                if let Some(x) = plan.exchanges.iter().find(|x| x.id == *id) {
                    steps[s] = exchange_cycles(machine, plan, x);
                    e.exchange += n * steps[s];
                    e.sync += n * u64::from(t.sync_cycles);
                }
            }
            StepKind::HostIn | StepKind::HostOut => {}
        }
    }
    e.cycles = e.compute + e.exchange + e.sync;
    (e, steps)
}

fn exchange_cycles(machine: &Machine, plan: &TilePlan, x: &crate::ir::Exchange) -> u64 {
    let mut load = tessera_machine::ExchangeLoad::new(machine);
    for c in &x.copies {
        let src = plan.buffer(c.src.buf).tile;
        load.add(
            src,
            u64::from(c.bytes),
            c.dsts.iter().map(|d| plan.buffer(d.buf).tile),
        );
    }
    let counts = crate::exchange_code::exchange_counts(plan, x);
    let code = crate::exchange_code::code_cycles(machine, &counts);
    load.cycles_with(|t| code.get(t as usize).copied().unwrap_or(0))
}

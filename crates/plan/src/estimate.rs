//! A whole-plan cycle estimate, read off a finished tile plan: each compute step
//! costs its busiest tile's kernel estimates, each exchange step the simulator's
//! exchange rule (fixed overhead, then the busiest tile's send or receive bytes,
//! with whole shared-bus groups receiving at the group's rate), and every step a
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
    let t = &machine.timing;
    let mut per_step: Vec<HashMap<u32, u64>> = vec![HashMap::new(); plan.steps.len()];
    for c in &plan.calls {
        let cycles = c.kernel.kernel().estimate_cycles_with(t);
        *per_step[c.step as usize].entry(c.tile).or_default() += cycles;
    }
    let mut e = PlanEstimate::default();
    for (s, kind) in plan.steps.iter().enumerate() {
        match kind {
            StepKind::Compute => {
                let busiest = per_step[s].values().copied().max().unwrap_or(0);
                if busiest > 0 {
                    e.compute += busiest;
                    e.sync += u64::from(t.sync_cycles);
                }
            }
            StepKind::Exchange(id) => {
                if let Some(x) = plan.exchanges.iter().find(|x| x.id == *id) {
                    e.exchange += exchange_cycles(machine, plan, &x.copies);
                    e.sync += u64::from(t.sync_cycles);
                }
            }
            StepKind::HostIn | StepKind::HostOut => {}
        }
    }
    e.cycles = e.compute + e.exchange + e.sync;
    e
}

fn exchange_cycles(machine: &Machine, plan: &TilePlan, copies: &[crate::ir::Copy]) -> u64 {
    let rate = u64::from(machine.timing.exchange_bytes_per_cycle.max(1));
    let group = machine.timing.tiles_per_shared_exchange_bus.max(1);
    let g = u64::from(group);
    let mut sent: HashMap<u32, u64> = HashMap::new();
    let mut received: HashMap<u32, u64> = HashMap::new();
    let mut dsts: Vec<u32> = Vec::new();
    for c in copies {
        let bytes = u64::from(c.bytes);
        *sent.entry(plan.buffer(c.src.buf).tile).or_default() += bytes * g;
        dsts.clear();
        dsts.extend(c.dsts.iter().map(|d| plan.buffer(d.buf).tile));
        dsts.sort_unstable();
        dsts.dedup();
        for &d in &dsts {
            let first = d - d % group;
            let whole =
                (first..first.saturating_add(group)).all(|t| dsts.binary_search(&t).is_ok());
            *received.entry(d).or_default() += if whole { bytes } else { bytes * g };
        }
    }
    let busiest = sent
        .values()
        .chain(received.values())
        .copied()
        .max()
        .unwrap_or(0);
    u64::from(machine.timing.exchange_overhead_cycles) + busiest.div_ceil(rate * g)
}

//! The exchange phase's timing rule, shared by the simulator (which charges it) and
//! the planner's estimate (which predicts it).

use std::collections::HashMap;

use crate::Machine;

/// Bytes each tile sends and receives in one exchange phase, and the phase's cycles:
/// its fixed overhead, then the busiest tile's send or receive time. Every tile
/// sends and receives `exchange_bytes_per_cycle`; a transfer that all tiles of a
/// shared-bus group receive arrives on each of them at group-size times that rate
/// (poplibs' exchange estimators), so it costs each receiver its bytes divided by
/// the group size.
#[derive(Debug, Clone)]
pub struct ExchangeLoad {
    rate: u64,
    group: u32,
    overhead: u64,
    sent: HashMap<u32, u64>,
    /// In units of 1/group byte, so that sums stay exact integers.
    received: HashMap<u32, u64>,
    dsts: Vec<u32>,
}

impl ExchangeLoad {
    pub fn new(machine: &Machine) -> ExchangeLoad {
        let t = &machine.timing;
        ExchangeLoad {
            rate: u64::from(t.exchange_bytes_per_cycle.max(1)),
            group: t.tiles_per_shared_exchange_bus.max(1),
            overhead: u64::from(t.exchange_overhead_cycles),
            sent: HashMap::new(),
            received: HashMap::new(),
            dsts: Vec::new(),
        }
    }

    /// One transfer of `bytes` from tile `src` to tiles `dsts` (repeats count once).
    pub fn add(&mut self, src: u32, bytes: u64, dsts: impl IntoIterator<Item = u32>) {
        let g = u64::from(self.group);
        *self.sent.entry(src).or_default() += bytes * g;
        self.dsts.clear();
        self.dsts.extend(dsts);
        self.dsts.sort_unstable();
        self.dsts.dedup();
        for &d in &self.dsts {
            let first = d - d % self.group;
            let whole = (first..first.saturating_add(self.group))
                .all(|t| self.dsts.binary_search(&t).is_ok());
            *self.received.entry(d).or_default() += if whole { bytes } else { bytes * g };
        }
    }

    pub fn cycles(&self) -> u64 {
        let busiest = self
            .sent
            .values()
            .chain(self.received.values())
            .copied()
            .max()
            .unwrap_or(0);
        self.overhead + busiest.div_ceil(self.rate * u64::from(self.group))
    }
}

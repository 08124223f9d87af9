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
    sent: Counts,
    /// In units of 1/group byte, so that sums stay exact integers.
    received: Counts,
    dsts: Vec<u32>,
}

/// Counts by tile: in a vector for the machine's tiles (a phase names thousands of
/// transfers to hundreds of tiles, and the simulator and the planner cost every
/// phase), in a map for tiles past them, which only a malformed program names.
#[derive(Debug, Clone)]
struct Counts {
    dense: Vec<u64>,
    beyond: HashMap<u32, u64>,
}

impl Counts {
    fn new(tiles: usize) -> Counts {
        Counts {
            dense: vec![0; tiles],
            beyond: HashMap::new(),
        }
    }

    fn add(&mut self, tile: u32, by: u64) {
        match self.dense.get_mut(tile as usize) {
            Some(v) => *v += by,
            None => *self.beyond.entry(tile).or_default() += by,
        }
    }
}

impl ExchangeLoad {
    pub fn new(machine: &Machine) -> ExchangeLoad {
        let t = &machine.timing;
        // A machine that skipped validation may claim any count: the vectors stay
        // within the largest valid one.
        let tiles = machine.tiles.min(crate::MAX_TILES as u32) as usize;
        ExchangeLoad {
            rate: u64::from(t.exchange_bytes_per_cycle.max(1)),
            group: t.tiles_per_shared_exchange_bus.max(1),
            overhead: u64::from(t.exchange_overhead_cycles),
            sent: Counts::new(tiles),
            received: Counts::new(tiles),
            dsts: Vec::new(),
        }
    }

    /// One transfer of `bytes` from tile `src` to tiles `dsts` (repeats count once).
    pub fn add(&mut self, src: u32, bytes: u64, dsts: impl IntoIterator<Item = u32>) {
        let g = u64::from(self.group);
        self.sent.add(src, bytes * g);
        self.dsts.clear();
        self.dsts.extend(dsts);
        self.dsts.sort_unstable();
        self.dsts.dedup();
        for &d in &self.dsts {
            let first = d - d % self.group;
            let whole = (first..first.saturating_add(self.group))
                .all(|t| self.dsts.binary_search(&t).is_ok());
            self.received.add(d, if whole { bytes } else { bytes * g });
        }
    }

    /// The phase's cycles with no exchange code: the busiest tile's bytes.
    pub fn cycles(&self) -> u64 {
        self.cycles_with(|_| 0)
    }

    /// The phase's cycles when each tile first runs its exchange code, `code(t)`
    /// cycles of instructions, and only then moves its bytes: the fixed overhead,
    /// then the tile whose code and data together take longest. With no code this
    /// is [`ExchangeLoad::cycles`].
    pub fn cycles_with(&self, code: impl Fn(u32) -> u64) -> u64 {
        let per = self.rate * u64::from(self.group);
        let dense = (0..self.sent.dense.len()).map(|t| {
            let bytes = self.sent.dense[t].max(self.received.dense[t]);
            code(t as u32) + bytes.div_ceil(per)
        });
        let beyond = self
            .sent
            .beyond
            .keys()
            .chain(self.received.beyond.keys())
            .map(|&t| {
                let get = |c: &Counts| c.beyond.get(&t).copied().unwrap_or(0);
                code(t) + get(&self.sent).max(get(&self.received)).div_ceil(per)
            });
        self.overhead + dense.chain(beyond).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The rule written out plainly, per tile in maps: what the counts by tile must
    /// agree with.
    fn oracle(m: &Machine, transfers: &[(u32, u64, Vec<u32>)]) -> u64 {
        let g = u64::from(m.timing.tiles_per_shared_exchange_bus.max(1));
        let mut sent: BTreeMap<u32, u64> = BTreeMap::new();
        let mut received: BTreeMap<u32, u64> = BTreeMap::new();
        for (src, bytes, dsts) in transfers {
            *sent.entry(*src).or_default() += bytes * g;
            let set: std::collections::BTreeSet<u32> = dsts.iter().copied().collect();
            for &d in &set {
                let first = u64::from(d) / g * g;
                let whole = (first..first + g).all(|t| set.contains(&(t as u32)));
                *received.entry(d).or_default() += if whole { *bytes } else { bytes * g };
            }
        }
        let busiest = sent
            .values()
            .chain(received.values())
            .copied()
            .max()
            .unwrap_or(0);
        let rate = u64::from(m.timing.exchange_bytes_per_cycle.max(1)) * g;
        u64::from(m.timing.exchange_overhead_cycles) + busiest.div_ceil(rate)
    }

    #[test]
    fn counts_by_tile_agree_with_the_rule_written_out() {
        // Fixed-seed transfers over the machine's tiles and a few past them (which
        // only a malformed program names), broadcasts to pairs and to lone tiles.
        use rand::{Rng, SeedableRng};
        let m = Machine::small();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(13);
        let mut next = |n: u64| rng.random_range(0..n);
        let span = u64::from(m.tiles) + 5;
        for case in 0..200 {
            let transfers: Vec<(u32, u64, Vec<u32>)> = (0..1 + next(12))
                .map(|_| {
                    let dsts = (0..next(6)).map(|_| next(span) as u32).collect();
                    (next(span) as u32, next(5000), dsts)
                })
                .collect();
            let mut load = ExchangeLoad::new(&m);
            for (src, bytes, dsts) in &transfers {
                load.add(*src, *bytes, dsts.iter().copied());
            }
            assert_eq!(
                load.cycles(),
                oracle(&m, &transfers),
                "case {case}: {transfers:?}"
            );
            assert_eq!(load.cycles_with(|_| 0), load.cycles(), "case {case}");
            // With code: each tile's code, then its own bytes.
            let code = |t: u32| u64::from(t * 7 % 23);
            assert_eq!(
                load.cycles_with(code),
                oracle_with_code(&m, &transfers, code),
                "case {case}: {transfers:?}"
            );
        }
    }

    fn oracle_with_code(
        m: &Machine,
        transfers: &[(u32, u64, Vec<u32>)],
        code: impl Fn(u32) -> u64,
    ) -> u64 {
        let span = m.tiles + 5;
        (0..span)
            .map(|t| {
                // The tile's own sends and receives, alone, through the plain rule.
                let own: Vec<(u32, u64, Vec<u32>)> = transfers
                    .iter()
                    .map(|(src, bytes, dsts)| {
                        let b = if *src == t { *bytes } else { 0 };
                        let d: Vec<u32> = dsts.clone();
                        (*src, b, d)
                    })
                    .collect();
                let sent = oracle(m, &own) - u64::from(m.timing.exchange_overhead_cycles);
                let recv: Vec<(u32, u64, Vec<u32>)> = transfers
                    .iter()
                    .map(|(_, bytes, dsts)| (u32::MAX, *bytes, dsts.clone()))
                    .collect();
                let received = received_by(m, &recv, t);
                code(t) + sent.max(received)
            })
            .max()
            .unwrap_or(0)
            + u64::from(m.timing.exchange_overhead_cycles)
    }

    /// Cycles tile `t` spends receiving, by the plain rule.
    fn received_by(m: &Machine, transfers: &[(u32, u64, Vec<u32>)], t: u32) -> u64 {
        let g = u64::from(m.timing.tiles_per_shared_exchange_bus.max(1));
        let mut units = 0;
        for (_, bytes, dsts) in transfers {
            let set: std::collections::BTreeSet<u32> = dsts.iter().copied().collect();
            if set.contains(&t) {
                let first = u64::from(t) / g * g;
                let whole = (first..first + g).all(|u| set.contains(&(u as u32)));
                units += if whole { *bytes } else { bytes * g };
            }
        }
        units.div_ceil(u64::from(m.timing.exchange_bytes_per_cycle.max(1)) * g)
    }
}

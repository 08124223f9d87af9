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
    overlap_percent: u64,
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

    fn merge(&mut self, other: &Counts) {
        for (v, o) in self.dense.iter_mut().zip(&other.dense) {
            *v += o;
        }
        for (&t, &by) in &other.beyond {
            self.add(t, by);
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
            // Past 100 the overlap would hide more than the shorter part.
            overlap_percent: u64::from(t.exchange_code_overlap_percent.min(100)),
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

    /// Adds the transfers counted in `other` (a load of the same machine), so
    /// that one phase's transfers can be counted in parts, in parallel.
    pub fn merge(&mut self, other: &ExchangeLoad) {
        self.sent.merge(&other.sent);
        self.received.merge(&other.received);
    }

    /// The phase's cycles with no exchange code: the busiest tile's bytes.
    pub fn cycles(&self) -> u64 {
        self.cycles_with(|_| 0)
    }

    /// The phase's cycles when each tile runs its exchange code, `code(t)` cycles
    /// of instructions, and moves its bytes, `data(t)` cycles: the fixed overhead,
    /// then the tile whose code and data together take longest. How much of the
    /// two overlap is the machine's `exchange_code_overlap_percent` `p`, an
    /// assumption: a tile takes `code + data - p/100 * min(code, data)` (rounded
    /// up), from the sum at 0 to the larger of the two at 100. With no code this
    /// is [`ExchangeLoad::cycles`] whatever `p` is.
    pub fn cycles_with(&self, code: impl Fn(u32) -> u64) -> u64 {
        let per = self.rate * u64::from(self.group);
        let tile =
            |code: u64, bytes: u64| overlapped(code, bytes.div_ceil(per), self.overlap_percent);
        let dense = (0..self.sent.dense.len()).map(|t| {
            tile(
                code(t as u32),
                self.sent.dense[t].max(self.received.dense[t]),
            )
        });
        let beyond = self
            .sent
            .beyond
            .keys()
            .chain(self.received.beyond.keys())
            .map(|&t| {
                let get = |c: &Counts| c.beyond.get(&t).copied().unwrap_or(0);
                tile(code(t), get(&self.sent).max(get(&self.received)))
            });
        self.overhead + dense.chain(beyond).max().unwrap_or(0)
    }
}

/// One tile's exchange: `code` and `data` cycles, `percent` of the shorter hidden
/// under the longer. The hidden part rounds down, so that a partial overlap never
/// charges less than the exact figure; in u128 so that no count overflows it.
fn overlapped(code: u64, data: u64, percent: u64) -> u64 {
    let hidden = u128::from(percent) * u128::from(code.min(data)) / 100;
    // At most min(code, data): the result lies between max(code, data) and the sum.
    code + data - hidden as u64
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
            // Counted in two parts and merged, the same figure.
            let cut = transfers.len() / 2;
            let mut parts = [ExchangeLoad::new(&m), ExchangeLoad::new(&m)];
            for (k, (src, bytes, dsts)) in transfers.iter().enumerate() {
                parts[usize::from(k >= cut)].add(*src, *bytes, dsts.iter().copied());
            }
            let [mut merged, second] = parts;
            merged.merge(&second);
            assert_eq!(
                merged.cycles(),
                oracle(&m, &transfers),
                "case {case}, merged"
            );
            // With code: each tile's code and its own bytes, at each reading of
            // their overlap. Scaled so that either of code and bytes is the
            // shorter on some tiles; tiles past the machine with no bytes are not
            // in the rule's count, so none of them may have the most code.
            let code = |t: u32| u64::from(t * 7 % 23) * 50;
            for percent in [0, 50, 100] {
                let mut m = m.clone();
                m.timing.exchange_code_overlap_percent = percent;
                let mut load = ExchangeLoad::new(&m);
                for (src, bytes, dsts) in &transfers {
                    load.add(*src, *bytes, dsts.iter().copied());
                }
                assert_eq!(load.cycles_with(|_| 0), oracle(&m, &transfers), "{case}");
                assert_eq!(
                    load.cycles_with(code),
                    oracle_with_code(&m, &transfers, code),
                    "case {case} at {percent} %: {transfers:?}"
                );
            }
        }
    }

    /// One tile's code and data under the overlap, by cases: the sum, the larger,
    /// or in between the sum less the hidden share of the shorter, rounded up.
    fn tile_oracle(code: u64, data: u64, percent: u32) -> u64 {
        match percent {
            0 => code + data,
            100 => code.max(data),
            p => (100 * (code + data) - u64::from(p) * code.min(data)).div_ceil(100),
        }
    }

    #[test]
    fn overlap_of_code_and_data_by_hand() {
        // Tile 0 sends 40 bytes to tile 2 alone: 10 cycles at 4 B/cycle on either
        // side, after the 100 of overhead.
        let (code, data) = (
            |t: u32| [30, 0, 7][t as usize % 3],
            |m: &Machine| {
                let mut load = ExchangeLoad::new(m);
                load.add(0, 40, [2]);
                load
            },
        );
        // (percent, phase): tile 0 runs 30 cycles of code beside its 10 of bytes,
        // tile 2 runs 7 beside its 10.
        for (percent, want) in [(0, 100 + 40), (50, 100 + 35), (100, 100 + 30)] {
            let mut m = Machine::small();
            m.timing.exchange_code_overlap_percent = percent;
            let load = data(&m);
            assert_eq!(load.cycles_with(code), want, "{percent} %");
            assert_eq!(load.cycles(), 100 + 10, "{percent} %");
        }
        // Tile 2 alone decides when tile 0 has no code: 7 + 10 = 17 at 0 %, 10 at
        // 100 %, 17 - 3.5 rounded up to 14 at 50 %.
        let code = |t: u32| if t == 2 { 7 } else { 0 };
        for (percent, want) in [(0, 117), (50, 114), (100, 110)] {
            let mut m = Machine::small();
            m.timing.exchange_code_overlap_percent = percent;
            assert_eq!(data(&m).cycles_with(code), want, "{percent} %");
        }
        for (c, d) in [(0, 0), (30, 10), (7, 10), (10, 10), (1, u64::MAX / 200)] {
            for p in [0, 1, 50, 99, 100] {
                assert_eq!(
                    overlapped(c, d, p.into()),
                    tile_oracle(c, d, p),
                    "{c} {d} {p}"
                );
                assert_eq!(
                    overlapped(d, c, p.into()),
                    tile_oracle(c, d, p),
                    "{c} {d} {p}"
                );
            }
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
                tile_oracle(
                    code(t),
                    sent.max(received),
                    m.timing.exchange_code_overlap_percent,
                )
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

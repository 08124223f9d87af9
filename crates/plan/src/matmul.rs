//! Matmul mapping: a [rows, k] x [k, n] product split into `pr` row groups, `pk`
//! inner-dimension groups and `pn` column groups, one tile per (row, inner, column)
//! group. The AMP works on 16-wide chunks of `k` and 16-wide blocks of `n`, so the
//! split is counted in those units.
//!
//! The cost model adds up the kernels' own cycle estimates (which match the
//! simulator on the shapes the kernel tests run) and the exchange volume at the
//! machine's rates, rather than counting FLOP: what hurts on this machine is the
//! per-call overhead (weight loads, worker start and sync) when a tile has few rows,
//! and exchange volume when operands are replicated.

use crate::PlanError;
use serde::Serialize;
use tessera_kernels::{Add, AmpMatmul, Fp8ToF16, Kernel, Rearrange, ReduceAdd, WORKERS};
use tessera_machine::Machine;

/// AMP chunk width (16 inputs by 16 outputs per weight load): the machine's fact,
/// named here too because the lowering rules count in it.
pub use tessera_machine::AMP_WIDTH;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct MatmulShape {
    pub rows: u32,
    pub k: u32,
    pub n: u32,
    /// The input arrives in the AMP's chunk-major layout (the block layout of a
    /// previous product's output): no rearrangement on the tile and no row-major
    /// copy beside it.
    pub a_blocked: bool,
    /// A row-major input is rearranged to the chunk-major layout on the tile (the
    /// seed's way, kept for its weakened-contract reproduction) instead of being
    /// read row-major by the AMP's strided loads.
    pub rearrange: bool,
    /// Also cost each row split with its groups rounded up to whole rows a worker
    /// (see `MatmulMapping::row_options`); the fit loop turns it off before it
    /// gives up weight replicas, since the rounded groups hold a few rows more.
    pub even_rows: bool,
    /// Parts of each tile's chunks of K taken one after another (1: all at
    /// once): each part's inputs arrive in an exchange of their own and its AMP
    /// call continues from the previous part's partial sums, held for the next
    /// part in a carry buffer. Against row passes, which also bound the input
    /// bytes a tile holds, every weight block runs once over all the rows
    /// instead of once a pass; the output side is held at its whole size.
    pub k_parts: u32,
    /// The bias varies with the row (a fused position embedding): it stays a
    /// slab summed in the reduction. A plain bias goes into the AMP's first call
    /// on one inner group's tiles instead (`AmpMatmul::with_bias`), where the
    /// row split lets it.
    pub per_row_bias: bool,
    /// How each tile's weight block reaches the AMP: costed with the product, so
    /// that a grid replicating weights pays for moving and widening its replicas.
    pub feed: WeightFeed,
}

/// Where a product's weights live and in what form (`LowerOptions::stage_weights`,
/// `LowerOptions::weight_dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Default)]
pub struct WeightFeed {
    /// Copied from the weight store into the operation's layout by its staging
    /// exchange before it runs (else resident in that layout).
    pub staged: bool,
    /// Held as FP8 codes and widened to f16 on the tile before the AMP reads them.
    pub fp8: bool,
}

impl MatmulShape {
    /// A product whose input arrives row-major (read so by the AMP).
    pub fn new(rows: u32, k: u32, n: u32) -> MatmulShape {
        MatmulShape {
            rows,
            k,
            n,
            a_blocked: false,
            rearrange: false,
            even_rows: true,
            k_parts: 1,
            per_row_bias: false,
            feed: WeightFeed::default(),
        }
    }

    /// Whether the tile rearranges A before the product.
    fn rearranged(&self) -> bool {
        !self.a_blocked && self.rearrange
    }

    pub fn k_chunks(&self) -> u32 {
        self.k.div_ceil(AMP_WIDTH)
    }
    pub fn n_blocks(&self) -> u32 {
        self.n.div_ceil(AMP_WIDTH)
    }
    pub fn flop(&self) -> u64 {
        2 * u64::from(self.rows) * u64::from(self.k) * u64::from(self.n)
    }
}

/// Estimated cycles, per tile (the slowest tile), by phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct MatmulCost {
    /// Receiving the row-major input block.
    pub exchange_in: u64,
    /// Row-major to AMP layout.
    pub rearrange: u64,
    pub amp: u64,
    /// Receiving and summing partial results of the inner-dimension split.
    pub reduce: u64,
    /// Receiving the tile's weight block from the store (staged weights).
    pub stage: u64,
    /// Widening FP8 weights to f16.
    pub widen: u64,
}

impl MatmulCost {
    pub fn total(&self) -> u64 {
        self.exchange_in + self.rearrange + self.amp + self.reduce + self.stage + self.widen
    }

    /// The product done in `passes` row passes on the same tiles: the weights
    /// are staged and widened once, for every pass.
    pub fn over_passes(&self, passes: u64) -> u64 {
        let once = self.stage + self.widen;
        (self.total() - once) * passes + once
    }
}

/// One way to spread a matmul over tiles, with its per-tile sizes and cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatmulMapping {
    pub shape: MatmulShape,
    pub pr: u32,
    pub pk: u32,
    pub pn: u32,
    /// Rows per tile (the last group may have fewer).
    pub rows_per_tile: u32,
    /// 16-wide chunks of k per tile.
    pub chunks_per_tile: u32,
    /// 16-wide blocks of n per tile, padded to a multiple of `pk`.
    pub blocks_per_tile: u32,
    /// Tensor bytes on the busiest tile.
    pub bytes_per_tile: u64,
    /// Of which weights (in the interleaved region).
    pub weight_bytes: u64,
    /// Of which live for the whole program: weights and the broadcast bias.
    pub persistent_bytes: u64,
    pub cost: MatmulCost,
}

impl MatmulMapping {
    pub fn tiles(&self) -> u32 {
        self.pr * self.pk * self.pn
    }

    /// Share of the machine's f16 peak this mapping would reach if the estimate held.
    pub fn peak_share(&self, machine: &Machine) -> f64 {
        self.shape.flop() as f64
            / (self.cost.total() as f64 * machine.peak_f16_flop_per_cycle() as f64)
    }

    /// The mapping of `pr` row groups as they fall (tests name splits this way).
    #[cfg(test)]
    fn evaluate(machine: &Machine, shape: MatmulShape, pr: u32, pk: u32, pn: u32) -> Self {
        Self::evaluate_rows(machine, shape, shape.rows.div_ceil(pr), pk, pn)
    }

    /// The row groups `rows.div_ceil(pr)` and, where different, the same rounded up
    /// to whole rows a worker: the busiest worker's rows stay the same, and the
    /// AMP's workers then share one header walked from a table, with no records,
    /// several issues a call fewer; but the busiest tile holds a few rows more,
    /// which may cost a row pass where the budget is tight, so both are costed.
    fn row_options(
        machine: &Machine,
        shape: MatmulShape,
        pr: u32,
        pk: u32,
        pn: u32,
    ) -> impl Iterator<Item = Self> {
        let rows_t = shape.rows.div_ceil(pr);
        let even = rows_t.next_multiple_of(WORKERS).min(shape.rows);
        let round = (shape.even_rows && even != rows_t)
            .then(|| Self::evaluate_rows(machine, shape, even, pk, pn));
        std::iter::once(Self::evaluate_rows(machine, shape, rows_t, pk, pn)).chain(round)
    }

    fn evaluate_rows(machine: &Machine, shape: MatmulShape, rows_t: u32, pk: u32, pn: u32) -> Self {
        let kc_t = shape.k_chunks().div_ceil(pk);
        let real_nb = shape.n_blocks().div_ceil(pn);
        // The grid the lowering builds (`Grid`): groups of these sizes, so a
        // nominal split with empty groups (46 column groups of 6 blocks for 269
        // blocks) is the smaller one it really is (45), which decides the shared
        // receive bus below and the tiles used.
        let pr = shape.rows.div_ceil(rows_t);
        let pk = shape.k_chunks().div_ceil(kc_t);
        let pn = shape.n_blocks().div_ceil(real_nb);
        // A column group's blocks are reduced in slabs of `slab` blocks, one per
        // inner group while they last; the blocks are padded to whole slabs (less
        // than one slab of zero weights).
        let slab = real_nb.div_ceil(pk);
        let nb_t = real_nb.div_ceil(slab) * slab;
        let (rows, kc, nb) = (u64::from(rows_t), u64::from(kc_t), u64::from(nb_t));
        let t = &machine.timing;
        let xbw = u64::from(t.exchange_bytes_per_cycle);

        let chunk_bytes = u64::from(AMP_WIDTH) * 2;
        // K in parts: each inner group's chunks cut at `c * parts / kc` (the
        // lowering's `part_chunks`), so the busiest tile's largest part holds
        // `ceil(kc / parts)` chunks of inputs at a time. Every group needs a
        // chunk a part, and the parts after the first continue from partial sums,
        // which only an even row split's AMP call does.
        let parts = shape.k_parts.max(1);
        let smallest_group = shape.k_chunks() - (pk - 1) * kc_t;
        let part_sizes: Vec<u32> = (0..parts).map(|p| part_chunks(kc_t, parts, p).1).collect();
        let a_bytes = rows * u64::from(kc_t.div_ceil(parts)) * chunk_bytes;
        let weight_bytes = nb * kc * chunk_bytes * u64::from(AMP_WIDTH);
        // The AMP reads A as it lands unless it arrives in blocks or is rearranged.
        let rearranged = shape.rearranged();
        let amp_call = |kc: u32| {
            let mm = AmpMatmul::new(rows_t, kc, nb_t);
            if shape.a_blocked || rearranged {
                mm
            } else {
                mm.row_major()
            }
        };
        let mm = amp_call(kc_t);
        // Where whole-block slabs would move more bytes (`row_piece_rows`), the
        // output is cut into pieces of rows (all blocks) instead, one per inner
        // group, received into a buffer of their own (the lowering's
        // `row_pieces`). `slab_bytes` is what one inner group reduces; `moved`
        // what the busiest tile's reduce-scatter sends or receives.
        let (out_bytes, slab_bytes, moved) = match row_piece_rows(rows_t, pk, real_nb) {
            Some(pr) => {
                let piece = u64::from(pr) * nb * chunk_bytes;
                let output = rows * nb * chunk_bytes;
                // Every tile sends its output and holds it beside one piece from
                // every inner group. Its own piece goes through the exchange to
                // itself unless it is whole workers' rows, which the AMP writes
                // into the piece buffer directly.
                let own = nb_t == real_nb && mm.with_own_rows(0, pr, pr * AMP_WIDTH * 2).is_some();
                let moved = if own {
                    (output - piece).max(u64::from(pk - 1) * piece)
                } else {
                    output.max(u64::from(pk) * piece)
                };
                (output + u64::from(pk) * piece, piece, moved)
            }
            None => {
                let slab_bytes = rows * u64::from(slab) * chunk_bytes;
                // The partials buffer holds the AMP's output and, on a reducing
                // tile, one slab from every other inner group, which it receives.
                (
                    rows * u64::from(pk * slab) * chunk_bytes,
                    slab_bytes,
                    slab_bytes * u64::from(pk.saturating_sub(1)),
                )
            }
        };
        let partial_bytes = 2 * rows * chunk_bytes;
        // The partial sums one part hands the next, `[nb][rows][16]`: held beside
        // the last part's output (and, from three parts, beside the next carry).
        let carry = if parts > 1 {
            rows * nb * chunk_bytes
        } else {
            0
        };
        // Weights and the broadcast bias slab stay for the whole program; of the
        // rest, the rearrangement holds both copies of A, the matmul one copy of A,
        // its output and the ping-pong partials; the reduction works in place.
        let transient = if rearranged {
            (2 * a_bytes).max(a_bytes + out_bytes + partial_bytes)
        } else {
            a_bytes + out_bytes.max(carry) + carry + partial_bytes
        };
        // Parts of K and the bias in the engine need every row group's call to
        // split its rows evenly, the last (smaller) group's too.
        let last_rows = shape.rows - (pr - 1) * rows_t;
        let even = AmpMatmul::splits_evenly(rows_t) && AmpMatmul::splits_evenly(last_rows);
        let amp_bias = !shape.per_row_bias && even;
        // Constant bias bytes: a block's 16 values on the tiles that feed them
        // to the engine, else the slab the reduction sums.
        let bias_bytes = if amp_bias {
            nb * chunk_bytes
        } else {
            slab_bytes
        };
        let parts_ok = parts == 1 || (!rearranged && parts <= smallest_group && even);
        // A strategy in parts that cannot continue is refused: no budget holds it.
        let bytes_per_tile = if parts_ok {
            weight_bytes + bias_bytes + transient
        } else {
            u64::MAX
        };

        // One call a part (one part: the whole product), the later ones continuing.
        let amp = if parts_ok {
            part_sizes
                .iter()
                .enumerate()
                .map(|(p, &kc)| {
                    let k = amp_call(kc);
                    let k = match (p, amp_bias) {
                        (0, true) => k.with_bias().unwrap_or(k),
                        (0, false) => k,
                        _ => k.continuing().unwrap_or(k),
                    };
                    k.estimate_cycles_with(t)
                })
                .sum()
        } else {
            u64::MAX / 8
        };
        let rearrange = if rearranged {
            Rearrange::new(rows_t, kc_t * AMP_WIDTH).estimate_cycles_with(t)
        } else {
            0
        };
        // A (row, inner) group's tiles are consecutive from an aligned first tile
        // (the column group varies fastest, see the lowering's grid), and all of
        // them receive the same input block: with a multiple of the shared bus's
        // group size, every receiver shares its bus with one receiving the same
        // bytes, at that many times the port rate.
        let bus = u64::from(t.tiles_per_shared_exchange_bus.max(1));
        let shared = if u64::from(pn).is_multiple_of(bus) {
            bus
        } else {
            1
        };
        let exchange_in = part_sizes
            .iter()
            .map(|&kc| {
                u64::from(t.exchange_overhead_cycles)
                    + rows * u64::from(kc) * chunk_bytes / (xbw * shared)
            })
            .sum();
        let slab_elems = u32::try_from(slab_bytes / 2).unwrap_or(u32::MAX);
        // Without the bias in the engine, its slab is added inside the reduction
        // when there is one (the lowering's whole-slab case), otherwise by its
        // own `add`.
        let reduce = if pk > 1 {
            let sum = ReduceAdd::new(pk, slab_elems);
            let sum = if amp_bias { sum } else { sum.with_addend() };
            u64::from(t.exchange_overhead_cycles) + moved / xbw + sum.estimate_cycles_with(t)
        } else if amp_bias {
            0
        } else {
            Add::new(slab_elems).estimate_cycles_with(t)
        };
        // A tile's block as the staging exchange brings it (one byte a weight
        // in FP8, else two) and as the widening reads it: the padding blocks of
        // whole slabs included, as the lowering packs them.
        let weight_elems = weight_bytes / 2;
        let stored = if shape.feed.fp8 {
            weight_elems
        } else {
            weight_bytes
        };
        let stage = if shape.feed.staged {
            u64::from(t.exchange_overhead_cycles) + stored.div_ceil(xbw)
        } else {
            0
        };
        let widen = if shape.feed.fp8 {
            u32::try_from(weight_elems)
                .map(|n| Fp8ToF16::new(n, 0).estimate_cycles_with(t))
                .unwrap_or(u64::MAX / 8)
        } else {
            0
        };
        MatmulMapping {
            shape,
            pr,
            pk,
            pn,
            rows_per_tile: rows_t,
            chunks_per_tile: kc_t,
            blocks_per_tile: real_nb,
            bytes_per_tile,
            weight_bytes,
            persistent_bytes: weight_bytes + bias_bytes,
            cost: MatmulCost {
                exchange_in,
                rearrange,
                amp,
                reduce,
                stage,
                widen,
            },
        }
    }
}

/// Part `p` of `parts` of a tile's `kc` chunks of K: its first chunk and its
/// chunks (the planner's cost and the lowering cut them alike).
pub(crate) fn part_chunks(kc: u32, parts: u32, p: u32) -> (u32, u32) {
    let parts = parts.max(1);
    let at = |p: u32| p * kc / parts;
    (at(p), at(p + 1) - at(p))
}

/// Rows a reduce piece holds when a matmul's output is reduced in pieces of rows
/// (every block of the column group) rather than slabs of whole blocks: where
/// that moves no more bytes through the busiest tile (their reduction is
/// smaller: a piece, not a slab, a tile). Slabs of `ceil(blocks / pk)`
/// blocks cost a reducer `pk - 1` of them; pieces cost every tile its whole
/// output sent and `pk` pieces received. With fewer blocks than inner groups
/// slabs leave inner groups idle; with a count of blocks that `pk` does not
/// divide, the last reducer's slab is short while the others receive full ones.
pub(crate) fn row_piece_rows(rows: u32, pk: u32, blocks: u32) -> Option<u32> {
    if pk < 2 || rows == 0 || blocks == 0 {
        return None;
    }
    let per = rows.div_ceil(pk);
    let (rows, pk, blocks) = (u64::from(rows), u64::from(pk), u64::from(blocks));
    let slabs = (pk - 1) * blocks.div_ceil(pk) * rows;
    let pieces = (blocks * rows).max(pk * u64::from(per) * blocks);
    (pieces <= slabs).then_some(per)
}

/// The cheapest mapping of `shape` onto at most `machine.tiles` tiles whose busiest
/// tile needs at most `budget` bytes of tensors. Deterministic: ties go to fewer
/// tiles, then to the smaller (pr, pk, pn) in lexicographic order.
pub fn map_matmul(
    machine: &Machine,
    shape: MatmulShape,
    budget: u64,
) -> Result<MatmulMapping, PlanError> {
    map_matmul_capped(machine, shape, budget, u64::MAX)
}

/// [`map_matmul`] with a second limit: at most `weight_cap` bytes of weights per
/// tile (weights stay resident for the whole program, so the matmuls of a model
/// share one budget for them). The smallest-weight mapping is kept when none fits
/// the cap, so that placement, not the planner, reports the shortfall with bytes.
pub fn map_matmul_capped(
    machine: &Machine,
    shape: MatmulShape,
    budget: u64,
    weight_cap: u64,
) -> Result<MatmulMapping, PlanError> {
    if shape.rows == 0 || shape.k == 0 || shape.n == 0 {
        return Err(PlanError::Empty {
            rows: shape.rows,
            k: shape.k,
            n: shape.n,
        });
    }
    let tiles = machine.tiles;
    let mut best: Option<MatmulMapping> = None;
    let mut smallest_need = u64::MAX;
    let mut lightest: Option<MatmulMapping> = None;
    for pk in 1..=shape.k_chunks().min(tiles) {
        for pn in 1..=shape.n_blocks().min(tiles / pk) {
            let pr_max = (tiles / (pk * pn)).min(shape.rows);
            if pr_max == 0 {
                continue;
            }
            // Only row counts that change rows-per-tile matter; take each distinct
            // one at its smallest pr.
            let mut pr = 1;
            while pr <= pr_max {
                let rows_t = shape.rows.div_ceil(pr);
                for m in MatmulMapping::row_options(machine, shape, pr, pk, pn) {
                    smallest_need = smallest_need.min(m.bytes_per_tile);
                    if m.bytes_per_tile <= budget
                        && lightest.as_ref().is_none_or(|l| {
                            (m.weight_bytes, m.cost.total()) < (l.weight_bytes, l.cost.total())
                        })
                    {
                        lightest = Some(m.clone());
                    }
                    if m.bytes_per_tile <= budget && m.weight_bytes <= weight_cap {
                        let better = match &best {
                            None => true,
                            Some(b) => (m.cost.total(), m.tiles()) < (b.cost.total(), b.tiles()),
                        };
                        if better {
                            best = Some(m);
                        }
                    }
                }
                // Next pr that lowers rows per tile.
                let next_rows = rows_t - 1;
                if next_rows == 0 {
                    break;
                }
                pr = shape.rows.div_ceil(next_rows).max(pr + 1);
            }
        }
    }
    best.or(lightest).ok_or(PlanError::DoesNotFit {
        rows: shape.rows,
        k: shape.k,
        n: shape.n,
        needed: smallest_need,
        budget,
    })
}

/// The mappings of `shape` within `budget` bytes and `weight_cap` weight bytes per
/// tile that no other mapping beats on both estimated cycles and busiest-tile bytes,
/// fastest first (ties: fewer tiles, then fewer bytes, then the grid). Empty when
/// nothing fits.
pub fn matmul_front(
    machine: &Machine,
    shape: MatmulShape,
    budget: u64,
    weight_cap: u64,
) -> Vec<MatmulMapping> {
    let tiles = machine.tiles;
    let mut all = Vec::new();
    if shape.rows == 0 || shape.k == 0 || shape.n == 0 {
        return all;
    }
    for pk in 1..=shape.k_chunks().min(tiles) {
        for pn in 1..=shape.n_blocks().min(tiles / pk) {
            let pr_max = (tiles / (pk * pn)).min(shape.rows);
            let mut pr = 1;
            while pr <= pr_max {
                let rows_t = shape.rows.div_ceil(pr);
                for m in MatmulMapping::row_options(machine, shape, pr, pk, pn) {
                    if m.bytes_per_tile <= budget && m.weight_bytes <= weight_cap {
                        all.push(m);
                    }
                }
                let next_rows = rows_t - 1;
                if next_rows == 0 {
                    break;
                }
                pr = shape.rows.div_ceil(next_rows).max(pr + 1);
            }
        }
    }
    pareto(all, |m| (m.cost.total(), m.bytes_per_tile))
}

/// The members of `items` not dominated on both keys of `key` (lower is better),
/// ordered by the first key, then the second, then the order given.
pub(crate) fn pareto<T>(mut items: Vec<T>, key: impl Fn(&T) -> (u64, u64)) -> Vec<T> {
    items.sort_by_key(|a| key(a));
    let mut front = Vec::new();
    let mut best_second = u64::MAX;
    for m in items {
        let (_, b) = key(&m);
        if b < best_second {
            best_second = b;
            front.push(m);
        }
    }
    front
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: u64 = 560 * 1024;

    #[test]
    fn so400m_mlp_matmuls_fit_and_use_most_of_the_chip() {
        let m = Machine::c600();
        for batch in [2u32, 4] {
            for (k, n) in [(1152, 4304), (4304, 1152)] {
                let shape = MatmulShape::new(729 * batch, k, n);
                let map = map_matmul(&m, shape, BUDGET).unwrap();
                assert!(map.tiles() <= m.tiles);
                assert!(map.bytes_per_tile <= BUDGET);
                assert!(map.tiles() > m.tiles / 2, "{map:?}");
                let share = map.peak_share(&m);
                assert!(share > 0.3 && share < 1.0, "share {share} for {map:?}");
            }
        }
    }

    /// An input already in the AMP's layout is charged no rearrangement and no
    /// second copy: on the same grid, the rearrangement's cycles less and no more
    /// bytes (fewer where the two copies were the peak).
    #[test]
    fn a_blocked_input_costs_no_rearrangement() {
        let m = Machine::c600();
        let s = MatmulShape {
            rearrange: true,
            ..MatmulShape::new(1458, 1280, 1152)
        };
        let b = MatmulShape {
            a_blocked: true,
            ..s
        };
        let (pr, pk, pn) = (7, 8, 24);
        let rm = MatmulMapping::evaluate(&m, s, pr, pk, pn);
        let bl = MatmulMapping::evaluate(&m, b, pr, pk, pn);
        assert!(rm.cost.rearrange > 0);
        assert_eq!(bl.cost.rearrange, 0);
        assert_eq!(bl.cost.amp, rm.cost.amp);
        assert_eq!(bl.cost.total() + rm.cost.rearrange, rm.cost.total());
        assert!(bl.bytes_per_tile <= rm.bytes_per_tile, "{bl:?} {rm:?}");
        let (r, k) = (
            MatmulMapping::evaluate(&m, MatmulShape { k: 4096, ..s }, 16, 1, 1),
            MatmulMapping::evaluate(&m, MatmulShape { k: 4096, ..b }, 16, 1, 1),
        );
        assert!(k.bytes_per_tile < r.bytes_per_tile, "{k:?} {r:?}");
    }

    /// Staged and FP8 weights are costed on the tile's block as the lowering
    /// packs it: the staging exchange receives one byte a weight in FP8 (two in
    /// f16) at the exchange rate after its overhead, the widening is the
    /// kernel's own estimate, both once however many row passes reuse the
    /// block; and a grid replicating weights pays for its replicas.
    #[test]
    fn staged_and_fp8_weights_are_costed_once_a_block() {
        let m = Machine::c600();
        let t = &m.timing;
        let resident = MatmulShape::new(729, 1152, 4304);
        let feed = |staged, fp8| MatmulShape {
            feed: WeightFeed { staged, fp8 },
            ..resident
        };
        let (pr, pk, pn) = (3, 9, 54);
        let r = MatmulMapping::evaluate(&m, resident, pr, pk, pn);
        assert_eq!((r.cost.stage, r.cost.widen), (0, 0));
        // 8 chunks and 5 blocks a tile: 10,240 weights.
        let elems = u64::from(r.chunks_per_tile * r.blocks_per_tile) * 256;
        assert_eq!(elems, 10_240);
        assert_eq!(r.weight_bytes, 2 * elems);
        let over = u64::from(t.exchange_overhead_cycles);
        let rate = u64::from(t.exchange_bytes_per_cycle);
        let f16 = MatmulMapping::evaluate(&m, feed(true, false), pr, pk, pn);
        assert_eq!(f16.cost.stage, over + (2 * elems).div_ceil(rate));
        assert_eq!(f16.cost.widen, 0);
        let fp8 = MatmulMapping::evaluate(&m, feed(true, true), pr, pk, pn);
        assert_eq!(fp8.cost.stage, over + elems.div_ceil(rate));
        let widen = Fp8ToF16::new(10_240, 0).estimate_cycles_with(t);
        assert!(widen > 0);
        assert_eq!(fp8.cost.widen, widen);
        let resident_fp8 = MatmulMapping::evaluate(&m, feed(false, true), pr, pk, pn);
        assert_eq!(
            (resident_fp8.cost.stage, resident_fp8.cost.widen),
            (0, widen)
        );
        for x in [&f16, &fp8, &resident_fp8] {
            assert_eq!(x.cost.total(), r.cost.total() + x.cost.stage + x.cost.widen);
            assert_eq!(
                x.cost.over_passes(3),
                3 * r.cost.total() + x.cost.stage + x.cost.widen
            );
        }
        // One row group over 162 column groups (2 blocks a tile where the
        // replicating grid has 5): a smaller block to receive and widen.
        let spread = MatmulMapping::evaluate(&m, feed(true, true), 1, 9, 162);
        assert!(spread.cost.stage < fp8.cost.stage, "{spread:?} {fp8:?}");
        assert!(spread.cost.widen < fp8.cost.widen, "{spread:?} {fp8:?}");
    }

    #[test]
    fn small_problem_covers_every_row_chunk_and_block() {
        let m = Machine::small();
        let shape = MatmulShape::new(7, 40, 20);
        let map = map_matmul(&m, shape, BUDGET).unwrap();
        assert!(map.tiles() <= 4);
        assert!(map.rows_per_tile * map.pr >= 7);
        assert!(map.chunks_per_tile * map.pk >= 3);
        assert!(map.blocks_per_tile * map.pn >= 2);
    }

    /// Read row-major by the AMP's strided loads, an input costs no rearrangement
    /// and no second copy, for exactly one worker issue a call more than a
    /// chunk-major one on an even row split (the stride's `setzi`: the header
    /// table's pointers hold the rows' offsets).
    #[test]
    fn row_major_input_is_read_without_rearrangement() {
        let m = Machine::c600();
        let direct = MatmulShape::new(1458, 1152, 4304);
        let seed = MatmulShape {
            rearrange: true,
            ..direct
        };
        let (pr, pk, pn) = (9, 6, 27);
        let d = MatmulMapping::evaluate(&m, direct, pr, pk, pn);
        let r = MatmulMapping::evaluate(&m, seed, pr, pk, pn);
        assert_eq!(d.cost.rearrange, 0);
        assert!(r.cost.rearrange > 0);
        // 162 rows, 12 chunks, 10 blocks: 120 calls, every worker with 27 rows.
        let calls = u64::from(d.chunks_per_tile) * u64::from(d.blocks_per_tile);
        assert_eq!(calls, 120);
        let issue = u64::from(m.timing.worker_issue_interval);
        assert_eq!(d.cost.amp - r.cost.amp, issue * calls, "{d:?} {r:?}");
        assert!(d.cost.total() < r.cost.total(), "{d:?} {r:?}");
        assert!(d.bytes_per_tile <= r.bytes_per_tile);
    }

    /// A split with empty column groups is costed as the grid the lowering
    /// builds: 269 blocks in groups of 6 make 45 column groups, not the 46 asked
    /// for, so the input's receivers do not pair up on the shared bus.
    #[test]
    fn empty_groups_are_not_counted() {
        let m = Machine::c600();
        let s = MatmulShape::new(1458, 1152, 4304);
        let nominal = MatmulMapping::evaluate(&m, s, 8, 4, 46);
        let real = MatmulMapping::evaluate(&m, s, 8, 4, 45);
        assert_eq!((nominal.pr, nominal.pk, nominal.pn), (8, 4, 45));
        assert_eq!(nominal, real);
        assert_eq!(nominal.rows_per_tile, 183);
        let a_bytes = 183 * 18 * 32;
        assert_eq!(nominal.cost.exchange_in, 100 + a_bytes / 4);
        assert_eq!(nominal.tiles(), 8 * 4 * 45);
    }

    /// Where whole-block slabs would move more bytes (fewer blocks a column group
    /// than inner groups, or a count the inner groups do not divide) the
    /// reduction works in pieces of rows: `mlp.fc2` at batch 2 as 12 x 10 x 12 (6 blocks a column
    /// group) had 6 reducers each receiving 9 whole-block slabs (36 KB); in pieces
    /// of 13 rows every tile sends its 24 KB output and receives 10 pieces of 13 x
    /// 6 blocks, and the buffer for them is counted.
    #[test]
    fn few_blocks_reduce_in_row_pieces() {
        let m = Machine::c600();
        let s = MatmulShape {
            a_blocked: true,
            ..MatmulShape::new(1458, 4304, 1152)
        };
        let map = MatmulMapping::evaluate(&m, s, 12, 10, 12);
        assert_eq!((map.rows_per_tile, map.blocks_per_tile), (122, 6));
        assert_eq!(row_piece_rows(122, 10, 6), Some(13));
        // Every tile sends its 23,424-byte output and receives 10 pieces of 13
        // rows x 6 blocks (24,960 bytes); its reduction sums 10 pieces.
        let reduce_of = |elems: u32| {
            ReduceAdd::new(10, elems)
                .with_addend()
                .estimate_cycles_with(&m.timing)
        };
        assert_eq!(map.cost.reduce, 100 + 24_960 / 4 + reduce_of(13 * 6 * 16));
        // Slabs had a reducer receive 9 slabs of one block (9 x 122 x 32 bytes)
        // and sum 10 of them.
        let slabs = 100 + 9 * 122 * 32 / 4 + reduce_of(122 * 16);
        assert!(map.cost.reduce < slabs, "{} >= {slabs}", map.cost.reduce);
        assert_eq!(map.persistent_bytes, map.weight_bytes + 13 * 6 * 32);
        // As many blocks as inner groups: slabs, as before.
        assert_eq!(row_piece_rows(122, 6, 6), None);
        assert_eq!(row_piece_rows(122, 1, 0), None);
        // 8 blocks over 6 inner groups: slabs of 2 leave 4 reducers receiving 5
        // slabs each (2,100 block-rows); pieces of 35 rows move 1,680. Over 4
        // inner groups the slabs are even (3 x 2 x 150 = 900 against 1,216).
        assert_eq!(row_piece_rows(210, 6, 8), Some(35));
        assert_eq!(row_piece_rows(150, 4, 8), None);
    }

    /// A plain bias goes into the engine where every row group's split is even:
    /// the tile holds 16 values a block instead of a slab, the reduction sums no
    /// addend, and the first AMP call is the biased one. A bias that varies with
    /// the row, or a split that is not even, keeps the slab.
    #[test]
    fn a_plain_bias_goes_into_the_engine_on_even_splits() {
        let m = Machine::c600();
        let t = &m.timing;
        // 2,916 rows in 9 groups of 324 (54 a worker), 3 inner groups.
        let s = MatmulShape::new(2916, 1152, 3456);
        let map = MatmulMapping::evaluate(&m, s, 9, 3, 54);
        let nb = u64::from(map.blocks_per_tile);
        assert_eq!(map.persistent_bytes, map.weight_bytes + nb * 32);
        let amp = AmpMatmul::new(324, 24, 4).row_major();
        assert_eq!(
            map.cost.amp,
            amp.with_bias().unwrap().estimate_cycles_with(t)
        );
        let moved = 2 * 108 * 4 * 32;
        let sum = ReduceAdd::new(3, 108 * 64).estimate_cycles_with(t);
        assert_eq!(map.cost.reduce, 100 + moved / 4 + sum);
        // The same product with a per-row bias: the slab, summed as an addend.
        let rowwise = MatmulMapping::evaluate(
            &m,
            MatmulShape {
                per_row_bias: true,
                ..s
            },
            9,
            3,
            54,
        );
        assert_eq!(rowwise.persistent_bytes, map.weight_bytes + 108 * 64 * 2);
        assert_eq!(rowwise.cost.amp, amp.estimate_cycles_with(t));
        let sum = ReduceAdd::new(3, 108 * 64)
            .with_addend()
            .estimate_cycles_with(t);
        assert_eq!(rowwise.cost.reduce, 100 + moved / 4 + sum);
        // 325 rows a group (the last 316): not even, the slab stays (here a slab
        // of 2 blocks of all 325 rows, which moves fewer bytes than pieces).
        let uneven = MatmulMapping::evaluate_rows(&m, s, 325, 3, 54);
        assert_eq!(uneven.persistent_bytes - uneven.weight_bytes, 2 * 325 * 32);
    }

    /// Pieces of whole workers' rows: the AMP writes a tile's own piece into its
    /// slot, so the reduce-scatter moves one piece fewer through each tile than
    /// where the pieces cut across workers' rows.
    #[test]
    fn own_pieces_of_whole_workers_rows_stay_on_the_tile() {
        let m = Machine::c600();
        let s = MatmulShape::new(1458, 1152, 4304);
        // 210 rows a tile, 35 a worker; 6 inner groups: pieces of 35 rows x 8
        // blocks (8,960 bytes), of which a tile receives 5, not 6.
        // The even split also takes the bias in the engine: no slab to add.
        let map = MatmulMapping::evaluate_rows(&m, s, 210, 6, 34);
        assert_eq!((map.rows_per_tile, map.blocks_per_tile), (210, 8));
        let reduce = ReduceAdd::new(6, 35 * 8 * 16).estimate_cycles_with(&m.timing);
        assert_eq!(map.cost.reduce, 100 + 5 * 8_960 / 4 + reduce);
        // 122 rows (20 or 21 a worker) in pieces of 13: through the exchange.
        let s = MatmulShape {
            a_blocked: true,
            ..MatmulShape::new(1458, 4304, 1152)
        };
        let map = MatmulMapping::evaluate(&m, s, 12, 10, 12);
        let reduce = ReduceAdd::new(10, 13 * 6 * 16)
            .with_addend()
            .estimate_cycles_with(&m.timing);
        assert_eq!(map.cost.reduce, 100 + 10 * 13 * 6 * 32 / 4 + reduce);
    }

    /// Each row split is also costed with its groups rounded up to whole rows a
    /// worker (the busiest worker keeps its rows, the last group takes what is
    /// left), which the even AMP layout makes cheaper a call.
    #[test]
    fn row_groups_are_also_costed_whole_rows_a_worker() {
        let m = Machine::c600();
        let s = MatmulShape::new(1458, 1152, 4304);
        for pr in [5, 8, 13] {
            let opts: Vec<_> = MatmulMapping::row_options(&m, s, pr, 4, 34).collect();
            assert_eq!(opts.len(), 2, "{opts:?}");
            let (plain, even) = (&opts[0], &opts[1]);
            assert_eq!(plain.rows_per_tile, s.rows.div_ceil(pr));
            assert_eq!(even.rows_per_tile % 6, 0, "{even:?}");
            assert_eq!(
                even.rows_per_tile.div_ceil(6),
                plain.rows_per_tile.div_ceil(6)
            );
            assert!(even.pr * even.rows_per_tile >= s.rows);
            assert!(even.cost.amp < plain.cost.amp, "{plain:?} {even:?}");
        }
        // 162 rows a group are already whole rows a worker: one option.
        assert_eq!(MatmulMapping::row_options(&m, s, 9, 4, 34).count(), 1);
        let few: Vec<_> =
            MatmulMapping::row_options(&m, MatmulShape::new(7, 32, 32), 1, 1, 1).collect();
        assert_eq!(few.len(), 1);
        assert_eq!(few[0].rows_per_tile, 7);
    }

    #[test]
    fn impossible_budget_reports_the_smallest_need() {
        let m = Machine::small();
        let err = map_matmul(&m, MatmulShape::new(4096, 4096, 4096), BUDGET).unwrap_err();
        match err {
            PlanError::DoesNotFit { needed, budget, .. } => {
                assert!(needed > budget);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            map_matmul(&m, MatmulShape::new(0, 1, 1), BUDGET),
            Err(PlanError::Empty { .. })
        ));
    }

    /// K in parts against row passes, `attn.q` at batch 4 on 9 x 3 x 54: the
    /// same input bytes a tile in the largest part as in a pass, one exchange's
    /// fixed cost a part, the AMP's runs once over all the rows (each weight
    /// block once, not once a pass), and the carry held beside the output.
    #[test]
    fn parts_of_k_run_each_weight_block_once() {
        let m = Machine::c600();
        let whole = MatmulShape::new(2916, 1152, 3456);
        let pass = MatmulShape::new(1458, 1152, 3456);
        let parts = |n: u32| MatmulShape {
            k_parts: n,
            ..whole
        };
        let p2 = MatmulMapping::evaluate(&m, pass, 9, 3, 54);
        let k2 = MatmulMapping::evaluate(&m, parts(2), 9, 3, 54);
        let k6 = MatmulMapping::evaluate(&m, parts(6), 9, 3, 54);
        let one = MatmulMapping::evaluate(&m, whole, 9, 3, 54);
        assert_eq!((p2.rows_per_tile, k2.rows_per_tile), (162, 324));
        // 324 rows, 24 chunks: 12 a part in two parts, as a pass's 162 rows.
        let a_pass = 162 * 24 * 32;
        // Half of A (12 chunks) off, the carry (4 blocks) on; in six parts five
        // sixths of A off.
        assert_eq!(
            one.bytes_per_tile - k2.bytes_per_tile,
            324 * 12 * 32 - 324 * 4 * 32
        );
        assert_eq!(
            one.bytes_per_tile - k6.bytes_per_tile,
            2 * a_pass - 324 * 4 * 32 - 324 * 4 * 32
        );
        let overhead = u64::from(m.timing.exchange_overhead_cycles);
        assert_eq!(k6.cost.exchange_in, one.cost.exchange_in + 5 * overhead);
        assert_eq!(k2.cost.exchange_in, 2 * p2.cost.exchange_in);
        // 96 runs (24 chunks x 4 blocks) against 2 x 96.
        assert!(
            k6.cost.amp < 2 * p2.cost.amp - 96 * 100,
            "{} {}",
            k6.cost.amp,
            p2.cost.amp
        );
        // ... and within a few cycles a call of the one pass that would not fit.
        assert!(
            k6.cost.amp.abs_diff(one.cost.amp) < one.cost.amp / 1000,
            "{} {}",
            k6.cost.amp,
            one.cost.amp
        );
        // Rows that do not split evenly over the workers cannot continue: the
        // strategy is refused (no budget holds it).
        let uneven = MatmulMapping::evaluate(
            &m,
            MatmulShape {
                rows: 2915,
                ..parts(2)
            },
            9,
            3,
            54,
        );
        assert_eq!(uneven.bytes_per_tile, u64::MAX);
        // More parts than a group's chunks: refused too.
        let thin = MatmulMapping::evaluate(&m, parts(6), 9, 72, 1);
        assert_eq!(thin.bytes_per_tile, u64::MAX);
    }

    #[test]
    fn deterministic() {
        let m = Machine::c600();
        let s = MatmulShape::new(1458, 1152, 4304);
        assert_eq!(
            map_matmul(&m, s, BUDGET).unwrap(),
            map_matmul(&m, s, BUDGET).unwrap()
        );
    }
}

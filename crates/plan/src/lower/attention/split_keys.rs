//! The transposed attention with each head's keys cut in two runs, for groups of
//! an odd number of tiles. A group of whole-key tiles that does not fill whole bus
//! pairs shares a pair with the next group, whose tiles receive other keys and
//! values: that pair receives at the single-port rate and sets both big
//! exchanges' time (So400m at batch 4: 23 tiles a head, 55.7k cycles where the
//! paired rate would take 28k). Here a group takes an even number of tiles, whole
//! bus pairs, and each half of it one run of the keys: every tile receives its
//! run's keys and values at the paired rate, about half the bytes.
//!
//! Per tile of a half: `S^T = K_run Q^T` for its query blocks, the column maxima
//! over its run (`softmax_cols` in its maxima form); the tiles holding the same
//! queries in the two halves exchange those maxima, so both shift their
//! exponentials by the maximum over all keys (`softmax_cols` in its shifted form,
//! which leaves each column's sum), and their `V_run^T e^T` add up as they are.
//! Each query block is merged by one of its two tiles, in runs spread over both
//! halves ([`merge_runs`]): the other tile's products and sums come to it, it adds
//! the two products (`add`), takes `1/(sum1 + sum2)` (`recip_sum`) and finishes
//! as the whole-key path does.
//!
//! The halves' query blocks a tile and key runs are chosen so that the busiest
//! tile's `S^T`, softmax and `V^T e^T` (each proportional to query blocks times
//! key blocks) are as small as can be: the first half takes `ceil(P / 2)` of the
//! group's `P` bus pairs.

use tessera_kernels::{Add, AmpMatmul, Kernel, RecipSum, SoftmaxCols, TransposeBlocks};
use tessera_machine::Timing;

use super::{
    Attention, Finish, Run, ValueTransposer, amp, finish, scores, transpose_run, vt_copies,
};
use super::{Slot, geometry};
use crate::PlanError;
use crate::dist::{DistTensor, Part};
use crate::ir::*;
use crate::lower::ctx::Lowering;
use crate::matmul::AMP_WIDTH;

/// One half of a group: its tiles and its run of the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Half {
    /// Its first tile within the group and its tiles (an even count).
    pub tile0: u32,
    pub tiles: u32,
    /// Its key blocks `kb0..kb0 + kbn` (16 keys each).
    pub kb0: u32,
    pub kbn: u32,
    /// Query blocks a tile (the last tiles may hold fewer, or none).
    pub qb: u32,
}

impl Half {
    /// Its stored keys (whole blocks) and, of those, the real ones before the last
    /// of `t` tokens.
    fn keys(&self, t: u32) -> (u32, u32) {
        let kp = self.kbn * AMP_WIDTH;
        (kp, kp.min(t - self.kb0 * AMP_WIDTH))
    }
}

/// How the key cut lays out every (image, head) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SplitGeometry {
    /// Tiles of a pair's group, from tile `pair * group`: an even count.
    pub group: u32,
    pub halves: [Half; 2],
}

/// Smallest run of real keys a half may have: the column softmax's two rows a
/// worker.
const MIN_KEYS: u32 = 12;

/// The key cut for these shapes, when the whole-key transposed path has more
/// than one pair and the cut's cost ([`cut_cost`]) is below the whole-key
/// path's ([`whole_cost`]): where its groups are an odd number of tiles, which
/// share bus pairs, or where half a tile's query block is padding (So400m at
/// batch 1: 8 query rows a tile, against every key; cut, 16 against half);
/// or, `for_memory`, wherever the groups have two bus pairs or more, whatever it
/// costs (`LowerOptions::cut_keys`: half the keys and values a tile).
pub(crate) fn split_geometry(
    timing: &Timing,
    tiles: u32,
    (batch, heads, tq, t): (u32, u32, u32, u32),
    (d, scale): (u32, f32),
    for_memory: bool,
) -> Option<SplitGeometry> {
    let pairs = batch * heads;
    let (path, whole, rows_per, ..) = geometry(tiles, false, (batch, heads, tq, t), scale);
    if path != super::Path::Transposed || pairs < 2 {
        return None;
    }
    // An odd group shares a bus pair with the next pair's group, which receives
    // other keys: its whole-key exchanges run at the single-port rate.
    let shared = whole % 2 == 1;
    let group = whole - whole % 2;
    let bus_pairs = group / 2;
    if bus_pairs < 2 {
        return None;
    }
    let (nb, tb) = (tq.div_ceil(AMP_WIDTH), t.div_ceil(AMP_WIDTH));
    let t1 = 2 * bus_pairs.div_ceil(2);
    let t2 = group - t1;
    let (q1, q2) = (nb.div_ceil(t1), nb.div_ceil(t2));
    // The first run's key blocks, each run with enough real keys: the busiest
    // tile's query-key block products as small as can be or, for memory, its
    // bytes at the scores' step (the half with fewer query blocks a tile then
    // takes fewer keys than the products would give it).
    let dp = d.next_multiple_of(AMP_WIDTH);
    let bytes = |kbn: u32, q: u32| scores_step_bytes(dp, kbn, q);
    let kb1 = (1..tb)
        .filter(|&k| k * AMP_WIDTH >= MIN_KEYS && t.saturating_sub(k * AMP_WIDTH) >= MIN_KEYS)
        .min_by_key(|&k| {
            let products = (q1 * k).max(q2 * (tb - k));
            let memory = if for_memory {
                bytes(k, q1).max(bytes(tb - k, q2))
            } else {
                0
            };
            (memory, products, k)
        })?;
    let sg = SplitGeometry {
        group,
        halves: [
            Half {
                tile0: 0,
                tiles: t1,
                kb0: 0,
                kbn: kb1,
                qb: q1,
            },
            Half {
                tile0: t1,
                tiles: t2,
                kb0: kb1,
                kbn: tb - kb1,
                qb: q2,
            },
        ],
    };
    if for_memory {
        return Some(sg);
    }
    let whole = whole_cost(timing, (t, d, scale), rows_per.div_ceil(AMP_WIDTH), shared);
    (cut_cost(timing, (tq, t, d, scale), &sg) < whole).then_some(sg)
}

/// Bytes a row tile of a half with `kbn` key blocks and `q` query blocks holds
/// for its scores' product (heads padded to `dp`): the run's keys, `S^T`, the
/// AMP's two partial sums and `Q^T`.
fn scores_step_bytes(dp: u32, kbn: u32, q: u32) -> u64 {
    let kp = u64::from(kbn * AMP_WIDTH);
    let (dp, q) = (u64::from(dp), u64::from(q));
    kp * dp * 2 + q * kp * 32 + 2 * kp * 32 + q * dp * 32
}

/// Estimated cycles of what differs between the two paths, with whole keys and
/// `nbq` query blocks a tile: the busiest tile's kernels ([`tile_cost`]) and the
/// keys and values at the single-port rate where groups share bus pairs (they
/// set the steps' time), else at the paired rate.
fn whole_cost(timing: &Timing, (t, d, scale): (u32, u32, f32), nbq: u32, shared: bool) -> u64 {
    let tb = t.div_ceil(AMP_WIDTH);
    let softmax = SoftmaxCols::new(nbq, tb * AMP_WIDTH, t, scale).estimate_cycles_with(timing);
    let rate = u64::from(timing.exchange_bytes_per_cycle) * if shared { 1 } else { 2 };
    tile_cost(timing, d, (tb, nbq), softmax) + run_bytes(d, tb) / rate
}

/// The same with the key cut: each half's busiest tile and its run at the paired
/// rate, the busier of the two, and the merge (its exchange, an exchange and a
/// sync more, its kernels on the tile that merges the most blocks).
fn cut_cost(timing: &Timing, (tq, t, d, scale): (u32, u32, u32, f32), sg: &SplitGeometry) -> u64 {
    let rate = u64::from(timing.exchange_bytes_per_cycle);
    let est = |k: &dyn Kernel| k.estimate_cycles_with(timing);
    let per_half = sg.halves.map(|h| {
        let (kp, real) = h.keys(t);
        let softmax = est(&SoftmaxCols::maxima(h.qb, kp, real))
            + est(&SoftmaxCols::shifted(h.qb, kp, real, scale, 2));
        (
            tile_cost(timing, d, (h.kbn, h.qb), softmax),
            run_bytes(d, h.kbn) / (2 * rate),
        )
    });
    let q = longest_merge(sg, tq).max(1);
    let merge = est(&Add::apart(q * d * AMP_WIDTH))
        + est(&RecipSum::new(q * AMP_WIDTH))
        + u64::from(q * (d * 32 + 64)) / rate
        + u64::from(timing.exchange_overhead_cycles + timing.sync_cycles);
    per_half.iter().map(|p| p.0).max().unwrap_or(0)
        + per_half.iter().map(|p| p.1).max().unwrap_or(0)
        + merge
}

/// A tile's `S^T`, softmax (`softmax` cycles), `V^T e^T` and its two transposes of
/// `q` query blocks, against `kb` key blocks.
fn tile_cost(timing: &Timing, d: u32, (kb, q): (u32, u32), softmax: u64) -> u64 {
    let kc = d.div_ceil(AMP_WIDTH);
    let est = |k: &dyn Kernel| k.estimate_cycles_with(timing);
    est(&AmpMatmul::new(kb * AMP_WIDTH, kc, q))
        + softmax
        + est(&AmpMatmul::new(d, kb, q))
        + 2 * est(&TransposeBlocks::new(kc, q))
}

/// Bytes of `K` and `V^T` for `kb` key blocks: `[kc][16 kb][16]` and `[kb][d][16]`.
fn run_bytes(d: u32, kb: u32) -> u64 {
    u64::from(kb * AMP_WIDTH * (d.div_ceil(AMP_WIDTH) * AMP_WIDTH + d) * 2)
}

/// A tile of a half that holds query blocks `blk0..blk0 + nbq` of its pair.
struct RunWork {
    s: Slot,
    half: usize,
    blk0: u32,
    nbq: u32,
    q_amp: BufId,
    qt: BufId,
    /// Its run's keys, `[kc][16 kbn][16]`.
    k: BufId,
    /// `S^T`, `[nbq][16 kbn][16]`; then `e^T` in place.
    st: BufId,
    /// Column maxima `[2][nbq][16]` f16: its own, then the other half's.
    maxes: BufId,
    /// Each query's sum of `e` over the run, f32.
    sums: BufId,
    /// Its run's `V^T` rows, `[kbn][d][16]`.
    vt: BufId,
    /// `V_run^T e^T`, `[nbq][d][16]`.
    ev: BufId,
    /// The query blocks this tile merges, if any, with their buffers.
    merge: Option<Merge>,
}

/// A tile's merge of query blocks `blk0..blk0 + n` (within its own): the other
/// half's products and sums, the products' sum, `1/sum`, and the finishing
/// buffers.
struct Merge {
    blk0: u32,
    n: u32,
    ev2: BufId,
    sums2: BufId,
    evsum: BufId,
    recip: BufId,
    ctxs: BufId,
    ctx: BufId,
}

/// The most query blocks a tile merges.
pub(crate) fn longest_merge(sg: &SplitGeometry, tq: u32) -> u32 {
    merge_runs(sg, tq.div_ceil(AMP_WIDTH))
        .iter()
        .map(|r| r.3)
        .max()
        .unwrap_or(0)
}

/// Which tile merges which query blocks: runs of blocks, each within one tile's
/// blocks in either half, at most one run a tile, the longest run as short as can
/// be (the merge, the scaling and the transposition back cost the busiest tile
/// per block), and then the most blocks a tile sends as few as can be (a tile
/// sends its products of every block it holds and does not merge, and the merge
/// exchange takes as long as the busiest tile's sending or receiving: with the
/// longest runs taken first, the second half's tiles of So400m at batch 4 would
/// merge none of their five blocks and send all of them, 3,060 cycles where three
/// a tile each way take 1,876). As `(half, tile of the half, first block, blocks)`,
/// in block order.
fn merge_runs(sg: &SplitGeometry, nb: u32) -> Vec<(usize, u32, u32, u32)> {
    let q = [sg.halves[0].qb, sg.halves[1].qb];
    let lo = nb.div_ceil(sg.group).max(1);
    // At a cap of the first half's query blocks a tile its tiles can merge all of
    // theirs, so the search succeeds there at the latest; the default is that
    // answer, for an empty range.
    (lo..=q[0])
        .find_map(|cap| {
            (0..=q[0].max(q[1])).find_map(|send| {
                let mut out = Vec::new();
                let mut dead = std::collections::HashSet::new();
                let walk = Walk { q, nb, cap, send };
                walk.from(0, [None; 2], &mut dead, &mut out).then_some(out)
            })
        })
        .unwrap_or_else(|| {
            (0..nb.div_ceil(q[0]))
                .map(|t| (0, t, t * q[0], q[0].min(nb - t * q[0])))
                .collect()
        })
}

/// [`merge_runs`]' search: query blocks a tile holds in each half (`q`), blocks
/// (`nb`), the longest run (`cap`) and the most blocks a tile may send (`send`).
struct Walk {
    q: [u32; 2],
    nb: u32,
    cap: u32,
    send: u32,
}

impl Walk {
    /// Blocks tile `t` of half `k` holds (the last tile's may be fewer).
    fn held(&self, k: usize, t: u32) -> u32 {
        ((t + 1) * self.q[k]).min(self.nb) - t * self.q[k]
    }

    /// Whether every tile of half `k` whose blocks end in `j..e` (blocks the run
    /// `j..e` of the other half, or of this tile, passes) sends few enough:
    /// `merged` blocks merged by the tile holding `j`, none by those after it.
    fn sends_ok(&self, k: usize, j: u32, e: u32, merged: u32) -> bool {
        let (q, t0) = (self.q[k], j / self.q[k]);
        // Tiles ending by `e` (the last one's at `nb` whatever its size).
        let finished = if e == self.nb { e.div_ceil(q) } else { e / q };
        (t0..finished.max(t0)).all(|t| {
            let m = if t == t0 { merged } else { 0 };
            self.held(k, t) - m <= self.send
        })
    }

    /// From block `j`, with the tiles of either half that hold `j` already
    /// merging `merged[k]` blocks (`None`: not merging): pushes the runs to the
    /// end onto `out`, longest first, and says whether it found them; `dead`
    /// keeps the states known to fail.
    fn from(
        &self,
        j: u32,
        merged: [Option<u32>; 2],
        dead: &mut std::collections::HashSet<(u32, [Option<u32>; 2])>,
        out: &mut Vec<(usize, u32, u32, u32)>,
    ) -> bool {
        if j == self.nb {
            return true;
        }
        if dead.contains(&(j, merged)) {
            return false;
        }
        let q = self.q;
        let mut options = Vec::new();
        for hi in (0..2).filter(|&hi| merged[hi].is_none()) {
            let t = j / q[hi];
            let end = ((t + 1) * q[hi]).min(self.nb).min(j + self.cap);
            options.extend((j + 1..=end).map(|e| (e, hi, t)));
        }
        options.sort_by_key(|&(e, hi, _)| (std::cmp::Reverse(e), hi));
        for (e, hi, t) in options {
            let n = e - j;
            let now = [0, 1].map(|k| merged[k].unwrap_or(0) + if k == hi { n } else { 0 });
            if !(0..2).all(|k| self.sends_ok(k, j, e, now[k])) {
                continue;
            }
            // At `e`, a holder is in use if it is the same tile as at `j` and was
            // in use, or took this run.
            let next = [0, 1].map(|k| {
                (e < self.nb && e / q[k] == j / q[k] && (merged[k].is_some() || k == hi))
                    .then_some(now[k])
            });
            out.push((hi, t, j, n));
            if self.from(e, next, dead, out) {
                return true;
            }
            out.pop();
        }
        dead.insert((j, merged));
        false
    }
}

pub(super) fn lower(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    sg: SplitGeometry,
) -> Result<DistTensor, PlanError> {
    let cut = KeyCut::lay_out(lw, op, sg);
    cut.land_qkv(lw)?;
    cut.scores(lw);
    cut.share_vt_and_maxima(lw);
    cut.exponentials(lw);
    cut.gather_merges(lw);
    cut.merge_and_finish(lw)
}

/// One attention's key cut: its row tiles and value transposers.
struct KeyCut<'p, 'a> {
    op: &'p Attention<'a>,
    sg: SplitGeometry,
    /// Query chunks (`Attention::padded`).
    kc: u32,
    work: Vec<RunWork>,
    /// Each value transposer, with its half.
    trans: Vec<(usize, ValueTransposer)>,
    /// Per pair and half, the index in `work` of its first tile.
    first: Vec<[usize; 2]>,
}

impl KeyCut<'_, '_> {
    /// Every pair's row tiles (with the merges [`merge_runs`] gives them) and
    /// value transposers, and their buffers.
    fn lay_out<'p, 'a>(
        lw: &mut Lowering<'_>,
        op: &'p Attention<'a>,
        sg: SplitGeometry,
    ) -> KeyCut<'p, 'a> {
        let name = op.name;
        let tiles = lw.machine.tiles;
        let (kc, _, _) = op.padded();
        let nb = op.tq.div_ceil(AMP_WIDTH);
        let runs = merge_runs(&sg, nb);
        let mut work: Vec<RunWork> = Vec::new();
        let mut trans = Vec::new();
        let mut first = Vec::new();
        for pair in 0..op.batch * op.heads {
            let (b, h) = (pair / op.heads, pair % op.heads);
            let base = pair * sg.group;
            let mut firsts = [0usize; 2];
            for (hi, half) in sg.halves.iter().enumerate() {
                firsts[hi] = work.len();
                let kp = half.kbn * AMP_WIDTH;
                for i in 0..half.tiles {
                    let blk0 = i * half.qb;
                    if blk0 >= nb {
                        break;
                    }
                    let nbq = half.qb.min(nb - blk0);
                    let r0 = blk0 * AMP_WIDTH;
                    let s = Slot {
                        tile: (base + half.tile0 + i) % tiles,
                        b,
                        h,
                        pair,
                        r0,
                        rows: (nbq * AMP_WIDTH).min(op.tq - r0),
                    };
                    let mut blk = |what: &str, bytes: u32| lw.activation(s.tile, name, what, bytes);
                    let merge =
                        runs.iter()
                            .find(|r| r.0 == hi && r.1 == i)
                            .map(|&(_, _, m0, n)| Merge {
                                blk0: m0,
                                n,
                                ev2: blk("ev2", n * op.d * 32),
                                sums2: blk("sums2", n * 64),
                                evsum: blk("ev.sum", n * op.d * 32),
                                recip: blk("recip", n * 64),
                                ctxs: blk("ctx.ts", op.ctxs_bytes(n)),
                                ctx: blk("ctx", n * AMP_WIDTH * op.dp * 2),
                            });
                    work.push(RunWork {
                        s,
                        half: hi,
                        blk0,
                        nbq,
                        q_amp: blk("q", nbq * AMP_WIDTH * op.dp * 2),
                        qt: blk("qt", nbq * kc * 512),
                        k: blk("k", kp * op.dp * 2),
                        st: blk("scores.t", nbq * kp * 32),
                        maxes: blk("maxes", 2 * nbq * 32),
                        sums: blk("sums", nbq * 64),
                        vt: blk("vt", half.kbn * op.d * 32),
                        ev: blk("ev", nbq * op.d * 32),
                        merge,
                    });
                }
                let share = half.kbn.div_ceil(half.tiles);
                for m in 0..half.kbn.div_ceil(share) {
                    let run = Run {
                        tile: (base + half.tile0 + m) % tiles,
                        b,
                        h,
                        pair,
                        m,
                        blk0: half.kb0 + m * share,
                        nbk: share.min(half.kbn - m * share),
                    };
                    trans.push((hi, ValueTransposer::new(lw, name, run, kc)));
                }
            }
            first.push(firsts);
        }
        KeyCut {
            op,
            sg,
            kc,
            work,
            trans,
            first,
        }
    }

    /// The tile of `pair`'s half `hi` holding query block `j`.
    fn holder(&self, pair: u32, hi: usize, j: u32) -> &RunWork {
        &self.work[self.first[pair as usize][hi] + (j / self.sg.halves[hi].qb) as usize]
    }

    /// Queries and the run's keys to the row tiles, value blocks to the
    /// transposers.
    fn land_qkv(&self, lw: &mut Lowering<'_>) -> Result<(), PlanError> {
        let op = self.op;
        let (q_first, k_first, v_first) = (op.q.1, op.k.1, op.v.1);
        let mut q_parts = Vec::new();
        let mut k_parts = Vec::new();
        for w in &self.work {
            let half = self.sg.halves[w.half];
            let r = if op.shared_q { 0 } else { w.s.b * op.tq } + w.s.r0;
            let (kp, real) = half.keys(op.t);
            let rk = w.s.b * op.t + half.kb0 * AMP_WIDTH;
            for c in 0..self.kc {
                q_parts.push(op.chunk(
                    w.q_amp,
                    c * w.nbq * 512,
                    r..r + w.s.rows,
                    q_first,
                    w.s.h,
                    c,
                ));
                k_parts.push(op.chunk(w.k, c * kp * 32, rk..rk + real, k_first, w.s.h, c));
            }
        }
        let v_parts: Vec<Part> = self
            .trans
            .iter()
            .flat_map(|(_, t)| op.run_parts(t.vpart, &t.run, v_first))
            .collect();
        lw.exchange(
            &format!("{}.qkv", op.name),
            op.gather_qkv(q_parts, k_parts, v_parts)?,
        );
        Ok(())
    }

    /// Value blocks transposed; per row tile `Q^T`, `S^T = K_run Q^T` and its
    /// column maxima.
    fn scores(&self, lw: &mut Lowering<'_>) {
        let op = self.op;
        let (prep, step) = (lw.compute_step(), lw.compute_step());
        for (_, t) in &self.trans {
            transpose_run(lw, op, &t.run, prep, t.vpart, at(t.out));
        }
        for w in &self.work {
            let half = self.sg.halves[w.half];
            let (kp, real) = half.keys(op.t);
            scores(
                lw,
                op,
                (prep, step),
                (&w.s, w.nbq),
                [w.q_amp, w.qt, w.k, w.st],
                (real, kp),
            );
            lw.call(
                w.s.tile,
                step,
                SoftmaxCols::maxima(w.nbq, kp, real),
                &[("in", at(w.st)), ("max", at(w.maxes))],
            );
        }
    }

    /// The run's `V^T` to the half's row tiles; each query block's maxima to the
    /// tile of the other half that holds it.
    fn share_vt_and_maxima(&self, lw: &mut Lowering<'_>) {
        let op = self.op;
        let mut copies = Vec::new();
        for (hi, t) in &self.trans {
            let dsts: Vec<BufId> = self
                .work
                .iter()
                .filter(|w| w.s.pair == t.run.pair && w.half == *hi)
                .map(|w| w.vt)
                .collect();
            copies.extend(vt_copies(op, t, self.sg.halves[*hi].kb0, &dsts));
        }
        for w in &self.work {
            for j in w.blk0..w.blk0 + w.nbq {
                let o = self.holder(w.s.pair, 1 - w.half, j);
                copies.push(Copy {
                    src: Loc {
                        buf: w.maxes,
                        offset: (j - w.blk0) * 32,
                    },
                    bytes: 32,
                    dsts: vec![Loc {
                        buf: o.maxes,
                        offset: (o.nbq + j - o.blk0) * 32,
                    }],
                });
            }
        }
        lw.exchange(&format!("{}.vt", op.name), copies);
    }

    /// The exponentials shifted by the maxima over both runs, their sums, and
    /// `V_run^T e^T`.
    fn exponentials(&self, lw: &mut Lowering<'_>) {
        let op = self.op;
        let step = lw.compute_step();
        for w in &self.work {
            let half = self.sg.halves[w.half];
            let (kp, real) = half.keys(op.t);
            lw.call(
                w.s.tile,
                step,
                SoftmaxCols::shifted(w.nbq, kp, real, op.scale, 2),
                &[
                    ("in", at(w.st)),
                    ("out", at(w.st)),
                    ("maxes", at(w.maxes)),
                    ("sum", at(w.sums)),
                ],
            );
            amp(
                lw,
                w.s.tile,
                step,
                op.name,
                (op.d, half.kbn, w.nbq),
                at(w.vt),
                at(w.st),
                at(w.ev),
            );
        }
    }

    /// Each merged run's other products and sums to its tile, a copy per run of
    /// blocks the other half holds on one tile.
    fn gather_merges(&self, lw: &mut Lowering<'_>) {
        let vt_block = self.op.d * 32;
        let mut copies = Vec::new();
        for w in &self.work {
            let Some(m) = &w.merge else { continue };
            let mut j = m.blk0;
            while j < m.blk0 + m.n {
                let o = self.holder(w.s.pair, 1 - w.half, j);
                let end = (o.blk0 + o.nbq).min(m.blk0 + m.n);
                let n = end - j;
                copies.push(Copy {
                    src: Loc {
                        buf: o.ev,
                        offset: (j - o.blk0) * vt_block,
                    },
                    bytes: n * vt_block,
                    dsts: vec![Loc {
                        buf: m.ev2,
                        offset: (j - m.blk0) * vt_block,
                    }],
                });
                copies.push(Copy {
                    src: Loc {
                        buf: o.sums,
                        offset: (j - o.blk0) * 64,
                    },
                    bytes: n * 64,
                    dsts: vec![Loc {
                        buf: m.sums2,
                        offset: (j - m.blk0) * 64,
                    }],
                });
                j = end;
            }
        }
        lw.exchange(&format!("{}.merge", self.op.name), copies);
    }

    /// The merge, then the whole-key path's finish.
    fn merge_and_finish(&self, lw: &mut Lowering<'_>) -> Result<DistTensor, PlanError> {
        let op = self.op;
        let vt_block = op.d * 32;
        let step = lw.compute_step();
        let mergers: Vec<(&RunWork, &Merge)> = self
            .work
            .iter()
            .filter_map(|w| w.merge.as_ref().map(|m| (w, m)))
            .collect();
        let fin: Vec<Finish> = mergers
            .iter()
            .map(|&(w, m)| Finish {
                s: Slot {
                    r0: m.blk0 * AMP_WIDTH,
                    rows: (m.n * AMP_WIDTH).min(op.tq - m.blk0 * AMP_WIDTH),
                    ..w.s
                },
                nbq: m.n,
                ev: m.evsum,
                recip: m.recip,
                ctxs: m.ctxs,
                ctx: m.ctx,
            })
            .collect();
        finish(lw, op, step, &fin, &mut |lw, i| {
            let (w, m) = mergers[i];
            let off = m.blk0 - w.blk0;
            lw.call(
                w.s.tile,
                step,
                Add::apart(m.n * op.d * AMP_WIDTH),
                &[
                    (
                        "a",
                        Loc {
                            buf: w.ev,
                            offset: off * vt_block,
                        },
                    ),
                    ("b", at(m.ev2)),
                    ("out", at(m.evsum)),
                ],
            );
            lw.call(
                w.s.tile,
                step,
                RecipSum::new(m.n * AMP_WIDTH),
                &[
                    (
                        "a",
                        Loc {
                            buf: w.sums,
                            offset: off * 64,
                        },
                    ),
                    ("b", at(m.sums2)),
                    ("out", at(m.recip)),
                ],
            );
        })
    }
}

/// The start of `buf`.
fn at(buf: BufId) -> Loc {
    Loc { buf, offset: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c600() -> Timing {
        tessera_machine::Machine::c600().timing
    }

    #[test]
    fn so400m_at_batch_4_cuts_its_keys_and_batch_2_only_for_memory() {
        // 23 tiles a head at batch 4: 22 of them, 12 on keys 0..416 with four
        // query blocks each, 10 on keys 416..729 with five.
        let sg = split_geometry(&c600(), 1472, (4, 16, 729, 729), (72, 1.0), false).expect("cut");
        assert_eq!(sg.group, 22);
        assert_eq!(
            sg.halves,
            [
                Half {
                    tile0: 0,
                    tiles: 12,
                    kb0: 0,
                    kbn: 26,
                    qb: 4
                },
                Half {
                    tile0: 12,
                    tiles: 10,
                    kb0: 26,
                    kbn: 20,
                    qb: 5
                },
            ]
        );
        // 92 tiles a head at batch 1, 8 query rows each: half of every query
        // block padding against all 46 key blocks. Cut, 46 tiles a half, each
        // with a whole query block against 23 key blocks.
        let sg = split_geometry(&c600(), 1472, (1, 16, 729, 729), (72, 1.0), false).expect("cut");
        assert_eq!(sg.group, 92);
        assert_eq!(
            sg.halves.map(|h| (h.tiles, h.kb0, h.kbn, h.qb)),
            [(46, 0, 23, 1), (46, 23, 23, 1)]
        );
        // 46 tiles a head at batch 2, whole query blocks and whole bus pairs
        // already: the cut would give a tile two or three query blocks against
        // half the keys, more block products than one against all of them.
        assert_eq!(
            split_geometry(&c600(), 1472, (2, 16, 729, 729), (72, 1.0), false),
            None
        );
        // For memory, whole bus pairs are cut too, and the run with fewer
        // query blocks a tile takes fewer keys than the products would give
        // it: 24 tiles with two query blocks each on keys 0..400, 22 with three
        // on keys 400..729, 120,320 bytes at the scores on either (keys
        // 0..448 would leave the first half 134,144).
        let sg = split_geometry(&c600(), 1472, (2, 16, 729, 729), (72, 1.0), true).expect("cut");
        assert_eq!(sg.group, 46);
        assert_eq!(
            sg.halves.map(|h| (h.tiles, h.kb0, h.kbn, h.qb)),
            [(24, 0, 25, 2), (22, 25, 21, 3)]
        );
        assert_eq!(scores_step_bytes(80, 25, 2), 120_320);
        assert_eq!(scores_step_bytes(80, 21, 3), 115_200);
        assert_eq!(scores_step_bytes(80, 28, 2), 134_144);
        // At batch 4, for memory: keys 0..384 on the half with four query
        // blocks a tile, where the products alone give it 0..416.
        let sg = split_geometry(&c600(), 1472, (4, 16, 729, 729), (72, 1.0), true).expect("cut");
        assert_eq!(sg.halves.map(|h| (h.kbn, h.qb)), [(24, 4), (22, 5)]);
        // One pair shares its bus pairs with nobody.
        assert_eq!(
            split_geometry(&c600(), 23, (1, 1, 729, 729), (72, 1.0), false),
            None
        );
    }

    /// Runs cover the blocks in order, one a tile, the longest as short as can
    /// be and then the most blocks a tile sends (So400m at batch 4: three, where
    /// the longest runs first left a second-half tile sending all five).
    #[test]
    fn merges_spread_over_both_halves_one_run_a_tile() {
        for (tiles, batch, heads, t, longest, most_sent) in [
            (1472u32, 4u32, 16u32, 729u32, 3u32, 3u32),
            (10, 1, 2, 81, 2, 2),
        ] {
            let sg = split_geometry(&c600(), tiles, (batch, heads, t, t), (72, 1.0), false)
                .expect("cut");
            let nb = t.div_ceil(AMP_WIDTH);
            let runs = merge_runs(&sg, nb);
            let mut next = 0;
            let mut seen = std::collections::BTreeSet::new();
            for &(hi, tile, m0, n) in &runs {
                assert_eq!(m0, next, "{runs:?}");
                let q = sg.halves[hi].qb;
                assert!(
                    n >= 1 && m0 / q == tile && (m0 + n - 1) / q == tile,
                    "{runs:?}"
                );
                assert!(seen.insert((hi, tile)), "two runs on one tile: {runs:?}");
                next = m0 + n;
            }
            assert_eq!(next, nb);
            assert_eq!(runs.iter().map(|r| r.3).max(), Some(longest), "{runs:?}");
            assert_eq!(longest_merge(&sg, t), longest);
            // A tile sends the blocks it holds and does not merge.
            let sent = (0..2)
                .flat_map(|hi| {
                    let q = sg.halves[hi].qb;
                    let runs = &runs;
                    (0..nb.div_ceil(q)).map(move |tile| {
                        let held = ((tile + 1) * q).min(nb) - tile * q;
                        let merged: u32 = runs
                            .iter()
                            .filter(|r| (r.0, r.1) == (hi, tile))
                            .map(|r| r.3)
                            .sum();
                        held - merged
                    })
                })
                .max();
            assert_eq!(sent, Some(most_sent), "{runs:?}");
        }
    }

    #[test]
    fn every_run_has_enough_keys_and_tiles_cover_the_queries() {
        let mut cuts = 0;
        for tiles in [10u32, 14, 18, 22, 46, 70, 94, 1472] {
            for (batch, heads, t) in [(1u32, 2u32, 81u32), (2, 2, 81), (1, 2, 49), (4, 16, 729)] {
                for for_memory in [false, true] {
                    let Some(sg) =
                        split_geometry(&c600(), tiles, (batch, heads, t, t), (32, 1.0), for_memory)
                    else {
                        continue;
                    };
                    assert!(sg.group % 2 == 0 && sg.group * batch * heads <= tiles);
                    let nb = t.div_ceil(AMP_WIDTH);
                    let tb = nb;
                    let [a, b] = sg.halves;
                    assert_eq!(
                        (a.tile0, b.tile0, a.tiles + b.tiles),
                        (0, a.tiles, sg.group)
                    );
                    assert_eq!((a.kb0, b.kb0, a.kbn + b.kbn), (0, a.kbn, tb));
                    assert!(a.tiles % 2 == 0 && b.tiles % 2 == 0);
                    for h in [a, b] {
                        assert!(h.qb * h.tiles >= nb);
                        let real = (h.kbn * AMP_WIDTH).min(t - h.kb0 * AMP_WIDTH);
                        assert!(real >= MIN_KEYS, "{tiles} {batch} {heads} {t}: {h:?}");
                    }
                    cuts += 1;
                }
            }
        }
        assert!(cuts >= 4, "{cuts}");
    }
}

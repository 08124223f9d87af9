//! The attention rule: per image and head, `softmax(Q K^T * scale) V`, where
//! Q, K and V are columns of projections whose heads take `stride` columns each:
//! head-padded (`stride` = `dp`, `d` up to a multiple of 16, the padding exact
//! zeros), or packed (`stride` = `d`, no padding columns; the transposed path only,
//! see [`packs_heads`]). Either way a head is read as `dp / 16` chunks of 16
//! columns from the 16-column boundary at or before its first column, so that its
//! chunks are whole blocks of the projection; a packed head's chunks then also hold
//! `lead(h)` columns of the head before it and some of the head after, which meet
//! zero rows of `Q^T` and so add nothing to the scores, and `V^T e^T` streams only
//! the head's own rows of `V^T`.
//!
//! Every (image, head) pair gets a group of tiles; each tile of a group owns a run
//! of query rows and holds all of that head's keys and values, so its scores are
//! whole and the softmax needs no exchange. With the keys on the AMP's rows
//! (`transposed`, the default), per tile:
//! - exchange: its queries and the head's keys in the AMP's chunk-major layout
//!   (straight from the projections' blocks), and to the transposers their blocks
//!   of the head's values;
//! - compute: the transposers transpose their value blocks (`V^T`'s chunks); each
//!   row tile zeroes its padding (query rows up to a multiple of 16, key rows past
//!   the last token), transposes its queries (`Q^T`, the AMP weights), computes
//!   `S^T = K Q^T` (`kc` calls of all the keys' rows) and the softmax down its
//!   columns (`softmax_cols`: the exponentials in place, each query's `1/sum`);
//! - exchange: `V^T` to every row tile of the pair;
//! - compute: `(e V)^T = V^T e^T` (`e^T` is the AMP weight layout as it stands),
//!   each query's column scaled by its `1/sum` (`scale_cols`), transposed back to
//!   the context's layout.
//!
//! The row path (`Q K^T`, the keys transposed by the transposers, the row softmax
//! on the AMP's block layout, `e V`) is taken under 12 keys, where the column
//! softmax's six workers would not have two rows each, and by the test hook
//! `Experimental::row_attention`. Its AMP calls stream only the tile's few query
//! rows, so their fixed cost dominates: at So400m sizes, batch 2, it takes half
//! as long again as the transposed path (196k cycles a tile against 127k,
//! measured side by side).
//!
//! The result is the head-padded context `[batch * tq, heads * dp]` in block
//! layout, ready for the output projection.
//!
//! A single query (the pooling head's probe) would leave all but one tile of a
//! group idle, one worker running the whole softmax row. There the keys are cut
//! over the group instead (`single_query`): each member scores its run of keys,
//! the run maxima are exchanged, each member exponentiates with the row's maximum
//! and multiplies by its run of values, and member 0 adds the partial products and
//! divides by the summed denominators (`row_max`, `exp_shift`, `reduce_norm`).

use tessera_kernels::{
    AmpMatmul, BlocksToRows, ExpShift, Kernel, Rearrange, ReduceNorm, RowMax, ScaleCols, ScaleRows,
    Softmax, SoftmaxCols, TransposeBlocks, ZeroFill,
};

use crate::PlanError;
use crate::dist::{DistTensor, Part, redistribute};

mod split_keys;
use crate::ir::*;
use crate::lower::count;
use crate::lower::ctx::Lowering;
use crate::matmul::AMP_WIDTH;

pub(crate) struct Attention<'a> {
    pub name: &'a str,
    /// `[q_batch * tq, heads * dp]`; `q_batch` is `batch` or 1 (one query set shared
    /// by every image, as the pooling head's probe).
    pub q: (&'a DistTensor, u32),
    /// `[batch * t, heads * dp]` each, as (tensor, first column): sibling
    /// projections may share one tensor side by side.
    pub k: (&'a DistTensor, u32),
    pub v: (&'a DistTensor, u32),
    pub batch: u32,
    pub shared_q: bool,
    pub tq: u32,
    pub t: u32,
    pub heads: u32,
    /// A head's dimensions, and as the attention's buffers and the context store
    /// them (`d` up to a multiple of 16).
    pub d: u32,
    pub dp: u32,
    /// Columns a head takes in the Q, K and V tensors: `dp`, or `d` when packed.
    pub stride: u32,
    pub scale: f32,
}

/// Which of the attention's three ways an attention takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// One query: the keys cut over the group.
    SingleQuery,
    /// The keys on the AMP's rows and the column softmax.
    Transposed,
    /// `Q K^T` and the row softmax.
    Rows,
}

/// The tiles of a pair's group, the query rows of a row tile, the key blocks of a
/// transposer and how many transposers, and the way taken: what [`attention`]
/// builds, from the shapes alone (the walker asks before it lowers the
/// projections, to know whether they may store their heads packed).
pub(crate) fn geometry(
    tiles: u32,
    row_attention: bool,
    (batch, heads, tq, t): (u32, u32, u32, u32),
    scale: f32,
) -> (Path, u32, u32, u32, u32) {
    let tp = t.next_multiple_of(AMP_WIDTH);
    let tb = tp / AMP_WIDTH;
    // Tiles per (image, head): as many as divide the chip. Up to `tq` of them own
    // query rows; up to `tb` of them share the transposition of the keys (with a
    // single query, the pooling head, most of a group only transposes).
    let group = (tiles / (batch * heads).max(1)).clamp(1, tq.max(tb).max(1));
    let rows_per = tq.div_ceil(group.min(tq).max(1));
    let share = tb.div_ceil(group.min(tb).max(1));
    let per_t = tb.div_ceil(share.max(1));
    let path = if tq == 1 && per_t >= 2 {
        Path::SingleQuery
    } else if !row_attention
        && SoftmaxCols::new(rows_per.div_ceil(AMP_WIDTH), tp, t, scale)
            .validate()
            .is_ok()
    {
        Path::Transposed
    } else {
        Path::Rows
    };
    (path, group, rows_per, share, per_t)
}

/// Whether `heads` heads of `d` dimensions can be read packed (`stride` = `d`):
/// `d` not already a multiple of 16, every head's chunks from its 16-column
/// boundary within `dp` columns and within the tensor (`heads d` a multiple of 16,
/// as a projection's output must be).
pub(crate) fn packs_heads(heads: u32, d: u32) -> bool {
    let dp = d.next_multiple_of(AMP_WIDTH);
    !d.is_multiple_of(AMP_WIDTH)
        && (heads * d).is_multiple_of(AMP_WIDTH)
        && (0..heads).all(|h| {
            (h * d) % AMP_WIDTH + d <= dp && (h * d) / AMP_WIDTH * AMP_WIDTH + dp <= heads * d
        })
}

impl Attention<'_> {
    /// Chunks of a head's dimensions, the keys padded to 16, and their blocks.
    fn padded(&self) -> (u32, u32, u32) {
        let tp = self.t.next_multiple_of(AMP_WIDTH);
        (self.dp / AMP_WIDTH, tp, tp / AMP_WIDTH)
    }

    /// Bytes of `nbq` query blocks of the scaled `(e V)^T`, `[nbq][dp][16]`: packed,
    /// the scaled rows start `lead` rows in, so a block's worth more.
    fn ctxs_bytes(&self, nbq: u32) -> u32 {
        nbq * self.dp * 32
            + if self.stride != self.dp {
                AMP_WIDTH * 32
            } else {
                0
            }
    }

    /// Columns of the head before head `h`'s first chunk that its chunks hold
    /// (0 unless packed).
    fn lead(&self, h: u32) -> u32 {
        (h * self.stride) % AMP_WIDTH
    }

    /// Chunk `c` of head `h`'s rows `rows` in the context, stored as `[rows][16]`
    /// at `buf + offset`, if head `h` holds it: the context is laid out as Q, K
    /// and V are, and a chunk packed heads share belongs to the one it starts in
    /// (which holds the other's columns too), a chunk past the head's columns to
    /// none.
    fn ctx_chunk(
        &self,
        buf: BufId,
        offset: u32,
        rows: std::ops::Range<u32>,
        h: u32,
        c: u32,
    ) -> Option<Part> {
        let part = self.chunk(buf, offset, rows, 0, h, c);
        let own =
            self.stride == self.dp || (h * self.d..(h + 1) * self.d).contains(&part.cols.start);
        own.then_some(part)
    }

    /// Chunk `c` of head `h`'s rows `rows`, stored as `[rows][16]` at `buf +
    /// offset`, in a Q, K or V tensor whose head columns start at `first`.
    fn chunk(
        &self,
        buf: BufId,
        offset: u32,
        rows: std::ops::Range<u32>,
        first: u32,
        h: u32,
        c: u32,
    ) -> Part {
        let c0 = first + (h * self.stride - self.lead(h)) + c * AMP_WIDTH;
        Part {
            at: Loc { buf, offset },
            rows,
            cols: c0..c0 + AMP_WIDTH,
        }
    }

    /// The exchange copies that fill `parts` (pieces of `src`'s matrix) from `src`;
    /// `what` names the operand in the error.
    fn gather(
        &self,
        src: &DistTensor,
        parts: Vec<Part>,
        what: &str,
    ) -> Result<Vec<Copy>, PlanError> {
        let dst = DistTensor {
            rows: src.rows,
            cols: src.cols,
            elem_bytes: 2,
            parts,
        };
        redistribute(src, &dst).map_err(|e| {
            PlanError::Unsupported(format!("{}: {what} do not cover the head: {e}", self.name))
        })
    }

    /// The queries, keys and values the parts name, as one exchange's copies.
    fn gather_qkv(
        &self,
        q_parts: Vec<Part>,
        k_parts: Vec<Part>,
        v_parts: Vec<Part>,
    ) -> Result<Vec<Copy>, PlanError> {
        let mut copies = self.gather(self.q.0, q_parts, "queries")?;
        copies.extend(self.gather(self.k.0, k_parts, "keys")?);
        copies.extend(self.gather(self.v.0, v_parts, "values")?);
        Ok(copies)
    }

    /// The `kc` chunks of a run's keys (or values) before the last token, stored
    /// `[kc][16 nbk][16]` in `buf`, from a tensor whose head columns start at
    /// `first`.
    fn run_parts(&self, buf: BufId, run: &Run, first: u32) -> Vec<Part> {
        let t0 = run.blk0 * AMP_WIDTH;
        let real = run.real(self.t);
        if real == 0 {
            return Vec::new();
        }
        let r = run.b * self.t + t0;
        (0..self.dp / AMP_WIDTH)
            .map(|c| self.chunk(buf, c * run.nbk * 512, r..r + real, first, run.h, c))
            .collect()
    }

    /// The tiles of pair `pair`'s group (of `group`, from tile `pair * group`) that
    /// own query rows, `rows_per` each.
    fn slots(
        &self,
        tiles: u32,
        group: u32,
        pair: u32,
        rows_per: u32,
    ) -> impl Iterator<Item = Slot> + use<'_> {
        (0..self.tq.div_ceil(rows_per)).map(move |m| {
            let r0 = m * rows_per;
            Slot {
                tile: (pair * group + m) % tiles,
                b: pair / self.heads,
                h: pair % self.heads,
                pair,
                r0,
                rows: rows_per.min(self.tq - r0),
            }
        })
    }

    /// The tiles of pair `pair`'s group that take key blocks, `share` each.
    fn runs(
        &self,
        tiles: u32,
        group: u32,
        pair: u32,
        share: u32,
    ) -> impl Iterator<Item = Run> + use<'_> {
        let tb = self.padded().2;
        (0..tb.div_ceil(share)).map(move |m| Run {
            tile: (pair * group + m) % tiles,
            b: pair / self.heads,
            h: pair % self.heads,
            pair,
            m,
            blk0: m * share,
            nbk: share.min(tb - m * share),
        })
    }

    /// The head-padded context `[batch * tq, heads * dp]` from its parts.
    fn context(&self, parts: Vec<Part>) -> DistTensor {
        DistTensor {
            rows: self.batch * self.tq,
            cols: self.heads * self.stride,
            elem_bytes: 2,
            parts,
        }
    }
}

/// A tile of an (image, head) pair's group that owns query rows `r0..r0 + rows`.
#[derive(Clone, Copy)]
struct Slot {
    tile: u32,
    b: u32,
    h: u32,
    pair: u32,
    r0: u32,
    rows: u32,
}

/// A tile of a pair's group that holds key blocks `blk0..blk0 + nbk`; `m` is its
/// place in the group.
#[derive(Clone, Copy)]
struct Run {
    tile: u32,
    b: u32,
    h: u32,
    pair: u32,
    m: u32,
    blk0: u32,
    nbk: u32,
}

impl Run {
    /// Its keys before the last of `t` tokens (the key dimension is padded to 16).
    fn real(&self, t: u32) -> u32 {
        t.saturating_sub(self.blk0 * AMP_WIDTH)
            .min(self.nbk * AMP_WIDTH)
    }
}

/// Zeroes rows `real..stored` of each of `kc` chunks `[stored][16]` in `buf`.
pub(super) fn zero_rows(
    lw: &mut Lowering<'_>,
    (tile, step): (u32, Step),
    kc: u32,
    buf: BufId,
    (real, stored): (u32, u32),
) {
    if stored > real {
        lw.call(
            tile,
            step,
            ZeroFill::new(kc, (stored - real) * 32, stored * 32),
            &[(
                "out",
                Loc {
                    buf,
                    offset: real * 32,
                },
            )],
        );
    }
}

/// A transposer's run of `nbk` key blocks from `blk0`, stored `[kc][16 nbk][16]` in
/// `part`: the rows past the last token zeroed (the key dimension is padded to 16),
/// then transposed to `out` (`[nbk][kc][16][16]`).
fn transpose_run(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    run: &Run,
    step: Step,
    part: BufId,
    out: Loc,
) {
    let kc = op.dp / AMP_WIDTH;
    let stored = run.nbk * AMP_WIDTH;
    zero_rows(lw, (run.tile, step), kc, part, (run.real(op.t), stored));
    lw.call(
        run.tile,
        step,
        TransposeBlocks::new(kc, run.nbk),
        &[
            (
                "in",
                Loc {
                    buf: part,
                    offset: 0,
                },
            ),
            ("out", out),
        ],
    );
}

/// A tile that owns query rows of one (image, head) pair.
struct RowWork {
    s: Slot,
    q_amp: BufId,
    /// The head's keys transposed, `[tb][kc][16][16]`, filled by the transposers.
    w1: BufId,
    s_blk: BufId,
    /// Row-major scores, when the softmax cannot work on the block layout.
    s_rm: Option<BufId>,
    /// Each query row's `1/sum`, f32: the softmax leaves the normalisation to the
    /// context rows.
    recip: BufId,
    v_w: BufId,
    ctx: BufId,
}

/// A tile that transposes key blocks `blk0..blk0 + nbk` of one pair and sends
/// them to the pair's row tiles.
struct Transposer {
    run: Run,
    /// Its keys, `[kc][16 * nbk][16]`.
    kpart: BufId,
    /// Where the transposed blocks go: its own row work's `w1` when it has one
    /// (at the blocks' offset), otherwise a buffer of its own.
    out: Loc,
    /// Index of its own row work, if any.
    own: Option<usize>,
}

pub(crate) fn attention(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let tiles = lw.machine.tiles;
    let (_, tp, _) = op.padded();
    let (path, group, rows_per, share, per_t) = geometry(
        tiles,
        lw.opts.experimental.row_attention,
        (op.batch, op.heads, op.tq, op.t),
        op.scale,
    );
    if op.stride != op.dp && (path != Path::Transposed || !packs_heads(op.heads, op.d)) {
        return Err(PlanError::Unsupported(format!(
            "{name}: heads of {} columns stored packed need the transposed attention",
            op.d
        )));
    }
    match path {
        Path::SingleQuery => {
            lw.plan.decisions.push(format!(
                "{name}: {} x {}, one query cut over {} each of {}; keys {} padded to {}",
                count(op.batch, "image"),
                count(op.heads, "head"),
                count(per_t, "tile"),
                count(share, "key block"),
                op.t,
                tp
            ));
            single_query(lw, op, group, share, per_t)
        }
        Path::Transposed => transposed_path(lw, op, group, rows_per, share, per_t),
        Path::Rows => {
            lw.plan.decisions.push(format!(
                "{name}: {} x {}, {} each: {} with {}, {per_t} transposing {}; keys {} padded to {}",
                count(op.batch, "image"),
                count(op.heads, "head"),
                count(group, "tile"),
                op.tq.div_ceil(rows_per),
                count(rows_per, "query row"),
                count(share, "key block"),
                op.t,
                tp
            ));
            let rows = RowAttention::lay_out(lw, op, group, rows_per, share);
            rows.land_qk(lw)?;
            rows.transpose_keys(lw);
            rows.scores(lw);
            rows.values_and_context(lw)
        }
    }
}

/// The transposed attention: with the keys cut in two runs where
/// `split_keys::split_geometry` finds that cheaper, otherwise whole.
fn transposed_path(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    group: u32,
    rows_per: u32,
    share: u32,
    per_t: u32,
) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let tiles = lw.machine.tiles;
    let (kc, tp, _) = op.padded();
    let per_rows = op.tq.div_ceil(rows_per);
    if op.stride != op.dp {
        lw.plan.decisions.push(format!(
            "{name}: heads of {} dimensions read packed from the projections ({} columns a head, none of padding); each head's {} chunks from its 16-column boundary, the neighbouring heads' rows of Q^T zeroed",
            op.d, op.stride, kc
        ));
    }
    let split = (!lw.opts.experimental.whole_keys)
        .then(|| {
            split_keys::split_geometry(
                &lw.machine.timing,
                tiles,
                (op.batch, op.heads, op.tq, op.t),
                (op.d, op.scale),
                lw.opts.cut_keys || lw.opts.experimental.cut_all_keys,
            )
        })
        .flatten();
    if let Some(sg) = split {
        let [h1, h2] = sg.halves;
        let why = if sg.group != group {
            format!("whole bus pairs; {group} would share one with the next head")
        } else if lw.opts.cut_keys || lw.opts.experimental.cut_all_keys {
            "for memory: half a head's keys and values a tile".to_string()
        } else {
            format!(
                "fewer block products a tile: {} by {} query and key blocks, against {} by {} with whole keys",
                h1.qb.max(h2.qb),
                h1.kbn.max(h2.kbn),
                rows_per.div_ceil(AMP_WIDTH),
                tp / AMP_WIDTH
            )
        };
        lw.plan.decisions.push(format!(
            "{name}: {} x {}, {} each ({why}): keys cut in two runs, {} with {} over keys {}..{}, {} with {} over keys {}..{}; maxima exchanged, query blocks merged in runs of up to {} on both halves' tiles",
            count(op.batch, "image"),
            count(op.heads, "head"),
            count(sg.group, "tile"),
            count(h1.tiles, "tile"),
            count(h1.qb, "query block"),
            h1.kb0 * AMP_WIDTH,
            (h1.kb0 + h1.kbn) * AMP_WIDTH,
            count(h2.tiles, "tile"),
            h2.qb,
            h2.kb0 * AMP_WIDTH,
            op.t,
            split_keys::longest_merge(&sg, op.tq)
        ));
        return split_keys::lower(lw, op, sg);
    }
    lw.plan.decisions.push(format!(
        "{name}: {} x {}, {} each: {per_rows} with {}, {per_t} transposing {}; keys {} padded to {}; scores transposed (K Q^T)",
        count(op.batch, "image"),
        count(op.heads, "head"),
        count(group, "tile"),
        count(rows_per, "query row"),
        count(share, "value block"),
        op.t,
        tp
    ));
    transposed(lw, op, group, rows_per, share)
}

/// The row attention (`Q K^T` and the row softmax): its row tiles and key
/// transposers.
struct RowAttention<'p, 'a> {
    op: &'p Attention<'a>,
    work: Vec<RowWork>,
    trans: Vec<Transposer>,
}

impl RowAttention<'_, '_> {
    /// Every pair's row tiles and key transposers, and their buffers.
    fn lay_out<'p, 'a>(
        lw: &mut Lowering<'_>,
        op: &'p Attention<'a>,
        group: u32,
        rows_per: u32,
        share: u32,
    ) -> RowAttention<'p, 'a> {
        let name = op.name;
        let tiles = lw.machine.tiles;
        let (kc, tp, _) = op.padded();
        let per_rows = op.tq.div_ceil(rows_per);
        let mut work = Vec::new();
        let mut trans = Vec::new();
        for pair in 0..op.batch * op.heads {
            for sl in op.slots(tiles, group, pair, rows_per) {
                let rows = sl.rows;
                // The kernel says whether its block-layout variant takes this shape.
                let blocked = Softmax::with_ld(rows, op.t, tp, op.scale)
                    .with_blocked()
                    .validate()
                    .is_ok();
                let mut blk = |what: &str, bytes: u32| lw.activation(sl.tile, name, what, bytes);
                work.push(RowWork {
                    s: sl,
                    q_amp: blk("q", rows * op.dp * 2),
                    w1: blk("kt", tp * op.dp * 2),
                    s_blk: blk("scores.amp", rows * tp * 2),
                    s_rm: (!blocked).then(|| blk("scores", rows * tp * 2)),
                    recip: blk("recip", rows * 4),
                    v_w: blk("v", tp * op.dp * 2),
                    ctx: blk("ctx", rows * op.dp * 2),
                });
            }
            for run in op.runs(tiles, group, pair, share) {
                let kpart = lw.buffer(
                    run.tile,
                    format!("{name}.k"),
                    run.nbk * AMP_WIDTH * op.dp * 2,
                    Category::Activation,
                );
                // A transposer that also owns query rows writes into its own `w1`.
                let (out, own) = if run.m < per_rows {
                    let own = (pair * per_rows + run.m) as usize;
                    (
                        Loc {
                            buf: work[own].w1,
                            offset: run.blk0 * kc * 512,
                        },
                        Some(own),
                    )
                } else {
                    let buf = lw.buffer(
                        run.tile,
                        format!("{name}.kt.part"),
                        run.nbk * kc * 512,
                        Category::Activation,
                    );
                    (Loc { buf, offset: 0 }, None)
                };
                trans.push(Transposer {
                    run,
                    kpart,
                    out,
                    own,
                });
            }
        }
        RowAttention { op, work, trans }
    }

    /// Queries to the row tiles, key blocks to the transposers.
    fn land_qk(&self, lw: &mut Lowering<'_>) -> Result<(), PlanError> {
        let op = self.op;
        let (kc, _, _) = op.padded();
        let (q_src, q_first) = op.q;
        let (k_src, k_first) = op.k;
        let mut q_parts = Vec::new();
        for w in &self.work {
            let r = if op.shared_q { 0 } else { w.s.b * op.tq } + w.s.r0;
            for c in 0..kc {
                q_parts.push(op.chunk(
                    w.q_amp,
                    c * w.s.rows * 32,
                    r..r + w.s.rows,
                    q_first,
                    w.s.h,
                    c,
                ));
            }
        }
        let key_parts: Vec<Part> = self
            .trans
            .iter()
            .flat_map(|t| op.run_parts(t.kpart, &t.run, k_first))
            .collect();
        let mut copies = op.gather(q_src, q_parts, "queries")?;
        copies.extend(op.gather(k_src, key_parts, "keys")?);
        lw.exchange(&format!("{}.qk", op.name), copies);
        Ok(())
    }

    /// K^T in the AMP weight layout, each transposer its blocks (zero rows past
    /// the last token: the key dimension is padded to 16), then to every row tile.
    fn transpose_keys(&self, lw: &mut Lowering<'_>) {
        let op = self.op;
        let (kc, _, _) = op.padded();
        let step = lw.compute_step();
        for t in &self.trans {
            transpose_run(lw, op, &t.run, step, t.kpart, t.out);
        }
        let mut copies = Vec::new();
        for t in &self.trans {
            let dsts: Vec<Loc> = self
                .work
                .iter()
                .enumerate()
                .filter(|(i, w)| w.s.pair == t.run.pair && t.own != Some(*i))
                .map(|(_, w)| Loc {
                    buf: w.w1,
                    offset: t.run.blk0 * kc * 512,
                })
                .collect();
            if !dsts.is_empty() {
                copies.push(Copy {
                    src: t.out,
                    bytes: t.run.nbk * kc * 512,
                    dsts,
                });
            }
        }
        lw.exchange(&format!("{}.kt", op.name), copies);
    }

    /// Scores, softmax, probabilities back to chunk-major (into the scores' AMP
    /// buffer, free once converted).
    fn scores(&self, lw: &mut Lowering<'_>) {
        let op = self.op;
        let (kc, tp, tb) = op.padded();
        let at = |buf| Loc { buf, offset: 0 };
        let step = lw.compute_step();
        for w in &self.work {
            amp(
                lw,
                w.s.tile,
                step,
                op.name,
                (w.s.rows, kc, tb),
                at(w.q_amp),
                at(w.w1),
                at(w.s_blk),
            );
            let softmax = Softmax::with_ld(w.s.rows, op.t, tp, op.scale);
            let Some(s_rm) = w.s_rm else {
                // In place on the AMP's block layout: `e` is what `e V` reads.
                lw.call(
                    w.s.tile,
                    step,
                    softmax.with_blocked(),
                    &[
                        ("in", at(w.s_blk)),
                        ("out", at(w.s_blk)),
                        ("recip", at(w.recip)),
                    ],
                );
                continue;
            };
            lw.call(
                w.s.tile,
                step,
                BlocksToRows::new(w.s.rows, tb),
                &[("in", at(w.s_blk)), ("out", at(s_rm))],
            );
            lw.call(
                w.s.tile,
                step,
                softmax.with_recip(),
                &[("in", at(s_rm)), ("out", at(s_rm)), ("recip", at(w.recip))],
            );
            let mut re = Rearrange::new(w.s.rows, tp);
            if let Some(al) = lw.opts.experimental.rearrange_declared_align {
                re.declared_align = al;
            }
            lw.call(
                w.s.tile,
                step,
                re,
                &[("in", at(s_rm)), ("out", at(w.s_blk))],
            );
        }
    }

    /// Values (their block layout is the AMP weight layout of `P V` as it
    /// stands), then `P V` scaled by each row's `1/sum`.
    fn values_and_context(&self, lw: &mut Lowering<'_>) -> Result<DistTensor, PlanError> {
        let op = self.op;
        let (kc, tp, tb) = op.padded();
        let (v_src, v_first) = op.v;
        let at = |buf| Loc { buf, offset: 0 };
        let mut value_parts = Vec::new();
        for w in &self.work {
            let r = w.s.b * op.t;
            for c in 0..kc {
                value_parts.push(op.chunk(w.v_w, c * tp * 32, r..r + op.t, v_first, w.s.h, c));
            }
        }
        let copies = op.gather(v_src, value_parts, "values")?;
        lw.exchange(&format!("{}.v", op.name), copies);
        let step = lw.compute_step();
        let mut out = Vec::new();
        for w in &self.work {
            zero_rows(lw, (w.s.tile, step), kc, w.v_w, (op.t, tp));
            amp(
                lw,
                w.s.tile,
                step,
                op.name,
                (w.s.rows, tb, kc),
                at(w.s_blk),
                at(w.v_w),
                at(w.ctx),
            );
            lw.call(
                w.s.tile,
                step,
                ScaleRows::new(w.s.rows, kc),
                &[("x", at(w.ctx)), ("f", at(w.recip))],
            );
            let r = w.s.b * op.tq + w.s.r0;
            for c in 0..kc {
                out.extend(op.ctx_chunk(w.ctx, c * w.s.rows * 32, r..r + w.s.rows, w.s.h, c));
            }
        }
        Ok(op.context(out))
    }
}

/// A tile of the transposed attention that owns query rows `r0..r0 + rows` of one
/// (image, head) pair, padded to `16 nbq` rows.
struct ColWork {
    s: Slot,
    nbq: u32,
    /// Its queries, `[kc][16 nbq][16]` (rows past `rows` zeroed).
    q_amp: BufId,
    /// `Q^T` in the AMP weight layout, `[nbq][kc][16][16]`.
    qt: BufId,
    /// The head's keys, `[kc][tp][16]` (rows past the last token zeroed): the
    /// AMP's rows.
    k: BufId,
    /// `S^T = K Q^T`, `[nbq][tp][16]`; then `e^T` in place.
    st: BufId,
    /// Each query's `1/sum`, f32.
    recip: BufId,
    /// `V^T`'s rows of the `d` real dimensions, `[tb][d][16]`, filled by the
    /// transposers.
    vt: BufId,
    /// `(e V)^T = V^T e^T`, `[nbq][d][16]`.
    ctxt: BufId,
    /// `ctxt` with each query's column scaled by its `1/sum` (`scale_cols` reads
    /// and writes different memory elements), `[nbq][kc 16][16]`: the padding
    /// dimensions' rows zeroed.
    ctxs: BufId,
    /// The context, `[kc][16 nbq][16]`.
    ctx: BufId,
}

/// A tile that transposes value blocks `blk0..blk0 + nbk` of one pair for the
/// pair's row tiles.
struct ValueTransposer {
    run: Run,
    /// Its values, `[kc][16 nbk][16]`.
    vpart: BufId,
    /// Their transpose, `[nbk][kc][16][16]`: blocks of `V^T`'s chunks.
    out: BufId,
}

impl ValueTransposer {
    /// `run`'s transposer with its two buffers (`kc` chunks of the head).
    fn new(lw: &mut Lowering<'_>, name: &str, run: Run, kc: u32) -> ValueTransposer {
        let bytes = run.nbk * kc * 512;
        let mut blk = |what: &str| {
            lw.buffer(
                run.tile,
                format!("{name}.{what}"),
                bytes,
                Category::Activation,
            )
        };
        ValueTransposer {
            run,
            vpart: blk("v.part"),
            out: blk("vt.part"),
        }
    }
}

/// The attention with the keys on the AMP's rows: per tile, `S^T = K Q^T` takes
/// `kc` calls of `tp` rows against `Q^T` (`kc nbq` 16x16 blocks) where `Q K^T` took
/// `kc tb` calls of the tile's few query rows against `K^T`; the softmax runs
/// down the columns (`softmax_cols`), `e^T` is the AMP weight layout of `V^T e^T`
/// as it stands, whose `tb` calls stream the head's `16 kc` value dimensions;
/// the transposers transpose the values once for all of a pair's tiles (the keys
/// needed it before), and each tile transposes its own few query and context
/// blocks.
fn transposed(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    group: u32,
    rows_per: u32,
    share: u32,
) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let tiles = lw.machine.tiles;
    let (kc, tp, tb) = op.padded();
    let mut work = Vec::new();
    let mut trans = Vec::new();
    for pair in 0..op.batch * op.heads {
        for sl in op.slots(tiles, group, pair, rows_per) {
            let nbq = sl.rows.div_ceil(AMP_WIDTH);
            let mut blk = |what: &str, bytes: u32| lw.activation(sl.tile, name, what, bytes);
            work.push(ColWork {
                s: sl,
                nbq,
                q_amp: blk("q", nbq * AMP_WIDTH * op.dp * 2),
                qt: blk("qt", nbq * kc * 512),
                k: blk("k", tp * op.dp * 2),
                st: blk("scores.t", nbq * tp * 32),
                recip: blk("recip", nbq * 64),
                vt: blk("vt", tb * op.d * 32),
                ctxt: blk("ctx.t", nbq * op.d * 32),
                ctxs: blk("ctx.ts", op.ctxs_bytes(nbq)),
                ctx: blk("ctx", nbq * AMP_WIDTH * op.dp * 2),
            });
        }
        for run in op.runs(tiles, group, pair, share) {
            trans.push(ValueTransposer::new(lw, name, run, kc));
        }
    }
    let (q_first, k_first, v_first) = (op.q.1, op.k.1, op.v.1);

    // Queries and the head's keys to the row tiles, value blocks to the
    // transposers, all in one exchange.
    let mut q_parts = Vec::new();
    let mut k_parts = Vec::new();
    for w in &work {
        let r = if op.shared_q { 0 } else { w.s.b * op.tq } + w.s.r0;
        let rk = w.s.b * op.t;
        for c in 0..kc {
            q_parts.push(op.chunk(w.q_amp, c * w.nbq * 512, r..r + w.s.rows, q_first, w.s.h, c));
            k_parts.push(op.chunk(w.k, c * tp * 32, rk..rk + op.t, k_first, w.s.h, c));
        }
    }
    let v_parts: Vec<Part> = trans
        .iter()
        .flat_map(|t| op.run_parts(t.vpart, &t.run, v_first))
        .collect();
    lw.exchange(
        &format!("{name}.qkv"),
        op.gather_qkv(q_parts, k_parts, v_parts)?,
    );

    // Value blocks transposed (rows past the last token zeroed first: the key
    // dimension is padded to 16); per row tile, `Q^T`, `S^T = K Q^T` and the
    // softmax down its columns.
    let (prep, step) = (lw.compute_step(), lw.compute_step());
    let at = |buf| Loc { buf, offset: 0 };
    for t in &trans {
        transpose_run(lw, op, &t.run, prep, t.vpart, at(t.out));
    }
    for w in &work {
        scores(
            lw,
            op,
            (prep, step),
            (&w.s, w.nbq),
            [w.q_amp, w.qt, w.k, w.st],
            (op.t, tp),
        );
        lw.call(
            w.s.tile,
            step,
            SoftmaxCols::new(w.nbq, tp, op.t, op.scale),
            &[("in", at(w.st)), ("out", at(w.st)), ("recip", at(w.recip))],
        );
    }

    // `V^T` to every row tile of the pair (a transposer's own row tile included):
    // of each block, the rows of the head's `d` real dimensions (the padding
    // dimensions are zeros, and `V^T e^T` leaves them out).
    let mut copies = Vec::new();
    for t in &trans {
        let dsts: Vec<BufId> = work
            .iter()
            .filter(|w| w.s.pair == t.run.pair)
            .map(|w| w.vt)
            .collect();
        copies.extend(vt_copies(op, t, 0, &dsts));
    }
    lw.exchange(&format!("{name}.vt"), copies);

    // `(e V)^T = V^T e^T`, then each query's column scaled by its `1/sum` and
    // back to the context's layout.
    let step = lw.compute_step();
    let fin: Vec<Finish> = work
        .iter()
        .map(|w| Finish {
            s: w.s,
            nbq: w.nbq,
            ev: w.ctxt,
            recip: w.recip,
            ctxs: w.ctxs,
            ctx: w.ctx,
        })
        .collect();
    finish(lw, op, step, &fin, &mut |lw, i| {
        let w = &work[i];
        amp(
            lw,
            w.s.tile,
            step,
            name,
            (op.d, tb, w.nbq),
            at(w.vt),
            at(w.st),
            at(w.ctxt),
        );
    })
}

/// A tile that finishes a run of query blocks: `(e V)^T` in `ev`, `[nbq][d][16]`,
/// and each query's `1/sum` in `recip`; `ctxs` and `ctx` as [`ColWork`] has them.
struct Finish {
    s: Slot,
    nbq: u32,
    ev: BufId,
    recip: BufId,
    ctxs: BufId,
    ctx: BufId,
}

/// Each query's column of `(e V)^T` scaled by its `1/sum` (in `step`, each tile's
/// after what `produce` emits for it: the calls that make its `ev` and `recip`),
/// back to the context's layout. Packed, a head's dimensions sit `lead` rows into
/// its chunks, as they do in the projections.
fn finish(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    step: Step,
    work: &[Finish],
    produce: &mut dyn FnMut(&mut Lowering<'_>, usize),
) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let kc = op.padded().0;
    let at = |buf| Loc { buf, offset: 0 };
    let packed = op.stride != op.dp;
    for (i, w) in work.iter().enumerate() {
        produce(lw, i);
        let lead = op.lead(w.s.h);
        if !packed {
            zero_rows(lw, (w.s.tile, step), w.nbq, w.ctxs, (op.d, op.dp));
        } else if lead > 0 {
            // The rows before the head's first dimension belong to the chunk the
            // head before holds; the transpose reads them all the same.
            lw.call(
                w.s.tile,
                step,
                ZeroFill::new(w.nbq, lead * 32, op.dp * 32),
                &[("out", at(w.ctxs))],
            );
        }
        lw.call(
            w.s.tile,
            step,
            ScaleCols::new(op.d, w.nbq).with_out_rows(op.dp),
            &[
                ("in", at(w.ev)),
                (
                    "out",
                    Loc {
                        buf: w.ctxs,
                        offset: lead * 32,
                    },
                ),
                ("f", at(w.recip)),
            ],
        );
    }
    if packed {
        // A chunk that a head shares with the next holds the next head's first
        // dimensions after its own: the next head's tile with the same query rows
        // sends those rows of its `(e V)^T` (contiguous rows of every query block).
        let mut copies = Vec::new();
        for (i, w) in work.iter().enumerate() {
            let next_lead = (op.lead(w.s.h) + op.d) % AMP_WIDTH;
            if w.s.h + 1 == op.heads || next_lead == 0 {
                continue;
            }
            let Some(nx) = work[i + 1..]
                .iter()
                .find(|x| x.s.pair == w.s.pair + 1 && x.s.r0 == w.s.r0)
            else {
                continue;
            };
            for j in 0..w.nbq {
                copies.push(Copy {
                    src: Loc {
                        buf: nx.ctxs,
                        offset: (j * op.dp + next_lead) * 32,
                    },
                    bytes: (AMP_WIDTH - next_lead) * 32,
                    dsts: vec![Loc {
                        buf: w.ctxs,
                        offset: (j * op.dp + op.lead(w.s.h) + op.d) * 32,
                    }],
                });
            }
        }
        lw.exchange(&format!("{name}.ctx"), copies);
    }
    let step = if packed { lw.compute_step() } else { step };
    let mut out = Vec::new();
    for w in work {
        lw.call(
            w.s.tile,
            step,
            TransposeBlocks::new(w.nbq, kc),
            &[("in", at(w.ctxs)), ("out", at(w.ctx))],
        );
        let r = w.s.b * op.tq + w.s.r0;
        for c in 0..kc {
            out.extend(op.ctx_chunk(w.ctx, c * w.nbq * 512, r..r + w.s.rows, w.s.h, c));
        }
    }
    Ok(op.context(out))
}

/// One tile of a single query's key cut: key blocks `blk0..blk0 + nbk` of one pair.
struct KeyRun {
    /// Its place in the pair's group is `run.m`; member 0 combines.
    run: Run,
    /// Real keys of the run (the last run of a pair ends at the last token).
    real: u32,
    q: BufId,
    /// Its keys, `[kc][16 * nbk][16]`, then its values in the same layout (the AMP
    /// weight layout of `e V`).
    kpart: BufId,
    vpart: BufId,
    kt: BufId,
    scores: BufId,
    /// Every member's maximum, `[g]` f32, its own at `m`.
    maxes: BufId,
    e: BufId,
    /// Its `e V` and its sum of `e`: its own buffers, or on member 0 its rows of the
    /// combination's inputs.
    ev: Loc,
    sum: Loc,
}

/// Member 0 of a pair in the single-query attention: its tile, image and head,
/// and its buffers of every member's `e V` and sum and of the context.
type SumTile = (u32, u32, u32, BufId, BufId, BufId);

/// The single-query attention's key runs and, per pair, its member 0's
/// combination buffers.
fn single_query_layout(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    group: u32,
    share: u32,
    g: u32,
) -> (Vec<KeyRun>, Vec<SumTile>) {
    let name = op.name;
    let tiles = lw.machine.tiles;
    let kc = op.padded().0;
    let mut runs: Vec<KeyRun> = Vec::new();
    // Member 0's combination buffers, per pair.
    let mut combine = Vec::new();
    for pair in 0..op.batch * op.heads {
        let tile0 = (pair * group) % tiles;
        let ev_all = lw.buffer(
            tile0,
            format!("{name}.ev"),
            g * op.dp * 2,
            Category::Activation,
        );
        let sums = lw.buffer(tile0, format!("{name}.sums"), g * 4, Category::Activation);
        let ctx = lw.buffer(
            tile0,
            format!("{name}.ctx"),
            op.dp * 2,
            Category::Activation,
        );
        combine.push((tile0, pair / op.heads, pair % op.heads, ev_all, sums, ctx));
        for run in op.runs(tiles, group, pair, share) {
            let nbk = run.nbk;
            let mut blk = |what: &str, bytes: u32| {
                lw.buffer(
                    run.tile,
                    format!("{name}.{what}"),
                    bytes,
                    Category::Activation,
                )
            };
            let q = blk("q", op.dp * 2);
            let kpart = blk("k", nbk * AMP_WIDTH * op.dp * 2);
            let vpart = blk("v", nbk * AMP_WIDTH * op.dp * 2);
            let kt = blk("kt", nbk * kc * 512);
            let scores = blk("scores", nbk * AMP_WIDTH * 2);
            let maxes = blk("maxes", g * 4);
            let e = blk("e", nbk * AMP_WIDTH * 2);
            let (ev, sum) = if run.m == 0 {
                (
                    Loc {
                        buf: ev_all,
                        offset: 0,
                    },
                    Loc {
                        buf: sums,
                        offset: 0,
                    },
                )
            } else {
                (
                    Loc {
                        buf: blk("ev.part", op.dp * 2),
                        offset: 0,
                    },
                    Loc {
                        buf: blk("sum", 4),
                        offset: 0,
                    },
                )
            };
            runs.push(KeyRun {
                run,
                real: run.real(op.t),
                q,
                kpart,
                vpart,
                kt,
                scores,
                maxes,
                e,
                ev,
                sum,
            });
        }
    }
    (runs, combine)
}

/// The single-query attention (the pooling head's probe) with the keys cut over the
/// group instead of one tile holding the whole row while the rest only transpose:
/// each member scores its run of keys, takes its maximum; the members exchange
/// their maxima; each computes `e = exp(scale (s - M))` for the row's maximum `M`,
/// `e V` over its values and the sum of `e`; member 0 sums the products and divides
/// by the sum of the sums (`reduce_norm`). Exchanges: queries, keys and values;
/// the maxima; the products and sums.
fn single_query(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    group: u32,
    share: u32,
    g: u32,
) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let kc = op.padded().0;
    let (runs, combine) = single_query_layout(lw, op, group, share, g);
    let (q_first, k_first, v_first) = (op.q.1, op.k.1, op.v.1);
    let (mut q_parts, mut k_parts, mut v_parts) = (Vec::new(), Vec::new(), Vec::new());
    for r in &runs {
        let qr = if op.shared_q { 0 } else { r.run.b * op.tq };
        for c in 0..kc {
            q_parts.push(op.chunk(r.q, c * 32, qr..qr + 1, q_first, r.run.h, c));
        }
        k_parts.extend(op.run_parts(r.kpart, &r.run, k_first));
        v_parts.extend(op.run_parts(r.vpart, &r.run, v_first));
    }
    lw.exchange(
        &format!("{name}.qkv"),
        op.gather_qkv(q_parts, k_parts, v_parts)?,
    );

    // Scores of each run (zero key and value rows past the last token) and their
    // maximum.
    let step = lw.compute_step();
    let at = |buf| Loc { buf, offset: 0 };
    for r in &runs {
        for buf in [r.kpart, r.vpart] {
            zero_rows(
                lw,
                (r.run.tile, step),
                kc,
                buf,
                (r.real, r.run.nbk * AMP_WIDTH),
            );
        }
        lw.call(
            r.run.tile,
            step,
            TransposeBlocks::new(kc, r.run.nbk),
            &[("in", at(r.kpart)), ("out", at(r.kt))],
        );
        amp(
            lw,
            r.run.tile,
            step,
            name,
            (1, kc, r.run.nbk),
            at(r.q),
            at(r.kt),
            at(r.scores),
        );
        lw.call(
            r.run.tile,
            step,
            RowMax::new(r.real),
            &[
                ("in", at(r.scores)),
                (
                    "out",
                    Loc {
                        buf: r.maxes,
                        offset: r.run.m * 4,
                    },
                ),
            ],
        );
    }
    let mut copies = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let pair0 = i - r.run.m as usize;
        let dsts = (0..g as usize)
            .filter(|&o| o != r.run.m as usize)
            .map(|o| Loc {
                buf: runs[pair0 + o].maxes,
                offset: r.run.m * 4,
            })
            .collect();
        copies.push(Copy {
            src: Loc {
                buf: r.maxes,
                offset: r.run.m * 4,
            },
            bytes: 4,
            dsts,
        });
    }
    lw.exchange(&format!("{name}.max"), copies);

    let step = lw.compute_step();
    for r in &runs {
        lw.call(
            r.run.tile,
            step,
            ExpShift::new(r.real, r.run.nbk * AMP_WIDTH, g, op.scale),
            &[
                ("in", at(r.scores)),
                ("maxes", at(r.maxes)),
                ("out", at(r.e)),
                ("sum", r.sum),
            ],
        );
        amp(
            lw,
            r.run.tile,
            step,
            name,
            (1, r.run.nbk, kc),
            at(r.e),
            at(r.vpart),
            r.ev,
        );
    }
    let mut copies = Vec::new();
    for r in runs.iter().filter(|r| r.run.m > 0) {
        let (_, _, _, ev_all, sums, _) = combine[(r.run.b * op.heads + r.run.h) as usize];
        copies.push(Copy {
            src: r.ev,
            bytes: op.dp * 2,
            dsts: vec![Loc {
                buf: ev_all,
                offset: r.run.m * op.dp * 2,
            }],
        });
        copies.push(Copy {
            src: r.sum,
            bytes: 4,
            dsts: vec![Loc {
                buf: sums,
                offset: r.run.m * 4,
            }],
        });
    }
    lw.exchange(&format!("{name}.ev"), copies);

    let step = lw.compute_step();
    let mut out = Vec::new();
    for &(tile, b, h, ev_all, sums, ctx) in &combine {
        lw.call(
            tile,
            step,
            ReduceNorm::new(g, op.dp),
            &[("in", at(ev_all)), ("sums", at(sums)), ("out", at(ctx))],
        );
        let r = b * op.tq;
        for c in 0..kc {
            out.extend(op.ctx_chunk(ctx, c * 32, r..r + 1, h, c));
        }
    }
    Ok(op.context(out))
}

/// A row tile's `S^T = K Q^T`: in `prep`, the padding of its `nbq` query blocks
/// (`bufs`: queries, `Q^T`, keys, scores) and of its `kp` stored keys past the
/// `real` ones zeroed, the queries transposed into the AMP weight layout, and, for
/// packed heads, the neighbouring heads' rows of `Q^T` zeroed (their columns in
/// the head's chunks then add nothing to `S^T`); the product in `step`. Two
/// steps, with no exchange between them, run as one on the tile, but the
/// queries as landed are dead before the scores and the AMP's partials exist:
/// at 27 So400m layers at batch 4 that is what the attention's tiles lack.
fn scores(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    (prep, step): (Step, Step),
    (s, nbq): (&Slot, u32),
    [q_amp, qt, k, st]: [BufId; 4],
    (real, kp): (u32, u32),
) {
    let kc = op.padded().0;
    let at = |buf| Loc { buf, offset: 0 };
    zero_rows(lw, (s.tile, prep), kc, q_amp, (s.rows, nbq * AMP_WIDTH));
    zero_rows(lw, (s.tile, prep), kc, k, (real, kp));
    lw.call(
        s.tile,
        prep,
        TransposeBlocks::new(kc, nbq),
        &[("in", at(q_amp)), ("out", at(qt))],
    );
    if op.stride != op.dp {
        let lead = op.lead(s.h);
        for (row0, rows) in [(0, lead), (lead + op.d, kc * AMP_WIDTH - lead - op.d)] {
            if rows > 0 {
                lw.call(
                    s.tile,
                    prep,
                    ZeroFill::new(nbq, rows * 32, kc * 512),
                    &[(
                        "out",
                        Loc {
                            buf: qt,
                            offset: row0 * 32,
                        },
                    )],
                );
            }
        }
    }
    amp(
        lw,
        s.tile,
        step,
        op.name,
        (kp, kc, nbq),
        at(k),
        at(qt),
        at(st),
    );
}

/// The copies of a transposer's blocks of `V^T` (its run from key block
/// `t.run.blk0`) to `dsts`, each the `vt` buffer of a row tile whose blocks start
/// at key block `kb0`: of each block the rows of the head's `d` real dimensions
/// (the padding dimensions are zeros, and `V^T e^T` leaves them out).
fn vt_copies(op: &Attention<'_>, t: &ValueTransposer, kb0: u32, dsts: &[BufId]) -> Vec<Copy> {
    if dsts.is_empty() {
        return Vec::new();
    }
    let kc = op.padded().0;
    let vt_block = op.d * 32;
    let lead = op.lead(t.run.h);
    let blocks = if op.d == op.dp {
        // Whole blocks are contiguous: one copy.
        vec![(0, t.run.nbk * kc * 512)]
    } else {
        (0..t.run.nbk).map(|j| (j, vt_block)).collect()
    };
    blocks
        .into_iter()
        .map(|(j, bytes)| Copy {
            src: Loc {
                buf: t.out,
                offset: j * kc * 512 + lead * 32,
            },
            bytes,
            dsts: dsts
                .iter()
                .map(|&buf| Loc {
                    buf,
                    offset: (t.run.blk0 - kb0 + j) * vt_block,
                })
                .collect(),
        })
        .collect()
}

/// One AMP product `(rows, kc, nb)` with its ping-pong partial buffers.
#[allow(clippy::too_many_arguments)]
pub(super) fn amp(
    lw: &mut Lowering<'_>,
    tile: u32,
    step: Step,
    name: &str,
    (rows, kc, nb): (u32, u32, u32),
    a: Loc,
    w: Loc,
    out: Loc,
) {
    let mm = AmpMatmul::new(rows, kc, nb);
    let mut ops = vec![("a", a), ("w", w), ("out", out)];
    for (idx, pname) in ["p0", "p1"].into_iter().enumerate() {
        if mm.partials() > idx as u32 {
            let pp = lw.buffer(
                tile,
                format!("{name}.{pname}"),
                rows * 32,
                Category::Partial,
            );
            ops.push((pname, Loc { buf: pp, offset: 0 }));
        }
    }
    lw.call(tile, step, mm, &ops);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_pack_where_each_fits_its_padded_chunks() {
        // So400m: 16 heads of 72, every other one 8 columns into a block.
        assert!(packs_heads(16, 72));
        // The tiny layer's 4 heads of 8, and heads of 20 whose last ends on the
        // tensor's last column.
        assert!(packs_heads(4, 8));
        assert!(packs_heads(4, 20));
        // Already whole blocks: nothing to gain.
        assert!(!packs_heads(12, 64));
        // Heads of 12: the second starts 12 columns into a block, and its 12
        // columns do not fit the 16 its one chunk covers.
        assert!(!packs_heads(4, 12));
        // Three heads of 8 end mid-block: the projection's width must be whole
        // blocks.
        assert!(!packs_heads(3, 8));
    }

    #[test]
    fn the_path_follows_from_the_shapes() {
        // So400m at batch 2 on the C600: 46 tiles a pair, 16 query rows a tile.
        let g = geometry(1472, false, (2, 16, 729, 729), 0.118);
        assert_eq!(g, (Path::Transposed, 46, 16, 1, 46));
        assert_eq!(geometry(1472, true, (2, 16, 729, 729), 0.118).0, Path::Rows);
        // The pooling head's single query cuts the keys.
        assert_eq!(
            geometry(1472, false, (2, 16, 1, 729), 0.118).0,
            Path::SingleQuery
        );
        // Under 12 keys the column softmax does not apply.
        assert_eq!(geometry(16, false, (1, 2, 8, 8), 0.5).0, Path::Rows);
    }
}

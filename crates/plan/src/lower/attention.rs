//! The attention rule: per image and head, `softmax(Q K^T * scale) V`, where
//! Q, K and V are columns of head-padded projections (each head's `d` columns
//! stored in `dp`, a multiple of 16, the padding exact zeros).
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
//!   transposed back to the context's layout, each query row scaled by its `1/sum`.
//!
//! The row path (`Q K^T`, the keys transposed by the transposers, the row softmax
//! on the AMP's block layout, `e V`) is taken under 12 keys, where the column
//! softmax's six workers would not have two rows each, and by the test hook
//! `LowerOptions::row_attention`. Its AMP calls stream only the tile's few query
//! rows, so their fixed cost dominates: at So400m sizes it took 196k cycles a tile
//! where the transposed path takes 127k.
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
    AmpMatmul, BlocksToRows, ExpShift, Kernel, Rearrange, ReduceNorm, RowMax, ScaleRows, Softmax,
    SoftmaxCols, TransposeBlocks, ZeroFill,
};

use crate::PlanError;
use crate::dist::{DistTensor, Part, redistribute};
use crate::ir::*;
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
    pub dp: u32,
    pub scale: f32,
}

impl Attention<'_> {
    /// Chunks of a head's dimensions, the keys padded to 16, and their blocks.
    fn padded(&self) -> (u32, u32, u32) {
        let tp = self.t.next_multiple_of(AMP_WIDTH);
        (self.dp / AMP_WIDTH, tp, tp / AMP_WIDTH)
    }

    /// Chunk `c` of head `h`'s rows `rows`, stored as `[rows][16]` at `buf +
    /// offset`, in a tensor whose head columns start at `first`.
    fn chunk(
        &self,
        buf: BufId,
        offset: u32,
        rows: std::ops::Range<u32>,
        first: u32,
        h: u32,
        c: u32,
    ) -> Part {
        let c0 = first + h * self.dp + c * AMP_WIDTH;
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

    /// The `kc` chunks of head `h`'s keys (or values) `16 blk0..16 (blk0 + nbk)` of
    /// image `b` (those before the last token), stored `[kc][16 nbk][16]` in `buf`,
    /// from a tensor whose head columns start at `first`.
    fn run_parts(
        &self,
        buf: BufId,
        (b, h): (u32, u32),
        blk0: u32,
        nbk: u32,
        first: u32,
    ) -> Vec<Part> {
        let t0 = blk0 * AMP_WIDTH;
        let t1 = ((blk0 + nbk) * AMP_WIDTH).min(self.t);
        if t1 <= t0 {
            return Vec::new();
        }
        let r = b * self.t;
        (0..self.dp / AMP_WIDTH)
            .map(|c| self.chunk(buf, c * nbk * 512, r + t0..r + t1, first, h, c))
            .collect()
    }
}

/// A transposer's run of `nbk` key blocks from `blk0`, stored `[kc][16 nbk][16]` in
/// `part`: the rows past the last token zeroed (the key dimension is padded to 16),
/// then transposed to `out` (`[nbk][kc][16][16]`).
fn transpose_run(
    lw: &mut Lowering<'_>,
    op: &Attention<'_>,
    (tile, step): (u32, Step),
    (blk0, nbk): (u32, u32),
    part: BufId,
    out: Loc,
) {
    let kc = op.dp / AMP_WIDTH;
    let real = op.t.saturating_sub(blk0 * AMP_WIDTH).min(nbk * AMP_WIDTH);
    let pad = nbk * AMP_WIDTH - real;
    if pad > 0 {
        lw.call(
            tile,
            step,
            ZeroFill::new(kc, pad * 32, nbk * 512),
            &[(
                "out",
                Loc {
                    buf: part,
                    offset: real * 32,
                },
            )],
        );
    }
    lw.call(
        tile,
        step,
        TransposeBlocks::new(kc, nbk),
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
    tile: u32,
    b: u32,
    h: u32,
    pair: u32,
    r0: u32,
    rows: u32,
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
    tile: u32,
    b: u32,
    h: u32,
    pair: u32,
    blk0: u32,
    nbk: u32,
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
    let (kc, tp, tb) = op.padded();
    let pairs = op.batch * op.heads;
    // Tiles per (image, head): as many as divide the chip. Up to `tq` of them own
    // query rows; up to `tb` of them share the transposition of the keys (with a
    // single query, the pooling head, most of a group only transposes).
    let group = (tiles / pairs).clamp(1, op.tq.max(tb));
    let rows_per = op.tq.div_ceil(group.min(op.tq));
    let per_rows = op.tq.div_ceil(rows_per);
    let share = tb.div_ceil(group.min(tb));
    let per_t = tb.div_ceil(share);
    if op.tq == 1 && per_t >= 2 {
        lw.plan.decisions.push(format!(
            "{name}: {} images x {} heads, one query cut over {} tiles each of {} key blocks; keys {} padded to {}",
            op.batch, op.heads, per_t, share, op.t, tp
        ));
        return single_query(lw, op, group, share, per_t);
    }
    let nbq = rows_per.div_ceil(AMP_WIDTH);
    if !lw.opts.row_attention && SoftmaxCols::new(nbq, tp, op.t, op.scale).validate().is_ok() {
        lw.plan.decisions.push(format!(
            "{name}: {} images x {} heads, {} tiles each: {} with {} query rows, {} transposing {} value blocks; keys {} padded to {}; scores transposed (K Q^T)",
            op.batch, op.heads, group, per_rows, rows_per, per_t, share, op.t, tp
        ));
        return transposed(lw, op, group, (rows_per, per_rows), (share, per_t));
    }
    lw.plan.decisions.push(format!(
        "{name}: {} images x {} heads, {} tiles each: {} with {} query rows, {} transposing {} key blocks; keys {} padded to {}",
        op.batch, op.heads, group, per_rows, rows_per, per_t, share, op.t, tp
    ));
    let mut work = Vec::new();
    let mut trans = Vec::new();
    for b in 0..op.batch {
        for h in 0..op.heads {
            let pair = b * op.heads + h;
            let tile_of = |m: u32| (pair * group + m) % tiles;
            for m in 0..per_rows {
                let tile = tile_of(m);
                let r0 = m * rows_per;
                let rows = rows_per.min(op.tq - r0);
                // The kernel says whether its block-layout variant takes this shape.
                let blocked = Softmax::with_ld(rows, op.t, tp, op.scale)
                    .with_blocked()
                    .validate()
                    .is_ok();
                let mut blk = |what: &str, bytes: u32| {
                    lw.buffer(tile, format!("{name}.{what}"), bytes, Category::Activation)
                };
                work.push(RowWork {
                    tile,
                    b,
                    h,
                    pair,
                    r0,
                    rows,
                    q_amp: blk("q", rows * op.dp * 2),
                    w1: blk("kt", tp * op.dp * 2),
                    s_blk: blk("scores.amp", rows * tp * 2),
                    s_rm: (!blocked).then(|| blk("scores", rows * tp * 2)),
                    recip: blk("recip", rows * 4),
                    v_w: blk("v", tp * op.dp * 2),
                    ctx: blk("ctx", rows * op.dp * 2),
                });
            }
            for m in 0..per_t {
                let tile = tile_of(m);
                let blk0 = m * share;
                let nbk = share.min(tb - blk0);
                let kpart = lw.buffer(
                    tile,
                    format!("{name}.k"),
                    nbk * AMP_WIDTH * op.dp * 2,
                    Category::Activation,
                );
                let (out, own) = if m < per_rows {
                    let own = work.len() - per_rows as usize + m as usize;
                    (
                        Loc {
                            buf: work[own].w1,
                            offset: blk0 * kc * 512,
                        },
                        Some(own),
                    )
                } else {
                    let buf = lw.buffer(
                        tile,
                        format!("{name}.kt.part"),
                        nbk * kc * 512,
                        Category::Activation,
                    );
                    (Loc { buf, offset: 0 }, None)
                };
                trans.push(Transposer {
                    tile,
                    b,
                    h,
                    pair,
                    blk0,
                    nbk,
                    kpart,
                    out,
                    own,
                });
            }
        }
    }
    let (q_src, q_first) = op.q;
    let (k_src, k_first) = op.k;
    let (v_src, v_first) = op.v;

    // Queries to the row tiles, key blocks to the transposers.
    let mut q_parts = Vec::new();
    for w in &work {
        let r = if op.shared_q { 0 } else { w.b * op.tq } + w.r0;
        for c in 0..kc {
            q_parts.push(op.chunk(w.q_amp, c * w.rows * 32, r..r + w.rows, q_first, w.h, c));
        }
    }
    let key_parts: Vec<Part> = trans
        .iter()
        .flat_map(|t| op.run_parts(t.kpart, (t.b, t.h), t.blk0, t.nbk, k_first))
        .collect();
    let mut copies = op.gather(q_src, q_parts, "queries")?;
    copies.extend(op.gather(k_src, key_parts, "keys")?);
    lw.exchange(&format!("{name}.qk"), copies);

    // K^T in the AMP weight layout, each transposer its blocks (zero rows past the
    // last token: the key dimension is padded to 16), then to every row tile.
    let step = lw.compute_step();
    for t in &trans {
        transpose_run(lw, op, (t.tile, step), (t.blk0, t.nbk), t.kpart, t.out);
    }
    let mut copies = Vec::new();
    for t in &trans {
        let dsts: Vec<Loc> = work
            .iter()
            .enumerate()
            .filter(|(i, w)| w.pair == t.pair && t.own != Some(*i))
            .map(|(_, w)| Loc {
                buf: w.w1,
                offset: t.blk0 * kc * 512,
            })
            .collect();
        if !dsts.is_empty() {
            copies.push(Copy {
                src: t.out,
                bytes: t.nbk * kc * 512,
                dsts,
            });
        }
    }
    lw.exchange(&format!("{name}.kt"), copies);

    // Scores, softmax, probabilities back to chunk-major (into the scores' AMP
    // buffer, free once converted).
    let step = lw.compute_step();
    for w in &work {
        let at = |buf| Loc { buf, offset: 0 };
        amp(
            lw,
            w.tile,
            step,
            name,
            (w.rows, kc, tb),
            at(w.q_amp),
            at(w.w1),
            at(w.s_blk),
        );
        let softmax = Softmax::with_ld(w.rows, op.t, tp, op.scale);
        let Some(s_rm) = w.s_rm else {
            // In place on the AMP's block layout: `e` is what `e V` reads.
            lw.call(
                w.tile,
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
            w.tile,
            step,
            BlocksToRows::new(w.rows, tb),
            &[("in", at(w.s_blk)), ("out", at(s_rm))],
        );
        lw.call(
            w.tile,
            step,
            softmax.with_recip(),
            &[("in", at(s_rm)), ("out", at(s_rm)), ("recip", at(w.recip))],
        );
        let mut re = Rearrange::new(w.rows, tp);
        if let Some(al) = lw.opts.rearrange_declared_align {
            re.declared_align = al;
        }
        lw.call(w.tile, step, re, &[("in", at(s_rm)), ("out", at(w.s_blk))]);
    }

    // Values (their block layout is the AMP weight layout of `P V` as it stands),
    // then P V.
    let mut value_parts = Vec::new();
    for w in &work {
        let r = w.b * op.t;
        for c in 0..kc {
            value_parts.push(op.chunk(w.v_w, c * tp * 32, r..r + op.t, v_first, w.h, c));
        }
    }
    let copies = op.gather(v_src, value_parts, "values")?;
    lw.exchange(&format!("{name}.v"), copies);
    let pad_rows = tp - op.t;
    let step = lw.compute_step();
    let mut out = Vec::new();
    for w in &work {
        if pad_rows > 0 {
            lw.call(
                w.tile,
                step,
                ZeroFill::new(kc, pad_rows * 32, tp * 32),
                &[(
                    "out",
                    Loc {
                        buf: w.v_w,
                        offset: op.t * 32,
                    },
                )],
            );
        }
        let at = |buf| Loc { buf, offset: 0 };
        amp(
            lw,
            w.tile,
            step,
            name,
            (w.rows, tb, kc),
            at(w.s_blk),
            at(w.v_w),
            at(w.ctx),
        );
        lw.call(
            w.tile,
            step,
            ScaleRows::new(w.rows, kc),
            &[("x", at(w.ctx)), ("f", at(w.recip))],
        );
        let r = w.b * op.tq + w.r0;
        for c in 0..kc {
            out.push(op.chunk(w.ctx, c * w.rows * 32, r..r + w.rows, 0, w.h, c));
        }
    }
    Ok(DistTensor {
        rows: op.batch * op.tq,
        cols: op.heads * op.dp,
        elem_bytes: 2,
        parts: out,
    })
}

/// A tile of the transposed attention that owns query rows `r0..r0 + rows` of one
/// (image, head) pair, padded to `16 nbq` rows.
struct ColWork {
    tile: u32,
    b: u32,
    h: u32,
    pair: u32,
    r0: u32,
    rows: u32,
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
    /// `V^T`, `[tb][kc 16][16]`, filled by the transposers.
    vt: BufId,
    /// `(e V)^T = V^T e^T`, `[nbq][kc 16][16]`.
    ctxt: BufId,
    /// The context, `[kc][16 nbq][16]`.
    ctx: BufId,
}

/// A tile that transposes value blocks `blk0..blk0 + nbk` of one pair for the
/// pair's row tiles.
struct ValueTransposer {
    tile: u32,
    pair: u32,
    b: u32,
    h: u32,
    blk0: u32,
    nbk: u32,
    /// Its values, `[kc][16 nbk][16]`.
    vpart: BufId,
    /// Their transpose, `[nbk][kc][16][16]`: blocks of `V^T`'s chunks.
    out: BufId,
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
    (rows_per, per_rows): (u32, u32),
    (share, per_t): (u32, u32),
) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let tiles = lw.machine.tiles;
    let (kc, tp, tb) = op.padded();
    let mut work = Vec::new();
    let mut trans = Vec::new();
    for b in 0..op.batch {
        for h in 0..op.heads {
            let pair = b * op.heads + h;
            let tile_of = |m: u32| (pair * group + m) % tiles;
            for m in 0..per_rows {
                let tile = tile_of(m);
                let r0 = m * rows_per;
                let rows = rows_per.min(op.tq - r0);
                let nbq = rows.div_ceil(AMP_WIDTH);
                let mut blk = |what: &str, bytes: u32| {
                    lw.buffer(tile, format!("{name}.{what}"), bytes, Category::Activation)
                };
                work.push(ColWork {
                    tile,
                    b,
                    h,
                    pair,
                    r0,
                    rows,
                    nbq,
                    q_amp: blk("q", nbq * AMP_WIDTH * op.dp * 2),
                    qt: blk("qt", nbq * kc * 512),
                    k: blk("k", tp * op.dp * 2),
                    st: blk("scores.t", nbq * tp * 32),
                    recip: blk("recip", nbq * 64),
                    vt: blk("vt", tp * op.dp * 2),
                    ctxt: blk("ctx.t", nbq * op.dp * 32),
                    ctx: blk("ctx", nbq * AMP_WIDTH * op.dp * 2),
                });
            }
            for m in 0..per_t {
                let tile = tile_of(m);
                let blk0 = m * share;
                let nbk = share.min(tb - blk0);
                let mut blk = |what: &str, bytes: u32| {
                    lw.buffer(tile, format!("{name}.{what}"), bytes, Category::Activation)
                };
                trans.push(ValueTransposer {
                    tile,
                    pair,
                    b,
                    h,
                    blk0,
                    nbk,
                    vpart: blk("v.part", nbk * kc * 512),
                    out: blk("vt.part", nbk * kc * 512),
                });
            }
        }
    }
    let (q_src, q_first) = op.q;
    let (k_src, k_first) = op.k;
    let (v_src, v_first) = op.v;

    // Queries and the head's keys to the row tiles, value blocks to the
    // transposers, all in one exchange.
    let mut q_parts = Vec::new();
    let mut k_parts = Vec::new();
    for w in &work {
        let r = if op.shared_q { 0 } else { w.b * op.tq } + w.r0;
        let rk = w.b * op.t;
        for c in 0..kc {
            q_parts.push(op.chunk(w.q_amp, c * w.nbq * 512, r..r + w.rows, q_first, w.h, c));
            k_parts.push(op.chunk(w.k, c * tp * 32, rk..rk + op.t, k_first, w.h, c));
        }
    }
    let v_parts: Vec<Part> = trans
        .iter()
        .flat_map(|t| op.run_parts(t.vpart, (t.b, t.h), t.blk0, t.nbk, v_first))
        .collect();
    let mut copies = op.gather(q_src, q_parts, "queries")?;
    copies.extend(op.gather(k_src, k_parts, "keys")?);
    copies.extend(op.gather(v_src, v_parts, "values")?);
    lw.exchange(&format!("{name}.qkv"), copies);

    // Value blocks transposed (rows past the last token zeroed first: the key
    // dimension is padded to 16); per row tile, `Q^T`, `S^T = K Q^T` and the
    // softmax down its columns.
    let step = lw.compute_step();
    let at = |buf| Loc { buf, offset: 0 };
    for t in &trans {
        transpose_run(lw, op, (t.tile, step), (t.blk0, t.nbk), t.vpart, at(t.out));
    }
    let key_pad = tp - op.t;
    for w in &work {
        let q_pad = w.nbq * AMP_WIDTH - w.rows;
        if q_pad > 0 {
            lw.call(
                w.tile,
                step,
                ZeroFill::new(kc, q_pad * 32, w.nbq * 512),
                &[(
                    "out",
                    Loc {
                        buf: w.q_amp,
                        offset: w.rows * 32,
                    },
                )],
            );
        }
        if key_pad > 0 {
            lw.call(
                w.tile,
                step,
                ZeroFill::new(kc, key_pad * 32, tp * 32),
                &[(
                    "out",
                    Loc {
                        buf: w.k,
                        offset: op.t * 32,
                    },
                )],
            );
        }
        lw.call(
            w.tile,
            step,
            TransposeBlocks::new(kc, w.nbq),
            &[("in", at(w.q_amp)), ("out", at(w.qt))],
        );
        amp(
            lw,
            w.tile,
            step,
            name,
            (tp, kc, w.nbq),
            at(w.k),
            at(w.qt),
            at(w.st),
        );
        lw.call(
            w.tile,
            step,
            SoftmaxCols::new(w.nbq, tp, op.t, op.scale),
            &[("in", at(w.st)), ("out", at(w.st)), ("recip", at(w.recip))],
        );
    }

    // `V^T` to every row tile of the pair (a transposer's own row tile included).
    let mut copies = Vec::new();
    for t in &trans {
        let dsts: Vec<Loc> = work
            .iter()
            .filter(|w| w.pair == t.pair)
            .map(|w| Loc {
                buf: w.vt,
                offset: t.blk0 * kc * 512,
            })
            .collect();
        if !dsts.is_empty() {
            copies.push(Copy {
                src: at(t.out),
                bytes: t.nbk * kc * 512,
                dsts,
            });
        }
    }
    lw.exchange(&format!("{name}.vt"), copies);

    // `(e V)^T = V^T e^T`, back to the context's layout, each query row scaled by
    // its `1/sum`.
    let step = lw.compute_step();
    let mut out = Vec::new();
    for w in &work {
        amp(
            lw,
            w.tile,
            step,
            name,
            (kc * AMP_WIDTH, tb, w.nbq),
            at(w.vt),
            at(w.st),
            at(w.ctxt),
        );
        lw.call(
            w.tile,
            step,
            TransposeBlocks::new(w.nbq, kc),
            &[("in", at(w.ctxt)), ("out", at(w.ctx))],
        );
        lw.call(
            w.tile,
            step,
            ScaleRows::new(w.nbq * AMP_WIDTH, kc),
            &[("x", at(w.ctx)), ("f", at(w.recip))],
        );
        let r = w.b * op.tq + w.r0;
        for c in 0..kc {
            out.push(op.chunk(w.ctx, c * w.nbq * 512, r..r + w.rows, 0, w.h, c));
        }
    }
    Ok(DistTensor {
        rows: op.batch * op.tq,
        cols: op.heads * op.dp,
        elem_bytes: 2,
        parts: out,
    })
}

/// One tile of a single query's key cut: key blocks `blk0..blk0 + nbk` of one pair.
struct KeyRun {
    tile: u32,
    b: u32,
    h: u32,
    /// Its place in the pair's group; member 0 combines.
    m: u32,
    blk0: u32,
    nbk: u32,
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
    let tiles = lw.machine.tiles;
    let (kc, _, tb) = op.padded();
    let mut runs: Vec<KeyRun> = Vec::new();
    // Member 0's combination buffers, per pair.
    let mut combine = Vec::new();
    for b in 0..op.batch {
        for h in 0..op.heads {
            let pair = b * op.heads + h;
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
            combine.push((tile0, b, h, ev_all, sums, ctx));
            for m in 0..g {
                let tile = (pair * group + m) % tiles;
                let blk0 = m * share;
                let nbk = share.min(tb - blk0);
                let real = op.t.min((blk0 + nbk) * AMP_WIDTH) - blk0 * AMP_WIDTH;
                let mut blk = |what: &str, bytes: u32| {
                    lw.buffer(tile, format!("{name}.{what}"), bytes, Category::Activation)
                };
                let q = blk("q", op.dp * 2);
                let kpart = blk("k", nbk * AMP_WIDTH * op.dp * 2);
                let vpart = blk("v", nbk * AMP_WIDTH * op.dp * 2);
                let kt = blk("kt", nbk * kc * 512);
                let scores = blk("scores", nbk * AMP_WIDTH * 2);
                let maxes = blk("maxes", g * 4);
                let e = blk("e", nbk * AMP_WIDTH * 2);
                let (ev, sum) = if m == 0 {
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
                    tile,
                    b,
                    h,
                    m,
                    blk0,
                    nbk,
                    real,
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
    }
    let (q_src, q_first) = op.q;
    let (k_src, k_first) = op.k;
    let (v_src, v_first) = op.v;
    let (mut q_parts, mut k_parts, mut v_parts) = (Vec::new(), Vec::new(), Vec::new());
    for r in &runs {
        let qr = if op.shared_q { 0 } else { r.b * op.tq };
        let k0 = r.b * op.t + r.blk0 * AMP_WIDTH;
        let keys = k0..k0 + r.real;
        for c in 0..kc {
            q_parts.push(op.chunk(r.q, c * 32, qr..qr + 1, q_first, r.h, c));
            let at = c * r.nbk * 512;
            k_parts.push(op.chunk(r.kpart, at, keys.clone(), k_first, r.h, c));
            v_parts.push(op.chunk(r.vpart, at, keys.clone(), v_first, r.h, c));
        }
    }
    let mut copies = op.gather(q_src, q_parts, "queries")?;
    copies.extend(op.gather(k_src, k_parts, "keys")?);
    copies.extend(op.gather(v_src, v_parts, "values")?);
    lw.exchange(&format!("{name}.qkv"), copies);

    // Scores of each run (zero key and value rows past the last token) and their
    // maximum.
    let step = lw.compute_step();
    let at = |buf| Loc { buf, offset: 0 };
    for r in &runs {
        let pad = r.nbk * AMP_WIDTH - r.real;
        if pad > 0 {
            for buf in [r.kpart, r.vpart] {
                lw.call(
                    r.tile,
                    step,
                    ZeroFill::new(kc, pad * 32, r.nbk * 512),
                    &[(
                        "out",
                        Loc {
                            buf,
                            offset: r.real * 32,
                        },
                    )],
                );
            }
        }
        lw.call(
            r.tile,
            step,
            TransposeBlocks::new(kc, r.nbk),
            &[("in", at(r.kpart)), ("out", at(r.kt))],
        );
        amp(
            lw,
            r.tile,
            step,
            name,
            (1, kc, r.nbk),
            at(r.q),
            at(r.kt),
            at(r.scores),
        );
        lw.call(
            r.tile,
            step,
            RowMax::new(r.real),
            &[
                ("in", at(r.scores)),
                (
                    "out",
                    Loc {
                        buf: r.maxes,
                        offset: r.m * 4,
                    },
                ),
            ],
        );
    }
    let mut copies = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let pair0 = i - r.m as usize;
        let dsts = (0..g as usize)
            .filter(|&o| o != r.m as usize)
            .map(|o| Loc {
                buf: runs[pair0 + o].maxes,
                offset: r.m * 4,
            })
            .collect();
        copies.push(Copy {
            src: Loc {
                buf: r.maxes,
                offset: r.m * 4,
            },
            bytes: 4,
            dsts,
        });
    }
    lw.exchange(&format!("{name}.max"), copies);

    let step = lw.compute_step();
    for r in &runs {
        lw.call(
            r.tile,
            step,
            ExpShift::new(r.real, r.nbk * AMP_WIDTH, g, op.scale),
            &[
                ("in", at(r.scores)),
                ("maxes", at(r.maxes)),
                ("out", at(r.e)),
                ("sum", r.sum),
            ],
        );
        amp(
            lw,
            r.tile,
            step,
            name,
            (1, r.nbk, kc),
            at(r.e),
            at(r.vpart),
            r.ev,
        );
    }
    let mut copies = Vec::new();
    for r in runs.iter().filter(|r| r.m > 0) {
        let (_, _, _, ev_all, sums, _) = combine[(r.b * op.heads + r.h) as usize];
        copies.push(Copy {
            src: r.ev,
            bytes: op.dp * 2,
            dsts: vec![Loc {
                buf: ev_all,
                offset: r.m * op.dp * 2,
            }],
        });
        copies.push(Copy {
            src: r.sum,
            bytes: 4,
            dsts: vec![Loc {
                buf: sums,
                offset: r.m * 4,
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
            out.push(op.chunk(ctx, c * 32, r..r + 1, 0, h, c));
        }
    }
    Ok(DistTensor {
        rows: op.batch * op.tq,
        cols: op.heads * op.dp,
        elem_bytes: 2,
        parts: out,
    })
}

/// One AMP product `(rows, kc, nb)` with its ping-pong partial buffers.
#[allow(clippy::too_many_arguments)]
fn amp(
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

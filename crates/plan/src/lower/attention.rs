//! The attention rule: per image and head, `softmax(Q K^T * scale) V`, where
//! Q, K and V are columns of head-padded projections (each head's `d` columns
//! stored in `dp`, a multiple of 16, the padding exact zeros).
//!
//! Every (image, head) pair gets a group of tiles; each tile of a group owns a run
//! of query rows and holds all of that head's keys and values, so its scores rows
//! are whole and the softmax needs no exchange. Per tile:
//! - exchange: its queries in the AMP's chunk-major layout, and the head's keys in
//!   block layout (both straight from the projections' blocks);
//! - compute: zero the key rows past the last token (the key dimension is padded to
//!   16), transpose the key blocks into the AMP weight layout (`K^T`);
//! - compute: scores on the AMP, to row-major, softmax (f32, row maximum
//!   subtracted, padding columns written as zeros), back to chunk-major;
//! - exchange: the head's values, whose block layout is the AMP weight layout of
//!   `P V` as it stands;
//! - compute: zero the value rows past the last token, `P V` on the AMP.
//!
//! The result is the head-padded context `[batch * tq, heads * dp]` in block
//! layout, ready for the output projection.

use tessera_kernels::{AmpMatmul, BlocksToRows, Rearrange, Softmax, TransposeBlocks, ZeroFill};

use crate::PlanError;
use crate::dist::{DistTensor, Part, redistribute};
use crate::ir::*;
use crate::lower::ctx::Lowering;
use crate::matmul::AMP_WIDTH;

pub(crate) struct Attention<'a> {
    pub name: &'a str,
    /// `[q_batch * tq, heads * dp]`; `q_batch` is `batch` or 1 (one query set shared
    /// by every image, as the pooling head's probe).
    pub q: &'a DistTensor,
    /// `[batch * t, heads * dp]` each.
    pub k: &'a DistTensor,
    pub v: &'a DistTensor,
    pub batch: u32,
    pub shared_q: bool,
    pub tq: u32,
    pub t: u32,
    pub heads: u32,
    pub dp: u32,
    pub scale: f32,
}

struct TileWork {
    tile: u32,
    b: u32,
    h: u32,
    r0: u32,
    rows: u32,
    q_amp: BufId,
    k_blk: BufId,
    w1: BufId,
    s_blk: BufId,
    s_rm: BufId,
    v_w: BufId,
    ctx: BufId,
}

pub(crate) fn attention(lw: &mut Lowering<'_>, op: &Attention<'_>) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let tiles = lw.machine.tiles;
    let kc = op.dp / AMP_WIDTH;
    let tp = op.t.next_multiple_of(AMP_WIDTH);
    let tb = tp / AMP_WIDTH;
    let pairs = op.batch * op.heads;
    // Tiles per (image, head): as many as divide the chip, but no more than rows.
    let per = (tiles / pairs).clamp(1, op.tq);
    let rows_per = op.tq.div_ceil(per);
    let per = op.tq.div_ceil(rows_per);
    lw.plan.decisions.push(format!(
        "{name}: {} images x {} heads, {} tiles each, {} query rows per tile, keys {} padded to {}",
        op.batch, op.heads, per, rows_per, op.t, tp
    ));
    let mut work = Vec::new();
    for b in 0..op.batch {
        for h in 0..op.heads {
            let pair = b * op.heads + h;
            for g in 0..per {
                let r0 = g * rows_per;
                let rows = rows_per.min(op.tq - r0);
                let tile = (pair * per + g) % tiles;
                let blk = |lw: &mut Lowering<'_>, what: &str, bytes: u32, cat: Category| {
                    lw.buffer(tile, format!("{name}.{what}"), bytes, cat)
                };
                let q_amp = blk(lw, "q", rows * op.dp * 2, Category::Activation);
                let k_blk = blk(lw, "k", tp * op.dp * 2, Category::Activation);
                let w1 = blk(lw, "kt", tp * op.dp * 2, Category::Activation);
                let s_blk = blk(lw, "scores.amp", rows * tp * 2, Category::Activation);
                let s_rm = blk(lw, "scores", rows * tp * 2, Category::Activation);
                let v_w = blk(lw, "v", tp * op.dp * 2, Category::Activation);
                let ctx = blk(lw, "ctx", rows * op.dp * 2, Category::Activation);
                work.push(TileWork {
                    tile,
                    b,
                    h,
                    r0,
                    rows,
                    q_amp,
                    k_blk,
                    w1,
                    s_blk,
                    s_rm,
                    v_w,
                    ctx,
                });
            }
        }
    }
    let cols = op.heads * op.dp;
    let tensor = |rows: u32, parts: Vec<Part>| DistTensor {
        rows,
        cols,
        elem_bytes: 2,
        parts,
    };
    // Chunk `c` of a head's rows `rows` stored as `[rows][16]` at `buf + offset`.
    let chunk = |buf: BufId, offset: u32, rows: std::ops::Range<u32>, h: u32, c: u32| Part {
        at: Loc { buf, offset },
        rows,
        cols: h * op.dp + c * AMP_WIDTH..h * op.dp + (c + 1) * AMP_WIDTH,
    };
    let q_row0 = |w: &TileWork| if op.shared_q { 0 } else { w.b * op.tq } + w.r0;
    let key_parts = |pick: &dyn Fn(&TileWork) -> BufId| {
        let mut parts = Vec::new();
        for w in &work {
            for c in 0..kc {
                let r = w.b * op.t;
                parts.push(chunk(pick(w), c * tp * 32, r..r + op.t, w.h, c));
            }
        }
        parts
    };
    let bad = |what: &str, e: crate::dist::DistError| {
        PlanError::Unsupported(format!("{name}: {what} do not cover the head: {e}"))
    };

    // Queries and keys.
    let mut q_parts = Vec::new();
    for w in &work {
        for c in 0..kc {
            let r = q_row0(w);
            q_parts.push(chunk(w.q_amp, c * w.rows * 32, r..r + w.rows, w.h, c));
        }
    }
    let mut copies = redistribute(op.q, &tensor(op.q.rows, q_parts)).map_err(|e| bad("queries", e))?;
    copies.extend(
        redistribute(op.k, &tensor(op.k.rows, key_parts(&|w| w.k_blk))).map_err(|e| bad("keys", e))?,
    );
    lw.exchange(&format!("{name}.qk"), copies);

    // K^T in the AMP weight layout.
    let pad_rows = tp - op.t;
    let step = lw.compute_step();
    for w in &work {
        if pad_rows > 0 {
            lw.call(
                w.tile,
                step,
                ZeroFill::new(kc, pad_rows * 32, tp * 32),
                &[("out", Loc { buf: w.k_blk, offset: op.t * 32 })],
            );
        }
        lw.call(
            w.tile,
            step,
            TransposeBlocks::new(kc, tb),
            &[
                ("in", Loc { buf: w.k_blk, offset: 0 }),
                ("out", Loc { buf: w.w1, offset: 0 }),
            ],
        );
    }

    // Scores, softmax, probabilities back to chunk-major (into the scores' AMP
    // buffer, free once converted).
    let step = lw.compute_step();
    for w in &work {
        let at = |buf| Loc { buf, offset: 0 };
        amp(lw, w.tile, step, name, (w.rows, kc, tb), at(w.q_amp), at(w.w1), at(w.s_blk));
        lw.call(
            w.tile,
            step,
            BlocksToRows::new(w.rows, tb),
            &[("in", at(w.s_blk)), ("out", at(w.s_rm))],
        );
        lw.call(
            w.tile,
            step,
            Softmax::with_ld(w.rows, op.t, tp, op.scale),
            &[("in", at(w.s_rm)), ("out", at(w.s_rm))],
        );
        let mut re = Rearrange::new(w.rows, tp);
        if let Some(al) = lw.opts.rearrange_declared_align {
            re.declared_align = al;
        }
        lw.call(w.tile, step, re, &[("in", at(w.s_rm)), ("out", at(w.s_blk))]);
    }

    // Values, then P V.
    let copies =
        redistribute(op.v, &tensor(op.v.rows, key_parts(&|w| w.v_w))).map_err(|e| bad("values", e))?;
    lw.exchange(&format!("{name}.v"), copies);
    let step = lw.compute_step();
    let mut out = Vec::new();
    for w in &work {
        if pad_rows > 0 {
            lw.call(
                w.tile,
                step,
                ZeroFill::new(kc, pad_rows * 32, tp * 32),
                &[("out", Loc { buf: w.v_w, offset: op.t * 32 })],
            );
        }
        let at = |buf| Loc { buf, offset: 0 };
        amp(lw, w.tile, step, name, (w.rows, tb, kc), at(w.s_blk), at(w.v_w), at(w.ctx));
        for c in 0..kc {
            let r = w.b * op.tq + w.r0;
            out.push(chunk(w.ctx, c * w.rows * 32, r..r + w.rows, w.h, c));
        }
    }
    Ok(tensor(op.batch * op.tq, out))
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
            let pp = lw.buffer(tile, format!("{name}.{pname}"), rows * 32, Category::Partial);
            ops.push((pname, Loc { buf: pp, offset: 0 }));
        }
    }
    lw.call(tile, step, mm, &ops);
}

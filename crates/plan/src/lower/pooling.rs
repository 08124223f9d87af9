//! Attention with a constant query (the pooling head's probe), its projections
//! absorbed. The query `q = probe Wq + bq` is known at compile time, so for head
//! `h` the scores `q_h . (x Wk_h + bk_h)` are `x . u_h` plus a constant the softmax
//! removes, with `u_h = scale Wk_h q_h`; and since each head's probabilities `p_h`
//! sum to 1, its context `p_h (X Wv_h + bv_h)` is `(p_h X) Wv_h + bv_h`. So instead
//! of projecting every token to keys and values (`2 W^2` per token) the head takes
//! the scores `S = X U` (16 columns: heads, zero weights past the last), the softmax
//! down `S`'s columns, the weighted sums `Y = P^T X` ([`weighted_sums`]), and
//! `Y Wv + bv`, a linear of `heads` rows per image whose diagonal head blocks are the
//! context (`Walker::absorbed_attention`).
//!
//! The weighted sums cut each image's tokens into 16-row blocks and the width into
//! column groups; a run tile takes one (image, token block, column group) and
//! computes both products of its piece of `X`:
//! - exchange: its block of `X` (chunk-major, which is also the AMP weight layout);
//! - compute: its group's partial scores `X_g U_g` (one AMP call, `U_g` a constant);
//! - exchange: the partial scores reduce-scattered by rows over the groups of its
//!   token block; compute: each group's rows added up (`reduce_add`); exchange: the
//!   rows all-gathered;
//! - compute: the block's column maxima (`col_max`, on group 0);
//! - exchange: every token block's maxima to every run of the image;
//! - compute: `e = exp(S - M)` with the image's maxima and its column sums
//!   (`col_exp_shift`), `e^T` (the AMP's input layout: heads on the rows), and
//!   `e^T X` for its column group: the partial sums of every head;
//! - exchange: to a combiner per (image, head, column range), that head's row of
//!   every token block's partials and their sums;
//! - compute: `reduce_norm` adds the partials and divides by the summed sums.

use tessera_graph::{Op, OpKind, TensorId};
use tessera_kernels::{ColExpShift, ColMax, ReduceAdd, ReduceNorm, TransposeBlocks, ZeroFill};

use super::fuse::Uses;
use super::{Cols, Val, Walker, attention::amp, count, to_u32, unsupported};
use crate::PlanError;
use crate::dist::{DistTensor, Part, redistribute};
use crate::ir::*;
use crate::lower::ctx::{Lowering, f16_bytes};
use crate::matmul::AMP_WIDTH;

/// An attention found absorbable: its operations and the folded score weights.
pub(super) struct Absorbed<'g> {
    q_op: &'g Op,
    k_op: &'g Op,
    v_op: &'g Op,
    pub scores_op: &'g Op,
    /// The scale, softmax and `p V` after the scores, and the three head splits.
    chain: Vec<&'g Op>,
    splits: [&'g Op; 3],
    /// The keys' and values' input `[batch * t, width]`.
    x: TensorId,
    batch: u32,
    t: u32,
    heads: u32,
    d: u32,
    /// `[width][16]`: column `h < heads` is `scale Wk_h q_h`, the rest zero.
    u: Vec<f32>,
}

impl<'g> Absorbed<'g> {
    /// The rows its value projection `op` is applied to (`Y`'s), if it is this
    /// attention's.
    pub fn value_rows(&self, op: &Op) -> Option<u32> {
        std::ptr::eq(self.v_op, op).then_some(self.batch * self.heads)
    }

    /// Whether `op` is its query or key projection, whose weights it does not keep.
    pub fn replaces(&self, op: &Op) -> bool {
        std::ptr::eq(self.q_op, op) || std::ptr::eq(self.k_op, op)
    }

    /// Operations lowered as part of the scores product: the projections (the
    /// query's folded, the keys' into `U`, the values' after the weighted sums)
    /// and the splits.
    pub fn folded(&self) -> impl Iterator<Item = &'g Op> + use<'g> {
        [self.q_op, self.k_op, self.v_op]
            .into_iter()
            .chain(self.splits)
    }
}

impl<'g> Uses<'g> {
    /// `q_op` as the query projection of an attention this rule can absorb: a
    /// parameter projected, split into at most 16 heads, whose scores feed the
    /// chain `attention` takes, with keys and values projected from one input that
    /// nothing else reads through them. `None` when any of it does not hold, or
    /// the folded weights do not fit f16: the attention is then lowered as it is.
    pub(super) fn absorbable(&self, q_op: &'g Op) -> Option<Absorbed<'g>> {
        let OpKind::MatMul {
            a: probe,
            b: wq,
            transpose_b: false,
            bias: bq,
        } = q_op.kind
        else {
            return None;
        };
        if !self.is_param(probe) || !self.is_param(wq) {
            return None;
        }
        let qs = self.sole(q_op.output)?;
        let OpKind::SplitHeads { heads, .. } = qs.kind else {
            return None;
        };
        let sc = self.sole(qs.output)?;
        let OpKind::MatMul {
            a,
            b: ks_t,
            transpose_b: true,
            bias: None,
        } = sc.kind
        else {
            return None;
        };
        if a != qs.output {
            return None;
        }
        let (scale, chain, vs_t) = self.softmax_chain(sc).ok()?;
        let pv = *chain.last()?;
        if !(scale.is_finite() && scale > 0.0) {
            return None;
        }
        // Keys and values: split projections of one input, read only here.
        let split_of = |t: TensorId, reader: &Op| -> Option<(&'g Op, &'g Op)> {
            let split = self.graph.producer(t);
            let OpKind::SplitHeads { x, heads: h } = split.kind else {
                return None;
            };
            let proj = self.graph.producer(x);
            let only = |t: TensorId, op: &Op| self.sole(t).is_some_and(|c| std::ptr::eq(c, op));
            (h == heads && only(x, split) && only(t, reader)).then_some((split, proj))
        };
        let (ks, k_op) = split_of(ks_t, sc)?;
        let (vs, v_op) = split_of(vs_t, pv)?;
        let (
            OpKind::MatMul {
                a: xk,
                b: wk,
                transpose_b: false,
                ..
            },
            OpKind::MatMul {
                a: xv,
                b: wv,
                transpose_b: false,
                ..
            },
        ) = (&k_op.kind, &v_op.kind)
        else {
            return None;
        };
        if xk != xv || !self.is_param(*wk) || !self.is_param(*wv) {
            return None;
        }
        let qd = self.graph.shape(qs.output).dims().to_vec();
        let kd = self.graph.shape(ks.output).dims().to_vec();
        let (&[1, h, 1, d], &[b, h2, t, d2]) = (&qd[..], &kd[..]) else {
            return None;
        };
        let width = *self.graph.shape(*xk).dims().last()?;
        if h != h2 || d != d2 || h == 0 || h > 16 || !width.is_multiple_of(16) {
            return None;
        }
        if self.graph.shape(vs.output).dims() != kd
            || self.graph.shape(*wk).dims() != [width, h * d]
        {
            return None;
        }
        let probe = self.param(probe)?.1;
        let wq = self.param(wq)?.1;
        let wk = self.param(*wk)?.1;
        let qwidth = probe.len();
        if wq.len() != qwidth * h * d || wk.len() != width * h * d {
            return None;
        }
        let bq = match bq {
            Some(t) => Some(self.param(t)?.1),
            None => None,
        };
        // In f64, rounded once: q, then each head's column of U.
        let q: Vec<f64> = (0..h * d)
            .map(|c| {
                let dot: f64 = (0..qwidth)
                    .map(|r| f64::from(probe[r]) * f64::from(wq[r * h * d + c]))
                    .sum();
                dot + bq.map_or(0.0, |b| f64::from(b[c]))
            })
            .collect();
        let mut u = vec![0f32; width * 16];
        for r in 0..width {
            for hh in 0..h {
                let dot: f64 = (0..d)
                    .map(|j| f64::from(wk[r * h * d + hh * d + j]) * q[hh * d + j])
                    .sum();
                u[r * 16 + hh] = (dot * f64::from(scale)) as f32;
            }
        }
        if u.iter().any(|v| !half::f16::from_f32(*v).is_finite()) {
            return None;
        }
        Some(Absorbed {
            q_op,
            k_op,
            v_op,
            scores_op: sc,
            chain,
            splits: [qs, ks, vs],
            x: *xk,
            batch: to_u32(b, "batch").ok()?,
            t: to_u32(t, "tokens").ok()?,
            heads: h as u32,
            d: d as u32,
            u,
        })
    }
}

impl Walker<'_> {
    /// Absorbed attention `i`, at its scores product: the scores, softmax and
    /// weighted sums, then `Y Wv + bv`, whose head blocks are the context.
    pub(super) fn absorbed_attention(
        &mut self,
        lw: &mut Lowering<'_>,
        i: usize,
    ) -> Result<(), PlanError> {
        let ab = &self.fusion.pooled[i];
        let name = ab.scores_op.name.clone();
        let (batch, t, heads, d, x, v_op) = (ab.batch, ab.t, ab.heads, ab.d, ab.x, ab.v_op);
        let chain = ab.chain.clone();
        let fused: Vec<String> = [ab.q_op, ab.k_op].iter().map(|o| o.name.clone()).collect();
        let u = std::mem::take(&mut self.fusion.pooled[i].u);
        let xv = self.operand(lw, x)?;
        let width = xv.t.cols;
        if xv.cols != Cols::Dense || xv.offset != 0 || u.len() as u32 != width * AMP_WIDTH {
            return Err(unsupported(format!(
                "{name}: the keys' input must be dense, {} columns",
                u.len() / 16
            )));
        }
        let y = weighted_sums(
            lw,
            &Pool {
                name: &name,
                u: &u,
                x: &xv.t,
                batch,
                t,
                heads,
            },
        )?;

        // `Y Wv + bv` with each head's `d` columns in `dp`, as the output
        // projection expects the context.
        let OpKind::MatMul {
            b: wv, bias: bv, ..
        } = v_op.kind
        else {
            unreachable!("absorbable checked the value projection")
        };
        let dp = d.next_multiple_of(AMP_WIDTH);
        let n = heads * dp;
        let wd = self.g.param_data(wv, (width * heads * d) as usize)?;
        let bd = match bv {
            Some(b) => Some(self.g.param_data(b, (heads * d) as usize)?),
            None => None,
        };
        let mut wp = vec![0f32; (width * n) as usize];
        for r in 0..width {
            for c in 0..heads * d {
                wp[(r * n + (c / d) * dp + c % d) as usize] = wd[(r * heads * d + c) as usize];
            }
        }
        let bias = |_: u32, col: u32| -> f32 {
            let (h, j) = (col / dp, col % dp);
            match bd {
                Some(b) if j < d => b[(h * d + j) as usize],
                _ => 0.0,
            }
        };
        let vname = v_op.name.clone();
        let fp8_scale = match lw.opts.weight_dtype {
            super::WeightDtype::F16 => None,
            super::WeightDtype::Fp8 => Some(self.fp8_scale(lw, &[v_op], &[wv], &[1.0], 1.0)?),
        };
        let z = self.mapped_linear(lw, (&vname, None), &y, (n, false), |lw, map| {
            super::linear::linear(
                lw,
                &super::linear::Linear {
                    source: None,
                    name: &vname,
                    x: &y,
                    w: &wp,
                    fp8_scale,
                    n,
                    bias: &bias,
                    per_row: false,
                    gelu: false,
                    residual: None,
                    map,
                },
            )
        })?;
        // Head `h`'s context of image `b` is row `b * heads + h` of its own blocks.
        let mut parts = Vec::new();
        for b in 0..batch {
            for h in 0..heads {
                let row = b * heads + h;
                for c in 0..dp / AMP_WIDTH {
                    let col = h * dp + c * AMP_WIDTH;
                    let p = z
                        .parts
                        .iter()
                        .find(|p| p.rows.contains(&row) && p.cols == (col..col + AMP_WIDTH))
                        .ok_or_else(|| {
                            unsupported(format!("{vname}: no block of row {row}, column {col}"))
                        })?;
                    parts.push(Part {
                        at: Loc {
                            buf: p.at.buf,
                            offset: p.at.offset + (row - p.rows.start) * AMP_WIDTH * 2,
                        },
                        rows: b..b + 1,
                        cols: col..col + AMP_WIDTH,
                    });
                }
            }
        }
        self.fused.extend(fused);
        self.fused.push(vname);
        // The scores, the weighted sums and each head's own columns of `Y Wv`.
        self.flop = Some(2 * u64::from(batch * heads) * u64::from(width) * u64::from(2 * t + d));
        for op in chain {
            self.mark(op);
        }
        let pv = self.fusion.pooled[i]
            .chain
            .last()
            .expect("the chain ends at p V");
        self.vals.insert(
            pv.output,
            Val {
                t: DistTensor {
                    rows: batch,
                    cols: n,
                    elem_bytes: 2,
                    parts,
                },
                cols: Cols::Heads { heads, d, dp },
                offset: 0,
            },
        );
        Ok(())
    }
}

/// The weighted sums of one absorbed attention.
pub(super) struct Pool<'a> {
    pub name: &'a str,
    /// `[width][16]`: the scores' weights, heads on the columns.
    pub u: &'a [f32],
    /// `[batch * t, width]`, dense.
    pub x: &'a DistTensor,
    pub batch: u32,
    pub t: u32,
    pub heads: u32,
}

/// A run tile: token block `kb` of image `b`, column blocks `c0..c0 + nc`.
struct PoolRun {
    tile: u32,
    b: u32,
    kb: u32,
    /// Its place in the image's column groups; group 0 computes the maxima.
    g: u32,
    c0: u32,
    nc: u32,
    real: u32,
    /// `U`'s rows of its column group (the AMP weight layout of one block).
    u: BufId,
    /// Its group's partial scores `[16][16]` (none with one group: the product
    /// writes `s`).
    spart: Option<BufId>,
    /// On a group that owns score rows (`owned`), every group's partial of them,
    /// `[groups][rows][16]`.
    rparts: Option<BufId>,
    s: BufId,
    x: BufId,
    maxes: BufId,
    e: BufId,
    et: BufId,
    sum: BufId,
    y: BufId,
}

/// A combiner: head `h` of image `b`, column blocks `c0..c0 + nc`.
struct Combiner {
    tile: u32,
    b: u32,
    h: u32,
    c0: u32,
    nc: u32,
    partials: BufId,
    sums: BufId,
    out: BufId,
}

/// `Y = softmax(S)^T X` per image (the softmax down each column of its scores):
/// `[batch * heads, width]`, head `h` of image `b` on row `b * heads + h`.
pub(super) fn weighted_sums(lw: &mut Lowering<'_>, op: &Pool<'_>) -> Result<DistTensor, PlanError> {
    let p = Pooling::lay_out(lw, op);
    p.land_inputs(lw)?;
    p.scores(lw);
    p.maxima(lw);
    p.exp_and_sums(lw);
    Ok(p.combine(lw))
}

/// One pooling's run tiles and combiners, and the sizes they are cut by.
struct Pooling<'p, 'a> {
    op: &'p Pool<'a>,
    /// Token blocks an image.
    tb: u32,
    /// Column blocks of the width.
    nb: u32,
    /// Column blocks a column group.
    per: u32,
    groups: u32,
    /// Partials a combiner adds up: the sums need two, so a single token block
    /// is paired with zeros.
    members: u32,
    /// Score rows a column group adds up (`owned`).
    rpg: u32,
    /// Column blocks a combiner.
    span: u32,
    /// In `run_at` order.
    runs: Vec<PoolRun>,
    combiners: Vec<Combiner>,
}

impl Pooling<'_, '_> {
    /// The pooling's cut over the machine's tiles, with every run's and
    /// combiner's buffers (and the decision recorded).
    fn lay_out<'p, 'a>(lw: &mut Lowering<'_>, op: &'p Pool<'a>) -> Pooling<'p, 'a> {
        let tiles = lw.machine.tiles;
        let (batch, heads) = (op.batch, op.heads);
        let tb = op.t.div_ceil(AMP_WIDTH);
        let nb = op.x.cols / AMP_WIDTH;
        // Column groups: as many as the tiles allow beside the token blocks.
        let per = nb.div_ceil((tiles / (batch * tb).max(1)).clamp(1, nb));
        let groups = nb.div_ceil(per);
        // Combiners: the fewest column blocks each that one tile apiece allows.
        let mut span = 1;
        while span < nb && batch * heads * nb.div_ceil(span) > tiles {
            span += 1;
        }
        let mut p = Pooling {
            op,
            tb,
            nb,
            per,
            groups,
            members: tb.max(2),
            // The partial scores are reduce-scattered by rows over a token
            // block's groups and the sums all-gathered.
            rpg: AMP_WIDTH.div_ceil(groups),
            span,
            runs: Vec::new(),
            combiners: Vec::new(),
        };
        p.runs = p.make_runs(lw);
        p.combiners = p.make_combiners(lw);
        lw.plan.decisions.push(format!(
            "{}: constant query, projections absorbed: {} x {}; scores, softmax and weighted sums on {} ({batch} x {} x {} of {}), combined on {} ({} each)",
            op.name,
            count(batch, "image"),
            count(heads, "head"),
            count(p.runs.len(), "tile"),
            count(tb, "token block"),
            count(groups, "column group"),
            count(per, "block"),
            count(p.combiners.len(), "tile"),
            count(span, "block"),
        ));
        p
    }

    /// The score rows column group `g` adds up.
    fn owned(&self, g: u32) -> std::ops::Range<u32> {
        (g * self.rpg).min(AMP_WIDTH)..((g + 1) * self.rpg).min(AMP_WIDTH)
    }

    /// Where run `(b, kb, g)` is in `runs`: they are made image, token block,
    /// then column group, in order, so a block's or an image's runs are one slice.
    fn run_at(&self, b: u32, kb: u32, g: u32) -> usize {
        ((b * self.tb + kb) * self.groups + g) as usize
    }

    /// The runs of `r`'s token block.
    fn block(&self, r: &PoolRun) -> &[PoolRun] {
        &self.runs[self.run_at(r.b, r.kb, 0)..self.run_at(r.b, r.kb + 1, 0)]
    }

    fn make_runs(&self, lw: &mut Lowering<'_>) -> Vec<PoolRun> {
        let (op, tb, groups, per, nb) = (self.op, self.tb, self.groups, self.per, self.nb);
        let name = op.name;
        let tiles = lw.machine.tiles;
        let mut runs = Vec::new();
        for b in 0..op.batch {
            for kb in 0..tb {
                for g in 0..groups {
                    let tile = self.run_at(b, kb, g) as u32 % tiles;
                    let c0 = g * per;
                    let nc = per.min(nb - c0);
                    let u = lw.constant(
                        tile,
                        format!("{name}.u"),
                        f16_bytes(
                            op.u[(c0 * AMP_WIDTH * AMP_WIDTH) as usize
                                ..((c0 + nc) * AMP_WIDTH * AMP_WIDTH) as usize]
                                .iter()
                                .copied(),
                        ),
                        Category::Weight,
                    );
                    let owned = self.owned(g);
                    let mut buf = |what: &str, bytes: u32| lw.activation(tile, name, what, bytes);
                    runs.push(PoolRun {
                        tile,
                        b,
                        kb,
                        g,
                        c0,
                        nc,
                        real: AMP_WIDTH.min(op.t - kb * AMP_WIDTH),
                        u,
                        spart: (groups > 1).then(|| buf("spart", 512)),
                        rparts: (groups > 1 && !owned.is_empty())
                            .then(|| buf("rparts", groups * owned.len() as u32 * 32)),
                        s: buf("s", 512),
                        x: buf("x", nc * 512),
                        maxes: buf("maxes", tb * 32),
                        e: buf("e", 512),
                        et: buf("et", 512),
                        sum: buf("sum", 64),
                        y: buf("y", nc * 512),
                    });
                }
            }
        }
        debug_assert!(
            runs.iter()
                .enumerate()
                .all(|(i, r)| self.run_at(r.b, r.kb, r.g) == i)
        );
        runs
    }

    fn make_combiners(&self, lw: &mut Lowering<'_>) -> Vec<Combiner> {
        let (op, nb, span) = (self.op, self.nb, self.span);
        let (name, heads, members) = (op.name, op.heads, self.members);
        let tiles = lw.machine.tiles;
        let mut combiners = Vec::new();
        for b in 0..op.batch {
            for h in 0..heads {
                for (r, c0) in (0..nb).step_by(span as usize).enumerate() {
                    let tile = (((b * heads + h) * nb.div_ceil(span)) + r as u32) % tiles;
                    let nc = span.min(nb - c0);
                    let mut buf = |what: &str, bytes: u32| lw.activation(tile, name, what, bytes);
                    combiners.push(Combiner {
                        tile,
                        b,
                        h,
                        c0,
                        nc,
                        partials: buf("partials", members * nc * 32),
                        sums: buf("sums", members * 4),
                        out: buf("ctx", nc * 32),
                    });
                }
            }
        }
        combiners
    }

    /// Each run's blocks of X.
    fn land_inputs(&self, lw: &mut Lowering<'_>) -> Result<(), PlanError> {
        let (op, t) = (self.op, self.op.t);
        let name = op.name;
        let (mut s_parts, mut x_parts) = (Vec::new(), Vec::new());
        for r in &self.runs {
            let r0 = r.b * t + r.kb * AMP_WIDTH;
            s_parts.push(Part {
                at: Loc {
                    buf: r.s,
                    offset: 0,
                },
                rows: r0..r0 + r.real,
                cols: 0..AMP_WIDTH,
            });
            for i in 0..r.nc {
                let c = (r.c0 + i) * AMP_WIDTH;
                x_parts.push(Part {
                    at: Loc {
                        buf: r.x,
                        offset: i * 512,
                    },
                    rows: r0..r0 + r.real,
                    cols: c..c + AMP_WIDTH,
                });
            }
        }
        let dst = DistTensor {
            rows: op.x.rows,
            cols: op.x.cols,
            elem_bytes: 2,
            parts: x_parts,
        };
        let copies = redistribute(op.x, &dst)
            .map_err(|e| unsupported(format!("{name}: the inputs do not cover the tokens: {e}")))?;
        lw.exchange(&format!("{name}.in"), copies);
        Ok(())
    }

    /// The scores `S = X U`: padding token rows zeroed (their scores and `e` are
    /// then zero; 0 times a stale NaN would not be), each group's partial
    /// scores, and with several groups their rows reduce-scattered, added up and
    /// all-gathered.
    fn scores(&self, lw: &mut Lowering<'_>) {
        let name = self.op.name;
        let step = lw.compute_step();
        for r in &self.runs {
            super::attention::zero_rows(lw, (r.tile, step), r.nc, r.x, (r.real, AMP_WIDTH));
            let out = match r.spart {
                Some(buf) => at(buf),
                None => at(r.s),
            };
            amp(
                lw,
                r.tile,
                step,
                name,
                (AMP_WIDTH, r.nc, 1),
                at(r.x),
                at(r.u),
                out,
            );
        }
        let mut copies = Vec::new();
        for r in &self.runs {
            let Some(spart) = r.spart else { continue };
            for o in self.block(r) {
                let (rows, Some(rparts)) = (self.owned(o.g), o.rparts) else {
                    continue;
                };
                copies.push(Copy {
                    src: Loc {
                        buf: spart,
                        offset: rows.start * 32,
                    },
                    bytes: rows.len() as u32 * 32,
                    dsts: vec![Loc {
                        buf: rparts,
                        offset: r.g * rows.len() as u32 * 32,
                    }],
                });
            }
        }
        lw.exchange(&format!("{name}.scores"), copies);
        let step = lw.compute_step();
        for r in &self.runs {
            if let Some(rparts) = r.rparts {
                let rows = self.owned(r.g);
                lw.call(
                    r.tile,
                    step,
                    ReduceAdd::new(self.groups, rows.len() as u32 * AMP_WIDTH),
                    &[
                        ("in", at(rparts)),
                        (
                            "out",
                            Loc {
                                buf: r.s,
                                offset: rows.start * 32,
                            },
                        ),
                    ],
                );
            }
        }
        let mut copies = Vec::new();
        for r in self.runs.iter().filter(|r| r.rparts.is_some()) {
            let rows = self.owned(r.g);
            let dsts: Vec<Loc> = self
                .block(r)
                .iter()
                .filter(|o| o.g != r.g)
                .map(|o| Loc {
                    buf: o.s,
                    offset: rows.start * 32,
                })
                .collect();
            copies.push(Copy {
                src: Loc {
                    buf: r.s,
                    offset: rows.start * 32,
                },
                bytes: rows.len() as u32 * 32,
                dsts,
            });
        }
        lw.exchange(&format!("{name}.scores.rows"), copies);
    }

    /// Each token block's column maxima, to every run of its image; and a lone
    /// token block's zero partner on the combiners.
    fn maxima(&self, lw: &mut Lowering<'_>) {
        let step = lw.compute_step();
        for r in &self.runs {
            if r.g == 0 {
                lw.call(
                    r.tile,
                    step,
                    ColMax::new(r.real),
                    &[
                        ("in", at(r.s)),
                        (
                            "out",
                            Loc {
                                buf: r.maxes,
                                offset: r.kb * 32,
                            },
                        ),
                    ],
                );
            }
        }
        if self.tb < self.members {
            for c in &self.combiners {
                let row = c.nc * 32;
                lw.call(
                    c.tile,
                    step,
                    ZeroFill::new(1, row, row),
                    &[(
                        "out",
                        Loc {
                            buf: c.partials,
                            offset: row,
                        },
                    )],
                );
                lw.call(c.tile, step, ZeroFill::new(1, 8, 8), &[("out", at(c.sums))]);
            }
        }

        let mut copies = Vec::new();
        for r in self.runs.iter().filter(|r| r.g == 0) {
            let dsts: Vec<Loc> = self.runs[self.run_at(r.b, 0, 0)..self.run_at(r.b + 1, 0, 0)]
                .iter()
                .filter(|o| !(o.kb == r.kb && o.g == 0))
                .map(|o| Loc {
                    buf: o.maxes,
                    offset: r.kb * 32,
                })
                .collect();
            if !dsts.is_empty() {
                copies.push(Copy {
                    src: Loc {
                        buf: r.maxes,
                        offset: r.kb * 32,
                    },
                    bytes: 32,
                    dsts,
                });
            }
        }
        lw.exchange(&format!("{}.max", self.op.name), copies);
    }

    /// `e = exp(S - M)` and its column sums, `e^T` (the AMP's input layout:
    /// heads on the rows), and each run's partial weighted sums `e^T X`.
    fn exp_and_sums(&self, lw: &mut Lowering<'_>) {
        let step = lw.compute_step();
        for r in &self.runs {
            lw.call(
                r.tile,
                step,
                ColExpShift::new(r.real, AMP_WIDTH, self.tb, 1.0),
                &[
                    ("in", at(r.s)),
                    ("maxes", at(r.maxes)),
                    ("out", at(r.e)),
                    ("sum", at(r.sum)),
                ],
            );
            lw.call(
                r.tile,
                step,
                TransposeBlocks::new(1, 1),
                &[("in", at(r.e)), ("out", at(r.et))],
            );
            amp(
                lw,
                r.tile,
                step,
                self.op.name,
                (AMP_WIDTH, 1, r.nc),
                at(r.et),
                at(r.x),
                at(r.y),
            );
        }
    }

    /// To each combiner its head's row of every token block's partials, and
    /// sums; their sum divided by the summed sums is `Y`.
    fn combine(&self, lw: &mut Lowering<'_>) -> DistTensor {
        let (name, heads) = (self.op.name, self.op.heads);
        let mut copies = Vec::new();
        for c in &self.combiners {
            for kb in 0..self.tb {
                for i in 0..c.nc {
                    let cb = c.c0 + i;
                    let r = &self.runs[self.run_at(c.b, kb, cb / self.per)];
                    debug_assert!(r.b == c.b && r.kb == kb && (r.c0..r.c0 + r.nc).contains(&cb));
                    copies.push(Copy {
                        src: Loc {
                            buf: r.y,
                            offset: (cb - r.c0) * 512 + c.h * 32,
                        },
                        bytes: 32,
                        dsts: vec![Loc {
                            buf: c.partials,
                            offset: (kb * c.nc + i) * 32,
                        }],
                    });
                    if i == 0 {
                        copies.push(Copy {
                            src: Loc {
                                buf: r.sum,
                                offset: c.h * 4,
                            },
                            bytes: 4,
                            dsts: vec![Loc {
                                buf: c.sums,
                                offset: kb * 4,
                            }],
                        });
                    }
                }
            }
        }
        lw.exchange(&format!("{name}.partials"), copies);

        let step = lw.compute_step();
        let mut parts = Vec::new();
        for c in &self.combiners {
            lw.call(
                c.tile,
                step,
                ReduceNorm::new(self.members, c.nc * AMP_WIDTH),
                &[
                    ("in", at(c.partials)),
                    ("sums", at(c.sums)),
                    ("out", at(c.out)),
                ],
            );
            // One part a 16-column block: the value projection then takes `Y` in the
            // AMP's layout as it arrives, without a rearrangement.
            let row = c.b * heads + c.h;
            for i in 0..c.nc {
                let col = (c.c0 + i) * AMP_WIDTH;
                parts.push(Part {
                    at: Loc {
                        buf: c.out,
                        offset: i * 32,
                    },
                    rows: row..row + 1,
                    cols: col..col + AMP_WIDTH,
                });
            }
        }
        DistTensor {
            rows: self.op.batch * heads,
            cols: self.op.x.cols,
            elem_bytes: 2,
            parts,
        }
    }
}

/// The start of `buf`.
fn at(buf: BufId) -> Loc {
    Loc { buf, offset: 0 }
}

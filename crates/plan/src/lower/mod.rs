//! Lowering a model graph to a tile plan, one rule per operation.
//!
//! The walker visits the graph's operations in order and keeps, for every tensor
//! computed so far, its distributed layout ([`DistTensor`]: which tile holds which
//! rows and columns, in which buffer). Each rule takes its operands' layouts as
//! they are, moves what it needs with [`redistribute`](crate::redistribute), asks
//! the context for fresh steps, and returns its result's layout; no rule knows
//! which model it is in. The rules:
//! - `linear` (`linear.rs`): a matmul by a weight, fusing the epilogue that follows
//!   it alone (a per-row constant such as the position embedding, GELU, a residual
//!   add);
//! - `attention` (`attention.rs`): the two batched products per head with the scale
//!   and the softmax between them;
//! - `layer_norm` (here): rows on their owners;
//! - views (`reshape`, `split_heads`, `merge_heads`) change no bytes.
//!
//! Tensors are 2-D `[rows, cols]` with rows the product of the leading dimensions.
//! A projection whose result is split into heads stores each head's `d` columns in
//! `dp` (the next multiple of 16, zero weights for the padding), so that every
//! head starts on an AMP block; consumers of such a tensor see that layout
//! ([`Cols::Heads`]) and pad their weights to match.

mod attention;
mod ctx;
mod fuse;
mod layers;
mod linear;
mod pooling;
mod recipe;

use std::collections::{BTreeMap, HashMap, HashSet};

use rayon::prelude::*;

use tessera_graph::{Graph, Op, OpKind, TensorId, TensorMap};
use tessera_kernels::LayerNorm;
use tessera_machine::Machine;

use crate::PlanError;
use crate::dist::{DistTensor, Part};
use crate::ir::*;
use crate::matmul::{AMP_WIDTH, MatmulShape, map_matmul_capped};
use ctx::{Lowering, f16_bytes};
use fuse::{FusedAttention, Fusion, Uses};

/// Policy knobs of the lowering.
#[derive(Debug, Clone, PartialEq)]
pub struct LowerOptions {
    /// Bytes per tile for the weights of every matmul together (they stay resident
    /// for the whole program). Each matmul gets what one copy of its weights needs
    /// on every tile twice over, and of the rest a share in proportion to its
    /// multiply-accumulates (weights times rows): replicas pay off by the rows
    /// they serve, so a few-row product (the pooling head's) keeps one copy.
    pub weight_bytes: u64,
    /// Bytes per tile a matmul's default strategy may use beyond its weights, for
    /// activations. The default, 192 KiB, gives the So400m layer at batch 4 the
    /// lowest plan estimate of the budgets scanned (docs/performance.md,
    /// "Budgets"): the budget moves where the fit loop settles, and with it every
    /// linear's grid. The cheapest strategies needing up to two thirds more are
    /// offered too, and the fit loop's growth phase takes one where the plan still
    /// fits and its estimate falls.
    pub transient_bytes: u64,
    /// Largest bias slab (a bias broadcast over a tile's output rows, one `add`)
    /// per matmul tile, where the bias cannot go into the engine (a row split
    /// that is not even over the workers); above it the bias is kept as one row
    /// per block and added block by block (slower, far smaller). A bias that
    /// varies with the row is a slab whatever its size.
    pub slab_bias_bytes: u32,
    /// Let linears' row groups round up to whole rows a worker where that is
    /// cheaper (`MatmulShape::even_rows`). The fit loop turns it off at a budget
    /// before it shrinks the weight budget.
    pub even_rows: bool,
    /// The strategy to use per operation name, as an index into the operation's
    /// candidates (`TilePlan::candidates`); operations not named take their first.
    pub choices: BTreeMap<String, usize>,
    /// Usable SRAM bytes a tile from the first SRAM address, when placement is
    /// squeezed below the machine's (`--capacity`; a compile sets it from its
    /// placement options): the fit limit is then [`FIT_SHARE`] of this, so the fit
    /// loop and growth aim at what placement has.
    pub capacity: Option<u64>,
    /// Keep one copy of every weight on the tiles, spread over all of them, and
    /// copy each operation's weights into its compute layout by an exchange
    /// before it runs (freed when it ends), instead of keeping every replica
    /// resident: what a whole model needs, whose weights do not fit replicated.
    pub stage_weights: bool,
    /// Lower a model's identical layers once, as a loop the program runs once a
    /// layer (`TilePlan::layer_loop`): the layer's code, vertex states and
    /// exchange code exist once whatever the depth. Where the graph has such
    /// layers, stages every weight (see `stage_weights`), since an iteration
    /// finds its layer's weights in that layer's instance of the store; a graph
    /// without lowers as if this were off. On by default.
    pub loop_layers: bool,
    /// How linears' weights are stored on the tiles.
    pub weight_dtype: WeightDtype,
    /// Cut every transposed attention's keys in two runs, each half of a group
    /// holding one run, also where whole keys would be faster: each tile then
    /// holds half a head's keys and values. The fit loop turns it on when
    /// budgets alone leave the attention's step over the limit (a whole tower
    /// at batch 2, whose weight store takes half of every tile).
    pub cut_keys: bool,
    /// Linears of a layer loop's body (by their body names, `layers.0.…`) whose
    /// FP8 weights stay resident in their compute layout, an instance a layer
    /// in the tile's store, widened where they lie (`Fp8ToF16::layered`)
    /// instead of staged by an exchange each iteration: no staging bytes, but
    /// every replica of every layer held for the whole program. The fit loop
    /// chooses them within the whole model's memory ([`reside`]).
    pub resident: std::collections::BTreeSet<String>,
    /// Let the fit loop choose `resident` linears (on by default).
    pub reside: bool,
    /// Knobs for tests and demonstrations; all off by default.
    pub experimental: Experimental,
}

/// Every knob that exists for tests and demonstrations rather than for a normal
/// compile, in one place: each changes the package or breaks it on purpose. The
/// lowering reads the first seven, the compile after it the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Experimental {
    /// Overrides the rearrangement's declared alignment: the seed-bug knob. `None`
    /// keeps the kernel's true contract.
    pub rearrange_declared_align: Option<u32>,
    /// Rearrange a linear's row-major input to the AMP's chunk-major layout on the
    /// tile (the seed's way) instead of letting the AMP read it row-major. The
    /// seed-bug reproduction needs the rearrangement's kernel; nothing else does.
    pub rearrange_inputs: bool,
    /// Lower every multi-query attention with scores `Q K^T` and the row softmax
    /// (for tests of that path), not only where the transposed one does not apply.
    pub row_attention: bool,
    /// Give every transposed attention's tiles whole keys, also where its groups
    /// are an odd number of tiles and the key cut would apply (for tests and
    /// measurements that compare the two).
    pub whole_keys: bool,
    /// Cut every transposed attention's keys in two runs from the first
    /// lowering on, as the fit loop does where memory is short
    /// (`LowerOptions::cut_keys`), for tests of that path at sizes that fit
    /// anyway.
    pub cut_all_keys: bool,
    /// Lower attentions with a constant query with their projections as they are
    /// (for tests that compare the absorbed lowering with it).
    pub unabsorbed: bool,
    /// Make a layer loop's later layers' weights by replaying the body for
    /// each, as before recipes (for the test that compares the two).
    pub replay_layers: bool,
    /// After placement, move each buffer whose declared alignment is below 8
    /// bytes to an address that is not 8-byte aligned, wherever the placement
    /// checker still accepts the tile: legal under the declared contracts, and
    /// with the true contracts nothing moves.
    pub exploit_declared_alignment: bool,
    /// One kernel constant scaled (`tessera_kernels::mutated`): validation must
    /// then report a mismatch.
    pub mutate_kernel: Option<tessera_kernels::KernelMutation>,
}

impl Experimental {
    /// The seed's bug: the rearrangement's operands declared 2-byte aligned,
    /// linears' inputs rearranged on the tile, and those buffers moved off 8-byte
    /// alignment where placement allows, so that the simulator faults at the
    /// kernel's 64-bit load.
    pub fn weakened_rearrange_contract(self) -> Experimental {
        Experimental {
            rearrange_declared_align: Some(2),
            rearrange_inputs: true,
            exploit_declared_alignment: true,
            ..self
        }
    }
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            weight_bytes: 512 * 1024,
            transient_bytes: 192 * 1024,
            slab_bias_bytes: 16 * 1024,
            even_rows: true,
            choices: BTreeMap::new(),
            capacity: None,
            stage_weights: false,
            loop_layers: true,
            weight_dtype: WeightDtype::F16,
            cut_keys: false,
            resident: std::collections::BTreeSet::new(),
            reside: true,
            experimental: Experimental::default(),
        }
    }
}

/// How linears' weights are stored on the tiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightDtype {
    #[default]
    F16,
    /// IPU21's F143 (`tessera_machine::fp8`) at a power-of-two scale a weight,
    /// widened to f16 on the tile before the AMP reads it. Biases, LayerNorm
    /// parameters and activations stay f16.
    Fp8,
}

impl WeightDtype {
    pub fn name(self) -> &'static str {
        match self {
            WeightDtype::F16 => "f16",
            WeightDtype::Fp8 => "fp8",
        }
    }
}

impl LowerOptions {
    /// Weights staged: asked for, or needed by the layer loop.
    pub fn staged(&self) -> bool {
        self.stage_weights || self.loop_layers
    }
}

/// `n` and `noun`, the noun in the plural unless `n` is one: decisions are read
/// by people, and "1 images" reads as a slip.
pub(crate) fn count(n: impl std::fmt::Display, noun: &str) -> String {
    let n = n.to_string();
    if n == "1" {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// How a tensor's logical columns sit in its stored columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cols {
    Dense,
    /// `heads` runs of `d` columns, each stored in `dp`.
    Heads {
        heads: u32,
        d: u32,
        dp: u32,
    },
}

impl Cols {
    /// Stored column of logical column `c`, if any (`None` never happens for a
    /// logical column; padding columns have no logical column).
    fn physical(self, c: u32) -> u32 {
        match self {
            Cols::Dense => c,
            Cols::Heads { d, dp, .. } => (c / d) * dp + c % d,
        }
    }
    fn width(self, logical: u32) -> u32 {
        match self {
            Cols::Dense => logical,
            Cols::Heads { heads, dp, .. } => heads * dp,
        }
    }
}

#[derive(Debug, Clone)]
struct Val {
    t: DistTensor,
    cols: Cols,
    /// First stored column of this tensor in `t` (sibling projections computed
    /// as one matmul share one distributed tensor side by side).
    offset: u32,
}

impl Val {
    fn dense(t: DistTensor) -> Val {
        Val {
            t,
            cols: Cols::Dense,
            offset: 0,
        }
    }
}

/// A row-wise kernel on whole rows: `x` gathered onto its row owners (an exchange
/// only when it is not there already), then one `call(lw, tile, step, rows, in,
/// out)` per owner, writing a new buffer of `x`'s shape.
fn row_wise(
    lw: &mut Lowering<'_>,
    name: &str,
    x: &DistTensor,
    mut call: impl FnMut(&mut Lowering<'_>, u32, Step, u32, Loc, Loc),
) -> DistTensor {
    let rows = lw.gather_rows(x, &format!("{name}.in"));
    let step = lw.compute_step();
    let mut parts = Vec::new();
    for p in &rows.parts {
        let tile = lw.plan.buffer(p.at.buf).tile;
        let n = p.rows.end - p.rows.start;
        let bytes = n * x.cols * x.elem_bytes;
        let buf = lw.buffer(tile, format!("{name}.out"), bytes, Category::Activation);
        let out = Loc { buf, offset: 0 };
        call(lw, tile, step, n, p.at, out);
        parts.push(Part {
            at: out,
            ..p.clone()
        });
    }
    DistTensor { parts, ..rows }
}

fn unsupported(message: impl Into<String>) -> PlanError {
    PlanError::Unsupported(message.into())
}

fn to_u32(v: usize, what: &str) -> Result<u32, PlanError> {
    u32::try_from(v).map_err(|_| unsupported(format!("{what} {v} is too large")))
}

struct Walker<'g> {
    g: Uses<'g>,
    /// The fused operations recognised before the walk.
    fusion: Fusion<'g>,
    vals: HashMap<TensorId, Val>,
    /// Every matmul by a parameter, for the budget shares: the floors' sum and
    /// the sum of weight bytes times rows.
    weight_floors: u64,
    weight_demand: f64,
    /// Operations the current rule fused.
    fused: Vec<String>,
    /// Chunks per inner group of the current matmul, when split.
    inner_chunks: Option<u32>,
    /// The operation with strategies that produced a value (its name), for the
    /// finalist search's layout costs.
    made_by: HashMap<TensorId, String>,
    /// FLOP of the current rule's products, when they are not the graph's.
    flop: Option<u64>,
    /// In a layer loop, every layer's parameters by their name after the
    /// layer's prefix.
    layer_params: Option<HashMap<String, Vec<TensorId>>>,
}

impl<'g> Walker<'g> {
    /// Records `op` as lowered by the current rule; the walk skips it, as the
    /// canonicalisation pass put it inside that rule.
    fn mark(&mut self, op: &Op) {
        self.fused.push(op.name.clone());
    }

    /// The FP8 scale of a product's stored weights: one for its members
    /// together (`factors[m] * pre` times member `m`'s weight is what is stored),
    /// from their largest magnitude over every layer the loop runs (the body's
    /// widening call holds one scale for all of them). Records each member's
    /// weight, the scale and its factor, for a reference that rounds the weight
    /// times the factor as the tile holds it.
    fn fp8_scale(
        &self,
        lw: &mut Lowering<'_>,
        members: &[&'g Op],
        params: &[TensorId],
        factors: &[f32],
        pre: f32,
    ) -> Result<i8, PlanError> {
        let mut max = 0.0f32;
        for (m, &param) in params.iter().enumerate() {
            let f = (factors[m] * pre).abs();
            for t in self.layer_copies(param) {
                let data = self.g.param_data(t, self.g.graph.shape(t).numel())?;
                max = max.max(data.iter().fold(0.0f32, |a, v| a.max(v.abs())) * f);
            }
        }
        let scale = tessera_machine::fp8::scale_for(max);
        for (m, _) in params.iter().enumerate() {
            let f = factors[m] * pre;
            if f == 0.0 || !f.is_finite() {
                return Err(unsupported(format!(
                    "{}: FP8 weights stored times {f}",
                    members[m].name
                )));
            }
            lw.plan
                .fp8_weights
                .push((members[m].name.clone(), scale, f));
        }
        Ok(scale)
    }

    /// `param` and, in a layer loop, the same parameter of every layer.
    fn layer_copies(&self, param: TensorId) -> Vec<TensorId> {
        let name = &self.g.graph.producer(param).name;
        match (&self.layer_params, layers::tail(name)) {
            (Some(by_tail), Some(tail)) => {
                by_tail.get(tail).cloned().unwrap_or_else(|| vec![param])
            }
            _ => vec![param],
        }
    }

    fn val(&self, t: TensorId) -> Result<&Val, PlanError> {
        self.vals.get(&t).ok_or_else(|| {
            unsupported(format!(
                "tensor {t} (from `{}`) has no layout: its producer is not lowered",
                self.g.graph.producer(t).name
            ))
        })
    }

    /// A parameter used as an activation (the pooling head's probe): its rows on
    /// row owners, as constants.
    fn materialize(&mut self, lw: &mut Lowering<'_>, t: TensorId) -> Result<Val, PlanError> {
        let dims = self.g.graph.shape(t).dims().to_vec();
        let cols = *dims.last().unwrap_or(&1);
        let rows = dims.iter().product::<usize>() / cols.max(1);
        let data = self.g.param_data(t, rows * cols)?;
        let (rows, cols) = (to_u32(rows, "rows")?, to_u32(cols, "columns")?);
        let name = self.g.graph.producer(t).name.clone();
        let mut parts = Vec::new();
        for (o, (r0, n)) in lw.row_owners(rows).into_iter().enumerate() {
            let bytes = f16_bytes(
                data[(r0 * cols) as usize..((r0 + n) * cols) as usize]
                    .iter()
                    .copied(),
            );
            let buf = lw.constant(o as u32, name.clone(), bytes, Category::Weight);
            parts.push(Part {
                at: Loc { buf, offset: 0 },
                rows: r0..r0 + n,
                cols: 0..cols,
            });
        }
        Ok(Val::dense(DistTensor {
            rows,
            cols,
            elem_bytes: 2,
            parts,
        }))
    }

    fn operand(&mut self, lw: &mut Lowering<'_>, t: TensorId) -> Result<Val, PlanError> {
        if self.g.is_param(t) {
            return self.materialize(lw, t);
        }
        self.val(t).cloned()
    }

    fn layer_norm(
        &mut self,
        lw: &mut Lowering<'_>,
        op: &Op,
        (x, gamma, beta, eps): (TensorId, TensorId, TensorId, f32),
    ) -> Result<(), PlanError> {
        let xv = self.operand(lw, x)?;
        if xv.cols != Cols::Dense {
            return Err(unsupported(format!(
                "{}: LayerNorm of a head-split tensor",
                op.name
            )));
        }
        let width = xv.t.cols;
        let g = f16_bytes(self.g.param_data(gamma, width as usize)?.iter().copied());
        let b = f16_bytes(self.g.param_data(beta, width as usize)?.iter().copied());
        let t = row_wise(lw, &op.name, &xv.t, |lw, tile, step, n, input, out| {
            let gb = lw.constant_with(
                tile,
                format!("{}.gamma", op.name),
                g.clone(),
                Category::Weight,
                Some(recipe::Recipe::Param(gamma, width as usize)),
            );
            let bb = lw.constant_with(
                tile,
                format!("{}.beta", op.name),
                b.clone(),
                Category::Weight,
                Some(recipe::Recipe::Param(beta, width as usize)),
            );
            lw.call(
                tile,
                step,
                LayerNorm::new(n, width, eps),
                &[
                    ("in", input),
                    ("gamma", Loc { buf: gb, offset: 0 }),
                    ("beta", Loc { buf: bb, offset: 0 }),
                    ("out", out),
                ],
            );
        });
        self.vals.insert(op.output, Val::dense(t));
        Ok(())
    }

    /// The graph tensors of operation `i` and the operations fused with it, for
    /// [`TilePlan::results`]: a tensor read outside the group (or a graph output)
    /// is what the rule left on the tiles; one read only inside it never exists
    /// whole.
    fn results(&self, i: usize, fused: &[String], plan_op: usize) -> Vec<OpResult> {
        let ops = self.g.graph.ops();
        let mut group: Vec<usize> = vec![i];
        for name in fused {
            if let Some(j) = ops.iter().position(|o| &o.name == name) {
                group.push(j);
            }
        }
        let outputs: HashSet<TensorId> = self.g.graph.outputs().iter().map(|o| o.tensor).collect();
        let mut out = Vec::new();
        for &j in &group {
            let op = &ops[j];
            let t = op.output;
            let read_outside = outputs.contains(&t)
                || self.g.consumers[t.index()]
                    .iter()
                    .any(|c| !group.contains(&(c.0 as usize)));
            let (stored, note) = match self.vals.get(&t) {
                Some(v) if read_outside => {
                    let scale = self.fusion.folded_scale(t).unwrap_or(1.0);
                    let stored = StoredTensor {
                        t: v.t.clone(),
                        heads: match v.cols {
                            Cols::Dense => None,
                            Cols::Heads { heads, d, dp } => Some((heads, d, dp)),
                        },
                        offset: v.offset,
                        scale,
                    };
                    let note = (scale != 1.0).then(|| {
                        format!(
                            "stored times the attention's scale {scale}, folded into the projection"
                        )
                    });
                    (Some(stored), note)
                }
                _ if !read_outside => (
                    None,
                    Some(format!(
                        "an intermediate of `{}`'s fused operations: never stored on its own",
                        ops[i].name
                    )),
                ),
                _ => (
                    None,
                    Some(format!(
                        "folded away by `{}` (an absorbed projection): never computed",
                        ops[i].name
                    )),
                ),
            };
            out.push(OpResult {
                op: plan_op,
                tensor: op.name.clone(),
                stored,
                note,
            });
        }
        out
    }

    /// Fused linear `l` of the canonicalisation pass: `x @ W (+ b)` with its
    /// epilogue and siblings as one matmul.
    fn linear(&mut self, lw: &mut Lowering<'_>, l: usize) -> Result<(), PlanError> {
        let fl = self.fusion.linears[l].clone();
        let (op, a, w) = (fl.matmul, fl.x, fl.w);
        let xv = self.operand(lw, a)?;
        let wdims = self.g.graph.shape(w).dims().to_vec();
        let [k_log, n_log] = wdims[..] else {
            return Err(unsupported(format!("{}: weight must be 2-D", op.name)));
        };
        let (k_log, n_log) = (to_u32(k_log, "k")?, to_u32(n_log, "n")?);
        let row_const: Option<(&[f32], u32)> = match fl.row_const {
            Some(c) => {
                let pd = self.g.graph.shape(c).dims();
                let cols = *pd.last().unwrap_or(&0);
                let prow = pd.iter().product::<usize>() / cols.max(1);
                Some((self.g.param_data(c, prow * cols)?, to_u32(prow, "rows")?))
            }
            None => None,
        };
        let residual = match fl.residual {
            Some(r) => {
                let v = self.val(r)?.clone();
                // No rule adds a head-split tensor, fused or not.
                if v.cols != Cols::Dense {
                    let add = fl
                        .epilogue
                        .last()
                        .expect("a residual add ends the epilogue");
                    return Err(unsupported(format!(
                        "{}: elementwise op on head-split tensors",
                        add.name
                    )));
                }
                Some(v)
            }
            None => None,
        };
        let (gelu, end, heads) = (fl.gelu, fl.end, fl.cols);
        for next in &fl.epilogue {
            self.mark(next);
        }
        let views = fl
            .epilogue
            .iter()
            .filter(|o| matches!(o.kind, OpKind::Reshape { .. }));

        if heads == Cols::Dense && !n_log.is_multiple_of(AMP_WIDTH) {
            return Err(unsupported(format!(
                "{}: output width {n_log} must be a multiple of {AMP_WIDTH}",
                op.name
            )));
        }
        if residual.is_some() && heads != Cols::Dense {
            return Err(unsupported(format!("{}: residual into heads", op.name)));
        }
        // The fused products (this one, then its siblings) and each one's
        // weight and bias parameters.
        let mut members: Vec<&'g Op> = vec![op];
        let mut member_params = vec![(w, fl.bias)];
        for sib in &fl.siblings {
            let OpKind::MatMul { b: sb, bias, .. } = sib.kind else {
                unreachable!("a sibling is a product")
            };
            members.push(sib);
            member_params.push((sb, bias));
        }
        let scales = fl.scales.clone();
        // A fused GELU reads `x / 2` (`Gelu::with_half_input`): the halving goes
        // into the weights and bias, exactly (a power of two).
        let pre = if gelu { 0.5 } else { 1.0 };
        let fp8_scale = match lw.opts.weight_dtype {
            WeightDtype::F16 => None,
            WeightDtype::Fp8 => {
                let params: Vec<TensorId> = member_params.iter().map(|p| p.0).collect();
                Some(self.fp8_scale(lw, &members, &params, &scales, pre)?)
            }
        };
        let per = heads.width(n_log);
        let n = per * members.len() as u32;
        let k = xv.t.cols;
        let kp = k.next_multiple_of(AMP_WIDTH);
        if xv.offset != 0 || xv.cols.width(k_log) != k {
            return Err(unsupported(format!(
                "{}: input has {k} stored columns, weight expects {k_log}",
                op.name
            )));
        }
        // The weight in stored coordinates: rows follow the input's columns,
        // columns the output's, zeros in every padding row and column. Built
        // from a description of where each value comes from, which a layer
        // loop's body keeps to make the later layers' weights
        // (`recipe.rs`).
        let source = recipe::LinearSource {
            members: member_params
                .iter()
                .zip(&scales)
                .map(|(&(w, b), &s)| (w, b, s))
                .collect(),
            pre,
            k_log,
            n_log,
            per,
            n,
            kp,
            rows: (0..k_log).map(|r| xv.cols.physical(r)).collect(),
            cols: (0..n_log).map(|c| heads.physical(c)).collect(),
        };
        let g = &self.g;
        let built = source.build(&|t, len| g.param_data(t, len))?;
        let wp = &built.w;
        let bias_fn = |row: u32, col: u32| -> f32 {
            let extra = row_const.map(|(data, prow)| {
                let c = built.logical[col as usize].1;
                if c == u32::MAX {
                    0.0
                } else {
                    data[((row % prow) * n_log + c) as usize]
                }
            });
            source.bias_at(&built, col, extra)
        };
        // In a layer loop's body, the constants it makes record how they
        // follow from the parameters (not with a per-row constant, which no
        // body has).
        let recipe_source = if row_const.is_none() {
            lw.linear_source(source.clone())
        } else {
            None
        };

        let input_from = self.made_by.get(&a).cloned();
        let per_row = row_const.is_some();
        let out = self.mapped_linear(
            lw,
            (&op.name, input_from),
            &xv.t,
            (n, per_row),
            |lw, map| {
                linear::linear(
                    lw,
                    &linear::Linear {
                        name: &op.name,
                        x: &xv.t,
                        w: wp,
                        source: recipe_source,
                        fp8_scale,
                        n,
                        bias: &bias_fn,
                        per_row,
                        gelu,
                        residual: residual.as_ref().map(|r| &r.t),
                        map,
                    },
                )
            },
        )?;
        let v = Val {
            t: out,
            cols: heads,
            offset: 0,
        };
        for (m, sib) in members.iter().enumerate().skip(1) {
            self.mark(sib);
            let sv = Val {
                offset: m as u32 * per,
                ..v.clone()
            };
            self.vals.insert(sib.output, sv);
            self.made_by.insert(sib.output, op.name.clone());
        }
        self.vals.insert(op.output, v.clone());
        for view in views {
            self.vals.insert(view.output, v.clone());
            self.made_by.insert(view.output, op.name.clone());
        }
        self.vals.insert(end, v);
        self.made_by.insert(op.output, op.name.clone());
        self.made_by.insert(end, op.name.clone());
        Ok(())
    }

    /// The mapping of matmul `name` of `x` by `n` weight columns, chosen within its
    /// share of the weight budget (or as the finalist search asks), with the
    /// strategies it was chosen from recorded; `lower` lowers it with that mapping.
    fn mapped_linear(
        &mut self,
        lw: &mut Lowering<'_>,
        (name, input_from): (&str, Option<String>),
        x: &DistTensor,
        (n, per_row_bias): (u32, bool),
        lower: impl FnOnce(
            &mut Lowering<'_>,
            crate::matmul::MatmulMapping,
        ) -> Result<DistTensor, PlanError>,
    ) -> Result<DistTensor, PlanError> {
        let kp = x.cols.next_multiple_of(AMP_WIDTH);
        let shape = MatmulShape {
            rows: x.rows,
            k: kp,
            n,
            a_blocked: linear::takes_blocks(x),
            rearrange: lw.opts.experimental.rearrange_inputs,
            even_rows: lw.opts.even_rows,
            k_parts: 1,
            per_row_bias,
            feed: crate::matmul::WeightFeed {
                // A resident linear keeps the staged feed's cost here: costed
                // without it, B/16's linears took grids with more replicas
                // (placement peak 452,608 bytes against 249,024) and ran
                // slower (1,026,704 cycles at 12 layers against 1,018,412).
                staged: lw.opts.staged(),
                fp8: lw.opts.weight_dtype == WeightDtype::Fp8,
            },
        };
        let wbytes = u64::from(kp) * u64::from(n) * 2;
        // Staged weights live only while their operation runs, so each linear
        // may take the whole budget; resident ones share it.
        let share = if lw.opts.staged() {
            lw.opts.weight_bytes.max(weight_floor(lw.machine, wbytes))
        } else {
            weight_floor(lw.machine, wbytes)
                + (lw.opts.weight_bytes.saturating_sub(self.weight_floors) as f64
                    * wbytes as f64
                    * f64::from(x.rows)
                    / self.weight_demand.max(1.0)) as u64
        };
        // A replayed layer takes the body's choice: its operations are the
        // body's, named for their layer.
        let choice = lw
            .opts
            .choices
            .get(lw.body_name(name).as_ref())
            .copied()
            .unwrap_or(0);
        let (map, candidates) = map_linear(
            lw.machine,
            shape,
            (
                share + lw.opts.transient_bytes,
                share + lw.opts.transient_bytes * 5 / 3,
            ),
            share,
            choice,
        )?;
        let chosen = choice.min(candidates.len() - 1);
        lw.plan.candidates.push(OpCandidates {
            op: name.to_string(),
            input_from,
            candidates,
            chosen,
        });
        if map.pk > 1 {
            self.inner_chunks = Some(map.chunks_per_tile);
        }
        lower(lw, map)
    }

    /// `softmax(q @ k^T * scale) @ v` per image and head, from the scores product.
    fn attention(
        &mut self,
        lw: &mut Lowering<'_>,
        fa: &FusedAttention<'g>,
    ) -> Result<(), PlanError> {
        let op = fa.scores;
        let fail = |what: &str| unsupported(format!("{}: {what}", op.name));
        let (q, k, v, mut scale) = (fa.q, fa.k, fa.v, fa.scale);
        let chain = fa.chain.clone();
        let pv = *chain.last().expect("the chain ends at p V");
        if let OpKind::SplitHeads { x, .. } = self.g.graph.producer(q).kind
            && self.fusion.folded_scale(x) == Some(scale)
        {
            lw.plan.decisions.push(format!(
                "{}: softmax scale {scale} folded into the query projection",
                op.name
            ));
            scale = 1.0;
        }
        if !(scale > 0.0 && scale <= tessera_kernels::Softmax::SCALE_MAX) {
            return Err(fail("the softmax scale must be in (0, 16]"));
        }

        let qd = self.g.graph.shape(q).dims().to_vec();
        let kd = self.g.graph.shape(k).dims().to_vec();
        let (&[qb, qh, tq, d], &[b, h, tk, d2]) = (&qd[..], &kd[..]) else {
            return Err(fail("attention operands must be [batch, heads, tokens, d]"));
        };
        if qh != h || d != d2 || (qb != b && qb != 1) || self.g.graph.shape(v).dims() != kd {
            return Err(fail("queries, keys and values disagree in shape"));
        }
        let head_val = |w: &Self, t: TensorId| -> Result<Val, PlanError> {
            // The tensor before its split: views pass the layout through.
            let src = match &w.g.graph.producer(t).kind {
                OpKind::SplitHeads { x, .. } => *x,
                _ => return Err(fail("attention operands must come from split_heads")),
            };
            let v = w.val(src)?.clone();
            match v.cols {
                Cols::Heads { .. } => Ok(v),
                Cols::Dense => Err(fail("attention operands must be head-padded projections")),
            }
        };
        let (qv, kv, vv) = (head_val(self, q)?, head_val(self, k)?, head_val(self, v)?);
        let Cols::Heads {
            d: dh, dp: stride, ..
        } = qv.cols
        else {
            unreachable!()
        };
        // The attention's own buffers keep each head padded.
        let dp = dh.next_multiple_of(AMP_WIDTH);
        if kv.cols != qv.cols || vv.cols != qv.cols {
            return Err(fail("queries, keys and values have different head layouts"));
        }
        let out = attention::attention(
            lw,
            &attention::Attention {
                name: &op.name,
                q: (&qv.t, qv.offset),
                k: (&kv.t, kv.offset),
                v: (&vv.t, vv.offset),
                batch: to_u32(b, "batch")?,
                shared_q: qb == 1 && b != 1,
                tq: to_u32(tq, "tokens")?,
                t: to_u32(tk, "tokens")?,
                heads: to_u32(h, "heads")?,
                d: dh,
                dp,
                stride,
                scale,
            },
        )?;
        for c in chain {
            self.mark(c);
        }
        // The context is laid out as the queries are: packed or head-padded.
        self.vals.insert(
            pv.output,
            Val {
                t: out,
                cols: qv.cols,
                offset: 0,
            },
        );
        Ok(())
    }

    /// GELU of `a`, or `a + b` (same shapes), on `a`'s layout as it stands: `b` is
    /// moved beside each part of `a`, results go to new buffers (the operands may
    /// have other readers).
    fn elementwise(
        &mut self,
        lw: &mut Lowering<'_>,
        op: &Op,
        a: TensorId,
        b: Option<TensorId>,
    ) -> Result<(), PlanError> {
        let av = self.operand(lw, a)?;
        if av.cols != Cols::Dense || av.offset != 0 {
            return Err(unsupported(format!(
                "{}: elementwise op on head-split tensors",
                op.name
            )));
        }
        let elems = |p: &Part| (p.rows.end - p.rows.start) * (p.cols.end - p.cols.start);
        if let Some(p) = av.t.parts.iter().find(|p| !elems(p).is_multiple_of(4)) {
            return Err(unsupported(format!(
                "{}: a part of {} elements (rows {:?}, columns {:?}); elementwise kernels take groups of 4",
                op.name,
                elems(p),
                p.rows,
                p.cols
            )));
        }
        let fresh = |lw: &mut Lowering<'_>, what: &str| -> Vec<Part> {
            av.t.parts
                .iter()
                .map(|p| {
                    let tile = lw.plan.buffer(p.at.buf).tile;
                    let buf = lw.buffer(
                        tile,
                        format!("{}.{what}", op.name),
                        elems(p) * 2,
                        Category::Activation,
                    );
                    Part {
                        at: Loc { buf, offset: 0 },
                        ..p.clone()
                    }
                })
                .collect()
        };
        let like = |parts| DistTensor {
            parts,
            ..av.t.clone()
        };
        let b_parts = match b {
            Some(b) => {
                let bv = self.operand(lw, b)?;
                if bv.cols != Cols::Dense || bv.offset != 0 {
                    return Err(unsupported(format!(
                        "{}: elementwise op on head-split tensors",
                        op.name
                    )));
                }
                // Parts of `b` already beside those of `a` (same rows, columns and
                // tile) are used where they are.
                let beside: Option<Vec<Part>> =
                    av.t.parts
                        .iter()
                        .map(|p| {
                            bv.t.parts
                                .iter()
                                .find(|q| {
                                    q.rows == p.rows
                                        && q.cols == p.cols
                                        && lw.plan.buffer(q.at.buf).tile
                                            == lw.plan.buffer(p.at.buf).tile
                                })
                                .cloned()
                        })
                        .collect();
                if let Some(parts) = beside {
                    Some(parts)
                } else {
                    let dst = like(fresh(lw, "b"));
                    let copies = crate::dist::redistribute(&bv.t, &dst)
                        .map_err(|e| unsupported(format!("{}: {e}", op.name)))?;
                    lw.exchange(&format!("{}.b", op.name), copies);
                    Some(dst.parts)
                }
            }
            None => None,
        };
        let out = fresh(lw, "out");
        let step = lw.compute_step();
        for (k, (p, o)) in av.t.parts.iter().zip(&out).enumerate() {
            let tile = lw.plan.buffer(p.at.buf).tile;
            match &b_parts {
                Some(bp) => lw.call(
                    tile,
                    step,
                    tessera_kernels::Add::new(elems(p)),
                    &[("a", p.at), ("b", bp[k].at), ("out", o.at)],
                ),
                None => lw.call(
                    tile,
                    step,
                    tessera_kernels::Gelu::new(elems(p)),
                    &[("in", p.at), ("out", o.at)],
                ),
            }
        }
        self.vals.insert(op.output, Val::dense(like(out)));
        Ok(())
    }

    /// Softmax over the last axis outside attention: whole rows on their owners,
    /// f32 with the row maximum subtracted.
    fn softmax(&mut self, lw: &mut Lowering<'_>, op: &Op, x: TensorId) -> Result<(), PlanError> {
        let xv = self.operand(lw, x)?;
        if xv.cols != Cols::Dense || xv.offset != 0 || !xv.t.cols.is_multiple_of(4) {
            return Err(unsupported(format!(
                "{}: softmax needs dense rows of a multiple of 4 values, not {}",
                op.name, xv.t.cols
            )));
        }
        let cols = xv.t.cols;
        let t = row_wise(lw, &op.name, &xv.t, |lw, tile, step, n, input, out| {
            lw.call(
                tile,
                step,
                tessera_kernels::Softmax::new(n, cols, 1.0),
                &[("in", input), ("out", out)],
            );
        });
        self.vals.insert(op.output, Val::dense(t));
        Ok(())
    }

    fn lower_op(&mut self, lw: &mut Lowering<'_>, op: &'g Op) -> Result<(), PlanError> {
        match &op.kind {
            OpKind::Parameter { .. } => Ok(()),
            OpKind::Input { name, shape, .. } => {
                let dims = shape.dims();
                let cols = *dims.last().unwrap_or(&1);
                let rows = dims.iter().product::<usize>() / cols.max(1);
                let t = lw.input(name, to_u32(rows, "rows")?, to_u32(cols, "columns")?);
                self.vals.insert(op.output, Val::dense(t));
                Ok(())
            }
            OpKind::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            } => self.layer_norm(lw, op, (*x, *gamma, *beta, *eps)),
            OpKind::MatMul { .. } if let Some(i) = self.fusion.pooled_at(op) => {
                self.absorbed_attention(lw, i)
            }
            OpKind::MatMul { .. } if let Some(l) = self.fusion.linear(op) => self.linear(lw, l),
            OpKind::MatMul {
                transpose_b: true,
                bias: None,
                ..
            } => match self.fusion.attention(op) {
                Some(fa) => {
                    let fa = FusedAttention {
                        chain: fa.chain.clone(),
                        ..*fa
                    };
                    self.attention(lw, &fa)
                }
                None => Err(unsupported(format!(
                    "{}: {}",
                    op.name,
                    self.g
                        .softmax_chain(op)
                        .err()
                        .unwrap_or("a product by a transposed operand outside attention")
                ))),
            },
            OpKind::Reshape { x, .. } | OpKind::SplitHeads { x, .. } | OpKind::MergeHeads { x } => {
                let v = self.operand(lw, *x)?;
                self.vals.insert(op.output, v);
                Ok(())
            }
            OpKind::Gelu { x } => self.elementwise(lw, op, *x, None),
            OpKind::Add { a, b }
                if self.g.graph.shape(*a).dims() == self.g.graph.shape(*b).dims() =>
            {
                self.elementwise(lw, op, *a, Some(*b))
            }
            OpKind::Softmax { x } => self.softmax(lw, op, *x),
            other => Err(unsupported(format!(
                "`{}` ({}) has no lowering rule outside the patterns it fuses into",
                op.name,
                other.mnemonic()
            ))),
        }
    }
}

/// The row-pass counts a linear is tried with; `precheck` bounds a linear by the
/// most of them.
pub(crate) const ROW_PASSES: [u32; 8] = [1, 2, 3, 4, 6, 8, 12, 16];

/// Parts of K a one-pass linear's strategies may take (`MatmulShape::k_parts`):
/// the other way to bound the input bytes a tile holds.
pub(crate) const K_PARTS: [u32; 5] = [1, 2, 3, 4, 6];

/// A linear's strategies: the mappings (the default first) and what the plan
/// records of them.
type Strategies = (Vec<crate::matmul::MatmulMapping>, Vec<Candidate>);

/// The strategy `choice` of a linear (see [`linear_strategies`]) and the list.
///
/// The list is a pure function of the machine, the shape and the budgets, and
/// costing it is most of a lowering's time (every row split walks the AMP's cost
/// model); the fit loop, its growth phase and the finalists lower the same
/// linears at the same few budgets again and again, so lists are kept for the
/// process (a few kilobytes each, at most [`STRATEGY_CACHE`] of them).
fn map_linear(
    machine: &Machine,
    shape: MatmulShape,
    budgets: (u64, u64),
    weight_cap: u64,
    choice: usize,
) -> Result<(crate::matmul::MatmulMapping, Vec<Candidate>), PlanError> {
    use foldhash::fast::FixedState;
    use std::sync::{Arc, Mutex};
    type Key = (String, MatmulShape, (u64, u64), u64);
    static CACHE: Mutex<HashMap<Key, Arc<Strategies>, FixedState>> =
        Mutex::new(HashMap::with_hasher(FixedState::with_seed(0)));
    let key = (format!("{machine:?}"), shape, budgets, weight_cap);
    let cached = CACHE.lock().ok().and_then(|c| c.get(&key).cloned());
    let strategies = match cached {
        Some(s) => s,
        None => {
            let s = Arc::new(linear_strategies(machine, shape, budgets, weight_cap)?);
            if let Ok(mut c) = CACHE.lock() {
                if c.len() >= STRATEGY_CACHE {
                    c.clear();
                }
                c.insert(key, Arc::clone(&s));
            }
            s
        }
    };
    let (list, cands) = &*strategies;
    let chosen = list[choice.min(list.len() - 1)].clone();
    Ok((chosen, cands.clone()))
}

/// Linear strategy lists [`map_linear`] keeps at most.
const STRATEGY_CACHE: usize = 4096;

/// The cheapest mapping of a matmul done in row passes (one after another on the
/// same tiles, weights loaded once): passes trade time for the activation bytes a
/// tile holds at once, which is what lets the largest matmuls fit. The outputs of
/// earlier passes stay, so they are taken off the budget first (spread evenly).
/// Then the other strategies the growth phase and the finalists choose among.
fn linear_strategies(
    machine: &Machine,
    shape: MatmulShape,
    (budget, wide): (u64, u64),
    weight_cap: u64,
) -> Result<Strategies, PlanError> {
    let out_bytes = u64::from(shape.rows) * u64::from(shape.n) * 2 / u64::from(machine.tiles);
    let mut best: Option<(u64, crate::matmul::MatmulMapping)> = None;
    let mut first_err = None;
    let mut others = Vec::new();
    let mut beyond = Vec::new();
    let splits = ROW_PASSES
        .iter()
        .flat_map(|&passes| {
            let parts: &[u32] = if passes == 1 { &K_PARTS } else { &[1] };
            parts.iter().map(move |&k_parts| (passes, k_parts))
        })
        .take_while(|&(passes, _)| passes <= shape.rows);
    for (passes, k_parts) in splits {
        let per = shape.rows.div_ceil(passes);
        let kept = if passes > 1 { out_bytes } else { 0 };
        let pass_shape = MatmulShape {
            rows: per,
            k_parts,
            ..shape
        };
        let runs = u64::from(shape.rows.div_ceil(per));
        let pass_budget = budget.saturating_sub(kept);
        match map_matmul_capped(machine, pass_shape, pass_budget, weight_cap) {
            Ok(m) => {
                let cost = m.cost.over_passes(runs);
                if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                    best = Some((cost, m));
                }
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
        for m in
            crate::matmul::matmul_front(machine, pass_shape, wide.saturating_sub(kept), weight_cap)
        {
            let cost = m.cost.over_passes(runs);
            if m.bytes_per_tile <= pass_budget {
                others.push((cost, m));
            } else {
                beyond.push((cost, m));
            }
        }
    }
    let (cost, m) = match (best, first_err) {
        (Some(b), _) => b,
        (None, Some(e)) => return Err(e),
        (None, None) => {
            return Err(PlanError::Empty {
                rows: shape.rows,
                k: shape.k,
                n: shape.n,
            });
        }
    };
    // The default first, then the other strategies within the budget no one beats
    // on both cycles and bytes, then the cheapest few beyond it that beat the
    // default's cycles (for the growth phase; last, so that the others' indices do
    // not depend on them).
    let front = crate::matmul::pareto(others, |(c, m)| (*c, m.bytes_per_tile));
    let mut list = vec![(cost, m)];
    for o in front {
        if list.len() == MAX_CANDIDATES {
            break;
        }
        if !list.iter().any(|l| l.1 == o.1) {
            list.push(o);
        }
    }
    let within = list.len();
    beyond.sort_by_key(|(c, m)| (*c, m.bytes_per_tile));
    list.extend(
        beyond
            .into_iter()
            .filter(|(c, _)| *c < cost)
            .take(MAX_BEYOND_BUDGET),
    );
    let cands = list
        .iter()
        .enumerate()
        .map(|(i, (c, m))| Candidate {
            beyond_budget: i >= within,
            estimated_cycles: *c,
            bytes_per_tile: m.bytes_per_tile,
            passes: shape.rows.div_ceil(m.shape.rows),
            in_bytes_per_tile: u64::from(m.rows_per_tile)
                * u64::from(m.chunks_per_tile.div_ceil(m.shape.k_parts.max(1)))
                * u64::from(crate::matmul::AMP_WIDTH)
                * 2,
            out_bytes_per_tile: u64::from(m.rows_per_tile)
                * u64::from(m.blocks_per_tile / m.pk.max(1))
                * u64::from(crate::matmul::AMP_WIDTH)
                * 2,
            grid: format!(
                "{} x ({}, {}, {}){}",
                shape.rows.div_ceil(m.shape.rows),
                m.pr,
                m.pk,
                m.pn,
                if m.shape.k_parts > 1 {
                    format!(" in {} parts of K", m.shape.k_parts)
                } else {
                    String::new()
                }
            ),
        })
        .collect();
    Ok((list.into_iter().map(|(_, m)| m).collect(), cands))
}

/// The least weight budget a matmul gets: one copy of its weights over every tile,
/// twice over (a grid rarely uses every tile).
fn weight_floor(machine: &Machine, wbytes: u64) -> u64 {
    2 * wbytes.div_ceil(u64::from(machine.tiles.max(1)))
}

/// Strategies a linear offers the finalist search.
const MAX_CANDIDATES: usize = 6;
/// Strategies beyond the activation budget a linear offers: the growth phase
/// tries them cheapest first, since the cheapest may fit at no budget while a
/// dearer one, needing fewer bytes, fits.
const MAX_BEYOND_BUDGET: usize = 4;

/// Lowers `graph` to a tile plan for `machine`.
///
/// Weights stay resident, so how much of a tile they may take decides how fast
/// the matmuls can be (replicas save exchange) and whether the activations still
/// fit. The lowering starts from `opts.weight_bytes` and, while the busiest tile's
/// live bytes at some step exceed [`FIT_SHARE`] of its SRAM, shrinks the weight
/// budget by a quarter at a time down to a floor, then gives up the whole-slab
/// biases; the first plan that fits (or the last tried) is returned, and placement
/// has the final word.
pub fn lower(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<TilePlan, PlanError> {
    lower_fitted(machine, graph, weights, opts).map(|(plan, _)| plan)
}

/// [`lower`], also returning the options the fit loop settled on: what
/// [`lower_exact`] takes to lower the same model with other strategies under the
/// same budgets (the candidate lists the plan records belong to those options).
pub fn lower_fitted(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<(TilePlan, LowerOptions), PlanError> {
    let (plan, o) = lower_fitted_shape(machine, graph, weights, opts)?;
    // The fit loop and growth judge plans by their shape alone, so they skip
    // the later layers' weights; the plan returned has them.
    if plan.layer_weights_pending {
        return Ok((lower_exact(machine, graph, weights, &o)?, o));
    }
    Ok((plan, o))
}

/// [`lower_fitted`] for the plan's shape only ([`lower_shape`]): what the
/// finalist search starts from, filling in the later layers' weights of the
/// one it selects alone.
pub fn lower_fitted_shape(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<(TilePlan, LowerOptions), PlanError> {
    let (plan, o) = fit(machine, graph, weights, opts)?;
    let (plan, o) = grow(machine, graph, weights, plan, o)?;
    reside(machine, graph, weights, plan, o)
}

/// Live bytes a step may take on a tile: [`FIT_SHARE`] of its SRAM.
pub fn fit_limit(machine: &Machine) -> u64 {
    fit_limit_within(machine, None)
}

/// [`fit_limit`] when placement has only `capacity` bytes a tile (at most the
/// machine's SRAM): [`LowerOptions::capacity`].
pub fn fit_limit_within(machine: &Machine, capacity: Option<u64>) -> u64 {
    let sram = u64::from(machine.sram_bytes());
    capacity.map_or(sram, |c| c.min(sram)) * FIT_SHARE.0 / FIT_SHARE.1
}

/// The fit loop: lowers with `opts`, then with smaller budgets until the busiest
/// tile's live bytes are within [`fit_limit`] (or nothing is left to shrink).
fn fit(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<(TilePlan, LowerOptions), PlanError> {
    let limit = fit_limit_within(machine, opts.capacity);
    let ladder = fit_ladder(opts);
    let (plan, i) = walk_ladder(
        ladder.len(),
        rayon::current_num_threads().max(1),
        |i| lower_shape(machine, graph, weights, &ladder[i]),
        |plan| max_live_bytes(plan) <= limit,
        |plan, floor| resident_fits(machine, plan, floor, opts.capacity),
    )?;
    Ok((plan, ladder[i].clone()))
}

/// Which of a ladder's `n` options the fit loop takes, lowering option `i`
/// with `lower`: the first that `fits`, or the last tried. `first` checks the
/// first plan (what lives for the whole program, which no option shrinks),
/// given the floor's plan too where it was lowered, for its figures.
///
/// The first option and the floor (option `n - 1`, every lever at its least)
/// are lowered at once: when the floor is over the limit too, it is the plan,
/// and the options between are not lowered. Each lever is there to shrink what
/// a tile holds, so an option between is not expected to fit where the floor
/// does not (one that would is given up for the floor, which placement then
/// judges, as it judges the last plan when nothing fits). At 27 So400m layers
/// each lowering takes seconds, and a whole tower at batch 2 or 4 is over the
/// limit at the floor (its weight store alone is half of every tile). A floor
/// that cannot be lowered at all (an activation budget no mapping of some
/// operation fits: the So400m layer at batch 4) says nothing of the options
/// between, which are walked in order; its error stands only if the walk
/// reaches it. The options between are lowered ahead, `threads` at once, and
/// taken in order: each follows from the one before alone, never from its
/// plan, so the result is the one a loop lowering one option at a time gives.
fn walk_ladder<T: Send, E: Send>(
    n: usize,
    threads: usize,
    lower: impl Fn(usize) -> Result<T, E> + Sync,
    fits: impl Fn(&T) -> bool,
    first: impl FnOnce(&T, Option<&T>) -> Result<(), E>,
) -> Result<(T, usize), E> {
    let last = n.saturating_sub(1);
    let (plan, floor) = if last > 0 {
        let (plan, floor) = rayon::join(|| lower(0), || lower(last));
        (plan?, Some(floor))
    } else {
        (lower(0)?, None)
    };
    first(&plan, floor.as_ref().and_then(|f| f.as_ref().ok()))?;
    if fits(&plan) {
        return Ok((plan, 0));
    }
    let Some(floor) = floor else {
        // Nothing to shrink: the plan tried, which placement judges.
        return Ok((plan, 0));
    };
    let floor = match floor {
        Ok(f) if !fits(&f) => return Ok((f, last)),
        f => f,
    };
    let between: Vec<usize> = (1..last).collect();
    for batch in between.chunks(threads.max(1)) {
        let plans: Vec<Result<T, E>> = batch.par_iter().map(|&i| lower(i)).collect();
        for (&i, plan) in batch.iter().zip(plans) {
            let plan = plan?;
            if fits(&plan) {
                return Ok((plan, i));
            }
        }
    }
    Ok((floor?, last))
}

/// The options the fit loop tries, in order, from `opts`. First the rounded
/// row groups (a few rows more on the busiest tile: the So400m layer at batch
/// 4 keeps 384 KiB of weights without them and falls to 288 KiB with them),
/// then weight replicas, then the fast whole-slab biases (the So400m layer at
/// batch 4 is faster with both at a budget of 180 KiB than with replicas and
/// no slabs). Each smaller weight budget is tried with rounded row groups
/// again.
fn fit_ladder(opts: &LowerOptions) -> Vec<LowerOptions> {
    let mut o = opts.clone();
    let mut ladder = vec![o.clone()];
    loop {
        if o.even_rows {
            o.even_rows = false;
        } else {
            match smaller_weight_budget(&o) {
                Some(smaller) => {
                    o = smaller;
                    o.even_rows = opts.even_rows;
                }
                None if o.slab_bias_bytes > 0 => o.slab_bias_bytes = 0,
                // Then half of every attention's keys and values a tile, for a
                // merge exchange more: at its peak the attention holds a head's
                // keys whole, which no weight budget touches.
                None if !o.cut_keys && !o.experimental.whole_keys => o.cut_keys = true,
                // Last, the activation budget: a whole tower's weight store
                // takes room no weight budget gives back.
                None if o.transient_bytes > MIN_TRANSIENT_BYTES => {
                    o.transient_bytes = (o.transient_bytes * 3 / 4).max(MIN_TRANSIENT_BYTES);
                }
                None => return ladder,
            }
        }
        ladder.push(o.clone());
    }
}

/// Refuses a model whose tiles cannot hold what lives for the whole program:
/// the weight store, vertex states and exchange code do not shrink much with
/// the budgets the fit loop tries (the store is every weight once), so when
/// they alone exceed a tile's SRAM no lowering fits, and the report says by
/// how much, in the time of one lowering rather than of every budget and a
/// placement. Both plans lowered at once are judged, the first and `floor` (the
/// ladder's last option, every budget at its least), and the model is refused
/// only when neither holds them: smaller budgets shrink resident replicas but
/// add calls, so vertex states and exchange code grow (27 tiny layers on one
/// tile: 46,156 bytes over at the first budgets, none at the floor; the f16
/// So400m tower: 17,252 bytes over at the first, 5,853,608 at the floor). The
/// figures are the plan that misses less; the total with the operations'
/// buffers is given for both.
fn resident_fits(
    machine: &Machine,
    first: &TilePlan,
    floor: Option<&TilePlan>,
    capacity: Option<u64>,
) -> Result<(), PlanError> {
    let available = capacity.unwrap_or(u64::from(machine.sram_bytes()));
    let Some(at_first) = whole_program_short(first, available) else {
        return Ok(());
    };
    let at_floor = match floor {
        Some(f) => match whole_program_short(f, available) {
            None => return Ok(()),
            Some(s) => Some(s),
        },
        None => None,
    };
    let (short, budgets) = match at_floor {
        Some(s) if s.total_missing < at_first.total_missing => (s, "smallest"),
        _ => (at_first, "first"),
    };
    // The plans' own buffers too, at each tile's busiest step: what they would
    // miss, which says more than the whole-program bytes alone.
    let (live_missing, live_tiles) = live_shortfall(first, available);
    let (floor_missing, floor_tiles) = live_shortfall(floor.unwrap_or(first), available);
    Err(PlanError::Resident {
        budgets: budgets.to_string(),
        live_tiles,
        live_missing,
        floor_tiles,
        floor_missing,
        tile: short.tile,
        needed: short.needed,
        available,
        missing: short.needed - available,
        total_missing: short.total_missing,
        tiles: short.tiles,
        categories: short.categories,
    })
}

/// Where a plan's whole-program bytes exceed `available`: the tile short of
/// most, its bytes by category (largest first), and the bytes over in all.
struct WholeProgramShort {
    tile: u32,
    needed: u64,
    categories: Vec<(String, u64)>,
    total_missing: u64,
    tiles: u32,
}

fn whole_program_short(plan: &TilePlan, available: u64) -> Option<WholeProgramShort> {
    let last = plan.last_step();
    let mut per_tile: Vec<BTreeMap<&'static str, u64>> = vec![BTreeMap::new(); plan.tiles as usize];
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.first == 0 && b.last >= last)
    {
        let what = match b.category {
            Category::WeightStore => "weight store",
            Category::Weight => "resident weights",
            Category::VertexState => "vertex state",
            _ => continue,
        };
        *per_tile[b.tile as usize].entry(what).or_default() += b.total_bytes();
    }
    for (t, code) in crate::exchange_code::code_bytes_per_tile(plan)
        .into_iter()
        .enumerate()
    {
        if code > 0 {
            *per_tile[t].entry("exchange code").or_default() += code;
        }
    }
    let total = |m: &BTreeMap<&str, u64>| m.values().sum::<u64>();
    let short: Vec<(usize, u64)> = per_tile
        .iter()
        .enumerate()
        .map(|(t, m)| (t, total(m)))
        .filter(|&(_, n)| n > available)
        .collect();
    let &(tile, needed) = short
        .iter()
        .max_by_key(|&&(t, n)| (n, std::cmp::Reverse(t)))?;
    let mut categories: Vec<(String, u64)> = per_tile[tile]
        .iter()
        .map(|(c, b)| (c.to_string(), *b))
        .collect();
    categories.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    Some(WholeProgramShort {
        tile: tile as u32,
        needed,
        categories,
        total_missing: short.iter().map(|&(_, n)| n - available).sum(),
        tiles: short.len() as u32,
    })
}

/// Bytes a plan's tiles hold beyond `available` at their busiest steps, in all,
/// and how many tiles are over.
fn live_shortfall(plan: &TilePlan, available: u64) -> (u64, u32) {
    let steps = plan.steps.len().max(1);
    let over: Vec<u64> = live_by_tile_and_step(plan)
        .chunks(steps)
        .filter_map(|t| t.iter().max().copied())
        .filter(|&b| b > available)
        .map(|b| b - available)
        .collect();
    (over.iter().sum(), over.len() as u32)
}

/// The residency phase after growth: which of a layer loop's linears keep
/// their FP8 weights resident in their compute layout (`LowerOptions::resident`)
/// instead of staging them each iteration, under the whole model's memory.
/// Resident, a linear's weights take every replica of every layer for the whole
/// program (its widening buffer's bytes times the depth on each tile) and save
/// the staging exchange of every iteration. Linears are tried one at a time,
/// fewest bytes on their busiest tile first, each with those kept so far; one
/// is kept when the plan's busiest tile stays within the fit limit, what lives
/// for the whole program still fits, and the whole plan's estimate falls. A
/// linear whose resident bytes cannot fit beside the plan's (each tile's
/// busiest step plus them, less its staged copy) is not lowered at all: the
/// So400m tower, whose store already takes half of every tile, tries none.
fn reside(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    mut plan: TilePlan,
    mut o: LowerOptions,
) -> Result<(TilePlan, LowerOptions), PlanError> {
    let Some(count) = plan.layer_loop.as_ref().map(|lp| lp.count) else {
        return Ok((plan, o));
    };
    let limit = fit_limit_within(machine, o.capacity);
    if !o.reside || o.weight_dtype != WeightDtype::Fp8 || max_live_bytes(&plan) > limit {
        return Ok((plan, o));
    }
    let mut best = crate::estimate(machine, &plan).cycles;
    let prefix = format!("{}0.", layers::PREFIX);
    let ops: Vec<String> = plan
        .candidates
        .iter()
        .map(|c| c.op.clone())
        .filter(|op| op.starts_with(&prefix) && !o.resident.contains(op))
        .collect();
    // Each linear's bytes a tile once resident, and the bound they give.
    let tiles = plan.tiles as usize;
    let busiest: Vec<u64> = {
        let steps = plan.steps.len().max(1);
        live_by_tile_and_step(&plan)
            .chunks(steps)
            .map(|t| t.iter().copied().max().unwrap_or(0))
            .collect()
    };
    let mut order: Vec<(u64, String)> = Vec::new();
    for op in ops {
        let name = format!("{op}.w8");
        let mut staged = vec![0u64; tiles];
        for b in plan.buffers.iter().filter(|b| b.name == name) {
            staged[b.tile as usize] += u64::from(b.bytes);
        }
        let resident = |t: usize| staged[t].next_multiple_of(8) * u64::from(count);
        let most = (0..tiles).map(resident).max().unwrap_or(0);
        let fits = (0..tiles).all(|t| busiest[t] + resident(t) - staged[t] <= limit);
        if most > 0 && fits {
            order.push((most, op));
        }
    }
    order.sort();
    for (_, op) in order {
        let mut t = o.clone();
        t.resident.insert(op);
        let p = lower_shape(machine, graph, weights, &t)?;
        if max_live_bytes(&p) > limit || resident_fits(machine, &p, None, t.capacity).is_err() {
            continue;
        }
        let e = crate::estimate(machine, &p).cycles;
        if e < best {
            (best, plan, o) = (e, p, t);
        }
    }
    Ok((plan, o))
}

/// The growth phase after the fit loop. A linear's default strategy keeps within
/// the activation budget (`transient_bytes`), which is sized for the busiest
/// linear; its candidate list also holds strategies that need up to two thirds
/// more (typically fewer row passes or parts of K, so fewer AMP calls). Each
/// linear in lowering order tries such strategies cheapest first, with the
/// choices kept so far, each at the budgets as they stand and then at smaller
/// weight budgets down to the fit loop's next one ([`grow_budgets`]: fewer
/// replicas, more room for activations) until one fits; a trial is kept when its
/// busiest tile stays within the fit limit and the whole plan's estimate
/// ([`crate::estimate`]) is lower, and the linear's first kept trial ends its
/// turn. A strategy needing at least the bytes of one that fitted at no budget
/// is not tried. Placement still judges the result, as it judges every plan.
fn grow(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    mut plan: TilePlan,
    mut o: LowerOptions,
) -> Result<(TilePlan, LowerOptions), PlanError> {
    let limit = fit_limit_within(machine, o.capacity);
    if max_live_bytes(&plan) > limit {
        return Ok((plan, o));
    }
    let mut best = crate::estimate(machine, &plan).cycles;
    let ops: Vec<String> = plan.candidates.iter().map(|c| c.op.clone()).collect();
    for op in ops {
        // The list as the current plan records it (budgets move as trials are
        // kept, and the indices belong to the budgets).
        let Some(rec) = plan.candidates.iter().find(|c| c.op == op) else {
            continue;
        };
        // The list's strategies beyond the budget, cheapest first, unless the
        // linear already takes one. Each is tried until one is kept; one needing
        // at least the bytes of one that fitted at no budget is not tried.
        let current = rec.candidates[rec.chosen].estimated_cycles;
        let beyond: Vec<(usize, u64)> = rec
            .candidates
            .iter()
            .enumerate()
            .filter(|&(i, c)| c.beyond_budget && i != rec.chosen && c.estimated_cycles < current)
            .map(|(i, c)| (i, c.bytes_per_tile))
            .collect();
        try_beyond(&beyond, |i| {
            let mut t = o.clone();
            t.choices.insert(op.clone(), i);
            // (fitted somewhere, kept)
            Ok(
                match grow_trial(machine, graph, weights, &t, limit, best)? {
                    GrowTrial::Nowhere => (false, false),
                    GrowTrial::NoCheaper => (true, false),
                    GrowTrial::Cheaper(kept) => {
                        (best, plan, o) = *kept;
                        (true, true)
                    }
                },
            )
        })?;
    }
    Ok((plan, o))
}

/// What one strategy of the growth phase came to ([`grow_trial`]).
enum GrowTrial {
    /// It fitted at no budget.
    Nowhere,
    /// Where it first fitted, its estimate was not below the plan's.
    NoCheaper,
    /// Where it first fitted, its estimate, plan and options.
    Cheaper(Box<(u64, TilePlan, LowerOptions)>),
}

/// Lowers the options `t` (a strategy chosen) at the budgets as they stand, then
/// at smaller weight budgets in steps of `GROW_STEP` down to the fit loop's next
/// one (the plan's estimate is not monotonic in the weight budget, so a budget
/// between the fit loop's quarters can be the cheaper place for a strategy to
/// fit); no further: each
/// lowering of that layer takes seconds, and a strategy that needs more gives up
/// more replicas than it saves. The first budget whose plan keeps within `limit`
/// decides, against the estimate `best`: where it fits and is no cheaper, fewer
/// replicas will not be cheaper. The budgets are lowered a thread's worth at a
/// time, and judged in order as one at a time would.
fn grow_trial(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    t: &LowerOptions,
    limit: u64,
    best: u64,
) -> Result<GrowTrial, PlanError> {
    let trials: Vec<LowerOptions> = grow_budgets(t)
        .into_iter()
        .map(|w| LowerOptions {
            weight_bytes: w,
            ..t.clone()
        })
        .collect();
    for batch in trials.chunks(rayon::current_num_threads().max(1)) {
        let plans: Vec<Result<TilePlan, PlanError>> = batch
            .par_iter()
            .map(|t| lower_shape(machine, graph, weights, t))
            .collect();
        for (t, p) in batch.iter().zip(plans) {
            let p = p?;
            if max_live_bytes(&p) > limit {
                continue;
            }
            let e = crate::estimate(machine, &p).cycles;
            return Ok(if e < best {
                GrowTrial::Cheaper(Box::new((e, p, t.clone())))
            } else {
                GrowTrial::NoCheaper
            });
        }
    }
    Ok(GrowTrial::Nowhere)
}

/// Tries a linear's strategies beyond the activation budget, `(index, bytes a
/// tile)` cheapest first, with `attempt`, which reports whether the strategy fitted
/// at some budget and whether it was kept; stops at the first kept, and skips one
/// needing at least the bytes of one that fitted at no budget. Returns the indices
/// tried.
fn try_beyond(
    beyond: &[(usize, u64)],
    mut attempt: impl FnMut(usize) -> Result<(bool, bool), PlanError>,
) -> Result<Vec<usize>, PlanError> {
    let mut too_big = u64::MAX;
    let mut tried = Vec::new();
    for &(i, bytes) in beyond {
        if bytes >= too_big {
            continue;
        }
        tried.push(i);
        let (fitted, kept) = attempt(i)?;
        if kept {
            break;
        }
        if !fitted {
            too_big = too_big.min(bytes);
        }
    }
    Ok(tried)
}

/// Steps of the weight budgets the growth phase tries for a strategy beyond the
/// activation budget, between the fit loop's budget and its next smaller one.
const GROW_STEP: u64 = 32 * 1024;

/// The weight budgets the growth phase tries, in order: `o`'s, then down in steps
/// of [`GROW_STEP`] to the fit loop's next smaller one, inclusive.
fn grow_budgets(o: &LowerOptions) -> Vec<u64> {
    let w = o.weight_bytes;
    let floor = smaller_weight_budget(o).map_or(w, |s| s.weight_bytes);
    let mut v = vec![w];
    v.extend(
        (1..)
            .map(|k| w.saturating_sub(k * GROW_STEP))
            .take_while(|&x| x > floor),
    );
    if floor < w {
        v.push(floor);
    }
    v
}

/// `o` with the next smaller weight budget the fit loop tries, `None` at the
/// floor.
fn smaller_weight_budget(o: &LowerOptions) -> Option<LowerOptions> {
    (o.weight_bytes > MIN_WEIGHT_BYTES).then(|| LowerOptions {
        weight_bytes: (o.weight_bytes * 3 / 4).max(MIN_WEIGHT_BYTES),
        ..o.clone()
    })
}

/// `o` with a slightly smaller weight budget (an eighth less), `None` at the
/// floor: what a caller tries when placement refuses a plan that the fit loop's
/// live-byte bound let through (the bound knows nothing of the memory elements
/// that streamed operands must keep apart, so such a plan is a near miss).
/// A plan with resident weights first gives them up (every weight staged, the
/// residency phase off), at the same budget: they are what it chose beyond
/// the fit loop's plan.
pub fn placement_retry_budget(o: &LowerOptions) -> Option<LowerOptions> {
    if !o.resident.is_empty() {
        return Some(LowerOptions {
            resident: Default::default(),
            reside: false,
            ..o.clone()
        });
    }
    (o.weight_bytes > MIN_WEIGHT_BYTES).then(|| LowerOptions {
        weight_bytes: (o.weight_bytes * 7 / 8).max(MIN_WEIGHT_BYTES),
        ..o.clone()
    })
}

/// Share of a tile's SRAM the live buffers of a step may take; the rest is for
/// code, host descriptors and what placement loses to alignment and elements
/// (measured on the So400m layer at batch 4: plans of 548 and 555 KB live on a
/// tile, 86-87 %, failed to place for want of separate elements; 539 KB placed).
pub const FIT_SHARE: (u64, u64) = (85, 100);
/// The smallest weight budget [`lower`] tries.
const MIN_WEIGHT_BYTES: u64 = 96 * 1024;
/// The smallest activation budget the fit loop tries.
const MIN_TRANSIENT_BYTES: u64 = 32 * 1024;

/// The most bytes of buffers live on one tile at one step: a lower bound of what
/// placement needs there.
pub fn max_live_bytes(plan: &TilePlan) -> u64 {
    busiest(plan).2
}

/// The tile and step with the most bytes live, and those bytes: the buffers live
/// at the step and the tile's exchange code, which stays for the whole program.
pub fn busiest(plan: &TilePlan) -> (u32, Step, u64) {
    let steps = plan.steps.len();
    live_by_tile_and_step(plan)
        .into_iter()
        .enumerate()
        .max_by_key(|&(i, bytes)| (bytes, std::cmp::Reverse(i)))
        .map_or((0, 0, 0), |(i, bytes)| {
            ((i / steps) as u32, (i % steps) as Step, bytes)
        })
}

/// Bytes live on each tile at each step (tile-major): the buffers live then and
/// the tile's exchange code.
fn live_by_tile_and_step(plan: &TilePlan) -> Vec<u64> {
    let steps = plan.steps.len();
    let mut live = vec![0u64; plan.tiles as usize * steps];
    let code = crate::exchange_code::code_bytes_per_tile(plan);
    for (t, code) in code.into_iter().enumerate() {
        for v in &mut live[t * steps..(t + 1) * steps] {
            *v += code;
        }
    }
    for b in &plan.buffers {
        for s in b.first..=b.last.min(steps.saturating_sub(1) as Step) {
            live[b.tile as usize * steps + s as usize] += b.total_bytes();
        }
    }
    live
}

/// One lowering with exactly `opts` (no fit loop): the plan may not fit, and
/// placement says so.
pub fn lower_exact(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<TilePlan, PlanError> {
    lower_layer_weights(machine, graph, weights, opts, 1..u32::MAX, &|| {})
}

/// [`lower_exact`] with only a layer loop's layers `layers` replayed for their
/// weights: the bindings of the others hold the first layer's bytes (and the
/// plan says so, `TilePlan::layer_weights_pending`). The replays are
/// independent of each other, so the later layers' weights can be made by
/// several such lowerings at once, each taking its layers' bindings.
/// `on_layer` is told of each layer replayed, for a caller showing progress.
pub fn lower_layer_weights(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
    layers: std::ops::Range<u32>,
    on_layer: &dyn Fn(),
) -> Result<TilePlan, PlanError> {
    lower_with(machine, graph, weights, opts, layers, on_layer)
}

/// A lowering for its shape only: a layer loop's later layers are not replayed
/// for their weights (their bindings hold the first layer's, and the plan says
/// so: `TilePlan::layer_weights_pending`), which is all the fit loop, growth
/// and a finalist's placement need, in a small part of the time. Without a loop
/// it is [`lower_exact`].
pub fn lower_shape(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<TilePlan, PlanError> {
    lower_with(machine, graph, weights, opts, 0..0, &|| {})
}

/// Whether a fused linear takes in operations of two layers, or of a layer and
/// what is outside the layers (its epilogue past the layer's last operation).
fn fusion_crosses_layers(graph: &Graph, fusion: &Fusion<'_>, ls: &layers::Layers) -> bool {
    let index: HashMap<TensorId, usize> = graph
        .ops()
        .iter()
        .enumerate()
        .map(|(i, o)| (o.output, i))
        .collect();
    let run = |t: TensorId| {
        index
            .get(&t)
            .and_then(|&i| ls.runs.iter().position(|r| r.contains(&i)))
    };
    fusion.linears.iter().any(|l| {
        let own = run(l.matmul.output);
        run(l.end) != own || l.siblings.iter().any(|s| run(s.output) != own)
    })
}

/// Lowers operation `i` by its rule and records the plan's op for it.
fn lower_at<'g>(w: &mut Walker<'g>, lw: &mut Lowering<'_>, i: usize) -> Result<(), PlanError> {
    let op = &w.g.graph.ops()[i];
    lw.op = op.name.clone();
    let steps = lw.plan.steps.len();
    // The rules that make constants: a LayerNorm's parameters, a linear's
    // weights and bias, the absorbed attention's folded projections.
    let stages = match op.kind {
        OpKind::LayerNorm { .. }
        | OpKind::MatMul {
            transpose_b: false, ..
        } => true,
        OpKind::MatMul { .. } => w.fusion.pooled_at(op).is_some(),
        _ => false,
    };
    if stages {
        lw.begin_staging();
    }
    w.lower_op(lw, op)?;
    lw.end_staging();
    let fused = std::mem::take(&mut w.fused);
    if lw.plan.steps.len() > steps || !fused.is_empty() {
        let kind = match &op.kind {
            OpKind::LayerNorm { .. } => "layer_norm",
            OpKind::MatMul {
                transpose_b: true, ..
            } => "attention",
            OpKind::MatMul { .. } => "linear",
            OpKind::Gelu { .. } | OpKind::Add { .. } => "elementwise",
            other => other.mnemonic(),
        };
        let results = w.results(i, &fused, lw.plan.ops.len());
        lw.plan.results.extend(results);
        lw.plan.ops.push(PlanOp {
            name: op.name.clone(),
            kind: kind.to_string(),
            fused,
            inner_chunks: w.inner_chunks.take(),
            flop: w.flop.take(),
        });
    }
    Ok(())
}

/// Where the walk is in the layer loop (`LowerOptions::loop_layers`).
#[derive(Default)]
struct LoopState {
    /// The body's first step, once it began.
    first: Option<Step>,
    /// The body's steps (its carry aside), for the replays to match.
    steps: Vec<StepKind>,
    replay: Option<ctx::Snapshot>,
    /// The later layers replayed for their weights; the others' operations
    /// are skipped.
    replays: std::ops::Range<u32>,
    /// The layer whose operations are being skipped.
    skipping: Option<usize>,
    /// The skipped layer's weights were made by the body's recipes.
    made_by_recipes: bool,
}

impl LoopState {
    /// Before operation `i`: the body or a replay begins at a layer's first
    /// operation.
    fn before(
        &mut self,
        w: &Walker<'_>,
        lw: &mut Lowering<'_>,
        ls: &layers::Layers,
        i: usize,
        waiting: &[usize],
    ) -> Result<(), PlanError> {
        let Some(l) = ls.runs.iter().position(|r| r.start == i) else {
            return Ok(());
        };
        if !waiting.is_empty() {
            return Err(unsupported(format!(
                "layer {l} begins while `{}` waits for an operand",
                lw.plan.ops.last().map_or("", |o| o.name.as_str())
            )));
        }
        if l == 0 {
            self.first = Some(lw.plan.steps.len() as Step);
            lw.begin_body(ls.count());
        } else if self.replays.contains(&(l as u32)) {
            let params = ls.params[l].as_ref();
            if let Some(params) =
                params.filter(|_| lw.recipes_complete() && !lw.opts.experimental.replay_layers)
            {
                // The layer's weights from its parameters by the body's
                // recipes; its operations are not lowered again.
                let layer = l as u32;
                lw.layer_from_recipes(layer, &|t, len| {
                    let own = params.get(&t).ok_or_else(|| {
                        unsupported(format!(
                            "layer {layer} has no parameter standing for `{}`",
                            w.g.graph.producer(t).name
                        ))
                    })?;
                    w.g.param_data(*own, len)
                })?;
                // Its products rounded to FP8 as the body's, under its names
                // (a replay records them as it lowers them).
                let body = format!("{}0.", layers::PREFIX);
                let renamed: Vec<(String, i8, f32)> = lw
                    .plan
                    .fp8_weights
                    .iter()
                    .filter_map(|(n, s, f)| {
                        let rest = n.strip_prefix(&body)?;
                        Some((format!("{}{layer}.{rest}", layers::PREFIX), *s, *f))
                    })
                    .collect();
                lw.plan.fp8_weights.extend(renamed);
                self.made_by_recipes = true;
                lw.plan.layer_weights_by_recipe = true;
                self.skipping = Some(l);
            } else {
                self.replay = Some(lw.begin_replay(l as u32));
            }
        } else {
            self.skipping = Some(l);
        }
        Ok(())
    }

    /// After operation `i`: at a layer's last, the body ends with its carry (the
    /// output copied into the buffers its input came in), or the replay is
    /// checked and taken back; either way the layer's output is then where its
    /// input was, which is what the next layer (or what follows) reads. Says
    /// whether a replay ended.
    fn after(
        &mut self,
        w: &mut Walker<'_>,
        lw: &mut Lowering<'_>,
        ls: &layers::Layers,
        i: usize,
        waiting: &[usize],
    ) -> Result<bool, PlanError> {
        let Some(l) = ls.runs.iter().position(|r| r.end == i + 1) else {
            return Ok(false);
        };
        if !waiting.is_empty() {
            return Err(unsupported(format!(
                "layer {l} ends with operations waiting"
            )));
        }
        let x = w.val(ls.input)?.clone();
        let mut replayed = false;
        if l == 0 {
            let first = self.first.expect("the body began");
            self.steps = lw.plan.steps[first as usize..].to_vec();
            let y = w.val(ls.outputs[0])?.clone();
            let dense = |v: &Val| v.cols == Cols::Dense && v.offset == 0;
            if !dense(&x) || !dense(&y) {
                return Err(unsupported("a layer's input or output is head-split"));
            }
            let copies = crate::dist::redistribute(&y.t, &x.t)
                .map_err(|e| unsupported(format!("the layer's output cannot carry: {e}")))?;
            // The carry is an operation of its own, so that profiles show what
            // it costs and no operation's result seems to end after it.
            lw.op = format!("{}0.carry", layers::PREFIX);
            let name = lw.op.clone();
            if lw.exchange(&name, copies).is_some() {
                lw.plan.ops.push(PlanOp {
                    name,
                    kind: "carry".into(),
                    fused: Vec::new(),
                    inner_chunks: None,
                    flop: None,
                });
            }
            lw.end_body();
            lw.plan.layer_loop = Some(LayerLoop {
                first,
                last: lw.plan.last_step(),
                count: ls.count(),
                prefix: layers::PREFIX.to_string(),
            });
        } else if let Some(snap) = self.replay.take() {
            lw.end_replay(snap, &self.steps).map_err(unsupported)?;
            replayed = true;
        } else if std::mem::take(&mut self.made_by_recipes) {
            self.skipping = None;
            replayed = true;
        } else {
            self.skipping = None;
            lw.plan.layer_weights_pending = true;
        }
        if let Some(e) = lw.replay_error.take() {
            return Err(unsupported(e));
        }
        w.vals.insert(ls.outputs[l], x);
        Ok(replayed)
    }
}

fn lower_with(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
    replays: std::ops::Range<u32>,
    on_replayed: &dyn Fn(),
) -> Result<TilePlan, PlanError> {
    // The loop (and the staging it needs) only where the graph has identical
    // layers: a one-layer model lowers as it always did.
    let layers = if opts.loop_layers {
        layers::find(graph)
    } else {
        None
    };
    let effective;
    let opts = if opts.loop_layers && layers.is_none() {
        effective = LowerOptions {
            loop_layers: false,
            ..opts.clone()
        };
        &effective
    } else {
        opts
    };
    let uses = Uses::new(graph, weights);
    let fusion = fuse::fuse(&uses, machine, opts);
    if let Some(ls) = &layers
        && fusion_crosses_layers(graph, &fusion, ls)
    {
        // A layer's product fused with what follows the layer: the body
        // would not end where the layer does. Lowered unrolled instead.
        let unrolled = LowerOptions {
            loop_layers: false,
            ..opts.clone()
        };
        return lower_with(machine, graph, weights, &unrolled, replays, on_replayed);
    }
    let mut w = Walker {
        g: uses,
        fusion,
        vals: HashMap::new(),
        weight_floors: 0,
        weight_demand: 0.0,
        fused: Vec::new(),
        inner_chunks: None,
        made_by: HashMap::new(),
        flop: None,
        layer_params: None,
    };
    // Every matmul by a parameter keeps its weights resident, except absorbed
    // query and key projections (the scores' few weights are constants beside
    // the tiles' pieces of the input; the value projection serves `heads` rows an
    // image).
    for op in graph.ops() {
        let OpKind::MatMul { a, b, .. } = op.kind else {
            continue;
        };
        if !w.g.is_param(b) || w.fusion.pooled.iter().any(|ab| ab.replaces(op)) {
            continue;
        }
        let dims = graph.shape(b).dims();
        let wbytes =
            (dims[0].next_multiple_of(16) * dims[dims.len() - 1].next_multiple_of(16) * 2) as u64;
        let rows = match w.fusion.pooled.iter().find_map(|ab| ab.value_rows(op)) {
            Some(r) => u64::from(r),
            None => (graph.shape(a).numel() / dims[0].max(1)) as u64,
        };
        w.weight_floors += weight_floor(machine, wbytes);
        w.weight_demand += wbytes as f64 * rows as f64;
    }
    let mut lw = Lowering::new(machine, opts);
    // A fused linear waits for its residual operand, which an importer may emit
    // after the product; the built-in builders never do.
    let waits = |w: &Walker<'_>, i: usize| {
        (w.fusion.linear(&graph.ops()[i]))
            .and_then(|l| w.fusion.linears[l].residual)
            .is_some_and(|r| !w.vals.contains_key(&r))
    };
    let mut waiting: Vec<usize> = Vec::new();
    if layers.is_some() {
        w.layer_params = Some(layers::params_by_tail(graph));
    }
    let mut body = LoopState {
        replays,
        ..LoopState::default()
    };
    for i in 0..graph.ops().len() {
        if let Some(ls) = &layers {
            body.before(&w, &mut lw, ls, i, &waiting)?;
        }
        if !w.fusion.inside(i) && body.skipping.is_none() {
            if waits(&w, i) {
                waiting.push(i);
            } else {
                lower_at(&mut w, &mut lw, i)?;
                while let Some(k) = waiting.iter().position(|&j| !waits(&w, j)) {
                    let j = waiting.remove(k);
                    lower_at(&mut w, &mut lw, j)?;
                }
            }
        }
        if let Some(ls) = &layers
            && body.after(&mut w, &mut lw, ls, i, &waiting)?
        {
            on_replayed();
        }
    }
    // What still waits has an operand nothing lowers: its rule says why.
    for j in waiting {
        lower_at(&mut w, &mut lw, j)?;
    }
    for out in graph.outputs() {
        lw.op = format!("output.{}", out.name);
        let v = w.val(out.tensor)?.clone();
        if v.cols != Cols::Dense || v.offset != 0 {
            return Err(unsupported(format!("output `{}` is head-split", out.name)));
        }
        let steps = lw.plan.steps.len();
        lw.output(&out.name, &v.t);
        if lw.plan.steps.len() > steps {
            lw.plan.ops.push(PlanOp {
                name: lw.op.clone(),
                kind: "output".into(),
                fused: Vec::new(),
                inner_chunks: None,
                flop: None,
            });
        }
    }
    let plan = lw.finish();
    // The verifier is the lowering's independent check; release builds skip it
    // for speed, tests and debug builds never do.
    if cfg!(debug_assertions) {
        let errors = crate::verify(&plan);
        assert!(
            errors.is_empty(),
            "the lowering broke the plan's rules:\n{}",
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(plan)
}

#[cfg(test)]
mod ladder_tests {
    use super::walk_ladder;
    use std::sync::Mutex;

    /// Walks a ladder of `n` options whose plans are their bytes (`Err` where
    /// an option cannot be lowered), fitting at or below `limit`; returns the
    /// option taken (or the error) and the options lowered.
    fn walk(
        plans: &[Result<u32, &'static str>],
        limit: u32,
    ) -> (Result<usize, &'static str>, Vec<usize>) {
        let lowered = Mutex::new(Vec::new());
        let r = walk_ladder(
            plans.len(),
            2,
            |i| {
                lowered.lock().unwrap().push(i);
                plans[i]
            },
            |&b| b <= limit,
            |_, _| Ok(()),
        );
        let mut l = lowered.into_inner().unwrap();
        l.sort_unstable();
        (r.map(|(_, i)| i), l)
    }

    #[test]
    fn the_ladder_takes_the_first_option_that_fits() {
        // The first fits: the floor was lowered beside it, nothing else.
        assert_eq!(walk(&[Ok(5), Ok(9), Ok(3)], 5), (Ok(0), vec![0, 2]));
        // The floor fits: the first between that fits.
        assert_eq!(
            walk(&[Ok(9), Ok(8), Ok(5), Ok(4), Ok(3)], 5),
            (Ok(2), vec![0, 1, 2, 4])
        );
        // None between fits: the floor.
        assert_eq!(
            walk(&[Ok(9), Ok(8), Ok(7), Ok(3)], 5),
            (Ok(3), vec![0, 1, 2, 3])
        );
    }

    #[test]
    fn a_floor_over_the_limit_is_taken_without_the_options_between() {
        assert_eq!(walk(&[Ok(9), Ok(5), Ok(8), Ok(7)], 5), (Ok(3), vec![0, 3]));
    }

    #[test]
    fn a_floor_that_cannot_be_lowered_leaves_the_walk_to_the_options_between() {
        assert_eq!(
            walk(&[Ok(9), Ok(8), Ok(4), Err("floor")], 5),
            (Ok(2), vec![0, 1, 2, 3])
        );
        // Reached, its error stands.
        assert_eq!(
            walk(&[Ok(9), Ok(8), Err("floor")], 5),
            (Err("floor"), vec![0, 1, 2])
        );
        // The first option's error stands at once.
        assert_eq!(walk(&[Err("first"), Ok(3)], 5).0, Err("first"));
    }
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    /// The fit loop's ladder: from the options given, rounded row groups off
    /// before each smaller weight budget (and on again after it), then the
    /// slab biases, the cut keys and the activation budget, each option
    /// shrinking exactly one thing, down to every floor, and no option twice.
    #[test]
    fn the_fit_ladder_shrinks_one_lever_a_step_to_every_floor() {
        let opts = LowerOptions::default();
        let ladder = fit_ladder(&opts);
        assert_eq!(ladder[0], opts);
        assert!(!ladder[1].even_rows && ladder[1].weight_bytes == opts.weight_bytes);
        assert!(ladder[2].even_rows && ladder[2].weight_bytes == opts.weight_bytes * 3 / 4);
        let key = |o: &LowerOptions| {
            (
                o.weight_bytes,
                o.even_rows,
                o.slab_bias_bytes,
                o.cut_keys,
                o.transient_bytes,
            )
        };
        for w in ladder.windows(2) {
            let (a, b) = (key(&w[0]), key(&w[1]));
            let changed = [
                a.0 != b.0,
                a.1 != b.1 && a.0 == b.0,
                a.2 != b.2,
                a.3 != b.3,
                a.4 != b.4,
            ];
            assert_eq!(changed.iter().filter(|c| **c).count(), 1, "{a:?} -> {b:?}");
        }
        let last = ladder.last().unwrap();
        assert_eq!(last.weight_bytes, MIN_WEIGHT_BYTES);
        assert_eq!(last.slab_bias_bytes, 0);
        assert!(last.cut_keys);
        assert_eq!(last.transient_bytes, MIN_TRANSIENT_BYTES);
        let distinct: std::collections::BTreeSet<_> = ladder.iter().map(key).collect();
        assert_eq!(distinct.len(), ladder.len());
        // With whole keys asked for, the keys are never cut.
        let mut whole = opts.clone();
        whole.experimental.whole_keys = true;
        assert!(fit_ladder(&whole).iter().all(|o| !o.cut_keys));
    }

    /// The order of a linear's strategies beyond the budget: cheapest first until
    /// one is kept, past ones that fit nowhere (bytes like `mlp.fc1`'s at batch 4
    /// with its bias a slab: the cheapest, in 3 parts of K, fits at no budget, and
    /// one in 6 parts, needing fewer bytes, does), skipping one as large as one
    /// that fitted nowhere.
    #[test]
    fn growth_tries_strategies_beyond_the_budget_until_one_is_kept() {
        let beyond = [(6, 362_752), (7, 335_872), (8, 308_992), (9, 355_968)];
        let fits = |i: usize| beyond.iter().find(|x| x.0 == i).unwrap().1 < 320_000;
        let kept_where_it_fits = try_beyond(&beyond, |i| Ok((fits(i), fits(i)))).unwrap();
        assert_eq!(kept_where_it_fits, vec![6, 7, 8]);
        // Fitting but not cheaper: the next is tried, unless it is as large as
        // one that fitted nowhere.
        let never_kept = try_beyond(&beyond, |i| Ok((fits(i), false))).unwrap();
        assert_eq!(never_kept, vec![6, 7, 8]);
        let small = [(1, 300), (2, 310), (3, 290)];
        assert_eq!(
            try_beyond(&small, |_| Ok((false, false))).unwrap(),
            vec![1, 3]
        );
        assert!(try_beyond(&small, |_| Err(PlanError::Unsupported("x".into()))).is_err());
    }

    /// Growth tries a strategy at the budget as it stands, then every 32 KiB down
    /// to the fit loop's next smaller budget (a quarter less), that one included;
    /// at the floor only the budget itself.
    #[test]
    fn growth_tries_budgets_between_the_fit_loops_steps() {
        let kib = |w: u64| LowerOptions {
            weight_bytes: w * 1024,
            ..LowerOptions::default()
        };
        let in_kib = |o: &LowerOptions| -> Vec<u64> {
            grow_budgets(o).into_iter().map(|w| w / 1024).collect()
        };
        assert_eq!(in_kib(&kib(384)), [384, 352, 320, 288]);
        assert_eq!(in_kib(&kib(512)), [512, 480, 448, 416, 384]);
        // 112 KiB: the next smaller is the floor (96), closer than a step.
        assert_eq!(in_kib(&kib(112)), [112, 96]);
        assert_eq!(in_kib(&kib(96)), [96]);
    }

    /// The kept strategy lists are the lists costed afresh: for every choice, the
    /// chosen mapping and the candidates; and a machine with other timing gets
    /// its own list, not the first machine's.
    #[test]
    fn kept_strategies_are_the_costed_ones() {
        let shape = MatmulShape::new(1458, 1152, 4304);
        let budgets = (400 * 1024, 600 * 1024);
        let cap = 64 * 1024;
        let mut slow = Machine::c600();
        slow.timing.exchange_bytes_per_cycle = 1;
        let machines = [Machine::c600(), slow];
        let fresh: Vec<Strategies> = machines
            .iter()
            .map(|m| linear_strategies(m, shape, budgets, cap).unwrap())
            .collect();
        // The premise: the two machines' lists differ, so a list kept for the
        // first and handed to the second shows.
        assert_ne!(fresh[0].1, fresh[1].1);
        for (m, (list, cands)) in machines.iter().zip(&fresh) {
            assert!(list.len() > 1);
            for round in 0..2 {
                for (i, want) in list.iter().enumerate() {
                    let (got, got_cands) = map_linear(m, shape, budgets, cap, i).unwrap();
                    assert_eq!(
                        (&got, &got_cands),
                        (want, cands),
                        "choice {i}, round {round}"
                    );
                }
            }
        }
    }

    /// A placement retry takes an eighth off the weight budget and keeps every
    /// other option; at the floor there is nothing left to take.
    #[test]
    fn placement_retry_takes_an_eighth() {
        let o = LowerOptions {
            even_rows: false,
            ..LowerOptions::default()
        };
        let r = placement_retry_budget(&o).unwrap();
        assert_eq!(r.weight_bytes, o.weight_bytes * 7 / 8);
        assert_eq!(
            LowerOptions {
                weight_bytes: o.weight_bytes,
                ..r.clone()
            },
            o
        );
        let floor = LowerOptions {
            weight_bytes: MIN_WEIGHT_BYTES,
            ..o.clone()
        };
        assert!(placement_retry_budget(&floor).is_none());
        let near = LowerOptions {
            weight_bytes: MIN_WEIGHT_BYTES + 8,
            ..o
        };
        assert_eq!(
            placement_retry_budget(&near).unwrap().weight_bytes,
            MIN_WEIGHT_BYTES
        );
    }
}

//! Lowering of the residual MLP block `y = x + fc2(gelu(fc1(ln(x))))` to a tile plan.
//!
//! Data path (steps in brackets):
//! - [0] the host writes `x` row-major onto its row owners, and, in the AMP block
//!   layout, into the residual slab of the tiles that finish `fc2`;
//! - [1] LayerNorm on the row owners;
//! - [2] exchange: each owner sends, per row, one slice of `k` per inner-dimension
//!   group to every column group of `fc1`'s tiles for that row group;
//! - [3] rearrangement to the AMP layout, then the AMP matmul, writing partials in
//!   `pk` slabs of output blocks;
//! - [4] exchange: reduce-scatter; slab `j'` of every tile goes to inner group `j'`,
//!   landing in the slot the sender just emptied (the exchange reads before it writes);
//! - [5] sum of the partials and the bias slab, then GELU: `g` stays in block layout;
//! - [6] exchange: `g` blocks are `fc2`'s inner chunks, so they land directly in
//!   `fc2`'s AMP layout (no rearrangement);
//! - [7] AMP matmul; [8] reduce-scatter; [9] sum of partials, bias and residual;
//! - [10] the host reads `y` from the block layout.
//!
//! Padding: a column group's blocks are padded up to a multiple of `pk` with zero
//! weights, so that every inner group reduces an equal slab.

use std::collections::{BTreeMap, HashMap};

use half::f16;
use tessera_graph::{Graph, OpKind, TensorId, TensorMap};
use tessera_kernels::{
    Add, AmpMatmul, Gelu, LayerNorm, MemClass, Rearrange, ReduceAdd, pack_weights,
};
use tessera_machine::Machine;

use crate::PlanError;
use crate::lower::LowerOptions;
use crate::dist::{DistTensor, Part, redistribute};
use crate::ir::*;
use crate::matmul::{AMP_WIDTH, MatmulMapping, MatmulShape, map_matmul};

/// The MLP's tensors and parameters as found in the graph.
struct MlpPattern {
    x_name: String,
    y_name: String,
    rows: u32,
    width: u32,
    hidden: u32,
    eps: f32,
    gamma: String,
    beta: String,
    w1: String,
    b1: String,
    w2: String,
    b2: String,
}

fn unsupported(message: impl Into<String>) -> PlanError {
    PlanError::Unsupported(message.into())
}

fn param_name(graph: &Graph, t: TensorId) -> Result<String, PlanError> {
    match &graph.producer(t).kind {
        OpKind::Parameter { name, .. } => Ok(name.clone()),
        other => Err(unsupported(format!(
            "expected a parameter, found `{}`",
            other.mnemonic()
        ))),
    }
}

/// Finds `x -> layer_norm -> matmul(+bias) -> gelu -> matmul(+bias) -> add(x, .)`.
fn match_mlp(graph: &Graph) -> Result<MlpPattern, PlanError> {
    let [x] = graph.inputs() else {
        return Err(unsupported("the MLP lowering needs exactly one input"));
    };
    let [out] = graph.outputs() else {
        return Err(unsupported("the MLP lowering needs exactly one output"));
    };
    let dims = graph.shape(*x).dims().to_vec();
    let [rows, width] = dims[..] else {
        return Err(unsupported(format!("input must be 2-D, it is {dims:?}")));
    };
    let consumers = graph.consumers();
    // The op that consumes `t`, which must be its only consumer.
    let single = |t: TensorId| -> Result<&tessera_graph::Op, PlanError> {
        match consumers[t.index()][..] {
            [op] => Ok(graph.op(op)),
            _ => Err(unsupported(format!("{t} must have exactly one consumer"))),
        }
    };
    let ln_op = consumers[x.index()]
        .iter()
        .find(|op| matches!(graph.op(**op).kind, OpKind::LayerNorm { .. }))
        .ok_or_else(|| unsupported("no LayerNorm of the input"))?;
    let OpKind::LayerNorm {
        gamma, beta, eps, ..
    } = &graph.op(*ln_op).kind
    else {
        unreachable!()
    };
    let ln_out = graph.op(*ln_op).output;
    let mm1 = single(ln_out)?;
    let OpKind::MatMul {
        b: w1,
        bias: Some(b1),
        transpose_b: false,
        ..
    } = mm1.kind
    else {
        return Err(unsupported("LayerNorm must feed a matmul with bias"));
    };
    let h = mm1.output;
    let gelu = single(h)?;
    let OpKind::Gelu { .. } = gelu.kind else {
        return Err(unsupported("fc1 must feed GELU"));
    };
    let g = gelu.output;
    let mm2 = single(g)?;
    let OpKind::MatMul {
        b: w2,
        bias: Some(b2),
        transpose_b: false,
        ..
    } = mm2.kind
    else {
        return Err(unsupported("GELU must feed a matmul with bias"));
    };
    let f = mm2.output;
    let add = consumers[f.index()]
        .first()
        .map(|op| graph.op(*op))
        .ok_or_else(|| unsupported("fc2 has no consumer"))?;
    match add.kind {
        OpKind::Add { a, b } if (a == *x && b == f) || (a == f && b == *x) => {}
        _ => return Err(unsupported("fc2 must be added to the input")),
    }
    if add.output != out.tensor {
        return Err(unsupported("the residual add must be the output"));
    }
    let hidden = graph.shape(h).last();
    let x_name = match &graph.producer(*x).kind {
        OpKind::Input { name, .. } => name.clone(),
        _ => unreachable!("graph inputs are Input ops"),
    };
    let to_u32 = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| unsupported(format!("{what} {v} is too large")))
    };
    let pattern = MlpPattern {
        x_name,
        y_name: out.name.clone(),
        rows: to_u32(rows, "rows")?,
        width: to_u32(width, "width")?,
        hidden: to_u32(hidden, "hidden")?,
        eps: *eps,
        gamma: param_name(graph, *gamma)?,
        beta: param_name(graph, *beta)?,
        w1: param_name(graph, w1)?,
        b1: param_name(graph, b1)?,
        w2: param_name(graph, w2)?,
        b2: param_name(graph, b2)?,
    };
    if !pattern.width.is_multiple_of(AMP_WIDTH) || !pattern.hidden.is_multiple_of(AMP_WIDTH) {
        return Err(unsupported(format!(
            "width {} and hidden {} must be multiples of {AMP_WIDTH}",
            pattern.width, pattern.hidden
        )));
    }
    Ok(pattern)
}

/// `total` split into runs of `per` (the last one shorter): (start, len).
fn groups(total: u32, per: u32) -> Vec<(u32, u32)> {
    (0..total.div_ceil(per))
        .map(|g| (g * per, per.min(total - g * per)))
        .collect()
}

fn f16_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|v| f16::from_f32(v).to_le_bytes())
        .collect()
}

fn weight<'a>(weights: &'a TensorMap, name: &str) -> Result<&'a [f32], PlanError> {
    weights
        .get(name)
        .map(|t| t.data())
        .ok_or_else(|| PlanError::MissingWeight(name.to_string()))
}

/// The concrete row/chunk/block groups of one matmul mapping.
struct Grid {
    map: MatmulMapping,
    rows: Vec<(u32, u32)>,
    chunks: Vec<(u32, u32)>,
    blocks: Vec<(u32, u32)>,
    /// First tile of this matmul's grid.
    base: u32,
}

impl Grid {
    fn new(map: MatmulMapping) -> Grid {
        let s = map.shape;
        Grid {
            rows: groups(s.rows, map.rows_per_tile),
            chunks: groups(s.k_chunks(), map.chunks_per_tile),
            blocks: groups(s.n_blocks(), map.blocks_per_tile),
            map,
            base: 0,
        }
    }
    fn pk(&self) -> u32 {
        self.chunks.len() as u32
    }
    fn tiles(&self) -> u32 {
        (self.rows.len() * self.chunks.len() * self.blocks.len()) as u32
    }
    fn tile(&self, i: usize, j: usize, l: usize) -> u32 {
        self.base + ((i * self.chunks.len() + j) * self.blocks.len() + l) as u32
    }
    /// Output blocks per reduce slab of column group `l`.
    fn slab_blocks(&self, l: usize) -> u32 {
        self.blocks[l].1.div_ceil(self.pk())
    }
    fn cells(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (r, c, b) = (self.rows.len(), self.chunks.len(), self.blocks.len());
        (0..r).flat_map(move |i| (0..c).flat_map(move |j| (0..b).map(move |l| (i, j, l))))
    }
}

/// A weight binding under construction: distinct tile images, concatenated.
#[derive(Default)]
struct WeightImage {
    image: Vec<u8>,
    /// Tile image -> its offset in `image`.
    offsets: HashMap<Vec<u8>, u32>,
    slices: Vec<Slice>,
}

struct Lowering<'a> {
    plan: TilePlan,
    /// Weight binding name -> its host image and slices.
    weights: BTreeMap<String, WeightImage>,
    machine: &'a Machine,
    opts: &'a LowerOptions,
}

const HOST_IN: Step = 0;
const LN: Step = 1;
const X1: Step = 2;
const REARRANGE: Step = 3;
const MM1: Step = 4;
const R1: Step = 5;
const ACT1: Step = 6;
const X2: Step = 7;
const MM2: Step = 8;
const R2: Step = 9;
const OUT: Step = 10;
const X3: Step = 11;
const HOST_OUT: Step = 12;

impl Lowering<'_> {
    fn last(&self) -> Step {
        HOST_OUT
    }

    /// A buffer of constant contents: the host streams `bytes` into it once, at
    /// initialisation, through the weight binding `weights/NAME`, whose image is
    /// every tile's part in device layout, concatenated in the order of creation.
    fn constant(&mut self, tile: u32, name: String, bytes: Vec<u8>, category: Category) -> BufId {
        let id = self
            .plan
            .add_buffer(tile, name.clone(), bytes.len() as u32, category);
        let w = self.weights.entry(format!("weights/{name}")).or_default();
        // Tiles that differ only in their row group hold identical weights: the
        // host image keeps one copy and several tiles' slices point at it.
        let len = bytes.len() as u32;
        let offset = *w.offsets.entry(bytes).or_insert_with_key(|b| {
            let at = w.image.len() as u32;
            w.image.extend_from_slice(b);
            at
        });
        w.slices.push(Slice {
            loc: Loc { buf: id, offset: 0 },
            offset,
            bytes: len,
        });
        let last = self.last();
        self.plan.touch(id, 0);
        self.plan.touch(id, last);
        id
    }

    fn call(&mut self, tile: u32, step: Step, kernel: impl Into<KernelKind>, ops: &[(&str, Loc)]) {
        let kernel: KernelKind = kernel.into();
        let contract = kernel.contract();
        let state_op = contract.operands.iter().find(|o| o.name == "state");
        let state_bytes = state_op.map_or(64, |o| o.bytes);
        let state = self.plan.add_buffer(
            tile,
            format!("{}.state", contract.kernel),
            state_bytes,
            Category::VertexState,
        );
        // The state is an operand like any other: its contract's alignment and
        // class bind the buffer (the verifier found states placed at 4 bytes while
        // kernels declared 8).
        if let Some(op) = state_op {
            let buf = &mut self.plan.buffers[state.0 as usize];
            buf.align = buf.align.max(op.align);
            buf.tail = buf.tail.max(op.tail_bytes);
            buf.class = op.mem_class;
        }
        let last = self.last();
        self.plan.touch(state, 0);
        self.plan.touch(state, last);
        let operands: BTreeMap<String, Loc> =
            ops.iter().map(|(n, l)| (n.to_string(), *l)).collect();
        for (name, loc) in &operands {
            self.plan.touch(loc.buf, step);
            let Some(op) = contract.operand(name) else {
                panic!("kernel {} has no operand `{name}`", contract.kernel);
            };
            let buf = &mut self.plan.buffers[loc.buf.0 as usize];
            assert!(
                loc.offset + op.bytes <= buf.bytes,
                "operand `{name}` of {} overruns {}",
                contract.kernel,
                buf.name
            );
            buf.align = buf.align.max(op.align);
            buf.tail = buf.tail.max(op.tail_bytes);
            buf.class = match (buf.class, op.mem_class) {
                (MemClass::Any, c) => c,
                (c, MemClass::Any) => c,
                (a, b) if a == b => a,
                (a, b) => panic!("buffer {} needs both {a:?} and {b:?}", buf.name),
            };
        }
        for op in &contract.operands {
            for other in &op.separate_from {
                if let (Some(a), Some(b)) = (operands.get(&op.name), operands.get(other))
                    && a.buf != b.buf
                    && a.buf < b.buf
                {
                    self.plan.separations.push((a.buf, b.buf));
                }
            }
        }
        self.plan.calls.push(Call {
            tile,
            step,
            kernel,
            operands,
            state,
        });
    }

    /// A new exchange phase at `step`; returns its id.
    fn exchange(&mut self, step: Step, name: &str, copies: Vec<Copy>) -> u16 {
        let id = self.plan.exchanges.len() as u16;
        self.plan.steps[step as usize] = StepKind::Exchange(id);
        self.plan.exchanges.push(Exchange {
            id,
            name: name.to_string(),
            step,
            copies: Vec::new(),
        });
        self.add_copies(id, copies);
        id
    }

    /// More copies in exchange `id`; every buffer they touch is live at its step.
    fn add_copies(&mut self, id: u16, copies: Vec<Copy>) {
        let step = self.plan.exchanges[id as usize].step;
        for c in &copies {
            self.plan.touch(c.src.buf, step);
            for d in &c.dsts {
                self.plan.touch(d.buf, step);
            }
        }
        self.plan.exchanges[id as usize].copies.extend(copies);
    }

    /// Weights of one tile of a matmul grid, padded to `pk * slab` blocks.
    fn packed_weights(
        w: &[f32],
        n: u32,
        chunks: (u32, u32),
        blocks: (u32, u32),
        padded_blocks: u32,
    ) -> Vec<u8> {
        let (c0, kc) = chunks;
        let (b0, nb) = blocks;
        let cols = padded_blocks * AMP_WIDTH;
        let mut sub = vec![f16::ZERO; (kc * AMP_WIDTH * cols) as usize];
        for kk in 0..kc * AMP_WIDTH {
            let row = (c0 * AMP_WIDTH + kk) as usize;
            for col in 0..nb * AMP_WIDTH {
                let src = row * n as usize + (b0 * AMP_WIDTH + col) as usize;
                sub[(kk * cols + col) as usize] = f16::from_f32(w[src]);
            }
        }
        pack_weights(kc as usize, padded_blocks as usize, &sub)
            .into_iter()
            .flat_map(|h| h.to_le_bytes())
            .collect()
    }

    /// Weights, partial buffers and the AMP call for every tile of `grid`; each
    /// tile's output buffer holds `pk` slabs.
    fn matmul_stage(
        &mut self,
        tag: &str,
        grid: &Grid,
        a_cm: &BTreeMap<(usize, usize, usize), BufId>,
        w: &[f32],
    ) -> BTreeMap<(usize, usize, usize), BufId> {
        let n = grid.map.shape.n;
        let pk = grid.pk();
        let step = if tag == "fc1" { MM1 } else { MM2 };
        let mut p_bufs = BTreeMap::new();
        for (i, j, l) in grid.cells() {
            let tile = grid.tile(i, j, l);
            let rows = grid.rows[i].1;
            let kc = grid.chunks[j].1;
            let slab = grid.slab_blocks(l);
            let nb_pad = slab * pk;
            let wbytes = Self::packed_weights(w, n, grid.chunks[j], grid.blocks[l], nb_pad);
            let wbuf = self.constant(tile, format!("{tag}.w"), wbytes, Category::Weight);
            let slab_bytes = slab * rows * AMP_WIDTH * 2;
            let p = self.plan.add_buffer(
                tile,
                format!("{tag}.partials"),
                slab_bytes * pk,
                Category::Partial,
            );
            let mm = AmpMatmul::new(rows, kc, nb_pad);
            let mut ops = vec![
                (
                    "a",
                    Loc {
                        buf: a_cm[&(i, j, l)],
                        offset: 0,
                    },
                ),
                (
                    "w",
                    Loc {
                        buf: wbuf,
                        offset: 0,
                    },
                ),
                ("out", Loc { buf: p, offset: 0 }),
            ];
            for (k, name) in ["p0", "p1"].into_iter().enumerate() {
                if mm.partials() > k as u32 {
                    let pp = self.plan.add_buffer(
                        tile,
                        format!("{tag}.{name}"),
                        rows * AMP_WIDTH * 2,
                        Category::Partial,
                    );
                    ops.push((name, Loc { buf: pp, offset: 0 }));
                }
            }
            self.call(tile, step, KernelKind::Matmul(mm), &ops);
            p_bufs.insert((i, j, l), p);
        }
        p_bufs
    }

    /// Reduce-scatter of `grid`'s partial slabs (see the module comment).
    fn reduce_scatter(
        &mut self,
        step: Step,
        name: &str,
        grid: &Grid,
        p: &BTreeMap<(usize, usize, usize), BufId>,
    ) {
        let pk = grid.pk() as usize;
        let mut copies = Vec::new();
        for (i, j, l) in grid.cells() {
            let slab_bytes = grid.slab_blocks(l) * grid.rows[i].1 * AMP_WIDTH * 2;
            for jj in 0..pk {
                if jj == j {
                    continue;
                }
                copies.push(Copy {
                    src: Loc {
                        buf: p[&(i, j, l)],
                        offset: jj as u32 * slab_bytes,
                    },
                    bytes: slab_bytes,
                    dsts: vec![Loc {
                        buf: p[&(i, jj, l)],
                        offset: j as u32 * slab_bytes,
                    }],
                });
            }
        }
        self.exchange(step, name, copies);
    }

    /// Sums the partial slabs into slab 0 (when the inner dimension was split) and
    /// adds the broadcast bias, in place.
    fn finish_slab(
        &mut self,
        grid: &Grid,
        (i, j, l): (usize, usize, usize),
        p: BufId,
        step: Step,
        bias: &[f32],
        tag: &str,
    ) {
        let tile = grid.tile(i, j, l);
        let pk = grid.pk();
        let n = grid.slab_blocks(l) * grid.rows[i].1 * AMP_WIDTH;
        let at0 = Loc { buf: p, offset: 0 };
        if pk > 1 {
            self.call(
                tile,
                step,
                ReduceAdd::new(pk, n),
                &[("in", at0), ("out", at0)],
            );
        }
        let bias = f16_bytes(Self::bias_slab(bias, grid, i, j, l));
        let bias = self.constant(tile, format!("{tag}.bias"), bias, Category::Weight);
        self.call(
            tile,
            step,
            Add::new(n),
            &[
                ("a", at0),
                (
                    "b",
                    Loc {
                        buf: bias,
                        offset: 0,
                    },
                ),
                ("out", at0),
            ],
        );
    }

    /// Bias broadcast over the rows of each slab a tile reduces, f16 block layout.
    fn bias_slab(bias: &[f32], grid: &Grid, i: usize, j: usize, l: usize) -> Vec<f32> {
        let slab = grid.slab_blocks(l);
        let rows = grid.rows[i].1;
        let (b0, nb) = grid.blocks[l];
        let mut out = Vec::with_capacity((slab * rows * AMP_WIDTH) as usize);
        for q in 0..slab {
            let local = j as u32 * slab + q;
            for _ in 0..rows {
                for c in 0..AMP_WIDTH {
                    out.push(if local < nb {
                        bias[((b0 + local) * AMP_WIDTH + c) as usize]
                    } else {
                        0.0
                    });
                }
            }
        }
        out
    }
}

/// The cheapest pair of mappings for fc1 ([r, d] x [d, f]) and fc2 ([r, f] x [f, d])
/// whose weights fit the interleaved region together and whose busiest tile fits
/// `usable` bytes in either matmul's phase (both weights stay resident).
fn choose_mappings(
    machine: &Machine,
    r: u32,
    d: u32,
    f: u32,
    usable: u64,
) -> Result<(MatmulMapping, MatmulMapping), PlanError> {
    let s1 = MatmulShape {
        rows: r,
        k: d,
        n: f,
    };
    let s2 = MatmulShape {
        rows: r,
        k: f,
        n: d,
    };
    let interleaved: u64 = machine
        .regions
        .iter()
        .filter(|g| g.interleaved)
        .map(|g| u64::from(g.len()))
        .sum::<u64>()
        .saturating_sub(16 * 1024);
    let mut best: Option<(u64, MatmulMapping, MatmulMapping)> = None;
    let mut last_err = None;
    // The split of the budget between the two matmuls is a one-dimensional search.
    for eighth in 1..8u64 {
        let b1 = usable * eighth / 8;
        let m1 = match map_matmul(machine, s1, b1) {
            Ok(m) => m,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        let m2 = match map_matmul(machine, s2, usable.saturating_sub(m1.persistent_bytes)) {
            Ok(m) => m,
            Err(e) => {
                last_err = Some(e);
                continue;
            }
        };
        if m1.bytes_per_tile + m2.persistent_bytes > usable
            || m1.weight_bytes + m2.weight_bytes > interleaved
        {
            continue;
        }
        let cost = m1.cost.total() + m2.cost.total();
        if best.as_ref().is_none_or(|(c, _, _)| cost < *c) {
            best = Some((cost, m1, m2));
        }
    }
    match (best, last_err) {
        (Some((_, m1, m2)), _) => Ok((m1, m2)),
        (None, Some(e)) => Err(e),
        (None, None) => Err(PlanError::DoesNotFit {
            rows: r,
            k: d,
            n: f,
            needed: usable + 1,
            budget: usable,
        }),
    }
}

/// Lowers the MLP block in `graph` to a tile plan for `machine`.
pub fn lower_mlp(
    machine: &Machine,
    graph: &Graph,
    weights: &TensorMap,
    opts: &LowerOptions,
) -> Result<TilePlan, PlanError> {
    let pat = match_mlp(graph)?;
    let (r, d, f) = (pat.rows, pat.width, pat.hidden);
    let tiles = machine.tiles;

    let (map1, map2) = choose_mappings(machine, r, d, f, opts.weight_bytes + opts.transient_bytes)?;
    let g1 = Grid::new(map1);
    let g2 = Grid::new(map2);
    let rows_per_owner = r.div_ceil(tiles);
    let owners = groups(r, rows_per_owner);

    let mut lw = Lowering {
        plan: TilePlan {
            tiles: g1.tiles().max(g2.tiles()).max(owners.len() as u32),
            steps: vec![StepKind::Compute; (HOST_OUT + 1) as usize],
            ..TilePlan::default()
        },
        weights: BTreeMap::new(),
        machine,
        opts,
    };
    lw.plan.steps[HOST_IN as usize] = StepKind::HostIn;
    lw.plan.steps[HOST_OUT as usize] = StepKind::HostOut;
    for (name, g) in [("fc1", &g1), ("fc2", &g2)] {
        lw.plan.decisions.push(format!(
            "{name}: [{}x{}]x[{}x{}] on {} tiles as {} row x {} inner x {} column groups \
             ({} rows, {} chunks, {} blocks per tile), estimated {} cycles ({:.0}% of peak)",
            g.map.shape.rows,
            g.map.shape.k,
            g.map.shape.k,
            g.map.shape.n,
            g.tiles(),
            g.rows.len(),
            g.chunks.len(),
            g.blocks.len(),
            g.map.rows_per_tile,
            g.map.chunks_per_tile,
            g.map.blocks_per_tile,
            g.map.cost.total(),
            100.0 * g.map.peak_share(lw.machine)
        ));
    }

    let gamma = f16_bytes(weight(weights, &pat.gamma)?.iter().copied());
    let beta = f16_bytes(weight(weights, &pat.beta)?.iter().copied());
    let w1 = weight(weights, &pat.w1)?;
    let b1 = weight(weights, &pat.b1)?;
    let w2 = weight(weights, &pat.w2)?;
    let b2 = weight(weights, &pat.b2)?;
    for (name, data, len) in [
        (&pat.w1, w1, d * f),
        (&pat.b1, b1, f),
        (&pat.w2, w2, f * d),
        (&pat.b2, b2, d),
    ] {
        if data.len() != len as usize {
            return Err(PlanError::MissingWeight(format!(
                "{name} has {} values, expected {len}",
                data.len()
            )));
        }
    }

    // [0..1] Row owners: host input, LayerNorm.
    let row_bytes = d * 2;
    let mut x_slices = Vec::new();
    let mut h_bufs = Vec::new();
    let mut x_bufs = Vec::new();
    for (o, &(r0, n)) in owners.iter().enumerate() {
        let tile = o as u32;
        let x = lw
            .plan
            .add_buffer(tile, "x".into(), n * row_bytes, Category::Activation);
        lw.plan.touch(x, HOST_IN);
        x_slices.push(Slice {
            loc: Loc { buf: x, offset: 0 },
            offset: r0 * row_bytes,
            bytes: n * row_bytes,
        });
        let h = lw
            .plan
            .add_buffer(tile, "ln.out".into(), n * row_bytes, Category::Activation);
        let gb = lw.constant(tile, "ln.gamma".into(), gamma.clone(), Category::Weight);
        let bb = lw.constant(tile, "ln.beta".into(), beta.clone(), Category::Weight);
        lw.call(
            tile,
            LN,
            LayerNorm::new(n, d, pat.eps),
            &[
                ("in", Loc { buf: x, offset: 0 }),
                ("gamma", Loc { buf: gb, offset: 0 }),
                ("beta", Loc { buf: bb, offset: 0 }),
                ("out", Loc { buf: h, offset: 0 }),
            ],
        );
        h_bufs.push(h);
        x_bufs.push(x);
    }

    // [2..3] fc1 inputs: row-major slices, rearranged on the tile.
    let mut a_rm = BTreeMap::new();
    let mut a_cm = BTreeMap::new();
    for (i, j, l) in g1.cells() {
        let tile = g1.tile(i, j, l);
        let bytes = g1.rows[i].1 * g1.chunks[j].1 * AMP_WIDTH * 2;
        a_rm.insert(
            (i, j, l),
            lw.plan
                .add_buffer(tile, "fc1.in".into(), bytes, Category::Activation),
        );
        a_cm.insert(
            (i, j, l),
            lw.plan
                .add_buffer(tile, "fc1.in.amp".into(), bytes, Category::Activation),
        );
    }
    // LayerNorm's row owners hold whole rows; each fc1 tile wants its row group's
    // chunk columns, row-major, and the column groups of one row and chunk want the
    // same bytes (sent once to all of them).
    let ln_out = DistTensor {
        rows: r,
        cols: d,
        elem_bytes: 2,
        parts: owners
            .iter()
            .enumerate()
            .map(|(o, &(r0, n))| Part {
                at: Loc {
                    buf: h_bufs[o],
                    offset: 0,
                },
                rows: r0..r0 + n,
                cols: 0..d,
            })
            .collect(),
    };
    let fc1_in = DistTensor {
        rows: r,
        cols: d,
        elem_bytes: 2,
        parts: g1
            .cells()
            .map(|(i, j, l)| {
                let (r0, rows) = g1.rows[i];
                let (c0, kc) = g1.chunks[j];
                Part {
                    at: Loc {
                        buf: a_rm[&(i, j, l)],
                        offset: 0,
                    },
                    rows: r0..r0 + rows,
                    cols: c0 * AMP_WIDTH..(c0 + kc) * AMP_WIDTH,
                }
            })
            .collect(),
    };
    let copies = redistribute(&ln_out, &fc1_in)
        .unwrap_or_else(|e| panic!("fc1 inputs cover the LayerNorm output: {e}"));
    let fc1_inputs = lw.exchange(X1, "fc1.inputs", copies);
    for (i, j, l) in g1.cells() {
        let mut re = Rearrange::new(g1.rows[i].1, g1.chunks[j].1 * AMP_WIDTH);
        if let Some(al) = lw.opts.rearrange_declared_align {
            re.declared_align = al;
        }
        lw.call(
            g1.tile(i, j, l),
            REARRANGE,
            re,
            &[
                (
                    "in",
                    Loc {
                        buf: a_rm[&(i, j, l)],
                        offset: 0,
                    },
                ),
                (
                    "out",
                    Loc {
                        buf: a_cm[&(i, j, l)],
                        offset: 0,
                    },
                ),
            ],
        );
    }
    let p1 = lw.matmul_stage("fc1", &g1, &a_cm, w1);

    // [5..6] reduce-scatter, then partials + bias and GELU, in place in slab 0.
    lw.reduce_scatter(R1, "fc1.reduce", &g1, &p1);
    for (i, j, l) in g1.cells() {
        let p = p1[&(i, j, l)];
        lw.finish_slab(&g1, (i, j, l), p, ACT1, b1, "fc1");
        let n = g1.slab_blocks(l) * g1.rows[i].1 * AMP_WIDTH;
        let at0 = Loc { buf: p, offset: 0 };
        lw.call(
            g1.tile(i, j, l),
            ACT1,
            Gelu::new(n),
            &[("in", at0), ("out", at0)],
        );
    }
    let g_bufs = &p1;

    // [7..8] fc2: `g`'s blocks land in fc2's AMP layout directly.
    let mut a2 = BTreeMap::new();
    for (i, j, l) in g2.cells() {
        let bytes = g2.rows[i].1 * g2.chunks[j].1 * AMP_WIDTH * 2;
        a2.insert(
            (i, j, l),
            lw.plan.add_buffer(
                g2.tile(i, j, l),
                "fc2.in.amp".into(),
                bytes,
                Category::Activation,
            ),
        );
    }
    // fc1's finished slabs are 16-column blocks, each row-major; fc2 wants its row
    // group's chunks in the same block form, on every column group.
    let block_part = |buf: BufId, k: u32, rows: (u32, u32), col_block: u32| Part {
        at: Loc {
            buf,
            offset: k * rows.1 * AMP_WIDTH * 2,
        },
        rows: rows.0..rows.0 + rows.1,
        cols: col_block * AMP_WIDTH..(col_block + 1) * AMP_WIDTH,
    };
    let mut fc1_out = Vec::new();
    for (i, j, l) in g1.cells() {
        let slab = g1.slab_blocks(l);
        let (b0, nb) = g1.blocks[l];
        for q in (0..slab).filter(|q| j as u32 * slab + q < nb) {
            fc1_out.push(block_part(
                g_bufs[&(i, j, l)],
                q,
                g1.rows[i],
                b0 + j as u32 * slab + q,
            ));
        }
    }
    let mut fc2_in = Vec::new();
    for (i, j, l) in g2.cells() {
        let (c0, kc) = g2.chunks[j];
        for c in 0..kc {
            fc2_in.push(block_part(a2[&(i, j, l)], c, g2.rows[i], c0 + c));
        }
    }
    let hidden = |parts| DistTensor {
        rows: r,
        cols: f,
        elem_bytes: 2,
        parts,
    };
    let copies = redistribute(&hidden(fc1_out), &hidden(fc2_in))
        .unwrap_or_else(|e| panic!("fc2 inputs cover fc1's output: {e}"));
    lw.exchange(X2, "fc2.inputs", copies);
    let p2 = lw.matmul_stage("fc2", &g2, &a2, w2);

    // [9..10] reduce-scatter, then partials + bias + residual, in place in slab 0.
    // The residual comes from the row owners' copy of `x` in the first exchange, and
    // `y` goes back to the row owners, so that the host moves whole rows.
    lw.reduce_scatter(R2, "fc2.reduce", &g2, &p2);
    // fc2's finished blocks, and the residual blocks beside them, as parts of the
    // `[rows, width]` output: `x` comes in from the row owners, `y` goes back to them.
    let mut out_blocks = Vec::new();
    let mut residual_blocks = Vec::new();
    let mut y_bufs = Vec::new();
    for (o, &(_, n)) in owners.iter().enumerate() {
        let y = lw
            .plan
            .add_buffer(o as u32, "y".into(), n * row_bytes, Category::Activation);
        lw.plan.touch(y, HOST_OUT);
        y_bufs.push(y);
    }
    for (i, j, l) in g2.cells() {
        let tile = g2.tile(i, j, l);
        let rows = g2.rows[i].1;
        let slab = g2.slab_blocks(l);
        let n = slab * rows * AMP_WIDTH;
        let p = p2[&(i, j, l)];
        lw.finish_slab(&g2, (i, j, l), p, OUT, b2, "fc2");
        let residual = lw
            .plan
            .add_buffer(tile, "residual".into(), n * 2, Category::Activation);
        let at0 = Loc { buf: p, offset: 0 };
        lw.call(
            tile,
            OUT,
            Add::new(n),
            &[
                ("a", at0),
                (
                    "b",
                    Loc {
                        buf: residual,
                        offset: 0,
                    },
                ),
                ("out", at0),
            ],
        );
        let (b0, nb) = g2.blocks[l];
        for q in (0..slab).filter(|q| j as u32 * slab + q < nb) {
            let block = b0 + j as u32 * slab + q;
            out_blocks.push(block_part(p, q, g2.rows[i], block));
            residual_blocks.push(block_part(residual, q, g2.rows[i], block));
        }
    }
    let width = |parts| DistTensor {
        rows: r,
        cols: d,
        elem_bytes: 2,
        parts,
    };
    let row_owners = |bufs: &[BufId]| {
        width(
            owners
                .iter()
                .enumerate()
                .map(|(o, &(r0, n))| Part {
                    at: Loc {
                        buf: bufs[o],
                        offset: 0,
                    },
                    rows: r0..r0 + n,
                    cols: 0..d,
                })
                .collect(),
        )
    };
    let residual_copies = redistribute(&row_owners(&x_bufs), &width(residual_blocks))
        .unwrap_or_else(|e| panic!("the residual covers fc2's blocks: {e}"));
    let y_copies = redistribute(&width(out_blocks), &row_owners(&y_bufs))
        .unwrap_or_else(|e| panic!("fc2's blocks cover the output: {e}"));
    lw.add_copies(fc1_inputs, residual_copies);
    lw.exchange(X3, "outputs", y_copies);
    let y_slices = owners
        .iter()
        .zip(&y_bufs)
        .map(|(&(r0, n), &y)| Slice {
            loc: Loc { buf: y, offset: 0 },
            offset: r0 * row_bytes,
            bytes: n * row_bytes,
        })
        .collect();
    let total = r * row_bytes;
    for (name, w) in std::mem::take(&mut lw.weights) {
        lw.plan.bindings.push(Binding {
            name,
            dir: BindingDir::Weight,
            bytes: w.image.len() as u32,
            slices: w.slices,
            data: w.image,
        });
    }
    lw.plan.bindings.push(Binding {
        name: pat.x_name,
        dir: BindingDir::Input,
        bytes: total,
        slices: x_slices,
        data: Vec::new(),
    });
    lw.plan.bindings.push(Binding {
        name: pat.y_name,
        dir: BindingDir::Output,
        bytes: total,
        slices: y_slices,
        data: Vec::new(),
    });
    // The verifier is the lowering's independent check; release builds skip it
    // for speed, tests and debug builds never do.
    if cfg!(debug_assertions) {
        let errors = crate::verify(&lw.plan);
        assert!(
            errors.is_empty(),
            "the MLP lowering broke the plan's rules:\n{}",
            errors
                .iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    Ok(lw.plan)
}

//! The matmul rule: `y = x @ W + b`, with the epilogues it fuses (a per-row bias
//! such as a position embedding, GELU, a residual add), on an AMP grid of row,
//! inner and column groups.
//!
//! Data path (each phase its own step):
//! - exchange: `x` (any layout) to each tile's row group and inner chunks. When
//!   `x` arrives as 16-column blocks it lands in the AMP's chunk-major layout
//!   directly; otherwise it lands row-major, and the AMP reads it so with its
//!   strided loads (`AmpMatmul::row_major`; with `rearrange_inputs`, the seed's
//!   way, it is rearranged into a chunk-major copy first). The residual's blocks
//!   ride in the same exchange;
//! - compute: zero padding columns, (the rearrangement,) AMP matmul writing `pk`
//!   slabs of output blocks;
//! - exchange (when the inner dimension is split): reduce-scatter; slab `j'` of
//!   every tile goes to inner group `j'`, landing in the slot the sender just
//!   emptied (the exchange reads before it writes). Where that would move more
//!   bytes (fewer blocks in a column group than inner groups leave inner groups
//!   idle and the rest receiving `pk - 1` slabs each; a block count the inner
//!   groups do not divide leaves the last slab short), the output is cut into
//!   pieces of rows (of every block) instead, piece `j'` of every tile landing in
//!   slot `j` of inner group `j'`'s piece buffer; a tile's own piece, where it is
//!   whole workers' rows, the AMP writes into its slot directly
//!   (`AmpMatmul::with_own_rows`), otherwise it too goes through the exchange;
//! - compute: sum of the partial slabs, bias, GELU, residual, in place in slab 0.
//!
//! A plain bias (not one that varies with the row) goes into the engine instead:
//! inner group 0's first AMP call starts each block's chunk 0 from the block's
//! 16 bias values (`AmpMatmul::with_bias`), so the partials already hold it once
//! and the reduction sums no bias slab (which every tile held for the whole
//! program) and no `add_bias` follows. Row splits that are not even over the
//! workers keep the slab or the `add_bias`.
//!
//! A mapping in parts of K (`MatmulShape::k_parts`) takes the first two phases
//! once a part: each part's chunks of every inner group arrive in their own
//! exchange (the residual with the last part's), and each part's AMP call
//! continues from the partial sums the previous part's call left in a carry
//! buffer (`AmpMatmul::continuing`); only the last part's call writes the slabs
//! or pieces the reduce-scatter sends. A tile's weights are stored part after
//! part, each part's blocks as one call reads them.
//!
//! The result is left in block layout: each finished block a `[rows, 16]` part.
//! A column group's blocks are cut into slabs of `ceil(blocks / pk)`, one per
//! inner group while they last (padded with zero weights to whole slabs); inner
//! groups past the last slab only send.

use std::collections::{BTreeMap, BTreeSet};

use half::f16;
use tessera_kernels::{AmpMatmul, Fp8ToF16, Gelu, Rearrange, ReduceAdd, ZeroFill, pack_weights};
use tessera_machine::fp8;

use super::recipe::Recipe;
use crate::PlanError;
use crate::dist::{DistTensor, Part, redistribute};
use crate::ir::*;
use crate::lower::count;
use crate::lower::ctx::{Lowering, f16_bytes, groups};
use crate::matmul::{AMP_WIDTH, MatmulMapping, part_chunks};

/// The concrete row/chunk/block groups of one matmul mapping.
pub(crate) struct Grid {
    pub map: MatmulMapping,
    pub rows: Vec<(u32, u32)>,
    pub chunks: Vec<(u32, u32)>,
    pub blocks: Vec<(u32, u32)>,
}

impl Grid {
    pub fn new(map: MatmulMapping) -> Grid {
        let s = map.shape;
        Grid {
            rows: groups(s.rows, map.rows_per_tile),
            chunks: groups(s.k_chunks(), map.chunks_per_tile),
            blocks: groups(s.n_blocks(), map.blocks_per_tile),
            map,
        }
    }
    pub fn pk(&self) -> u32 {
        self.chunks.len() as u32
    }
    pub fn tiles(&self) -> u32 {
        (self.rows.len() * self.chunks.len() * self.blocks.len()) as u32
    }
    /// Tile of cell (i, j, l): the column group varies fastest, from tile 0, so a
    /// (row, inner) group's tiles, which receive the same input, are consecutive
    /// (the cost model counts on it for the shared exchange bus).
    fn tile(&self, i: usize, j: usize, l: usize) -> u32 {
        ((i * self.chunks.len() + j) * self.blocks.len() + l) as u32
    }
    /// Output blocks per reduce slab of column group `l`.
    fn slab_blocks(&self, l: usize) -> u32 {
        self.blocks[l].1.div_ceil(self.pk())
    }
    /// Inner groups of column group `l` that reduce a slab (the others only send).
    fn reducers(&self, l: usize) -> u32 {
        self.blocks[l].1.div_ceil(self.slab_blocks(l))
    }
    /// Where whole-block slabs would move more bytes (`row_piece_rows`), column
    /// group `l`'s output is reduced in pieces of rows instead: the rows
    /// (from the row group's first, `rows` of them) of each piece, one per
    /// inner group while they last.
    fn row_pieces(&self, l: usize, rows: u32) -> Option<Vec<(u32, u32)>> {
        crate::matmul::row_piece_rows(rows, self.pk(), self.blocks[l].1)
            .map(|per| groups(rows, per))
    }
    /// What inner group `j` of column group `l` reduces in a row group of `rows`
    /// rows, if anything.
    fn piece(&self, (j, l): (usize, usize), rows: u32) -> Option<Piece> {
        let (_, nb) = self.blocks[l];
        match self.row_pieces(l, rows) {
            Some(pieces) => pieces.get(j).map(|&(r, n)| Piece {
                rows: (r, n),
                first: 0,
                blocks: nb,
                real: nb,
            }),
            None => {
                let slab = self.slab_blocks(l);
                ((j as u32) < self.reducers(l)).then(|| Piece {
                    rows: (0, rows),
                    first: j as u32 * slab,
                    blocks: slab,
                    real: (0..slab).filter(|q| j as u32 * slab + q < nb).count() as u32,
                })
            }
        }
    }
    fn cells(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let (r, c, b) = (self.rows.len(), self.chunks.len(), self.blocks.len());
        (0..r).flat_map(move |i| (0..c).flat_map(move |j| (0..b).map(move |l| (i, j, l))))
    }
}

/// The part of a column group's output one inner group reduces: rows
/// `rows.0..rows.0 + rows.1` of the row group (all of them for a slab) of local
/// blocks `first..first + blocks`, of which the first `real` are not padding.
/// Stored `[blocks][rows.1][16]`.
#[derive(Clone, Copy)]
struct Piece {
    rows: (u32, u32),
    first: u32,
    blocks: u32,
    real: u32,
}

impl Piece {
    fn elems(&self) -> u32 {
        self.blocks * self.rows.1 * AMP_WIDTH
    }
}

/// One matmul to lower. `w` is `[k_pad, n]` row-major in the physical column
/// order of `x` and of the result, zero rows beyond `x.cols`.
pub(crate) struct Linear<'a> {
    pub name: &'a str,
    pub x: &'a DistTensor,
    pub w: &'a [f32],
    /// Where `w` and `bias` come from, in a layer loop's body
    /// (`Lowering::linear_source`): the constants made record their recipes.
    pub source: Option<usize>,
    /// Store `w` as FP8 at this scale (`LowerOptions::weight_dtype`).
    pub fp8_scale: Option<i8>,
    pub n: u32,
    /// The value added to output `(row, col)`: the bias, plus any fused per-row
    /// constant.
    pub bias: &'a dyn Fn(u32, u32) -> f32,
    /// GELU follows, on the product of weights and bias already halved (the
    /// kernel's `with_half_input`).
    pub gelu: bool,
    /// The bias varies with the row (a fused position embedding), so passes
    /// cannot share bias constants.
    pub per_row: bool,
    pub residual: Option<&'a DistTensor>,
    /// The mapping of one pass: `map.shape.rows` rows at a time, the passes one
    /// after another on the same tiles (weights loaded once).
    pub map: MatmulMapping,
}

/// A 16-column block of `rows` rows stored row-major at `buf + offset`.
fn block_part(buf: BufId, offset: u32, rows: (u32, u32), block: u32) -> Part {
    Part {
        at: Loc { buf, offset },
        rows: rows.0..rows.0 + rows.1,
        cols: block * AMP_WIDTH..(block + 1) * AMP_WIDTH,
    }
}

/// Whether a linear reads `x` straight into the AMP's chunk-major layout: its
/// columns fill whole chunks and every part is one 16-column block (the cost model
/// then charges no rearrangement).
pub(crate) fn takes_blocks(x: &DistTensor) -> bool {
    x.cols.is_multiple_of(AMP_WIDTH) && is_block_layout(x)
}

/// True when every part of `t` is one whole 16-column block (block layout).
pub(crate) fn is_block_layout(t: &DistTensor) -> bool {
    t.parts
        .iter()
        .all(|p| p.cols.start.is_multiple_of(AMP_WIDTH) && p.cols.len() as u32 == AMP_WIDTH)
}

/// Weights of one tile of a grid, padded to `padded_blocks` blocks.
pub(crate) fn packed_weights(
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

pub(crate) fn linear(lw: &mut Lowering<'_>, op: &Linear<'_>) -> Result<DistTensor, PlanError> {
    let name = op.name;
    let k = op.x.cols;
    let kp = op.map.shape.k;
    let rows_total = op.x.rows;
    if !(kp - k).is_multiple_of(4) && kp != k {
        return Err(PlanError::Unsupported(format!(
            "{name}: inner dimension {k} must be a multiple of 4 (padding is zeroed 8 bytes at a time)"
        )));
    }
    let direct = takes_blocks(op.x);
    let per_pass = op.map.shape.rows;
    let passes = rows_total.div_ceil(per_pass);
    let g = Grid::new(op.map.clone());
    lw.plan.decisions.push(format!(
        "{name}: [{}x{}]x[{}x{}] {}on {} tiles as {} row x {} inner x {} column groups \
         ({}, {}, {} per tile){}{}, estimated {} cycles ({:.0}% of peak)",
        rows_total,
        k,
        k,
        op.n,
        if passes > 1 {
            format!("in {passes} passes of {per_pass} rows ")
        } else if op.map.shape.k_parts > 1 {
            format!("in {} parts of K ", op.map.shape.k_parts)
        } else {
            String::new()
        },
        g.tiles(),
        g.rows.len(),
        g.chunks.len(),
        g.blocks.len(),
        count(g.map.rows_per_tile, "row"),
        count(g.map.chunks_per_tile, "chunk"),
        count(g.map.blocks_per_tile, "block"),
        if direct { ", inputs in AMP layout" } else { "" },
        if engine_bias(op, &g) {
            ", bias in the engine"
        } else {
            ""
        },
        g.map.cost.over_passes(u64::from(passes)),
        100.0 * g.map.peak_share(lw.machine)
    ));
    let mut consts = Consts::default();
    let mut out_parts = Vec::new();
    for pass in 0..passes {
        let base = pass * per_pass;
        let rows = per_pass.min(rows_total - base);
        let mut pg = Grid::new(op.map.clone());
        pg.rows = groups(rows, g.map.rows_per_tile);
        one_pass(lw, op, &pg, base, direct, &mut consts, &mut out_parts)?;
    }
    Ok(DistTensor {
        rows: rows_total,
        cols: op.n,
        elem_bytes: 2,
        parts: out_parts,
    })
}

/// Whether `op`'s bias goes into the engine on grid `g`: a bias that does not
/// vary with the row, and every row group's AMP call able to take it.
fn engine_bias(op: &Linear<'_>, g: &Grid) -> bool {
    !op.per_row && g.rows.iter().all(|&(_, r)| AmpMatmul::splits_evenly(r))
}

/// Row `row`'s bias over a column group's (first block `b0`, `nb` blocks) local
/// blocks `first..first + count`, 16 values a block, zero for padding blocks
/// (any row for a bias that does not vary with the row).
fn block_bias<'a>(
    op: &'a Linear<'a>,
    (b0, nb): (u32, u32),
    (first, count): (u32, u32),
    row: u32,
) -> impl Iterator<Item = f32> + 'a {
    (first..first + count)
        .flat_map(|q| (0..AMP_WIDTH).map(move |c| (q, c)))
        .map(move |(q, c)| {
            if q < nb {
                (op.bias)(row, (b0 + q) * AMP_WIDTH + c)
            } else {
                0.0
            }
        })
}

/// The ping-pong partial-sum buffers an AMP call's chunks need, added to `ops`.
fn partial_bufs(
    lw: &mut Lowering<'_>,
    tile: u32,
    name: &str,
    rows: u32,
    mm: &AmpMatmul,
    ops: &mut Vec<(&'static str, Loc)>,
) {
    for (idx, pname) in ["p0", "p1"].into_iter().enumerate() {
        if mm.partials() > idx as u32 {
            let pp = lw.buffer(
                tile,
                format!("{name}.{pname}"),
                rows * AMP_WIDTH * 2,
                Category::Partial,
            );
            ops.push((pname, Loc { buf: pp, offset: 0 }));
        }
    }
}

/// Constants a matmul's passes share: weights per tile, bias slabs per tile and
/// row count (per pass too when a per-row constant is fused).
#[derive(Default)]
struct Consts {
    weights: BTreeMap<u32, BufId>,
    /// Packed weight blocks by (first chunk, chunks, first block, blocks, padded
    /// blocks): the row groups' replicas are packed once (converting and packing
    /// for every replica would be a third of a So400m lowering's time at batch 4).
    packed: BTreeMap<(u32, u32, u32, u32, u32), Vec<u8>>,
    bias: BTreeMap<(u32, u32, u32), BufId>,
    /// A column group's bias, 16 values a block, by tile: what inner group 0's
    /// first AMP call feeds the engine (`AmpMatmul::with_bias`).
    engine_bias: BTreeMap<u32, BufId>,
}

/// Buffers and copies for one part of a pass's input (`chunks(j)`: inner group
/// `j`'s first chunk and chunks in it): `a_rm` where `x` lands row-major, `a_amp`
/// what the AMP reads (the chunk-major buffer it lands in directly or is
/// rearranged into with `rearrange_inputs`, else `a_rm` itself).
fn land_inputs(
    lw: &mut Lowering<'_>,
    op: &Linear<'_>,
    g: &Grid,
    base: u32,
    chunks: impl Fn(usize) -> (u32, u32, u32),
    direct: bool,
    rearrange: bool,
) -> Result<(Bufs, Bufs, Vec<Copy>), PlanError> {
    let name = op.name;
    let k = op.x.cols;
    let span = |i: usize| (base + g.rows[i].0, g.rows[i].1);
    let mut a_rm = BTreeMap::new();
    let mut a_amp = BTreeMap::new();
    let mut in_parts = Vec::new();
    for (i, j, l) in g.cells() {
        let tile = g.tile(i, j, l);
        let (r0, rows) = span(i);
        let (c0, kc, _) = chunks(j);
        let bytes = rows * kc * AMP_WIDTH * 2;
        if direct || rearrange {
            let cm = lw.buffer(tile, format!("{name}.in.amp"), bytes, Category::Activation);
            a_amp.insert((i, j, l), cm);
            if direct {
                for c in 0..kc {
                    in_parts.push(block_part(cm, c * rows * AMP_WIDTH * 2, (r0, rows), c0 + c));
                }
                continue;
            }
        }
        let rm = lw.buffer(tile, format!("{name}.in"), bytes, Category::Activation);
        a_rm.insert((i, j, l), rm);
        a_amp.entry((i, j, l)).or_insert(rm);
        let col0 = c0 * AMP_WIDTH;
        let col1 = ((c0 + kc) * AMP_WIDTH).min(k);
        if col1 - col0 == kc * AMP_WIDTH {
            in_parts.push(Part {
                at: Loc { buf: rm, offset: 0 },
                rows: r0..r0 + rows,
                cols: col0..col1,
            });
        } else {
            // Padded rows: the stored row is longer than the tensor's columns, so
            // each row is its own part.
            for r in 0..rows {
                in_parts.push(Part {
                    at: Loc {
                        buf: rm,
                        offset: r * kc * AMP_WIDTH * 2,
                    },
                    rows: r0 + r..r0 + r + 1,
                    cols: col0..col1,
                });
            }
        }
    }
    let dst = DistTensor {
        rows: op.x.rows,
        cols: k,
        elem_bytes: 2,
        parts: in_parts,
    };
    let copies = redistribute(op.x, &dst)
        .map_err(|e| PlanError::Unsupported(format!("{name}: inputs do not cover x: {e}")))?;
    Ok((a_rm, a_amp, copies))
}

/// Buffers for the residual `res` beside the slabs it is added to (recorded in
/// `residual_bufs`), and the copies that fill them.
fn land_residual(
    lw: &mut Lowering<'_>,
    op: &Linear<'_>,
    g: &Grid,
    base: u32,
    res: &DistTensor,
    residual_bufs: &mut Bufs,
) -> Result<Vec<Copy>, PlanError> {
    let name = op.name;
    let mut parts = Vec::new();
    for (i, j, l) in g.cells() {
        let (r0, rows) = (base + g.rows[i].0, g.rows[i].1);
        let (b0, _) = g.blocks[l];
        let Some(pc) = g.piece((j, l), rows).filter(|pc| pc.real > 0) else {
            // Nothing reduced here, or a slab of padding only: nothing to add.
            continue;
        };
        let buf = lw.buffer(
            g.tile(i, j, l),
            format!("{name}.residual"),
            pc.elems() * 2,
            Category::Activation,
        );
        residual_bufs.insert((i, j, l), buf);
        for q in 0..pc.real {
            parts.push(block_part(
                buf,
                q * pc.rows.1 * AMP_WIDTH * 2,
                (r0 + pc.rows.0, pc.rows.1),
                b0 + pc.first + q,
            ));
        }
    }
    let dst = DistTensor {
        rows: op.x.rows,
        cols: op.n,
        elem_bytes: 2,
        parts,
    };
    redistribute(res, &dst).map_err(|e| {
        PlanError::Unsupported(format!(
            "{name}: the residual does not cover the output: {e}"
        ))
    })
}

/// A grid cell: (row group, inner group, column group).
type Cell = (usize, usize, usize);
/// A buffer a cell's tile holds.
type Bufs = BTreeMap<Cell, BufId>;

fn one_pass(
    lw: &mut Lowering<'_>,
    op: &Linear<'_>,
    g: &Grid,
    base: u32,
    direct: bool,
    consts: &mut Consts,
    out_parts: &mut Vec<Part>,
) -> Result<(), PlanError> {
    // K in parts (`MatmulShape::k_parts`): each part's inputs, then its AMP call,
    // continuing from the partial sums the previous part left in a carry buffer;
    // the last part's call writes the slabs the reduction takes.
    let parts = g.map.shape.k_parts.max(1);
    let rearrange = !direct && lw.opts.experimental.rearrange_inputs;
    if parts > 1 && rearrange {
        return Err(PlanError::Unsupported(format!(
            "{}: parts of K need the AMP to read its inputs as they land",
            op.name
        )));
    }
    let mut pass = OnePass {
        op,
        g,
        base,
        direct,
        rearrange,
        parts,
        amp_bias: engine_bias(op, g),
        partials: Bufs::new(),
        pieces: Bufs::new(),
        own_pieces: BTreeSet::new(),
        carries: Bufs::new(),
        residual: Bufs::new(),
    };
    for part in 0..parts {
        let (a_rm, a_amp) = pass.land_part(lw, part)?;
        pass.amp_part(lw, consts, part, &a_rm, &a_amp)?;
    }
    if g.pk() > 1 {
        pass.reduce_scatter(lw);
    }
    pass.epilogue(lw, consts, out_parts);
    Ok(())
}

/// One pass of a matmul, and the buffers its phases hand on to each other.
struct OnePass<'p, 'a> {
    op: &'p Linear<'a>,
    g: &'p Grid,
    /// The pass's first row in the whole tensor.
    base: u32,
    /// `x` lands in the AMP's chunk-major layout (`land_inputs`).
    direct: bool,
    /// Row-major inputs are rearranged before the AMP (`rearrange_inputs`).
    rearrange: bool,
    /// Parts of K (`MatmulShape::k_parts`), at least one.
    parts: u32,
    /// A plain bias goes into the engine with inner group 0's first AMP call
    /// (chunk 0 of each block starts from it instead of zero), where every row
    /// group's split lets it (the planner's cost assumes the same): no bias slab
    /// beside the reduction and no `add_bias` after it.
    amp_bias: bool,
    /// Each cell's slabs (or pieces), from the last part's AMP call.
    partials: Bufs,
    /// The buffers reducers of row pieces receive every inner group's piece in.
    pieces: Bufs,
    /// Cells whose AMP call wrote their own piece into its slot directly.
    own_pieces: BTreeSet<Cell>,
    /// The partial sums a part of K leaves for the next part's call.
    carries: Bufs,
    /// The residual's blocks, beside the slabs they are added to.
    residual: Bufs,
}

impl OnePass<'_, '_> {
    /// Part `part`'s chunks of inner group `j`: the first chunk, the count, and
    /// the first's place within the group.
    fn part_of(&self, j: usize, part: u32) -> (u32, u32, u32) {
        let (c0, kc) = self.g.chunks[j];
        let (at, n) = part_chunks(kc, self.parts, part);
        (c0 + at, n, at)
    }

    /// Whether inner group `j`'s call of part `part` starts from the bias.
    fn bias_in_engine(&self, part: u32, j: usize) -> bool {
        self.amp_bias && part == 0 && j == 0
    }

    /// Part `part`'s inputs in their own exchange, with the residual beside the
    /// slabs it is added to riding along the last part's. Returns the buffers
    /// as `land_inputs` does.
    fn land_part(&mut self, lw: &mut Lowering<'_>, part: u32) -> Result<(Bufs, Bufs), PlanError> {
        let (op, g, base) = (self.op, self.g, self.base);
        let chunks = |j: usize| self.part_of(j, part);
        let (a_rm, a_amp, mut copies) =
            land_inputs(lw, op, g, base, chunks, self.direct, self.rearrange)?;
        if let Some(res) = op.residual.filter(|_| part == self.parts - 1) {
            copies.extend(land_residual(lw, op, g, base, res, &mut self.residual)?);
        }
        lw.exchange(&format!("{}.inputs", op.name), copies);
        Ok((a_rm, a_amp))
    }

    /// Part `part`'s compute step: each cell's weights, zero padding, the
    /// rearrangement where asked for, and the AMP call.
    fn amp_part(
        &mut self,
        lw: &mut Lowering<'_>,
        consts: &mut Consts,
        part: u32,
        a_rm: &Bufs,
        a_amp: &Bufs,
    ) -> Result<(), PlanError> {
        let (op, g) = (self.op, self.g);
        let step = lw.compute_step();
        for (i, j, l) in g.cells() {
            let cell = (i, j, l);
            let tile = g.tile(i, j, l);
            let rows = g.rows[i].1;
            let (_, kc, part_at) = self.part_of(j, part);
            let nb_pad = g.slab_blocks(l) * g.reducers(l);
            let wbuf = self.weights(lw, consts, cell, step);
            let a_buf = a_amp[&cell];
            if let Some(&rm) = a_rm.get(&cell) {
                self.prepare_row_major(lw, step, cell, part, rm, a_buf);
            }
            let mut mm = self.amp_matmul(rows, kc, nb_pad, part, j)?;
            let w_at = Loc {
                buf: wbuf,
                offset: nb_pad * part_at * 512,
            };
            let init = self.carries.remove(&cell);
            let (out, own_at) = self.amp_out(lw, part, cell, &mut mm);
            let mut ops = vec![
                (
                    "a",
                    Loc {
                        buf: a_buf,
                        offset: 0,
                    },
                ),
                ("w", w_at),
                (
                    "out",
                    Loc {
                        buf: out,
                        offset: 0,
                    },
                ),
            ];
            ops.extend(own_at.map(|at| ("own", at)));
            ops.extend(init.map(|buf| ("init", Loc { buf, offset: 0 })));
            if self.bias_in_engine(part, j) {
                let bias = *consts.engine_bias.entry(tile).or_insert_with(|| {
                    let v = block_bias(op, g.blocks[l], (0, nb_pad), 0);
                    lw.constant_with(
                        tile,
                        format!("{}.bias", op.name),
                        f16_bytes(v),
                        Category::Weight,
                        op.source.map(|lin| Recipe::Bias {
                            lin,
                            blocks: g.blocks[l],
                            first: 0,
                            count: nb_pad,
                            rows: 1,
                        }),
                    )
                });
                ops.push((
                    "bias",
                    Loc {
                        buf: bias,
                        offset: 0,
                    },
                ));
            }
            partial_bufs(lw, tile, op.name, rows, &mm, &mut ops);
            lw.call(tile, step, mm, &ops);
        }
        Ok(())
    }

    /// A cell's weights, every part's blocks `[nb][kc][16][16]` one part after
    /// another, shared by all passes (the packing by tiles with the same blocks).
    ///
    /// With FP8 weights (`LowerOptions::weight_dtype`) the constant holds FP8
    /// codes at the weight's scale, and a call at `step` widens them into the f16
    /// buffer returned, before the AMP reads it.
    fn weights(
        &self,
        lw: &mut Lowering<'_>,
        consts: &mut Consts,
        (i, j, l): Cell,
        step: Step,
    ) -> BufId {
        let (op, g, parts) = (self.op, self.g, self.parts);
        let tile = g.tile(i, j, l);
        if let Some(&b) = consts.weights.get(&tile) {
            return b;
        }
        let nb_pad = g.slab_blocks(l) * g.reducers(l);
        let ((c0, kc), (b0, nb)) = (g.chunks[j], g.blocks[l]);
        // Packed (and with FP8, encoded) once per distinct block, not once per
        // replica: encoding was a quarter of a 27-layer FP8 compile's fit loop.
        let wbytes = consts
            .packed
            .entry((c0, kc, b0, nb, nb_pad))
            .or_insert_with(|| {
                let f16s: Vec<u8> = (0..parts)
                    .flat_map(|q| {
                        let (at, pkc) = part_chunks(kc, parts, q);
                        packed_weights(op.w, op.n, (c0 + at, pkc), (b0, nb), nb_pad)
                    })
                    .collect();
                match op.fp8_scale {
                    None => f16s,
                    Some(scale) => f16s
                        .chunks_exact(2)
                        .map(|h| fp8::encode(f16::from_le_bytes([h[0], h[1]]).to_f32(), scale))
                        .collect(),
                }
            })
            .clone();
        let recipe = op.source.map(|lin| Recipe::Weights {
            lin,
            parts: (0..parts)
                .map(|q| {
                    let (at, pkc) = part_chunks(kc, parts, q);
                    (c0 + at, pkc)
                })
                .collect(),
            blocks: (b0, nb),
            nb_pad,
            fp8: op.fp8_scale,
        });
        let b = match op.fp8_scale {
            None => lw.constant_with(
                tile,
                format!("{}.w", op.name),
                wbytes,
                Category::Weight,
                recipe,
            ),
            Some(scale) => {
                let codes = wbytes;
                let n = codes.len() as u32;
                let name = format!("{}.w8", op.name);
                // Resident in a layer loop: widened from the iteration's
                // instance in the store, where staged ones are exchanged to.
                let (src, widen) = if lw.resident_here(op.name) {
                    (
                        lw.layer_constant(tile, name, codes, recipe),
                        Fp8ToF16::layered(n, scale),
                    )
                } else {
                    let w8 = lw.constant_with(tile, name, codes, Category::Weight, recipe);
                    (Loc { buf: w8, offset: 0 }, Fp8ToF16::new(n, scale))
                };
                let w = lw.buffer(tile, format!("{}.w", op.name), 2 * n, Category::Weight);
                lw.call(
                    tile,
                    step,
                    widen,
                    &[("src", src), ("dst", Loc { buf: w, offset: 0 })],
                );
                w
            }
        };
        consts.weights.insert(tile, b);
        b
    }

    /// A cell's row-major inputs `rm` made ready for the AMP: the padding past
    /// `x`'s last column zeroed (the AMP reads whole chunks), and with
    /// `rearrange_inputs` the chunk-major copy `a_buf` made.
    fn prepare_row_major(
        &self,
        lw: &mut Lowering<'_>,
        step: Step,
        (i, j, l): Cell,
        part: u32,
        rm: BufId,
        a_buf: BufId,
    ) {
        let tile = self.g.tile(i, j, l);
        let rows = self.g.rows[i].1;
        let (c0, kc, _) = self.part_of(j, part);
        let valid = ((c0 + kc) * AMP_WIDTH).min(self.op.x.cols) - c0 * AMP_WIDTH;
        if valid < kc * AMP_WIDTH {
            lw.call(
                tile,
                step,
                ZeroFill::new(rows, (kc * AMP_WIDTH - valid) * 2, kc * AMP_WIDTH * 2),
                &[(
                    "out",
                    Loc {
                        buf: rm,
                        offset: valid * 2,
                    },
                )],
            );
        }
        if self.rearrange {
            let mut re = Rearrange::new(rows, kc * AMP_WIDTH);
            if let Some(al) = lw.opts.experimental.rearrange_declared_align {
                re.declared_align = al;
            }
            lw.call(
                tile,
                step,
                re,
                &[
                    ("in", Loc { buf: rm, offset: 0 }),
                    (
                        "out",
                        Loc {
                            buf: a_buf,
                            offset: 0,
                        },
                    ),
                ],
            );
        }
    }

    /// The AMP call of inner group `j` for part `part` on `rows` rows, in the
    /// form its inputs, the bias and the parts ask for.
    fn amp_matmul(
        &self,
        rows: u32,
        kc: u32,
        nb_pad: u32,
        part: u32,
        j: usize,
    ) -> Result<AmpMatmul, PlanError> {
        let mut mm = AmpMatmul::new(rows, kc, nb_pad);
        if !self.direct && !self.rearrange {
            mm = mm.row_major();
        }
        // Both forms need an even row split, which the planner (parts) and
        // `engine_bias` (the bias) checked before choosing them.
        let uneven = |what: &str| {
            PlanError::Unsupported(format!(
                "{}: {what} on {rows} rows a tile, not an even split over the workers",
                self.op.name
            ))
        };
        if self.bias_in_engine(part, j) {
            mm = mm
                .with_bias()
                .ok_or_else(|| uneven("a bias in the engine"))?;
        }
        if part > 0 {
            mm = mm.continuing().ok_or_else(|| uneven("parts of K"))?;
        }
        Ok(mm)
    }

    /// Where a cell's AMP call of part `part` writes, and where it writes the
    /// tile's own piece when that skips the exchange (`mm` then told so).
    fn amp_out(
        &mut self,
        lw: &mut Lowering<'_>,
        part: u32,
        (i, j, l): Cell,
        mm: &mut AmpMatmul,
    ) -> (BufId, Option<Loc>) {
        let (name, g) = (self.op.name, self.g);
        let tile = g.tile(i, j, l);
        let rows = g.rows[i].1;
        let slab = g.slab_blocks(l);
        let nb_pad = slab * g.reducers(l);
        // Parts before the last hand their partial sums on in a carry; the
        // last writes the slabs (or pieces) the reduction takes.
        if part < self.parts - 1 {
            let carry = lw.buffer(
                tile,
                format!("{name}.carry"),
                nb_pad * rows * AMP_WIDTH * 2,
                Category::Partial,
            );
            self.carries.insert((i, j, l), carry);
            return (carry, None);
        }
        let slab_bytes = slab * rows * AMP_WIDTH * 2;
        // Reducing tiles also receive a slab from every other inner group, in
        // place; reducers of row pieces receive a piece from every inner group
        // (their own included) into a buffer of their own.
        let pieces = g.row_pieces(l, rows).is_some();
        let slots = if (j as u32) < g.reducers(l) && !pieces {
            g.pk()
        } else {
            g.reducers(l)
        };
        let p = lw.buffer(
            tile,
            format!("{name}.partials"),
            slab_bytes * slots,
            Category::Partial,
        );
        let mut own_at = None;
        if let Some(pc) = g.piece((j, l), rows).filter(|_| pieces) {
            let r = lw.buffer(
                tile,
                format!("{name}.pieces"),
                g.pk() * pc.elems() * 2,
                Category::Partial,
            );
            self.pieces.insert((i, j, l), r);
            // The tile's own piece, where it is whole workers' rows of every
            // (unpadded) block, goes straight into its slot of the piece buffer
            // instead of through the exchange to itself.
            let (s0, sr) = pc.rows;
            if nb_pad == pc.blocks
                && let Some(k) = mm.with_own_rows(s0, sr, sr * AMP_WIDTH * 2)
            {
                *mm = k;
                self.own_pieces.insert((i, j, l));
                own_at = Some(Loc {
                    buf: r,
                    offset: j as u32 * pc.elems() * 2,
                });
            }
        }
        self.partials.insert((i, j, l), p);
        (p, own_at)
    }

    /// Reduce-scatter of the partial slabs.
    fn reduce_scatter(&self, lw: &mut Lowering<'_>) {
        let g = self.g;
        let mut copies = Vec::new();
        for (i, j, l) in g.cells() {
            let rows = g.rows[i].1;
            if let Some(pieces) = g.row_pieces(l, rows) {
                // Piece `jj` (its rows of every block) to inner group `jj`, into
                // slot `j` of its piece buffer.
                let nb = g.blocks[l].1;
                for (jj, &(s0, sr)) in pieces.iter().enumerate() {
                    if jj == j && self.own_pieces.contains(&(i, j, l)) {
                        continue;
                    }
                    let piece_bytes = nb * sr * AMP_WIDTH * 2;
                    for q in 0..nb {
                        copies.push(Copy {
                            src: Loc {
                                buf: self.partials[&(i, j, l)],
                                offset: (q * rows + s0) * AMP_WIDTH * 2,
                            },
                            bytes: sr * AMP_WIDTH * 2,
                            dsts: vec![Loc {
                                buf: self.pieces[&(i, jj, l)],
                                offset: j as u32 * piece_bytes + q * sr * AMP_WIDTH * 2,
                            }],
                        });
                    }
                }
                continue;
            }
            let slab_bytes = g.slab_blocks(l) * rows * AMP_WIDTH * 2;
            for jj in 0..g.reducers(l) as usize {
                if jj == j {
                    continue;
                }
                copies.push(Copy {
                    src: Loc {
                        buf: self.partials[&(i, j, l)],
                        offset: jj as u32 * slab_bytes,
                    },
                    bytes: slab_bytes,
                    dsts: vec![Loc {
                        buf: self.partials[&(i, jj, l)],
                        offset: j as u32 * slab_bytes,
                    }],
                });
            }
        }
        lw.exchange(&format!("{}.reduce", self.op.name), copies);
    }

    /// Partials summed into a compact output (the slots die here), then bias and
    /// epilogues in place; each finished block joins `out_parts`.
    fn epilogue(&self, lw: &mut Lowering<'_>, consts: &mut Consts, out_parts: &mut Vec<Part>) {
        let (op, g) = (self.op, self.g);
        let name = op.name;
        let pk = g.pk();
        let step = lw.compute_step();
        for (i, j, l) in g.cells() {
            let (r0, all_rows) = (self.base + g.rows[i].0, g.rows[i].1);
            let Some(pc) = g.piece((j, l), all_rows) else {
                continue;
            };
            let tile = g.tile(i, j, l);
            // This piece's first row in the tensor, its rows and its blocks.
            let (r0, rows, slab) = (r0 + pc.rows.0, pc.rows.1, pc.blocks);
            let elems = pc.elems();
            let p = Loc {
                buf: *self
                    .pieces
                    .get(&(i, j, l))
                    .unwrap_or(&self.partials[&(i, j, l)]),
                offset: 0,
            };
            let (b0, _) = g.blocks[l];
            // A whole-slab bias goes into the reduction's sum (or is one fast `add`
            // when there is nothing to reduce); a 16-wide row per block is a call per
            // block but far fewer bytes. A per-row constant (the position embedding)
            // needs the whole slab.
            let slab_bias = !self.amp_bias && (op.per_row || elems * 2 <= lw.opts.slab_bias_bytes);
            // Only the slab's real blocks (a prefix) have residual bytes; padding
            // blocks are never read downstream.
            let real = pc.real;
            // Only pieces with real blocks were given a residual buffer.
            let residual = self.residual.get(&(i, j, l)).copied();
            // The residual joins the reduction too when it covers the whole slab and no
            // GELU comes between.
            let fused_residual = residual
                .filter(|_| pk > 1 && (slab_bias || self.amp_bias) && real == slab && !op.gelu);
            let y = if pk > 1 {
                let y = lw.buffer(tile, format!("{name}.out"), elems * 2, Category::Activation);
                Loc { buf: y, offset: 0 }
            } else {
                p
            };
            // The whole-slab bias, a constant per tile and row count (and pass, for
            // a per-row one).
            let slab_b = slab_bias.then(|| {
                let key = (tile, rows, if op.per_row { self.base } else { 0 });
                let buf = *consts.bias.entry(key).or_insert_with(|| {
                    let v = (pc.first..pc.first + slab).flat_map(|q| {
                        (r0..r0 + rows).flat_map(move |r| block_bias(op, g.blocks[l], (q, 1), r))
                    });
                    // A per-row bias has no source (never in a loop's body).
                    let recipe = op.source.map(|lin| Recipe::Bias {
                        lin,
                        blocks: g.blocks[l],
                        first: pc.first,
                        count: slab,
                        rows,
                    });
                    lw.constant_with(
                        tile,
                        format!("{name}.bias"),
                        f16_bytes(v),
                        Category::Weight,
                        recipe,
                    )
                });
                Loc { buf, offset: 0 }
            });
            if pk > 1 {
                // The partials, then the slab's bias and the fused residual, in one
                // f32 sum (with the bias in the engine, the partials hold it).
                let residual_at = fused_residual.map(|buf| Loc { buf, offset: 0 });
                let addends: Vec<Loc> = slab_b.into_iter().chain(residual_at).collect();
                let mut ops = vec![("in", p), ("out", y)];
                ops.extend(["b", "c"].into_iter().zip(addends.iter().copied()));
                lw.call(
                    tile,
                    step,
                    ReduceAdd {
                        addends: addends.len() as u8,
                        ..ReduceAdd::new(pk, elems)
                    },
                    &ops,
                );
            } else if let Some(b) = slab_b {
                lw.call(
                    tile,
                    step,
                    tessera_kernels::Add::new(elems),
                    &[("a", y), ("b", b), ("out", y)],
                );
            }
            if !self.amp_bias && !slab_bias {
                self.add_block_bias(lw, consts, step, (tile, l), &pc, y);
            }
            if op.gelu {
                // The walker halved the weights and bias for it.
                lw.call(
                    tile,
                    step,
                    Gelu::new(elems).with_half_input(),
                    &[("in", y), ("out", y)],
                );
            }
            if let Some(res) = residual.filter(|_| fused_residual.is_none()) {
                lw.call(
                    tile,
                    step,
                    tessera_kernels::Add::new(real * rows * AMP_WIDTH),
                    &[
                        ("a", y),
                        (
                            "b",
                            Loc {
                                buf: res,
                                offset: 0,
                            },
                        ),
                        ("out", y),
                    ],
                );
            }
            for q in 0..real {
                out_parts.push(block_part(
                    y.buf,
                    q * rows * AMP_WIDTH * 2,
                    (r0, rows),
                    b0 + pc.first + q,
                ));
            }
        }
    }

    /// The bias as one 16-wide row per block of piece `pc` (of column group `l`,
    /// on `tile`), broadcast over the block's rows of `y`.
    fn add_block_bias(
        &self,
        lw: &mut Lowering<'_>,
        consts: &mut Consts,
        step: Step,
        (tile, l): (u32, usize),
        pc: &Piece,
        y: Loc,
    ) {
        let (op, g) = (self.op, self.g);
        let rows = pc.rows.1;
        let bias = *consts.bias.entry((tile, 0, u32::MAX)).or_insert_with(|| {
            let v = block_bias(op, g.blocks[l], (pc.first, pc.blocks), 0);
            lw.constant_with(
                tile,
                format!("{}.bias", op.name),
                f16_bytes(v),
                Category::Weight,
                op.source.map(|lin| Recipe::Bias {
                    lin,
                    blocks: g.blocks[l],
                    first: pc.first,
                    count: pc.blocks,
                    rows: 1,
                }),
            )
        });
        for q in 0..pc.blocks {
            let at = Loc {
                buf: y.buf,
                offset: y.offset + q * rows * AMP_WIDTH * 2,
            };
            lw.call(
                tile,
                step,
                tessera_kernels::AddBias::new(rows, AMP_WIDTH),
                &[
                    ("a", at),
                    (
                        "bias",
                        Loc {
                            buf: bias,
                            offset: q * AMP_WIDTH * 2,
                        },
                    ),
                    ("out", at),
                ],
            );
        }
    }
}

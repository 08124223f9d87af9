//! The f32 routines behind each op. Shapes arrive already validated by the graph, so
//! these take plain slices and dimensions; slicing (which bounds-checks) guards every
//! access that `unsafe` GEMM makes.

use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

/// Rows per GEMM task. A function of `m` alone, never of the thread count, so that
/// every run partitions (and therefore rounds) identically on any machine. Capping the
/// task count keeps the per-call packing of `b` small next to the arithmetic.
fn row_block(m: usize) -> usize {
    const MAX_TASKS: usize = 8;
    const MIN_ROWS: usize = 64;
    m.div_ceil(MAX_TASKS)
        .next_multiple_of(8)
        .max(MIN_ROWS)
        .min(m.max(1))
}

/// For each index of the output batch dimensions `out`, the element offset of the
/// matching matrix in an operand whose batch dimensions are `inp` (right-aligned,
/// size-1 dimensions broadcast), each matrix `matrix` elements long.
fn batch_offsets(out: &[usize], inp: &[usize], matrix: usize) -> Vec<usize> {
    let count: usize = out.iter().product();
    let lead = out.len() - inp.len();
    let mut strides = vec![0usize; out.len()];
    let mut s = matrix;
    for d in (0..inp.len()).rev() {
        strides[lead + d] = if inp[d] == 1 { 0 } else { s };
        s *= inp[d];
    }
    let mut offsets = Vec::with_capacity(count);
    let mut idx = vec![0usize; out.len()];
    for _ in 0..count {
        offsets.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            if idx[d] < out[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    offsets
}

/// How a batched matmul's operands are laid out, shared by the f32 and the chunked
/// paths so that both see the same batches, row blocks and strides.
struct Gemm {
    m: usize,
    k: usize,
    n: usize,
    a_offs: Vec<usize>,
    b_offs: Vec<usize>,
    /// Strides of `b` element (p, j): row `rsb`, column `csb`.
    rsb: usize,
    csb: usize,
}

impl Gemm {
    fn new(a_shape: &[usize], b_shape: &[usize], transpose_b: bool) -> Gemm {
        let (ra, rb) = (a_shape.len(), b_shape.len());
        let k = a_shape[ra - 1];
        let n = if transpose_b {
            b_shape[rb - 2]
        } else {
            b_shape[rb - 1]
        };
        // With a shared 2-D `b`, all of a's batch dimensions are just more rows: one
        // tall GEMM parallelises better than many short ones.
        let (m, a_batch, b_batch): (usize, &[usize], &[usize]) = if rb == 2 {
            (a_shape[..ra - 1].iter().product(), &[], &[])
        } else {
            (a_shape[ra - 2], &a_shape[..ra - 2], &b_shape[..rb - 2])
        };
        let out_batch: Vec<usize> = {
            let rank = a_batch.len().max(b_batch.len());
            (0..rank)
                .map(|i| {
                    let pick = |d: &[usize]| {
                        let off = rank - d.len();
                        if i >= off { d[i - off] } else { 1 }
                    };
                    pick(a_batch).max(pick(b_batch))
                })
                .collect()
        };
        // b is [k, n] row-major, or [n, k] when transposed: element (p, j) at j * k + p.
        let (rsb, csb) = if transpose_b { (1, k) } else { (n, 1) };
        Gemm {
            m,
            k,
            n,
            a_offs: batch_offsets(&out_batch, a_batch, m * k),
            b_offs: batch_offsets(&out_batch, b_batch, k * n),
            rsb,
            csb,
        }
    }

    /// Runs `block(c, a, b, first_row)` on every row block of every batch matrix in
    /// parallel: `c` is the block's `rows x n` output, `a` its `rows x k` input rows,
    /// `b` the whole `k x n` matrix.
    fn for_each_block(
        &self,
        a: &[f32],
        b: &[f32],
        block: impl Fn(&mut [f32], &[f32], &[f32]) + Sync,
    ) -> Vec<f32> {
        let (m, k, n) = (self.m, self.k, self.n);
        let mut out = vec![0.0f32; self.a_offs.len() * m * n];
        if m * n == 0 {
            return out;
        }
        let rows = row_block(m);
        out.par_chunks_mut(m * n)
            .zip(self.a_offs.par_iter().zip(self.b_offs.par_iter()))
            .for_each(|(c_mat, (&a_off, &b_off))| {
                let a_mat = &a[a_off..a_off + m * k];
                let b_mat = &b[b_off..b_off + k * n];
                c_mat
                    .par_chunks_mut(rows * n)
                    .enumerate()
                    .for_each(|(i, c)| {
                        let r0 = i * rows;
                        let mr = c.len() / n;
                        block(c, &a_mat[r0 * k..(r0 + mr) * k], b_mat);
                    });
            });
        out
    }
}

/// `c [mr, n] = a [mr, kk] @ b [kk, n]`, `a` at row stride `lda`, `b` element (p, j)
/// at `p * rsb + j * csb`. The asserts are what make the raw-pointer call sound.
#[allow(clippy::too_many_arguments)]
fn sgemm(
    mr: usize,
    kk: usize,
    n: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    (rsb, csb): (usize, usize),
    c: &mut [f32],
) {
    if mr == 0 || n == 0 {
        return;
    }
    if kk == 0 {
        c[..mr * n].fill(0.0);
        return;
    }
    assert!(a.len() >= (mr - 1) * lda + kk);
    assert!(b.len() > (kk - 1) * rsb + (n - 1) * csb);
    assert!(c.len() >= mr * n);
    // SAFETY: the asserts above bound every element sgemm reads from `a` and `b` and
    // writes in `c` under the given strides.
    unsafe {
        matrixmultiply::sgemm(
            mr,
            kk,
            n,
            1.0,
            a.as_ptr(),
            lda as isize,
            1,
            b.as_ptr(),
            rsb as isize,
            csb as isize,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Batched `a @ b (+ bias)` with numpy batch broadcasting; see `OpKind::MatMul`.
pub fn matmul(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    transpose_b: bool,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let g = Gemm::new(a_shape, b_shape, transpose_b);
    let (k, n) = (g.k, g.n);
    g.for_each_block(a, b, |c, a_blk, b_mat| {
        sgemm(c.len() / n, k, n, a_blk, k, b_mat, (g.rsb, g.csb), c);
        if let Some(bias) = bias {
            for row in c.chunks_exact_mut(n) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
    })
}

/// Width of the AMP's contraction chunk: the unit after which the machine stores its
/// running partial sum in f16.
pub const CHUNK: usize = 16;

/// Output columns [`matmul_f16_chunked`] works on at a time.
const COLUMN_TILE: usize = 128;

fn to_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// [`matmul`] with the f16 storage of the compiled program: `k` in [`CHUNK`]-wide
/// chunks (the last one implicitly zero-padded), consecutive groups of
/// `chunks_per_group` chunks; within a group the partial is rounded to f16 after each
/// chunk's product is added, the groups' partials are summed in f32 in group order and
/// rounded once (only when there is more than one group), then `bias` is added and
/// rounded. The result is f16-representable.
pub fn matmul_f16_chunked(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    transpose_b: bool,
    bias: Option<&[f32]>,
    chunks_per_group: usize,
) -> Vec<f32> {
    let g = Gemm::new(a_shape, b_shape, transpose_b);
    let (k, n) = (g.k, g.n);
    let chunks = k.div_ceil(CHUNK);
    let per_group = chunks_per_group.clamp(1, chunks.max(1));
    let groups = chunks.div_ceil(per_group);
    g.for_each_block(a, b, |c, a_blk, b_mat| {
        let mr = c.len() / n;
        // A chunk's product is as wide as the output; one column tile of them at a
        // time keeps the partial sums and the product in cache across the chunks
        // (each element's operations and their order are the same).
        let tile = COLUMN_TILE.min(n);
        let mut partial = vec![0.0f32; mr * tile];
        let mut product = vec![0.0f32; mr * tile];
        let mut halves = vec![f16::ZERO; mr * tile];
        for j0 in (0..n).step_by(tile) {
            let nt = tile.min(n - j0);
            let (partial, product) = (&mut partial[..mr * nt], &mut product[..mr * nt]);
            let halves = &mut halves[..mr * nt];
            for group in 0..groups {
                partial.fill(0.0);
                for chunk in group * per_group..((group + 1) * per_group).min(chunks) {
                    let p0 = chunk * CHUNK;
                    let width = CHUNK.min(k - p0);
                    let b_chunk = &b_mat[p0 * g.rsb + j0 * g.csb..];
                    sgemm(
                        mr,
                        width,
                        nt,
                        &a_blk[p0..],
                        k,
                        b_chunk,
                        (g.rsb, g.csb),
                        product,
                    );
                    for (p, d) in partial.iter_mut().zip(product.iter()) {
                        *p += d;
                    }
                    // Rounded to f16 and back as `to_f16` does, a slice at a time
                    // (vector conversions).
                    halves.convert_from_f32_slice(partial);
                    halves.convert_to_f32_slice(partial);
                }
                for (row, part) in c.chunks_exact_mut(n).zip(partial.chunks_exact(nt)) {
                    let out = &mut row[j0..j0 + nt];
                    if group == 0 {
                        out.copy_from_slice(part);
                    } else {
                        for (v, p) in out.iter_mut().zip(part) {
                            *v += p;
                        }
                    }
                }
            }
        }
        if groups > 1 {
            for v in c.iter_mut() {
                *v = to_f16(*v);
            }
        }
        if let Some(bias) = bias {
            for row in c.chunks_exact_mut(n) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v = to_f16(*v + b);
                }
            }
        }
    })
}

/// Strides of an operand of shape `inp` read as the (right-aligned) output shape
/// `out`; broadcast dimensions get stride 0.
fn broadcast_strides(out: &[usize], inp: &[usize]) -> Vec<usize> {
    let lead = out.len() - inp.len();
    let mut strides = vec![0usize; out.len()];
    let mut s = 1;
    for d in (0..inp.len()).rev() {
        strides[lead + d] = if inp[d] == 1 { 0 } else { s };
        s *= inp[d];
    }
    strides
}

/// Offset of the first element of output row `row` (all dimensions but the last).
fn row_offset(row: usize, out: &[usize], strides: &[usize]) -> usize {
    let mut rem = row;
    let mut off = 0;
    for d in (0..out.len().saturating_sub(1)).rev() {
        off += (rem % out[d]) * strides[d];
        rem /= out[d];
    }
    off
}

/// Elementwise `a + b` with numpy broadcasting into `out_shape`.
pub fn add(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    out_shape: &[usize],
) -> Vec<f32> {
    if a_shape == b_shape {
        return a.par_iter().zip(b).map(|(x, y)| x + y).collect();
    }
    let numel: usize = out_shape.iter().product();
    let last = *out_shape.last().unwrap_or(&1);
    let sa = broadcast_strides(out_shape, a_shape);
    let sb = broadcast_strides(out_shape, b_shape);
    let (la, lb) = (sa[sa.len() - 1], sb[sb.len() - 1]);
    let mut out = vec![0.0f32; numel];
    out.par_chunks_mut(last).enumerate().for_each(|(row, o)| {
        let oa = row_offset(row, out_shape, &sa);
        let ob = row_offset(row, out_shape, &sb);
        for (j, v) in o.iter_mut().enumerate() {
            *v = a[oa + j * la] + b[ob + j * lb];
        }
    });
    out
}

pub fn scale(x: &[f32], factor: f32) -> Vec<f32> {
    x.par_iter().map(|v| v * factor).collect()
}

/// Per row of `width`: `(x - mean) / sqrt(var + eps) * gamma + beta`, biased variance.
/// Sums run in f64 so the reference is not the noisiest thing in a comparison.
pub fn layer_norm(x: &[f32], width: usize, gamma: &[f32], beta: &[f32], eps: f32) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(o, row)| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / width as f64;
            let var = row
                .iter()
                .map(|&v| {
                    let d = f64::from(v) - mean;
                    d * d
                })
                .sum::<f64>()
                / width as f64;
            let inv = 1.0 / (var + f64::from(eps)).sqrt();
            for (((o, &v), &g), &b) in o.iter_mut().zip(row).zip(gamma).zip(beta) {
                *o = ((f64::from(v) - mean) * inv) as f32 * g + b;
            }
        });
    out
}

/// Softmax per row of `width`, shifted by the row maximum so `exp` cannot overflow.
pub fn softmax(x: &[f32], width: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(o, row)| {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f64;
            for (o, &v) in o.iter_mut().zip(row) {
                *o = (v - max).exp();
                sum += f64::from(*o);
            }
            let inv = (1.0 / sum) as f32;
            for o in o.iter_mut() {
                *o *= inv;
            }
        });
    out
}

/// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_scalar(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

pub fn gelu(x: &[f32]) -> Vec<f32> {
    x.par_iter().map(|&v| gelu_scalar(v)).collect()
}

/// Output dimension `i` is input dimension `perm[i]`.
pub fn permute(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let in_strides = {
        let mut s = vec![1usize; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    };
    let strides: Vec<usize> = perm.iter().map(|&p| in_strides[p]).collect();
    let last = *out_shape.last().unwrap_or(&1);
    let inner = *strides.last().unwrap_or(&1);
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(last).enumerate().for_each(|(row, o)| {
        let base = row_offset(row, &out_shape, &strides);
        for (j, v) in o.iter_mut().enumerate() {
            *v = x[base + j * inner];
        }
    });
    out
}

/// `[..., T, H*D]` -> `[..., H, T, D]`.
pub fn split_heads(x: &[f32], shape: &[usize], heads: usize) -> Vec<f32> {
    let r = shape.len();
    let mut view = shape[..r - 1].to_vec();
    view.extend([heads, shape[r - 1] / heads]);
    permute(x, &view, &swap_two_before_last(view.len()))
}

/// `[..., H, T, D]` -> `[..., T, H*D]` (element order of `[..., T, H, D]`).
pub fn merge_heads(x: &[f32], shape: &[usize]) -> Vec<f32> {
    permute(x, shape, &swap_two_before_last(shape.len()))
}

/// The permutation of `rank` axes that swaps axes `rank-3` and `rank-2`.
fn swap_two_before_last(rank: usize) -> Vec<usize> {
    let mut perm: Vec<usize> = (0..rank).collect();
    perm.swap(rank - 3, rank - 2);
    perm
}

/// Elements `start..end` of `axis`.
pub fn slice(x: &[f32], shape: &[usize], axis: usize, start: usize, end: usize) -> Vec<f32> {
    let inner: usize = shape[axis + 1..].iter().product();
    let dim = shape[axis];
    let mut out = Vec::with_capacity(x.len() / dim * (end - start));
    for block in x.chunks_exact(dim * inner) {
        out.extend_from_slice(&block[start * inner..end * inner]);
    }
    out
}

/// Joins `parts` (data, size along `axis`) along `axis`; `inner` is the product of
/// the dimensions after `axis`, `outer` of those before.
pub fn concat(parts: &[(&[f32], usize)], outer: usize, inner: usize) -> Vec<f32> {
    let total: usize = parts.iter().map(|(d, _)| d.len()).sum();
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (data, dim) in parts {
            let chunk = dim * inner;
            out.extend_from_slice(&data[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

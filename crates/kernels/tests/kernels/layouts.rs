//! The layout kernels: `zero_fill`, `blocks_to_rows_f16` and `transpose_blocks_f16`,
//! bit-exact against host-side references.

use half::f16;
use rand::Rng;
use tessera_kernels::{
    BlocksToRows, Kernel, TransposeBlocks, ZeroFill, pack_chunk_major, pack_weights,
};

use crate::harness::{f16_bytes, layout, random_f16, rng, run};

/// Arbitrary bit patterns, NaNs and infinities included: the copies must be exact.
fn random_bits(seed: u64, n: usize) -> Vec<u8> {
    let mut r = rng(seed);
    (0..n).map(|_| r.random::<u8>()).collect()
}

#[test]
fn zero_fill_zeros_the_runs_and_nothing_else() {
    for (seed, &(runs, run_bytes, stride)) in [
        (1, 8, 8),
        (1, 32760, 32760),
        (3, 8, 64),
        (5, 224, 224),
        (5, 224, 1472),
        (7, 40, 48),
        (11, 16, 24),
        (100, 32, 96),
        (2000, 8, 16),
    ]
    .iter()
    .enumerate()
    {
        let kern = ZeroFill::new(runs, run_bytes, stride);
        let before = random_bits(seed as u64, kern.bytes() as usize);
        let out = run(&kern, &layout(&kern), &[("out", before.clone())]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read("out", kern.bytes());
        for (i, (&g, &b)) in got.iter().zip(&before).enumerate() {
            let in_run = (i as u32) % stride < run_bytes;
            let want = if in_run { 0 } else { b };
            assert_eq!(g, want, "{}: byte {i}", kern.symbol());
        }
    }
}

#[test]
fn blocks_to_rows_inverts_rearrange() {
    for (seed, &(rows, nb)) in [
        (1, 1),
        (1, 3),
        (5, 2),
        (6, 1),
        (7, 1),
        (13, 3),
        (32, 46),
        (100, 4),
        (200, 30),
    ]
    .iter()
    .enumerate()
    {
        let kern = BlocksToRows::new(rows, nb);
        let x = random_f16(&mut rng(seed as u64 + 10), (rows * nb * 16) as usize, 4.0);
        let blocks = pack_chunk_major(rows as usize, nb as usize, &x);
        let out = run(&kern, &layout(&kern), &[("in", f16_bytes(&blocks))]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        assert_eq!(out.read_f16("out", x.len()), x, "rows {rows} nb {nb}");
    }
}

#[test]
fn blocks_to_rows_copies_bits() {
    let kern = BlocksToRows::new(9, 5);
    let bits = random_bits(77, kern.bytes() as usize);
    let out = run(&kern, &layout(&kern), &[("in", bits.clone())]);
    out.assert_ok();
    let got = out.read("out", kern.bytes());
    let (rows, nb) = (9usize, 5usize);
    for b in 0..nb {
        for r in 0..rows {
            let src = (b * rows + r) * 32;
            let dst = r * nb * 32 + b * 32;
            assert_eq!(got[dst..dst + 32], bits[src..src + 32], "block {b} row {r}");
        }
    }
}

/// `x` is row-major `[rows, cols]`; its transpose, row-major `[cols, rows]`.
fn transpose(rows: usize, cols: usize, x: &[f16]) -> Vec<f16> {
    let mut t = vec![f16::ZERO; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

#[test]
fn transpose_blocks_gives_the_weight_layout_of_the_transpose() {
    for (seed, &(kc, tb)) in [
        (1, 1),
        (1, 5),
        (2, 3),
        (1, 7),
        (3, 13),
        (5, 7),
        (5, 46),
        (8, 48),
        (5, 3),
        (5, 4),
        (4, 1),
    ]
    .iter()
    .enumerate()
    {
        let kern = TransposeBlocks::new(kc, tb);
        let (rows, cols) = (16 * tb as usize, 16 * kc as usize);
        let x = random_f16(&mut rng(seed as u64 + 20), rows * cols, 2.0);
        let blocks = pack_chunk_major(rows, kc as usize, &x);
        let out = run(&kern, &layout(&kern), &[("in", f16_bytes(&blocks))]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        // `amp_matmul`'s weights for `Q · Xᵀ` are the packed `Xᵀ`.
        let want = pack_weights(kc as usize, tb as usize, &transpose(rows, cols, &x));
        assert_eq!(out.read_f16("out", want.len()), want, "kc {kc} tb {tb}");
    }
}

#[test]
fn transpose_blocks_copies_bits() {
    let (kc, tb) = (3usize, 4usize);
    let kern = TransposeBlocks::new(kc as u32, tb as u32);
    let bits = random_bits(78, kern.bytes() as usize);
    let out = run(&kern, &layout(&kern), &[("in", bits.clone())]);
    out.assert_ok();
    let got = out.read("out", kern.bytes());
    let at = |i: usize| [bits[i], bits[i + 1]];
    for b in 0..tb {
        for c in 0..kc {
            for kk in 0..16 {
                for j in 0..16 {
                    let dst = (((b * kc + c) * 16 + kk) * 16 + j) * 2;
                    let src = ((c * 16 * tb + 16 * b + j) * 16 + kk) * 2;
                    assert_eq!([got[dst], got[dst + 1]], at(src), "b {b} c {c} [{kk}][{j}]");
                }
            }
        }
    }
}

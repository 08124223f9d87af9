use half::f16;
use rand::Rng;
use tessera_kernels::{Kernel, ScaleCols};

use crate::harness::{f16_bytes, layout, random_f16, rng, run};

/// Bit-exact: each column's factor rounded to f16, each product (exact in f32)
/// rounded to f16, as `f16v4mul` does; `in` untouched. Shapes with workers of
/// one row and without rows, several blocks, and the encoder attention's 80 rows.
#[test]
fn scale_cols_matches_reference() {
    for (seed, &(rows, nb)) in [(1u32, 1u32), (5, 2), (6, 1), (13, 3), (80, 1), (80, 2)]
        .iter()
        .enumerate()
    {
        let k = ScaleCols::new(rows, nb);
        let mut r = rng(1450 + seed as u64);
        let x = random_f16(&mut r, (rows * nb * 16) as usize, 200.0);
        let f: Vec<f32> = (0..nb * 16)
            .map(|_| r.random_range(1.0f32 / 729.0..1.0))
            .collect();
        let fb: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = run(&k, &layout(&k), &[("in", f16_bytes(&x)), ("f", fb)]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read_f16("out", x.len());
        assert_eq!(out.read_f16("in", x.len()), x, "{}: in changed", k.symbol());
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            // Block layout `[nb][rows][16]`: element i is in block i / (16 rows),
            // column i % 16.
            let col = (i / (16 * rows as usize)) * 16 + i % 16;
            let want = f16::from_f32(v.to_f32() * f16::from_f32(f[col]).to_f32());
            assert_eq!(g.to_bits(), want.to_bits(), "{}: element {i}", k.symbol());
        }
    }
}

use half::f16;
use rand::Rng;
use tessera_kernels::{Kernel, ScaleRows};

use crate::harness::{f16_bytes, layout, random_f16, rng, run};

/// Bit-exact: each element widened to f32, multiplied by its row's factor (one f32
/// rounding) and rounded to f16, as the kernel does.
#[test]
fn scale_rows_matches_reference() {
    for (seed, &(rows, nb)) in [(1u32, 1u32), (5, 2), (16, 5), (32, 5), (7, 46), (13, 3)]
        .iter()
        .enumerate()
    {
        let k = ScaleRows::new(rows, nb);
        let mut r = rng(1400 + seed as u64);
        let x = random_f16(&mut r, (rows * nb * 16) as usize, 200.0);
        let f: Vec<f32> = (0..rows)
            .map(|_| r.random_range(1.0f32 / 729.0..1.0))
            .collect();
        let fb: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        let out = run(&k, &layout(&k), &[("x", f16_bytes(&x)), ("f", fb)]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read_f16("x", x.len());
        for (i, (&g, &v)) in got.iter().zip(&x).enumerate() {
            // Block layout `[nb][rows][16]`: element i is in row (i / 16) % rows.
            let row = (i / 16) % rows as usize;
            let want = f16::from_f32(v.to_f32() * f[row]);
            assert_eq!(g.to_bits(), want.to_bits(), "{}: element {i}", k.symbol());
        }
    }
}

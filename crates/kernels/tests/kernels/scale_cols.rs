use half::f16;
use rand::Rng;
use tessera_kernels::{Kernel, ScaleCols};

use crate::harness::{f16_bytes, layout, random_f16, rng, run};

/// Bit-exact: each column's factor rounded to f16, each product (exact in f32)
/// rounded to f16, as `f16v4mul` does; `in` untouched. Shapes with workers of
/// one row and without rows, several blocks, and the encoder attention's 80 rows.
#[test]
fn scale_cols_matches_reference() {
    for (seed, &(rows, nb, out_rows)) in [
        (1u32, 1u32, 1u32),
        (5, 2, 5),
        (6, 1, 6),
        (13, 3, 13),
        (80, 1, 80),
        (80, 2, 80),
        // The attention's 72 real dimensions in blocks of 80.
        (72, 2, 80),
        (7, 3, 9),
    ]
    .iter()
    .enumerate()
    {
        let k = ScaleCols::new(rows, nb).with_out_rows(out_rows);
        let mut r = rng(1450 + seed as u64);
        let x = random_f16(&mut r, (rows * nb * 16) as usize, 200.0);
        let f: Vec<f32> = (0..nb * 16)
            .map(|_| r.random_range(1.0f32 / 729.0..1.0))
            .collect();
        let fb: Vec<u8> = f.iter().flat_map(|v| v.to_le_bytes()).collect();
        // `out` starts as a pattern: rows past `rows` must keep it.
        let olen = (out_rows * nb * 16) as usize;
        let before: Vec<f16> = (0..olen).map(|i| f16::from_f32(i as f32)).collect();
        let out = run(
            &k,
            &layout(&k),
            &[
                ("in", f16_bytes(&x)),
                ("f", fb),
                ("out", f16_bytes(&before)),
            ],
        );
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read_f16("out", olen);
        assert_eq!(out.read_f16("in", x.len()), x, "{}: in changed", k.symbol());
        for (i, &g) in got.iter().enumerate() {
            // Block layout `[nb][out_rows][16]`.
            let (b, row, j) = (
                i / (16 * out_rows as usize),
                i / 16 % out_rows as usize,
                i % 16,
            );
            let want = if row < rows as usize {
                let v = x[(b * rows as usize + row) * 16 + j];
                f16::from_f32(v.to_f32() * f16::from_f32(f[b * 16 + j]).to_f32())
            } else {
                before[i]
            };
            assert_eq!(g.to_bits(), want.to_bits(), "{}: element {i}", k.symbol());
        }
    }
}

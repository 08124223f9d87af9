use half::f16;
use tessera_kernels::{Kernel, SoftmaxCols};

use crate::harness::{f16_bytes, layout, random_f16, rng, run};

/// Bit patterns the kernel must never read as scores: they fill the padding rows.
const GARBAGE: [u16; 4] = [0x7e00, 0x7c00, 0x7bff, 0xfc00];

/// The kernel's arithmetic in Rust, in its order: per column the maximum `M` over
/// the valid rows; `x - M` rounded to f16, times `scale` rounded to f16, rounded
/// to f16; its exponential in f32 rounded to f16 (`e`); f32 sums of `e` per
/// worker's rows (the rows split as the workers take them), added in worker order,
/// then `1/sum`. Returns `e` (valid rows) and `1/sum` per column.
fn model(k: &SoftmaxCols, x: &[f16]) -> (Vec<f16>, Vec<f32>) {
    let (rows, n) = (k.rows as usize, k.n as usize);
    let mut e = x.to_vec();
    let mut recip = Vec::new();
    let split: Vec<usize> = {
        let (base, extra) = (n / 6, n % 6);
        (0..6).map(|w| base + usize::from(w < extra)).collect()
    };
    for b in 0..k.blocks as usize {
        for c in 0..16 {
            let at = |r: usize| (b * rows + r) * 16 + c;
            let m = (0..n)
                .map(|r| x[at(r)].to_f32())
                .fold(f32::NEG_INFINITY, f32::max);
            let s16 = f16::from_f32(k.scale).to_f32();
            let mut total = 0f32;
            let mut r0 = 0;
            for &cnt in &split {
                let mut sum = 0f32;
                for r in r0..r0 + cnt {
                    let d = f16::from_f32(x[at(r)].to_f32() - m).to_f32();
                    let arg = f16::from_f32(d * s16).to_f32();
                    let v = f16::from_f32(arg.exp());
                    sum += v.to_f32();
                    e[at(r)] = v;
                }
                total = if r0 == 0 { sum } else { total + sum };
                r0 += cnt;
            }
            recip.push(1.0 / total);
        }
    }
    (e, recip)
}

/// Out of place and in place: bit-exact against the model, the padding rows `+0`, and the normalised
/// probabilities near an f64 softmax. The exponentials' arguments are rounded to
/// f16 three times (`x - M`, `scale`, the product): each `e` is within `2^-11 +
/// 1.25 * 2^-10 |a|` (relative) of `exp(a)`, `a = (x - M) * scale`, and the sum within
/// that bound weighted by the probabilities; so `p` within `2^-10 + 2^-9 (|a| + ā)`,
/// `ā` the mean of `|a|` under the softmax (an f16 argument cannot do better: its
/// spacing near `a` is `2^-10 |a|` at worst).
#[test]
fn softmax_cols_matches_reference() {
    for (seed, &(blocks, rows, n, scale)) in [
        (1u32, 736u32, 729u32, 0.117_851_13f32),
        (2, 736, 729, 0.125),
        (1, 12, 12, 1.0),
        (3, 40, 13, 0.5),
        (1, 64, 50, 4.0),
        // Unscaled: the multiply is left out.
        (2, 736, 729, 1.0),
    ]
    .iter()
    .enumerate()
    {
        let k = SoftmaxCols::new(blocks, rows, n, scale);
        let mut r = rng(1500 + seed as u64);
        let mut x = random_f16(&mut r, (blocks * rows * 16) as usize, 40.0);
        for b in 0..blocks as usize {
            for row in n as usize..rows as usize {
                for c in 0..16 {
                    x[(b * rows as usize + row) * 16 + c] =
                        f16::from_bits(GARBAGE[(row + c) % GARBAGE.len()]);
                }
            }
        }
        // `out` starts as garbage too: every byte of it must be written.
        let junk: Vec<f16> = (0..x.len())
            .map(|i| f16::from_bits(GARBAGE[i % GARBAGE.len()]))
            .collect();
        let in_place = seed % 2 == 1;
        let mut addrs = layout(&k);
        let inputs = if in_place {
            addrs.insert("out", addrs.get("in").expect("in"));
            vec![("in", f16_bytes(&x))]
        } else {
            vec![("in", f16_bytes(&x)), ("out", f16_bytes(&junk))]
        };
        let out = run(&k, &addrs, &inputs);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read_f16("out", x.len());
        let recip: Vec<f32> = out
            .read("recip", blocks * 64)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let (want_e, want_recip) = model(&k, &x);
        let name = format!("{} (in place: {in_place})", k.symbol());
        for b in 0..blocks as usize {
            for row in 0..rows as usize {
                for c in 0..16 {
                    let i = (b * rows as usize + row) * 16 + c;
                    if row >= n as usize {
                        assert_eq!(got[i].to_bits(), 0, "{name}: padding row {row} col {c}");
                    } else {
                        assert_eq!(
                            got[i].to_bits(),
                            want_e[i].to_bits(),
                            "{name}: e at block {b} row {row} col {c}"
                        );
                    }
                }
            }
        }
        for (j, (&g, &w)) in recip.iter().zip(&want_recip).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}: 1/sum of column {j}");
        }
        // Independent of the model: e * (1/sum) against softmax in f64.
        for b in 0..blocks as usize {
            for c in 0..16 {
                let at = |r: usize| (b * rows as usize + r) * 16 + c;
                let xs: Vec<f64> = (0..n as usize).map(|r| x[at(r)].to_f64()).collect();
                let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = xs
                    .iter()
                    .map(|v| ((v - m) * f64::from(scale)).exp())
                    .collect();
                let sum: f64 = ex.iter().sum();
                let arg = |r: usize| (xs[r] - m).abs() * f64::from(scale);
                let mean_arg: f64 = (0..xs.len()).map(|r| ex[r] / sum * arg(r)).sum();
                for (r, v) in ex.iter().enumerate() {
                    let p = got[at(r)].to_f64() * f64::from(recip[b * 16 + c]);
                    let want = v / sum;
                    let rel = 2f64.powi(-10) + 2f64.powi(-9) * (arg(r) + mean_arg);
                    assert!(
                        (p - want).abs() <= want * rel + 2f64.powi(-24),
                        "{name}: p at block {b} row {r} col {c}: {p} against {want}"
                    );
                }
            }
        }
    }
}

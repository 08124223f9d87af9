use half::f16;
use rand::Rng;
use tessera_kernels::{Kernel, SoftmaxCols};

use crate::harness::{Outcome, f16_bytes, layout, random_f16, rng, run};

/// Bit patterns the kernel must never read as scores: they fill the padding rows.
const GARBAGE: [u16; 4] = [0x7e00, 0x7c00, 0x7bff, 0xfc00];

/// Each column's maximum over the valid rows (`[blocks][16]`).
fn column_max(k: &SoftmaxCols, x: &[f16]) -> Vec<f16> {
    let (rows, n) = (k.rows as usize, k.n as usize);
    (0..k.blocks as usize * 16)
        .map(|j| {
            let (b, c) = (j / 16, j % 16);
            let m = (0..n)
                .map(|r| x[(b * rows + r) * 16 + c].to_f32())
                .fold(f32::NEG_INFINITY, f32::max);
            f16::from_f32(m)
        })
        .collect()
}

/// The kernel's arithmetic in Rust, in its order: per column the maximum `M` over
/// the valid rows; `x - M` rounded to f16, times `scale` rounded to f16, rounded
/// to f16; its exponential in f32 rounded to f16 (`e`); f32 sums of `e` per
/// worker's rows (the rows split as the workers take them), added in worker order,
/// then `1/sum`. Returns `e` (valid rows) and `1/sum` per column.
fn model(k: &SoftmaxCols, x: &[f16]) -> (Vec<f16>, Vec<f32>) {
    let (e, sums) = shifted_model(k, x, &column_max(k, x));
    (e, sums.iter().map(|s| 1.0 / s).collect())
}

/// [`model`] with `M` given (`[blocks][16]`), and the sums themselves.
fn shifted_model(k: &SoftmaxCols, x: &[f16], maxima: &[f16]) -> (Vec<f16>, Vec<f32>) {
    let (rows, n) = (k.rows as usize, k.n as usize);
    let mut e = x.to_vec();
    let mut sums = Vec::new();
    let split: Vec<usize> = {
        let (base, extra) = (n / 6, n % 6);
        (0..6).map(|w| base + usize::from(w < extra)).collect()
    };
    for b in 0..k.blocks as usize {
        for c in 0..16 {
            let at = |r: usize| (b * rows + r) * 16 + c;
            let m = maxima[b * 16 + c].to_f32();
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
            sums.push(total);
        }
    }
    (e, sums)
}

/// Random scores in `[blocks][rows][16]`, `GARBAGE` in the padding rows `n..rows`.
fn scores(seed: u64, blocks: u32, rows: u32, n: u32) -> Vec<f16> {
    let mut r = rng(seed);
    let mut x = random_f16(&mut r, (blocks * rows * 16) as usize, 40.0);
    pad_with_garbage(&mut x, rows, n);
    x
}

fn pad_with_garbage(x: &mut [f16], rows: u32, n: u32) {
    for (i, v) in x.iter_mut().enumerate() {
        let (row, c) = ((i / 16) % rows as usize, i % 16);
        if row >= n as usize {
            *v = f16::from_bits(GARBAGE[(row + c) % GARBAGE.len()]);
        }
    }
}

/// `n` values of garbage, for outputs that must be written whole.
fn junk(n: usize) -> Vec<f16> {
    (0..n)
        .map(|i| f16::from_bits(GARBAGE[i % GARBAGE.len()]))
        .collect()
}

fn read_f32(out: &Outcome, name: &str, n: u32) -> Vec<f32> {
    out.read(name, 4 * n)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Runs `k` on scores `x` (with `out` at `in` when `in_place`, else starting as
/// garbage) and the `other` inputs; checks it ran cleanly within its contract.
fn run_on(k: &SoftmaxCols, x: &[f16], other: &[(&str, Vec<u8>)], in_place: bool) -> Outcome {
    let mut addrs = layout(k);
    let mut inputs = vec![("in", f16_bytes(x))];
    if in_place {
        addrs.insert("out", addrs.get("in").expect("in"));
    } else if k.contract().operand("out").is_some() {
        inputs.push(("out", f16_bytes(&junk(x.len()))));
    }
    inputs.extend(other.iter().cloned());
    let out = run(k, &addrs, &inputs);
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    out
}

/// `e` as the kernel must leave it: bit-exact on the valid rows, `+0` on the
/// padding rows.
fn assert_exps(name: &str, k: &SoftmaxCols, got: &[f16], want: &[f16]) {
    let (rows, n) = (k.rows as usize, k.n as usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (b, row, c) = (i / 16 / rows, (i / 16) % rows, i % 16);
        let want = if row >= n { 0 } else { w.to_bits() };
        assert_eq!(
            g.to_bits(),
            want,
            "{name}: e at block {b} row {row} col {c} (padding: {})",
            row >= n
        );
    }
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
        let x = scores(1500 + seed as u64, blocks, rows, n);
        let in_place = seed % 2 == 1;
        let out = run_on(&k, &x, &[], in_place);
        let got = out.read_f16("out", x.len());
        let recip = read_f32(&out, "recip", 16 * blocks);
        let (want_e, want_recip) = model(&k, &x);
        let name = format!("{} (in place: {in_place})", k.symbol());
        assert_exps(&name, &k, &got, &want_e);
        for (j, (&g, &w)) in recip.iter().zip(&want_recip).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}: 1/sum of column {j}");
        }
        // Independent of the model: e * (1/sum) against softmax in f64.
        for b in 0..blocks as usize {
            for c in 0..16 {
                let at = |r: usize| (b * rows as usize + r) * 16 + c;
                let xs: Vec<f64> = (0..n as usize).map(|r| x[at(r)].to_f64()).collect();
                let ps: Vec<f64> = (0..n as usize)
                    .map(|r| got[at(r)].to_f64() * f64::from(recip[b * 16 + c]))
                    .collect();
                assert_near_softmax(&format!("{name}: block {b} col {c}"), &xs, &ps, scale);
            }
        }
    }
}

/// Probabilities `ps` of one column against the f64 softmax of its scores `xs`:
/// within `2^-10 + 2^-9 (|a| + ā)` (relative), as derived above.
fn assert_near_softmax(name: &str, xs: &[f64], ps: &[f64], scale: f32) {
    let m = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ex: Vec<f64> = xs
        .iter()
        .map(|v| ((v - m) * f64::from(scale)).exp())
        .collect();
    let sum: f64 = ex.iter().sum();
    let arg = |r: usize| (xs[r] - m).abs() * f64::from(scale);
    let mean_arg: f64 = (0..xs.len()).map(|r| ex[r] / sum * arg(r)).sum();
    for (r, (v, &p)) in ex.iter().zip(ps).enumerate() {
        let want = v / sum;
        let rel = 2f64.powi(-10) + 2f64.powi(-9) * (arg(r) + mean_arg);
        assert!(
            (p - want).abs() <= want * rel + 2f64.powi(-24),
            "{name}: p at row {r}: {p} against {want}"
        );
    }
}

/// `Maxima`: each column's maximum over the valid rows, bit-exact, whatever the
/// padding holds (NaN and infinities: a read of it would show), `in` untouched
/// and every byte of `max` written.
#[test]
fn maxima_match_reference() {
    for (seed, &(blocks, rows, n)) in [
        (1u32, 736u32, 729u32),
        (2, 40, 13),
        (1, 12, 12),
        (3, 64, 50),
        (4, 416, 416),
        (5, 320, 313),
    ]
    .iter()
    .enumerate()
    {
        let k = SoftmaxCols::maxima(blocks, rows, n);
        let x = scores(1600 + seed as u64, blocks, rows, n);
        let out = run_on(
            &k,
            &x,
            &[("max", f16_bytes(&junk(16 * blocks as usize)))],
            false,
        );
        let got = out.read_f16("max", 16 * blocks as usize);
        for (j, (g, w)) in got.iter().zip(column_max(&k, &x)).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{}: column {j}", k.symbol());
        }
        let kept = out.read_f16("in", x.len());
        assert!(
            kept.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{}: `in` changed",
            k.symbol()
        );
    }
}

/// `g` rows of maxima for `Shifted` on scores `x`: row 0 at or above each column's
/// own maximum (some columns far above, so that all their `e` underflow), the
/// other rows around it, the largest above or below (another tile's keys).
fn tiles_maxima(k: &SoftmaxCols, x: &[f16], g: u32, seed: u64) -> Vec<f16> {
    let own = column_max(k, x);
    let mut r = rng(seed);
    let mut rows = Vec::new();
    for t in 0..g {
        for (j, m) in own.iter().enumerate() {
            let m = m.to_f32();
            let v = match (t, j % 16) {
                (0, 5) => m + 40.0 / k.scale,
                (0, c) if c % 3 == 0 => m,
                (0, _) => m + r.random_range(0.0f32..8.0),
                _ => m + r.random_range(-8.0f32..8.0),
            };
            // `m` is an f16: rounding keeps row 0 at or above it.
            rows.push(f16::from_f32(v));
        }
    }
    rows
}

/// `Shifted`: `e` shifted by the largest of the `g` rows of `maxes`, and each
/// column's sum of them, bit-exact against the model with that `M`, in and out of
/// place, the padding rows `+0`.
#[test]
fn shifted_matches_reference() {
    for (seed, &(blocks, rows, n, scale, g)) in [
        (1u32, 736u32, 729u32, 0.117_851_13f32, 2u32),
        (2, 40, 13, 0.5, 1),
        (1, 12, 12, 1.0, 3),
        (3, 64, 50, 4.0, 6),
        (2, 368, 365, 1.0, 2),
        (1, 40, 20, 0.125, 12),
        (5, 320, 313, 1.0, 2),
    ]
    .iter()
    .enumerate()
    {
        let k = SoftmaxCols::shifted(blocks, rows, n, scale, g);
        let x = scores(1700 + seed as u64, blocks, rows, n);
        let maxes = tiles_maxima(&k, &x, g, 1800 + seed as u64);
        let in_place = seed % 2 == 1;
        let out = run_on(
            &k,
            &x,
            &[
                ("maxes", f16_bytes(&maxes)),
                ("sum", f16_bytes(&junk(32 * blocks as usize))),
            ],
            in_place,
        );
        let m: Vec<f16> = (0..16 * blocks as usize)
            .map(|j| {
                (0..g as usize)
                    .map(|t| maxes[t * 16 * blocks as usize + j])
                    .max_by(|a, b| a.total_cmp(b))
                    .expect("g >= 1")
            })
            .collect();
        let (want_e, want_sums) = shifted_model(&k, &x, &m);
        let name = format!("{} (in place: {in_place})", k.symbol());
        assert_exps(&name, &k, &out.read_f16("out", x.len()), &want_e);
        let sums = read_f32(&out, "sum", 16 * blocks);
        for (j, (s, w)) in sums.iter().zip(&want_sums).enumerate() {
            assert_eq!(s.to_bits(), w.to_bits(), "{name}: sum of column {j}");
        }
        // Column 5's `M` lies `40 / scale` above its scores: every `e` underflows.
        assert!(
            (0..blocks as usize).all(|b| sums[b * 16 + 5] == 0.0),
            "{name}: a column far below M sums to zero"
        );
    }
}

/// On one tile, `Maxima` then `Shifted` over its own maxima (`g = 1`) is the
/// default mode: the same `e`, and `1/sum` its `recip`.
#[test]
fn maxima_then_shifted_is_the_full_softmax() {
    for (blocks, rows, n, scale) in [(2u32, 40u32, 13u32, 0.5f32), (1, 736, 729, 1.0)] {
        let x = scores(1900, blocks, rows, n);
        let full = SoftmaxCols::new(blocks, rows, n, scale);
        let out = run_on(&full, &x, &[], false);
        let (e, recip) = (
            out.read_f16("out", x.len()),
            read_f32(&out, "recip", 16 * blocks),
        );
        let maxima = SoftmaxCols::maxima(blocks, rows, n);
        let max = run_on(&maxima, &x, &[], false).read("max", 32 * blocks);
        let shifted = SoftmaxCols::shifted(blocks, rows, n, scale, 1);
        let out = run_on(&shifted, &x, &[("maxes", max)], true);
        let name = shifted.symbol();
        assert_exps(&name, &shifted, &out.read_f16("out", x.len()), &e);
        for (j, (s, r)) in read_f32(&out, "sum", 16 * blocks)
            .iter()
            .zip(&recip)
            .enumerate()
        {
            assert_eq!((1.0 / s).to_bits(), r.to_bits(), "{name}: column {j}");
        }
    }
}

/// The keys cut over two tiles: each tile's `Maxima`, both rows as `maxes`, each
/// tile's `Shifted`; `e / (sum1 + sum2)` over both runs against the f64 softmax of
/// all the keys, within the bound of the single-tile test.
#[test]
fn two_tiles_combine_to_the_softmax() {
    for (seed, &(blocks, keys, n1, scale)) in [
        (1u32, 729u32, 365u32, 0.117_851_13f32),
        (2, 729, 400, 1.0),
        (3, 50, 20, 4.0),
        (1, 24, 12, 0.5),
    ]
    .iter()
    .enumerate()
    {
        let all = scores(2000 + seed as u64, blocks, keys, keys);
        let runs = [(0, n1), (n1, keys - n1)];
        // A tile's run of keys, padded to a multiple of 8 rows plus 8.
        let tiles: Vec<(SoftmaxCols, Vec<f16>)> = runs
            .iter()
            .map(|&(r0, n)| {
                let rows = n.next_multiple_of(8) + 8;
                let mut x = vec![f16::ZERO; (blocks * rows * 16) as usize];
                for b in 0..blocks as usize {
                    for r in 0..n as usize {
                        let from = (b * keys as usize + r0 as usize + r) * 16;
                        let to = (b * rows as usize + r) * 16;
                        x[to..to + 16].copy_from_slice(&all[from..from + 16]);
                    }
                }
                pad_with_garbage(&mut x, rows, n);
                (SoftmaxCols::maxima(blocks, rows, n), x)
            })
            .collect();
        let maxes: Vec<u8> = tiles
            .iter()
            .flat_map(|(k, x)| run_on(k, x, &[], false).read("max", 32 * blocks))
            .collect();
        let mut es = Vec::new();
        let mut total = vec![0f64; 16 * blocks as usize];
        for (t, (k, x)) in tiles.iter().enumerate() {
            let k = SoftmaxCols::shifted(k.blocks, k.rows, k.n, scale, 2);
            let out = run_on(&k, x, &[("maxes", maxes.clone())], t == 0);
            for (s, v) in total.iter_mut().zip(read_f32(&out, "sum", 16 * blocks)) {
                *s += f64::from(v);
            }
            es.push((k.rows, out.read_f16("out", x.len())));
        }
        for b in 0..blocks as usize {
            for c in 0..16 {
                let xs: Vec<f64> = (0..keys as usize)
                    .map(|r| all[(b * keys as usize + r) * 16 + c].to_f64())
                    .collect();
                let ps: Vec<f64> = runs
                    .iter()
                    .zip(&es)
                    .flat_map(|(&(_, n), (rows, e))| {
                        (0..n as usize).map(move |r| e[(b * *rows as usize + r) * 16 + c])
                    })
                    .map(|e| e.to_f64() / total[b * 16 + c])
                    .collect();
                let name = format!("{blocks} blocks, {keys} keys cut at {n1}: block {b} col {c}");
                assert_near_softmax(&name, &xs, &ps, scale);
            }
        }
    }
}

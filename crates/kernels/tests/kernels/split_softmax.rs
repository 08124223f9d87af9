//! The softmax cut over tiles: `row_max` and `exp_shift` per tile, `reduce_norm` to
//! combine, checked together against a softmax of the whole row in f64.

use half::f16;
use rand::Rng;
use tessera_kernels::{ColExpShift, ColMax, ExpShift, ReduceNorm, RowMax};

use crate::harness::{f16_bytes, layout, random_f16, rng, run};

/// Padding lanes of a partial last group: what the kernels must never use.
const NAN: u16 = 0x7e00;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())
}

/// `n` scores in `4 * ceil(n/4)` elements, NaN past `n`.
fn padded(x: &[f16]) -> Vec<f16> {
    let mut v = x.to_vec();
    v.resize(x.len().next_multiple_of(4), f16::from_bits(NAN));
    v
}

fn row_max(x: &[f16]) -> f32 {
    let k = RowMax::new(x.len() as u32);
    let out = run(&k, &layout(&k), &[("in", f16_bytes(&padded(x)))]);
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    f32_at(&out.read("out", 4), 0)
}

#[test]
fn row_max_is_exact_for_every_remainder() {
    let mut r = rng(900);
    for n in [1u32, 2, 3, 4, 5, 6, 7, 8, 9, 16, 31, 32, 33, 729] {
        let x = random_f16(&mut r, n as usize, 20.0);
        let want = x
            .iter()
            .map(|v| v.to_f32())
            .fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(row_max(&x), want, "n {n}");
        // The maximum in each lane position, first and last.
        for at in [0, n as usize - 1] {
            let mut y = x.clone();
            y[at] = f16::from_f32(1000.0);
            assert_eq!(row_max(&y), 1000.0, "n {n}, at {at}");
        }
    }
}

/// One row of `t` scores cut into runs of `per` over `g` tiles: each tile's maximum
/// and shifted exponentials on the simulator, then the combination of `e V` for a
/// `[t, d]` value matrix; against the f64 softmax of the whole row times V.
fn split_row(seed: u64, t: usize, per: usize, d: u32, scale: f32) {
    let mut r = rng(seed);
    let s = random_f16(&mut r, t, 8.0);
    let v: Vec<Vec<f32>> = (0..t)
        .map(|_| {
            (0..d)
                .map(|_| f16::from_f32(r.random_range(-1.0f32..1.0)).to_f32())
                .collect()
        })
        .collect();
    let runs: Vec<&[f16]> = s.chunks(per).collect();
    let g = runs.len() as u32;
    let maxes: Vec<f32> = runs.iter().map(|x| row_max(x)).collect();
    let ld = per.next_multiple_of(16) as u32;
    let mut partial = Vec::new();
    let mut sums = Vec::new();
    for (i, x) in runs.iter().enumerate() {
        let k = ExpShift::new(x.len() as u32, ld, g, scale);
        let out = run(
            &k,
            &layout(&k),
            &[
                ("in", f16_bytes(&padded(x))),
                ("maxes", f32_bytes(&maxes)),
                ("out", vec![0xff; 2 * ld as usize]),
            ],
        );
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let e = out.read_f16("out", ld as usize);
        for (j, z) in e.iter().enumerate().skip(x.len()) {
            assert_eq!(z.to_bits(), 0, "padding {j} of tile {i} is not +0");
        }
        sums.push(f32_at(&out.read("sum", 4), 0));
        // `e V` of the tile, as the AMP would give it (f32 sums rounded to f16).
        partial.extend((0..d as usize).map(|c| {
            let acc: f32 = e[..x.len()]
                .iter()
                .enumerate()
                .map(|(j, ej)| ej.to_f32() * v[i * per + j][c])
                .sum();
            f16::from_f32(acc)
        }));
    }
    let k = ReduceNorm::new(g, d);
    let out = run(
        &k,
        &layout(&k),
        &[("in", f16_bytes(&partial)), ("sums", f32_bytes(&sums))],
    );
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    let got = out.read_f16("out", d as usize);

    let m = s
        .iter()
        .map(|x| x.to_f64())
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s
        .iter()
        .map(|x| ((x.to_f64() - m) * f64::from(scale)).exp())
        .collect();
    let total: f64 = e.iter().sum();
    for c in 0..d as usize {
        let want: f64 = (0..t).map(|j| e[j] * f64::from(v[j][c])).sum::<f64>() / total;
        let err = (got[c].to_f64() - want).abs();
        assert!(
            err <= 4e-3 * want.abs().max(0.05),
            "seed {seed} column {c}: got {} want {want}",
            got[c]
        );
    }
}

#[test]
fn split_softmax_matches_the_whole_row() {
    // The pooling head's cuts (729 keys in runs of 32 and of 16), odd tile counts,
    // partial last groups of every size, one and two tiles.
    split_row(910, 729, 32, 80, 0.117_851_13);
    split_row(911, 729, 16, 80, 0.117_851_13);
    split_row(912, 45, 7, 16, 1.0);
    split_row(913, 10, 6, 32, 0.5);
    split_row(914, 33, 11, 8, 2.0);
    split_row(915, 19, 10, 8, 1.0);
    split_row(916, 64, 32, 16, 0.25);
}

/// The sums divide exactly: with every denominator 1 and k = 2, the output is the
/// f32 sum halved and rounded once.
#[test]
fn reduce_norm_divides_by_the_sum_of_the_sums() {
    for (seed, &(k, n)) in [(2u32, 8u32), (3, 100), (23, 80), (46, 84), (5, 4)]
        .iter()
        .enumerate()
    {
        let kern = ReduceNorm::new(k, n);
        let mut r = rng(920 + seed as u64);
        let x = random_f16(&mut r, (k * n) as usize, 4.0);
        let sums: Vec<f32> = (0..k).map(|_| r.random_range(0.5f32..2.0)).collect();
        let out = run(
            &kern,
            &layout(&kern),
            &[("in", f16_bytes(&x)), ("sums", f32_bytes(&sums))],
        );
        out.assert_ok();
        let got = out.read_f16("out", n as usize);
        // The kernel's order: pairs of denominators, the odd last, then the pair.
        let mut pair = [sums[0], sums[1]];
        let mut i = 2;
        while i + 1 < k as usize {
            pair[0] += sums[i];
            pair[1] += sums[i + 1];
            i += 2;
        }
        if i < k as usize {
            pair[0] += sums[i];
        }
        let rl = 1.0 / (pair[0] + pair[1]);
        for c in 0..n as usize {
            let acc: f32 = (0..k as usize)
                .map(|p| x[p * n as usize + c].to_f32())
                .sum();
            let want = f16::from_f32(acc * rl);
            let diff = (got[c].to_f32() - want.to_f32()).abs();
            // One f32 summation order against another: at most one f16 step apart.
            assert!(
                diff <= want.to_f32().abs() * 2f32.powi(-10) + 1e-6,
                "k {k} n {n} column {c}: got {} want {want}",
                got[c]
            );
        }
    }
}

/// A softmax down 16 columns whose `t` rows are cut into blocks of `per` rows over
/// `g` tiles: each tile's column maxima (`col_max`), then with every tile's maxima
/// its shifted exponentials and column sums (`col_exp_shift`); the exponentials
/// divided by the summed sums must match an f64 softmax of each whole column.
fn split_cols(seed: u64, t: usize, per: usize, scale: f32) {
    let mut r = rng(seed);
    let s = random_f16(&mut r, t * 16, 8.0);
    let blocks: Vec<&[f16]> = s.chunks(per * 16).collect();
    let g = blocks.len() as u32;
    let mut maxes = Vec::new();
    for (i, x) in blocks.iter().enumerate() {
        let n = (x.len() / 16) as u32;
        let k = ColMax::new(n);
        let out = run(&k, &layout(&k), &[("in", f16_bytes(x))]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read_f16("out", 16);
        for (c, m) in got.iter().enumerate() {
            let want = x
                .iter()
                .skip(c)
                .step_by(16)
                .map(|v| v.to_f32())
                .fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(m.to_f32(), want, "seed {seed} block {i} column {c}");
        }
        maxes.extend(got);
    }
    let rows = per.next_multiple_of(16) as u32;
    let mut e = Vec::new();
    let mut sums = [0f64; 16];
    for (i, x) in blocks.iter().enumerate() {
        let n = (x.len() / 16) as u32;
        let k = ColExpShift::new(n, rows, g, scale);
        let out = run(
            &k,
            &layout(&k),
            &[
                ("in", f16_bytes(x)),
                ("maxes", f16_bytes(&maxes)),
                ("out", vec![0xff; 32 * rows as usize]),
            ],
        );
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let got = out.read_f16("out", 16 * rows as usize);
        for (j, z) in got.iter().enumerate().skip(16 * n as usize) {
            assert_eq!(z.to_bits(), 0, "padding {j} of tile {i} is not +0");
        }
        e.extend_from_slice(&got[..16 * n as usize]);
        let sum = out.read("sum", 64);
        for (c, total) in sums.iter_mut().enumerate() {
            *total += f64::from(f32_at(&sum, c));
        }
    }
    for c in 0..16 {
        let col: Vec<f64> = s.iter().skip(c).step_by(16).map(|v| v.to_f64()).collect();
        let m = col.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let ex: Vec<f64> = col
            .iter()
            .map(|x| ((x - m) * f64::from(scale)).exp())
            .collect();
        let total: f64 = ex.iter().sum();
        assert!(
            (sums[c] - total).abs() <= 1e-5 * total,
            "seed {seed} column {c}: sum {} want {total}",
            sums[c]
        );
        for (j, want) in ex.iter().enumerate() {
            let got = e[j * 16 + c].to_f64();
            assert!(
                (got - want).abs() <= want * 2f64.powi(-10) + 1e-7,
                "seed {seed} row {j} column {c}: got {got} want {want}"
            );
        }
    }
}

#[test]
fn split_column_softmax_matches_whole_columns() {
    // The pooling head's cut (729 tokens in blocks of 16: the last has 9 rows), one
    // block, one row a block.
    split_cols(930, 729, 16, 1.0);
    split_cols(931, 16, 16, 0.5);
    split_cols(932, 5, 1, 2.0);
    split_cols(933, 40, 16, 0.125);
}

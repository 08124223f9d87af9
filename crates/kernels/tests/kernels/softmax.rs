use half::f16;
use rand::Rng;
use tessera_kernels::{Kernel, OperandAddrs, Softmax, Violation};
use tessera_sim::{FaultKind, Status};

use crate::harness::{Outcome, f16_bytes, layout, machine, rng, run};

/// Bit patterns the kernel must never read as scores: they fill the padding columns
/// of `in` (NaN, +inf, the largest f16, -inf) and the whole of `out` before the run.
const GARBAGE: [u16; 4] = [0x7e00, 0x7c00, 0x7bff, 0xfc00];

/// One f16 ulp at `p` (`p >= 0`), subnormals included.
fn ulp16(p: f64) -> f64 {
    if p < 2f64.powi(-14) {
        2f64.powi(-24)
    } else {
        2f64.powi(p.log2().floor() as i32 - 10)
    }
}

/// The error bound documented in docs/kernels.md, for a row of `n` scores:
/// the f16 rounding of `e` between the passes (relative, or absolute below the
/// normal range, where `1.04` covers the common factor `exp(r)`, `|r| <= 2^-25
/// |M scale|`), the final rounding to f16, and the f32 steps (arguments, `expf`,
/// the sum over `ceil(n/4)` terms per lane, the reciprocal and the product).
fn tolerance(p: f64, n: u32) -> f64 {
    let g = f64::from(n.div_ceil(4));
    2f64.powi(-11) * p
        + 1.04 * 2f64.powi(-25)
        + 0.5 * ulp16(p * (1.0 + 2f64.powi(-10)))
        + (g + 24.0) * 2f64.powi(-24) * p
}

/// softmax(x * scale) of one row in f64; `-inf` scores get probability 0.
fn reference(x: &[f16], scale: f32) -> Vec<f64> {
    let xs: Vec<f64> = x.iter().map(|v| v.to_f64()).collect();
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = xs
        .iter()
        .map(|v| ((v - max) * f64::from(scale)).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}

/// `rows` rows of `n` scores laid out with stride `ld`, padding filled with garbage.
fn padded(k: &Softmax, scores: &[f16]) -> Vec<f16> {
    let (n, ld) = (k.n as usize, k.ld as usize);
    let mut buf = Vec::with_capacity(k.rows as usize * ld);
    for (r, row) in scores.chunks(n).enumerate() {
        buf.extend_from_slice(row);
        buf.extend((n..ld).map(|c| f16::from_bits(GARBAGE[(r + c) % GARBAGE.len()])));
    }
    buf
}

fn garbage_out(k: &Softmax) -> Vec<u8> {
    let len = (k.rows * k.ld) as usize;
    f16_bytes(
        &(0..len)
            .map(|i| f16::from_bits(GARBAGE[i % GARBAGE.len()]))
            .collect::<Vec<_>>(),
    )
}

/// Runs `k` on `scores` (`rows * n`, densely packed) at `addrs`, checks every row
/// against the reference within the documented bound and the padding columns for
/// `+0`, and returns the worst error in f16 ulps of the exact probability.
fn check_at(k: &Softmax, scores: &[f16], addrs: &OperandAddrs, in_place: bool) -> f64 {
    let (n, ld) = (k.n as usize, k.ld as usize);
    assert_eq!(scores.len(), k.rows as usize * n);
    let input = f16_bytes(&padded(k, scores));
    let inputs = if in_place {
        vec![("in", input)]
    } else {
        vec![("in", input), ("out", garbage_out(k))]
    };
    let out = run(k, addrs, &inputs);
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    worst_error(k, scores, &out, n, ld)
}

fn worst_error(k: &Softmax, scores: &[f16], out: &Outcome, n: usize, ld: usize) -> f64 {
    let got = out.read_f16("out", k.rows as usize * ld);
    let mut worst = 0.0f64;
    for (r, row) in scores.chunks(n).enumerate() {
        let want = reference(row, k.scale);
        let g = &got[r * ld..(r + 1) * ld];
        for (c, (&p, &w)) in g.iter().zip(&want).enumerate() {
            let err = (p.to_f64() - w).abs();
            assert!(
                err <= tolerance(w, k.n),
                "{}: row {r} column {c}: got {p} want {w} (error {err:e}, tolerance {:e})",
                k.symbol(),
                tolerance(w, k.n)
            );
            worst = worst.max(err / ulp16(w));
        }
        for (c, p) in g.iter().enumerate().skip(n) {
            assert_eq!(p.to_bits(), 0, "{}: row {r} padding column {c}", k.symbol());
        }
    }
    worst
}

fn check(k: &Softmax, scores: &[f16]) -> f64 {
    check_at(k, scores, &layout(k), false)
}

/// Uniform scores in `[-spread, spread]` around `offset`.
fn scores(seed: u64, len: usize, spread: f32, offset: f32) -> Vec<f16> {
    let mut r = rng(seed);
    (0..len)
        .map(|_| f16::from_f32(offset + r.random_range(-1.0f32..1.0) * spread))
        .collect()
}

#[test]
fn softmax_matches_reference() {
    // (rows, n, ld, scale, spread of the scaled scores)
    let cases: [(u32, u32, u32, f32, f32); 12] = [
        (1, 1, 4, 1.0, 4.0),
        (2, 2, 8, 0.5, 8.0),
        (5, 3, 4, 1.0, 6.0),
        (6, 4, 4, 0.25, 10.0),
        (7, 5, 8, 1.0, 3.0),
        (13, 8, 16, 0.125, 12.0),
        (3, 13, 16, 2.0, 20.0),
        (11, 17, 20, 1.0, 16.0),
        (12, 196, 196, 0.125, 8.0),
        (7, 196, 208, 0.125, 30.0),
        (7, 729, 736, 0.117_851_13, 12.0),
        (19, 729, 732, 0.117_851_13, 40.0),
    ];
    for (seed, &(rows, n, ld, scale, spread)) in cases.iter().enumerate() {
        let k = Softmax::with_ld(rows, n, ld, scale);
        let x = scores(700 + seed as u64, (rows * n) as usize, spread / scale, 0.0);
        let worst = check(&k, &x);
        println!("{:28} worst error {worst:.3} ulp", k.symbol());
    }
}

/// Each row's `1/sum` as the kernel wrote it.
fn read_recip(out: &Outcome, rows: u32) -> Vec<f32> {
    out.read("recip", rows * 4)
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// `e · 1/sum` of every row (`e` row-major, `ld` apart) against the f64 softmax
/// within the documented bound, `e` at most 1 (up to the common factor), padding
/// columns `+0`.
fn check_exponentials(k: &Softmax, scores: &[f16], e: &[f16], recip: &[f32]) {
    let (n, ld) = (k.n as usize, k.ld as usize);
    for (r, row) in scores.chunks(n).enumerate() {
        let want = reference(row, k.scale);
        let g = &e[r * ld..(r + 1) * ld];
        for (c, (&ev, &w)) in g.iter().zip(&want).enumerate() {
            let p = ev.to_f64() * f64::from(recip[r]);
            assert!(
                (p - w).abs() <= tolerance(w, k.n),
                "{}: row {r} column {c}: e {ev} x 1/sum {} = {p}, want {w}",
                k.symbol(),
                recip[r]
            );
            assert!(ev.to_f64() <= 1.04, "{}: e above 1", k.symbol());
        }
        for (c, v) in g.iter().enumerate().skip(n) {
            assert_eq!(v.to_bits(), 0, "{}: row {r} padding column {c}", k.symbol());
        }
    }
}

/// Runs the row-major `recip` softmax on `scores`: its exponentials and `1/sum`s.
fn run_recip(k: &Softmax, scores: &[f16]) -> (Vec<f16>, Vec<f32>) {
    let inputs = vec![
        ("in", f16_bytes(&padded(k, scores))),
        ("out", garbage_out(k)),
    ];
    let out = run(k, &layout(k), &inputs);
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    let e = out.read_f16("out", (k.rows * k.ld) as usize);
    (e, read_recip(&out, k.rows))
}

/// With `recip`, `out` holds the exponentials and `recip` each row's `1/sum`: their
/// product is the softmax within the same bound (less the final rounding, which the
/// caller's scaling does), and the padding columns are `+0`.
#[test]
fn recip_leaves_the_normalisation_to_the_caller() {
    let cases: [(u32, u32, u32, f32, f32); 7] = [
        (1, 1, 4, 1.0, 4.0),
        (5, 3, 4, 1.0, 6.0),
        (7, 5, 8, 1.0, 3.0),
        (3, 13, 16, 2.0, 20.0),
        (12, 196, 196, 0.125, 8.0),
        (16, 729, 736, 0.117_851_13, 12.0),
        (32, 729, 736, 0.117_851_13, 40.0),
    ];
    for (seed, &(rows, n, ld, scale, spread)) in cases.iter().enumerate() {
        let k = Softmax::with_ld(rows, n, ld, scale).with_recip();
        let x = scores(1300 + seed as u64, (rows * n) as usize, spread / scale, 1.0);
        let (e, recip) = run_recip(&k, &x);
        check_exponentials(&k, &x, &e, &recip);
    }
}

/// Row-major `[rows][ld]` to the AMP's block layout `[ld/16][rows][16]`.
fn to_blocks<T: Copy>(v: &[T], rows: usize, ld: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for b in 0..ld / 16 {
        for r in 0..rows {
            out.extend_from_slice(&v[r * ld + 16 * b..r * ld + 16 * b + 16]);
        }
    }
    out
}

/// The AMP's block layout `[ld/16][rows][16]` back to row-major `[rows][ld]`.
fn from_blocks<T: Copy>(v: &[T], rows: usize, ld: usize) -> Vec<T> {
    let mut out = Vec::with_capacity(v.len());
    for r in 0..rows {
        for b in 0..ld / 16 {
            let at = (b * rows + r) * 16;
            out.extend_from_slice(&v[at..at + 16]);
        }
    }
    out
}

/// Blocked: scores in block layout in, exponentials in block layout out (in place
/// or not), the same bits as the row-major `recip` softmax on the same scores (same
/// arithmetic in the same order), and so the same checks: `e · recip` within the
/// bound, padding columns `+0`.
#[test]
fn blocked_reads_and_writes_the_amp_layout() {
    let cases: [(u32, u32, u32, f32, f32, bool); 9] = [
        (1, 1, 16, 1.0, 4.0, false),
        (5, 3, 16, 1.0, 6.0, false),
        (7, 13, 16, 2.0, 20.0, true),
        (6, 20, 32, 1.0, 3.0, false),
        (12, 196, 208, 0.125, 8.0, false),
        (16, 729, 736, 0.117_851_13, 12.0, true),
        (32, 729, 736, 0.117_851_13, 40.0, false),
        (3, 64, 64, 0.5, 10.0, false),
        (31, 17, 32, 1.0, 5.0, true),
    ];
    for (seed, &(rows, n, ld, scale, spread, in_place)) in cases.iter().enumerate() {
        let k = Softmax::with_ld(rows, n, ld, scale).with_blocked();
        let x = scores(
            1500 + seed as u64,
            (rows * n) as usize,
            spread / scale,
            -2.0,
        );
        let (r, ld) = (rows as usize, ld as usize);
        let mut addrs = layout(&k);
        let input = f16_bytes(&to_blocks(&padded(&k, &x), r, ld));
        let inputs = if in_place {
            addrs.insert("out", addrs.get("in").unwrap());
            vec![("in", input)]
        } else {
            vec![("in", input), ("out", garbage_out(&k))]
        };
        let out = run(&k, &addrs, &inputs);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let e = from_blocks(&out.read_f16("out", r * ld), r, ld);
        let recip = read_recip(&out, rows);
        check_exponentials(&k, &x, &e, &recip);
        let (e_rm, recip_rm) = run_recip(
            &Softmax::with_ld(rows, n, ld as u32, scale).with_recip(),
            &x,
        );
        let bits = |v: &[f16]| v.iter().map(|h| h.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&e),
            bits(&e_rm),
            "{}: e differs from row-major",
            k.symbol()
        );
        assert_eq!(
            recip,
            recip_rm,
            "{}: 1/sum differs from row-major",
            k.symbol()
        );
    }
}

/// Many rows at SigLIP So400m's shape: the measured worst error quoted in
/// docs/kernels.md, against the bound's ~1.5 ulp.
#[test]
fn softmax_error_over_many_rows() {
    let mut worst = 0.0f64;
    for (seed, spread) in [(0u64, 4.0f32), (1, 12.0), (2, 40.0)] {
        let k = Softmax::with_ld(60, 729, 736, 0.117_851_13);
        let x = scores(800 + seed, 60 * 729, spread / k.scale, 3.0);
        worst = worst.max(check(&k, &x));
    }
    println!("softmax, 180 rows of 729: worst error {worst:.3} ulp");
    assert!(worst < 1.5);
}

#[test]
fn equal_scores_give_uniform_rows() {
    for (n, ld) in [(1, 4), (3, 4), (4, 8), (7, 8), (100, 100), (729, 732)] {
        let values = [0.0f32, 1.0, -3.5, 1000.0, -65504.0, 65504.0];
        let k = Softmax::with_ld(values.len() as u32, n, ld, 1.0);
        let x: Vec<f16> = values
            .iter()
            .flat_map(|&v| std::iter::repeat_n(f16::from_f32(v), n as usize))
            .collect();
        check(&k, &x);
    }
}

/// Scores near the ends of the f16 range: the subtraction of the maximum keeps
/// every exponential at most 1 (up to the common factor), so nothing overflows.
#[test]
fn extreme_scores_do_not_overflow() {
    let rows: [&[f32]; 6] = [
        &[65504.0, 65472.0, -65504.0, 60000.0, 65504.0, 0.0, 1.0],
        &[
            -65504.0, -65472.0, -65504.0, -65440.0, -65504.0, -65500.0, -65504.0,
        ],
        &[
            65504.0, -65504.0, -65504.0, -65504.0, -65504.0, -65504.0, -65504.0,
        ],
        &[0.0, 0.0, 30.0, 0.0, 0.0, 0.0, 0.0],
        &[1e-7, -1e-7, 6e-8, 0.0, -0.0, 1e-5, -1e-5],
        &[100.0, 99.0, 98.0, 97.0, 96.0, 95.0, 94.0],
    ];
    for scale in [1.0f32, 16.0, 1.0 / 64.0] {
        let k = Softmax::new(rows.len() as u32, 7, scale);
        let x: Vec<f16> = rows
            .iter()
            .flat_map(|r| r.iter().map(|&v| f16::from_f32(v)))
            .collect();
        check(&k, &x);
    }
}

/// `-inf` scores (a masked attention entry) get probability 0, as long as the row
/// has a finite score.
#[test]
fn minus_infinity_scores_get_zero() {
    let ninf = f16::NEG_INFINITY;
    let k = Softmax::new(4, 9, 0.5);
    let mut x = scores(900, 36, 6.0, 0.0);
    x[0] = ninf;
    x[8] = ninf;
    for v in &mut x[9..17] {
        *v = ninf; // only the last score of row 1 is finite
    }
    x[27] = ninf;
    check(&k, &x);
}

/// Fewer rows than workers: idle workers exit at once.
#[test]
fn fewer_rows_than_workers() {
    for (rows, n) in [(1, 729), (2, 5), (5, 1), (3, 4)] {
        let k = Softmax::new(rows, n, 0.125);
        let x = scores(1000 + u64::from(rows), (rows * n) as usize, 40.0, 0.0);
        check(&k, &x);
    }
}

/// `out` may be `in`: each group is stored after it has been read.
#[test]
fn in_place() {
    for (rows, n, ld) in [(7, 729, 736), (4, 6, 8), (9, 1, 12), (6, 16, 16)] {
        let k = Softmax::with_ld(rows, n, ld, 0.25);
        let mut addrs = layout(&k);
        addrs.insert("out", addrs.get("in").unwrap());
        let x = scores(1100 + u64::from(n), (rows * n) as usize, 24.0, 0.0);
        check_at(&k, &x, &addrs, true);
    }
}

/// The contract declares no over-read tail: with an operand ending exactly at the
/// end of SRAM, any access past it would be "outside SRAM". (Initial contents cannot
/// reach past the loader limit, so the scores there are the zeroed memory: uniform
/// rows.)
#[test]
fn operands_at_the_end_of_memory() {
    let m = machine();
    let end = m.regions.iter().map(|r| r.end).max().unwrap();
    for (rows, n, ld) in [(7, 729, 732), (5, 3, 4), (13, 6, 16)] {
        let k = Softmax::with_ld(rows, n, ld, 1.0);
        let bytes = k.contract().operand("in").unwrap().bytes;
        for (last, other) in [("in", "out"), ("out", "in")] {
            let addrs = OperandAddrs::new()
                .with(last, end - bytes)
                .with(other, end - 2 * bytes)
                .with("state", crate::harness::STATE_ADDR);
            assert!(k.contract().check(&m, &addrs).is_empty());
            let out = run(&k, &addrs, &[]);
            out.assert_ok();
            let zeros = vec![f16::ZERO; (rows * n) as usize];
            worst_error(&k, &zeros, &out, n as usize, ld as usize);
        }
    }
}

/// The declared 8-byte alignment is what the code needs: the contract check rejects
/// `in` at 4 mod 8, and the simulator faults at the first 64-bit load from it.
#[test]
fn misaligned_input_is_rejected_and_faults() {
    let k = Softmax::new(6, 8, 1.0);
    let mut addrs = layout(&k);
    let at = addrs.get("in").unwrap() + 4;
    addrs.insert("in", at);
    let v = k.contract().check(&machine(), &addrs);
    assert!(
        v.iter()
            .any(|v| matches!(v, Violation::Misaligned { name, .. } if name == "in")),
        "{v:?}"
    );
    let out = run(&k, &addrs, &[]);
    assert_eq!(out.report.status, Status::Fault);
    assert_eq!(out.report.faults.len(), 6, "every worker has a row");
    for f in &out.report.faults {
        assert_eq!(f.kind, FaultKind::InvalidMemoryAddress, "{f:?}");
    }
}

#[test]
fn contract_is_exact() {
    let k = Softmax::with_ld(7, 729, 736, 0.125);
    let c = k.contract();
    let m = machine();
    for name in ["in", "out"] {
        let op = c.operand(name).unwrap();
        assert_eq!((op.bytes, op.align, op.tail_bytes), (2 * 7 * 736, 8, 0));
        assert!(op.separate_from.is_empty());
    }
    assert_eq!(c.operand("state").unwrap().bytes, 192);
    assert!(c.check(&m, &layout(&k)).is_empty());
}

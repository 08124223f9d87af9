//! `recip_sum` on the simulator against `1 / (a + b)` in f32, bit for bit: the sum
//! rounded once, then `f32recip` (the simulator's `1.0 / x`, rounded once).

use rand::Rng;
use tessera_kernels::{Kernel, RecipSum};

use crate::harness::{layout, rng, run};

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn model(a: f32, b: f32) -> f32 {
    1.0 / (a + b)
}

/// Softmax denominators (positive, from about 1 to a few hundred), with extremes
/// planted: sums that overflow to infinity (reciprocal +0), cancel to +0
/// (reciprocal +inf), sit near the smallest normal (reciprocal near the largest
/// finite), are subnormal (reciprocal overflows), and negative values.
fn operands(seed: u64, n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut r = rng(seed);
    let mut a: Vec<f32> = (0..n).map(|_| r.random_range(0.5f32..400.0)).collect();
    let mut b: Vec<f32> = (0..n).map(|_| r.random_range(0.5f32..400.0)).collect();
    let extremes = [
        (3.0e38, 3.0e38),
        (1.0e30, 7.5e29),
        (5.0, -5.0),
        (1.2e-38, 3.0e-39),
        (1.0e-44, 2.0e-45),
        (-3.25, 1.0),
        (1.0e-20, 0.0),
        (f32::MIN_POSITIVE, 0.0),
    ];
    for (k, &(x, y)) in extremes.iter().enumerate() {
        // Spread over the run so that every worker and the tail see some.
        let i = (k * 7 + 3) % n;
        a[i] = x;
        b[i] = y;
    }
    (a, b)
}

fn check(n: u32, seed: u64) {
    let k = RecipSum::new(n);
    let (a, b) = operands(seed, n as usize);
    let len = 4 * n;
    let addrs = layout(&k);
    // `out` starts as NaN: every element must be written.
    let out = run(
        &k,
        &addrs,
        &[
            ("a", f32_bytes(&a)),
            ("b", f32_bytes(&b)),
            ("out", vec![0xff; len as usize]),
        ],
    );
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    let got = bytes_f32(&out.read("out", len));
    for i in 0..n as usize {
        let want = model(a[i], b[i]);
        assert_eq!(
            got[i].to_bits(),
            want.to_bits(),
            "{}: element {i}: 1/({:e} + {:e}) got {:e} want {want:e}",
            k.symbol(),
            a[i],
            b[i],
            got[i]
        );
    }
    // Nothing past `out`, and the inputs as they were.
    assert_eq!(out.read("out", len + 16)[len as usize..], [0; 16]);
    assert_eq!(bytes_f32(&out.read("a", len)), a);
    assert_eq!(bytes_f32(&out.read("b", len)), b);
}

#[test]
fn recip_sum_matches_the_f32_model() {
    // The attention's sizes, idle workers (n < 12), odd tails with and without
    // pairs on the tail worker, a long run.
    for (seed, n) in [16u32, 64, 80, 96, 48, 1, 2, 3, 7, 11, 12, 13, 97, 1000]
        .into_iter()
        .enumerate()
    {
        check(n, 1500 + seed as u64);
    }
}

#[test]
fn the_extremes_give_what_ieee_says() {
    assert_eq!(model(3.0e38, 3.0e38), 0.0);
    assert_eq!(model(5.0, -5.0), f32::INFINITY);
    assert_eq!(model(1.0e-44, 2.0e-45), f32::INFINITY);
    assert!(model(1.2e-38, 3.0e-39).is_finite());
}

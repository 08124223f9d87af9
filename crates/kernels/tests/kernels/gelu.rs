use half::f16;
use tessera_kernels::Gelu;

use crate::harness::{assert_close, f16_bytes, layout, random_f16, rng, run};

fn gelu(x: f64) -> f64 {
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

#[test]
fn gelu_matches_reference() {
    for (seed, &n) in [4u32, 24, 100, 1000, 4304].iter().enumerate() {
        let k = Gelu::new(n);
        let mut x = random_f16(&mut rng(300 + seed as u64), n as usize, 6.0);
        // Extremes: `x^2` overflowing f16 (|x| >= 256), `tanh` saturating, zeros, a
        // value in the cancellation region (`1 + tanh u` small), a tiny value.
        for (i, v) in [-65504.0f32, 65504.0, -20.0, 20.0, 0.0, -0.0, -3.5, 1e-4]
            .iter()
            .enumerate()
        {
            if i < x.len() {
                x[i] = f16::from_f32(*v);
            }
        }
        let out = run(&k, &layout(&k), &[("in", f16_bytes(&x))]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let want: Vec<f64> = x.iter().map(|v| gelu(v.to_f64())).collect();
        let got = out.read_f16("out", n as usize);
        // One f16 ulp of the result, plus the rounding of the f16 `u` and tanh
        // carried by `x/2`: for negative x, `1 + tanh u` is small and that error is
        // absolute, not relative to y (at most about |x| 2^-12 over every f16 input;
        // the bound leaves a factor of 2).
        assert_close(&format!("gelu n={n}"), &got, &want, |i| {
            want[i].abs() * 2f64.powi(-10) + x[i].to_f64().abs() * 2f64.powi(-11) + 1e-6
        });
    }
}

/// From half inputs (`h = x / 2`, the factor folded into the producer's weights)
/// the same `gelu(x)`: bit for bit what the plain kernel gives from `x`, for group
/// counts of either parity a worker (the leftover group after the pairs).
#[test]
fn gelu_of_half_inputs_is_the_same_bits() {
    for (seed, &n) in [4u32, 24, 48, 100, 1000, 4304].iter().enumerate() {
        let mut x = random_f16(&mut rng(900 + seed as u64), n as usize, 6.0);
        for (i, v) in [-65504.0f32, 65504.0, -20.0, 20.0, 0.0, -0.0, -3.5, 300.0]
            .iter()
            .enumerate()
        {
            if i < x.len() {
                x[i] = f16::from_f32(*v);
            }
        }
        // Normal halves only: a subnormal half would lose a bit.
        for v in x.iter_mut() {
            if v.to_f32() != 0.0 && v.to_f32().abs() < 2.0 * f16::MIN_POSITIVE.to_f32() {
                *v = f16::from_f32(0.25);
            }
        }
        let h: Vec<f16> = x.iter().map(|v| f16::from_f32(v.to_f32() / 2.0)).collect();
        let plain = Gelu::new(n);
        let want = run(&plain, &layout(&plain), &[("in", f16_bytes(&x))]);
        want.assert_ok();
        let k = Gelu::new(n).with_half_input();
        let got = run(&k, &layout(&k), &[("in", f16_bytes(&h))]);
        got.assert_ok();
        assert!(got.violations.is_empty(), "{:?}", got.violations);
        let (w, g) = (
            want.read_f16("out", n as usize),
            got.read_f16("out", n as usize),
        );
        for i in 0..n as usize {
            assert_eq!(
                w[i].to_bits(),
                g[i].to_bits(),
                "n={n} x={} h={}",
                x[i],
                h[i]
            );
        }
    }
}

/// The error bound of `gelu_matches_reference` over every finite f16 input, so that
/// the bound documented in docs/kernels.md is a measured fact, not a sample.
#[test]
fn gelu_error_bound_holds_for_every_finite_f16() {
    let x: Vec<f16> = (0..=u16::MAX)
        .map(f16::from_bits)
        .filter(|v| v.is_finite())
        .collect();
    let n = x.len() as u32;
    let k = Gelu::new(n);
    let out = run(&k, &layout(&k), &[("in", f16_bytes(&x))]);
    out.assert_ok();
    let got = out.read_f16("out", n as usize);
    let want: Vec<f64> = x.iter().map(|v| gelu(v.to_f64())).collect();
    let tol =
        |i: usize| want[i].abs() * 2f64.powi(-10) + x[i].to_f64().abs() * 2f64.powi(-11) + 1e-6;
    let worst = (0..x.len())
        .map(|i| (got[i].to_f64() - want[i]).abs() / tol(i))
        .fold(0.0f64, f64::max);
    println!("gelu over {n} f16 inputs: worst error {worst:.2} of the tolerance");
    assert_close("gelu, every finite f16", &got, &want, tol);
}

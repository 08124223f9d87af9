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
        // Extremes: the clamp (large negative), exp underflow (large positive), zero.
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
        assert_close(&format!("gelu n={n}"), &got, &want, |i| {
            want[i].abs() * 2f64.powi(-10) + 1e-6
        });
    }
}

use half::f16;
use tessera_kernels::{Add, AddBias, Kernel, ReduceAdd};

use crate::harness::{R1, f16_bytes, layout, random_f16, rng, run};

fn add_f16(a: f16, b: f16) -> f16 {
    f16::from_f32(a.to_f32() + b.to_f32())
}

/// Both forms: the general one and `apart` (one issue a group), the latter with
/// workers of no, one, two and many groups (n = 4: five idle workers; 28: one
/// group each but the first; 3456: the attention merge's).
#[test]
fn add_matches_reference() {
    let cases = [4u32, 28, 48, 100, 1152]
        .into_iter()
        .map(Add::new)
        .chain([4u32, 28, 48, 100, 1152, 3456].into_iter().map(Add::apart));
    for (seed, k) in cases.enumerate() {
        let n = k.n;
        let mut r = rng(400 + seed as u64);
        let a = random_f16(&mut r, n as usize, 100.0);
        let b = random_f16(&mut r, n as usize, 1.0);
        let out = run(
            &k,
            &layout(&k),
            &[("a", f16_bytes(&a)), ("b", f16_bytes(&b))],
        );
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let want: Vec<f16> = a.iter().zip(&b).map(|(x, y)| add_f16(*x, *y)).collect();
        assert_eq!(out.read_f16("out", n as usize), want, "{}", k.symbol());
    }
}

/// `out` may be the very buffer `a` is read from.
#[test]
fn add_in_place() {
    let n = 260;
    let k = Add::new(n);
    let mut r = rng(450);
    let a = random_f16(&mut r, n as usize, 10.0);
    let b = random_f16(&mut r, n as usize, 10.0);
    let mut addrs = layout(&k);
    addrs.insert("out", R1);
    addrs.insert("a", R1);
    let out = run(&k, &addrs, &[("a", f16_bytes(&a)), ("b", f16_bytes(&b))]);
    out.assert_ok();
    let want: Vec<f16> = a.iter().zip(&b).map(|(x, y)| add_f16(*x, *y)).collect();
    assert_eq!(out.read_f16("out", n as usize), want);
}

#[test]
fn add_bias_matches_reference() {
    // Narrow rows (at most 16 columns) keep the bias in registers and split the
    // rows over the workers: among them a linear's block (140 x 16) and fewer
    // rows than workers.
    for (seed, &(rows, n)) in [
        (1u32, 8u32),
        (3, 20),
        (7, 1152),
        (2, 4),
        (140, 16),
        (13, 16),
        (3, 16),
        (7, 12),
        (25, 8),
        (1, 16),
    ]
    .iter()
    .enumerate()
    {
        let k = AddBias::new(rows, n);
        let mut r = rng(500 + seed as u64);
        let a = random_f16(&mut r, (rows * n) as usize, 8.0);
        let bias = random_f16(&mut r, n as usize, 8.0);
        let out = run(
            &k,
            &layout(&k),
            &[("a", f16_bytes(&a)), ("bias", f16_bytes(&bias))],
        );
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let want: Vec<f16> = a
            .iter()
            .enumerate()
            .map(|(i, x)| add_f16(*x, bias[i % n as usize]))
            .collect();
        assert_eq!(out.read_f16("out", want.len()), want, "{}", k.symbol());
    }
}

/// With addends, `b` and then `c` go into the same f32 sum after the partials: one
/// rounding, bit-exact against that order, on the wide (n % 8 == 0) and narrow paths
/// and with the last worker's trailing group of 4; the wide shapes are unrolled and
/// software-pipelined, among them the So400m layer's (8 x 3888, 9 x 2592), and those
/// whose partials lie past one base register's immediates (18 x 2448, batch 4's
/// `fc2`; 24 x 1600) take the later ones from a second base.
#[test]
fn reduce_add_with_addends_matches_reference() {
    for (seed, &(kk, n)) in [
        (2u32, 4u32),
        (3, 28),
        (6, 5184),
        (9, 100),
        (17, 1680),
        (8, 12),
        (8, 3888),
        (9, 2592),
        (18, 2448),
        (24, 1600),
    ]
    .iter()
    .enumerate()
    {
        for two in [false, true] {
            let k = if two {
                ReduceAdd::new(kk, n).with_addends()
            } else {
                ReduceAdd::new(kk, n).with_addend()
            };
            let mut r = rng(650 + seed as u64);
            let x = random_f16(&mut r, (kk * n) as usize, 30.0);
            let b = random_f16(&mut r, n as usize, 4.0);
            let c = random_f16(&mut r, n as usize, 60.0);
            let mut inputs = vec![("in", f16_bytes(&x)), ("b", f16_bytes(&b))];
            if two {
                inputs.push(("c", f16_bytes(&c)));
            }
            let out = run(&k, &layout(&k), &inputs);
            out.assert_ok();
            assert!(out.violations.is_empty(), "{:?}", out.violations);
            let n = n as usize;
            let want: Vec<f16> = (0..n)
                .map(|j| {
                    let s = (0..kk as usize).fold(0f32, |s, i| s + x[i * n + j].to_f32());
                    let s = s + b[j].to_f32();
                    f16::from_f32(if two { s + c[j].to_f32() } else { s })
                })
                .collect();
            assert_eq!(out.read_f16("out", n), want, "{}", k.symbol());
        }
    }
}

#[test]
fn reduce_add_matches_reference() {
    for (seed, &(kk, n)) in [
        (2u32, 4u32),
        (3, 28),
        (5, 1152),
        (8, 100),
        (17, 12),
        (20, 2400),
    ]
    .iter()
    .enumerate()
    {
        let k = ReduceAdd::new(kk, n);
        let mut r = rng(600 + seed as u64);
        let x = random_f16(&mut r, (kk * n) as usize, 30.0);
        let out = run(&k, &layout(&k), &[("in", f16_bytes(&x))]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let n = n as usize;
        // f32 accumulation in partial order, one rounding to f16 at the end: the
        // same bits as summing with f16v2tof32 and f32v2add.
        let want: Vec<f16> = (0..n)
            .map(|c| f16::from_f32((0..kk as usize).fold(0f32, |s, i| s + x[i * n + c].to_f32())))
            .collect();
        assert_eq!(out.read_f16("out", n), want, "{}", k.symbol());
    }
}

use half::f16;
use tessera_kernels::{AmpMatmul, Kernel, OperandAddrs, Violation, pack_chunk_major, pack_weights};
use tessera_sim::{FaultKind, Status};

use crate::harness::{
    Outcome, R1, STATE_ADDR, assert_close, f16_bytes, layout, random_f16, rng, run,
};

struct Case {
    x: Vec<f16>,
    w: Vec<f16>,
}

fn case(k: &AmpMatmul, seed: u64) -> Case {
    let mut r = rng(seed);
    let kdim = (k.kc * 16) as usize;
    Case {
        x: random_f16(&mut r, k.rows as usize * kdim, 1.0),
        w: random_f16(&mut r, kdim * (k.nb * 16) as usize, 0.5),
    }
}

fn inputs(k: &AmpMatmul, c: &Case) -> Vec<(&'static str, Vec<u8>)> {
    let a = if k.a_row_major {
        c.x.clone()
    } else {
        pack_chunk_major(k.rows as usize, k.kc as usize, &c.x)
    };
    vec![
        ("a", f16_bytes(&a)),
        (
            "w",
            f16_bytes(&pack_weights(k.kc as usize, k.nb as usize, &c.w)),
        ),
    ]
}

/// Compares `[nb][rows][16]` output with an f64 product. Partials are rounded to f16
/// after every chunk, so the tolerance grows with the chunk count.
fn check(k: &AmpMatmul, c: &Case, out: &Outcome) {
    let (rows, kdim, n) = (k.rows as usize, (k.kc * 16) as usize, (k.nb * 16) as usize);
    let got = out.read_f16("out", rows * n);
    let mut want = vec![0.0; rows * n];
    let mut mag = vec![0.0; rows * n];
    for r in 0..rows {
        for col in 0..n {
            let (mut s, mut m) = (0.0f64, 0.0f64);
            for kk in 0..kdim {
                let p = c.x[r * kdim + kk].to_f64() * c.w[kk * n + col].to_f64();
                s += p;
                m += p.abs();
            }
            let at = (col / 16) * rows * 16 + r * 16 + col % 16;
            want[at] = s;
            mag[at] = m.max(s.abs());
        }
    }
    let steps = f64::from(k.kc + 1);
    assert_close(&format!("{k:?}"), &got, &want, |i| {
        steps * mag[i] * 2f64.powi(-11) + 1e-6
    });
}

/// The product as docs/isa.md's AMP computes it, bit for bit: per 16-wide chunk
/// of K, each output starts from the f16 partial sum of the chunks before (zero
/// for the first), adds the chunk's 16 products in f32 in order of k, and is
/// rounded to f16 for the next chunk. An oracle independent of the kernel's
/// streams: a partial fed to the wrong row, or added after the products, differs.
fn engine_order(k: &AmpMatmul, c: &Case) -> Vec<f16> {
    let (rows, kdim, n) = (k.rows as usize, (k.kc * 16) as usize, (k.nb * 16) as usize);
    let mut out = vec![f16::ZERO; rows * n];
    for r in 0..rows {
        for col in 0..n {
            let mut partial = f16::ZERO;
            for chunk in 0..k.kc as usize {
                let mut acc = partial.to_f32();
                for kk in chunk * 16..chunk * 16 + 16 {
                    acc += c.x[r * kdim + kk].to_f32() * c.w[kk * n + col].to_f32();
                }
                partial = f16::from_f32(acc);
            }
            out[(col / 16) * rows * 16 + r * 16 + col % 16] = partial;
        }
    }
    out
}

#[test]
fn matmul_matches_reference() {
    let shapes = [
        (1, 1, 1),
        (2, 1, 1),
        (7, 1, 1),
        (12, 1, 2),
        (13, 2, 1),
        (17, 3, 2),
        (31, 4, 3),
        (6, 5, 1),
        (100, 2, 2),
        (5, 16, 1),
        (24, 3, 3),
        (36, 4, 2),
        (13, 4, 3),
        (12, 1, 3),
        (8, 3, 2),
        (804, 1, 1),
    ];
    for (seed, &(rows, kc, nb)) in shapes.iter().enumerate() {
        let plain = AmpMatmul::new(rows, kc, nb);
        let c = case(&plain, seed as u64 + 10);
        // The same product reading A row-major: the same bits, since only the
        // addresses of the loads differ.
        let mut first = None;
        for k in [plain.clone(), plain.clone().row_major()] {
            let out = run(&k, &layout(&k), &inputs(&k, &c));
            out.assert_ok();
            assert!(out.violations.is_empty(), "{:?}", out.violations);
            check(&k, &c, &out);
            let got = out.read_f16("out", (rows * nb * 16) as usize);
            assert_eq!(got, engine_order(&k, &c), "{k:?}: not the engine's bits");
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(f, &got, "{k:?}: row-major A changed the result"),
            }
        }
    }
}

/// Rows redirected to `own` (a reduction's own piece, whole workers' rows) come
/// out there, block by block at `own`'s stride, with the same bits the plain
/// product writes to `out`; the other rows land in `out` as before; a biased
/// product's too (inner group 0 of a linear reduced in pieces). Splits whose
/// rows are not whole workers' are refused.
#[test]
fn own_rows_go_to_their_own_operand() {
    for ((rows, kc, nb, first, own_rows, rm), biased) in [
        (36, 3, 2, 12, 12, false),
        (24, 1, 3, 0, 8, false),
        (48, 4, 2, 16, 24, true),
    ]
    .into_iter()
    .flat_map(|shape| [(shape, false), (shape, true)])
    {
        let mut plain = AmpMatmul::new(rows, kc, nb);
        if rm {
            plain = plain.row_major();
        }
        let c = case(&plain, u64::from(rows + kc));
        let mut ins = inputs(&plain, &c);
        if biased {
            plain = plain.with_bias().expect("an even split");
            ins.push((
                "bias",
                f16_bytes(&random_f16(
                    &mut rng(u64::from(nb)),
                    (nb * 16) as usize,
                    1.0,
                )),
            ));
        }
        let stride = own_rows * 32 + 64;
        let k = plain
            .with_own_rows(first, own_rows, stride)
            .expect("whole workers");
        let want = run(&plain, &layout(&plain), &ins);
        want.assert_ok();
        let got = run(&k, &layout(&k), &ins);
        got.assert_ok();
        assert!(got.violations.is_empty(), "{:?}", got.violations);
        let (w, o) = (
            want.read_f16("out", (rows * nb * 16) as usize),
            got.read_f16("out", (rows * nb * 16) as usize),
        );
        let own_len = ((nb - 1) * stride / 2 + own_rows * 16) as usize;
        let own = got.read_f16("own", own_len);
        for b in 0..nb {
            for r in 0..rows {
                let at = ((b * rows + r) * 16) as usize;
                let row = &w[at..at + 16];
                if (first..first + own_rows).contains(&r) {
                    let at2 = ((b * stride / 2) + (r - first) * 16) as usize;
                    assert_eq!(&own[at2..at2 + 16], row, "{k:?} block {b} row {r}");
                } else {
                    assert_eq!(&o[at..at + 16], row, "{k:?} block {b} row {r}");
                }
            }
        }
    }
    // 5 rows a worker: 10 rows from row 5 are whole workers', from row 4 not.
    let k = AmpMatmul::new(30, 2, 1);
    assert!(k.with_own_rows(5, 10, 320).is_some());
    assert!(k.with_own_rows(4, 10, 320).is_none());
    // Records (uneven rows) keep one output pointer a call.
    assert!(AmpMatmul::new(31, 2, 1).with_own_rows(0, 5, 160).is_none());
}

/// A product taken in two parts of K, the second continuing from the first's
/// output (`init`), gives the bits of the one call over all of K: the chunks'
/// partial sums are rounded to f16 between chunks either way. Splits that are
/// not even refuse to continue.
#[test]
fn a_continuing_product_adds_to_the_partials_it_is_given() {
    for (rows, kc1, kc2, nb, rm) in [
        (36, 2, 3, 2, false),
        (24, 1, 2, 3, false),
        (24, 2, 1, 3, false),
        (48, 3, 1, 1, true),
        (12, 2, 2, 4, true),
        (30, 3, 4, 2, false),
    ] {
        let with_layout = |k: AmpMatmul| if rm { k.row_major() } else { k };
        let whole = with_layout(AmpMatmul::new(rows, kc1 + kc2, nb));
        let c = case(&whole, u64::from(rows * 7 + kc1));
        let want = run(&whole, &layout(&whole), &inputs(&whole, &c));
        want.assert_ok();
        // The parts' inputs and weights: K's first `kc1` chunks, then the rest.
        let kdim = ((kc1 + kc2) * 16) as usize;
        let n = (nb * 16) as usize;
        let part = |c0: u32, kc: u32| Case {
            x: (0..rows as usize)
                .flat_map(|r| {
                    let at = r * kdim + (c0 * 16) as usize;
                    c.x[at..at + (kc * 16) as usize].to_vec()
                })
                .collect(),
            w: c.w[(c0 * 16) as usize * n..((c0 + kc) * 16) as usize * n].to_vec(),
        };
        let first = with_layout(AmpMatmul::new(rows, kc1, nb));
        let p1 = part(0, kc1);
        let out1 = run(&first, &layout(&first), &inputs(&first, &p1));
        out1.assert_ok();
        let carried = out1.read_f16("out", (rows * nb * 16) as usize);
        let second = with_layout(AmpMatmul::new(rows, kc2, nb))
            .continuing()
            .expect("an even split");
        let p2 = part(kc1, kc2);
        let mut ins = inputs(&second, &p2);
        ins.push(("init", f16_bytes(&carried)));
        let got = run(&second, &layout(&second), &ins);
        got.assert_ok();
        assert!(got.violations.is_empty(), "{:?}", got.violations);
        assert_eq!(
            got.read_f16("out", (rows * nb * 16) as usize),
            want.read_f16("out", (rows * nb * 16) as usize),
            "{second:?}"
        );
    }
    // 31 rows split unevenly keep records and the zero-partial start.
    assert!(AmpMatmul::new(31, 2, 1).continuing().is_none());
    assert!(AmpMatmul::new(30, 2, 1).continuing().is_some());
}

/// A biased product (the bias fed to the engine at chunk 0 of each block) gives
/// the bits of the same product continuing from partial sums that hold the bias
/// in every row: both add the same f16 values to the accumulators at chunk 0,
/// one from registers, the other streamed. And it is the product plus the bias
/// within the reference's tolerance. Splits that are not even, and continuing
/// products, refuse a bias.
#[test]
fn a_biased_product_adds_its_bias_in_the_engine() {
    for (rows, kc, nb, rm) in [
        (36, 2, 2, false),
        (24, 1, 3, false),
        (12, 3, 1, true),
        (48, 4, 2, true),
        (30, 5, 4, false),
        (18, 1, 1, false),
    ] {
        let with_layout = |k: AmpMatmul| if rm { k.row_major() } else { k };
        let plain = with_layout(AmpMatmul::new(rows, kc, nb));
        let biased = plain.with_bias().expect("an even split");
        let c = case(&plain, u64::from(rows * 5 + kc));
        let n = (nb * 16) as usize;
        let bias = random_f16(&mut rng(u64::from(rows + nb)), n, 2.0);
        let mut ins = inputs(&biased, &c);
        ins.push(("bias", f16_bytes(&bias)));
        let got = run(&biased, &layout(&biased), &ins);
        got.assert_ok();
        assert!(got.violations.is_empty(), "{:?}", got.violations);
        let got = got.read_f16("out", rows as usize * n);

        // The oracle: the bias as partial sums in every row, `[nb][rows][16]`.
        let init: Vec<f16> = (0..n / 16)
            .flat_map(|b| (0..rows).flat_map(move |_| b * 16..b * 16 + 16))
            .map(|col| bias[col])
            .collect();
        let cont = plain.continuing().expect("an even split");
        let mut ins = inputs(&cont, &c);
        ins.push(("init", f16_bytes(&init)));
        let want = run(&cont, &layout(&cont), &ins);
        want.assert_ok();
        assert_eq!(got, want.read_f16("out", rows as usize * n), "{biased:?}");

        // And against the product without a bias: every element moved by its
        // column's bias, within the rounding of the f16 output.
        let bare = run(&plain, &layout(&plain), &inputs(&plain, &c));
        bare.assert_ok();
        let bare = bare.read_f16("out", rows as usize * n);
        for (i, (g, b)) in got.iter().zip(&bare).enumerate() {
            let col = (i / (rows as usize * 16)) * 16 + i % 16;
            let d = g.to_f64() - b.to_f64() - bias[col].to_f64();
            let tol = (g.to_f64().abs() + b.to_f64().abs() + 1.0) * 2f64.powi(-9);
            assert!(
                d.abs() <= tol,
                "{biased:?} element {i}: {g} - {b} != {}",
                bias[col]
            );
        }
    }
    assert!(AmpMatmul::new(31, 2, 1).with_bias().is_none());
    assert!(
        AmpMatmul::new(30, 2, 1)
            .continuing()
            .unwrap()
            .with_bias()
            .is_none()
    );
    assert!(
        AmpMatmul::new(30, 2, 1)
            .with_bias()
            .unwrap()
            .continuing()
            .is_none()
    );
}

/// The two layouts really differ: a row-major A given to the chunk-major kernel
/// gives another product, so the reference test's agreement of both layouts (and
/// the stride that makes row-major work) is not vacuous.
#[test]
fn row_major_input_read_as_chunk_major_is_wrong() {
    let rm = AmpMatmul::new(24, 3, 1).row_major();
    let c = case(&rm, 5);
    let cm = AmpMatmul::new(24, 3, 1);
    let out = run(&cm, &layout(&cm), &inputs(&rm, &c));
    out.assert_ok();
    let got = out.read_f16("out", 24 * 16);
    let good = run(&rm, &layout(&rm), &inputs(&rm, &c));
    good.assert_ok();
    assert_ne!(got, good.read_f16("out", 24 * 16));
}

/// Two operands the kernel streams in one issue share an element: the contract's
/// own check names them and the simulator faults with MemoryConflict; separated,
/// the same call is correct.
#[test]
fn streamed_operands_in_one_element_conflict() {
    let k = AmpMatmul::new(24, 2, 1);
    let c = case(&k, 77);
    let a_bytes = 24 * 32 * 2;
    let addrs = OperandAddrs::new()
        .with("a", R1)
        .with("p0", R1 + a_bytes)
        .with("w", R1 + 0x8000)
        .with("out", R1 + 0x1_0000)
        .with("state", STATE_ADDR);
    assert_element_conflict(&run(&k, &addrs, &inputs(&k, &c)));

    let out = run(&k, &layout(&k), &inputs(&k, &c));
    out.assert_ok();
    assert!(out.violations.is_empty());
    check(&k, &c, &out);
}

/// The output may share an element with the partial buffer the last chunk does
/// not read: the contract does not separate them, and the simulator, which
/// faults on any two accesses of one issue in one element, runs the product
/// correctly. With the other buffer (the one the last chunk reads) it faults.
#[test]
fn output_shares_an_element_with_the_idle_partial_buffer() {
    let k = AmpMatmul::new(24, 5, 2);
    let c = case(&k, 31);
    let rb = 24 * 32;
    let base = OperandAddrs::new()
        .with("a", R1)
        .with("w", R1 + 0x8000)
        .with("state", STATE_ADDR);
    // Chunk 4 reads `p1`: `p0` and `out` in one 32 KiB pair.
    let shared = base
        .clone()
        .with("p0", R1 + 0x1_8000)
        .with("out", R1 + 0x1_8000 + rb)
        .with("p1", R1 + 0x2_0000);
    let out = run(&k, &shared, &inputs(&k, &c));
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    check(&k, &c, &out);
    // `p1` and `out` in one pair: the contract says so and the simulator faults.
    let clash = base
        .with("p1", R1 + 0x1_8000)
        .with("out", R1 + 0x1_8000 + rb)
        .with("p0", R1 + 0x2_0000);
    assert_element_conflict(&run(&k, &clash, &inputs(&k, &c)));
}

/// The contract names a shared element and the simulator faults on it, with
/// memory conflicts only.
fn assert_element_conflict(out: &crate::harness::Outcome) {
    assert!(
        out.violations
            .iter()
            .any(|v| matches!(v, Violation::SharedElement { .. })),
        "{:?}",
        out.violations
    );
    assert_eq!(out.report.status, Status::Fault);
    assert!(!out.report.faults.is_empty());
    for f in &out.report.faults {
        println!("{f}");
        assert_eq!(f.kind, FaultKind::MemoryConflict, "{f}");
    }
}

/// One [N,16]x[16,16] product per tile, against the public microbenchmark's
/// ~340 + 4N cycles and the kernel's own estimate.
#[test]
fn matmul_cycles_calibration() {
    println!("rows  simulated  340+4N  ratio  estimate");
    let mut simulated = Vec::new();
    for rows in [16u32, 128, 256, 2048] {
        let k = AmpMatmul::new(rows, 1, 1);
        let c = case(&k, u64::from(rows));
        let out = run(&k, &layout(&k), &inputs(&k, &c));
        out.assert_ok();
        check(&k, &c, &out);
        let cycles = out.report.cycles;
        let bench = 340 + 4 * u64::from(rows);
        let est = k.estimate_cycles();
        println!(
            "{rows:5} {cycles:9} {bench:7} {:6.3} {est:9}",
            cycles as f64 / bench as f64
        );
        let off = |x: u64, y: u64| (x as f64 - y as f64).abs() / y as f64;
        // The harness's `exit` is the only supervisor issue outside the estimate.
        assert!(
            off(est + 1, cycles) < 0.02,
            "estimate {est} vs simulated {cycles}"
        );
        simulated.push(cycles);
    }
    // The slope (cycles per row) is what the hardware measurement pins down: 4.
    // The intercept is this kernel's own supervisor and worker set-up, leaner than
    // the vertex that was measured (docs/sim.md, calibration).
    let slope = (simulated[3] - simulated[2]) as f64 / (2048.0 - 256.0);
    assert!(
        (slope - 4.0).abs() / 4.0 < 0.02,
        "slope {slope} cycles per row"
    );
}

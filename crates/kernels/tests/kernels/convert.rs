//! `fp8_to_f16` on the simulator against `tessera_machine::fp8::decode`, bit for
//! bit, and what its contract refuses.

use half::f16;
use rand::Rng;
use tessera_kernels::{Fp8ToF16, Kernel, KernelError, Violation};
use tessera_machine::fp8;
use tessera_sim::Status;

use crate::harness::{R1, layout, rng, run, run_at_layer};

fn check(n: u32, scale: i8, codes: &[u8]) {
    let k = Fp8ToF16::new(n, scale);
    let out = run(&k, &layout(&k), &[("src", codes.to_vec())]);
    out.assert_ok();
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    let got = out.read_f16("dst", n as usize);
    for (i, (&c, g)) in codes.iter().zip(&got).enumerate() {
        let want = fp8::decode(c, scale);
        if want.is_nan() {
            assert!(
                g.is_nan(),
                "n={n} scale {scale} element {i}: code {c:#04x} gave {g}"
            );
        } else {
            assert_eq!(
                g.to_bits(),
                f16::from_f32(want).to_bits(),
                "n={n} scale {scale} element {i}: code {c:#04x}"
            );
        }
    }
}

#[test]
fn every_code_decodes_as_the_machine_does() {
    let codes: Vec<u8> = (0..=255).collect();
    for scale in [0i8, -7, 5, -31, 31] {
        check(256, scale, &codes);
    }
}

/// Element counts that leave workers idle (8: one group), split unevenly (56:
/// seven groups), evenly, and the layer's widths; random codes, NaN included.
#[test]
fn random_tensors_of_every_shape_decode_exactly() {
    for (seed, &(n, scale)) in [
        (8u32, 0i8),
        (16, -3),
        (48, 2),
        (56, -7),
        (96, 0),
        (200, 9),
        (1152, -5),
        (4304, -12),
        (6 * 8 * 300 + 24, 1),
    ]
    .iter()
    .enumerate()
    {
        let mut r = rng(700 + seed as u64);
        let codes: Vec<u8> = (0..n).map(|_| r.random::<u8>()).collect();
        check(n, scale, &codes);
    }
}

#[test]
fn quantized_weights_come_back_within_half_a_step() {
    let mut r = rng(17);
    let w: Vec<f32> = (0..1152).map(|_| r.random_range(-0.3f32..0.3)).collect();
    let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = fp8::scale_for(max);
    let codes: Vec<u8> = w.iter().map(|&x| fp8::encode(x, scale)).collect();
    let k = Fp8ToF16::new(1152, scale);
    let out = run(&k, &layout(&k), &[("src", codes)]);
    out.assert_ok();
    for (x, g) in w.iter().zip(out.read_f16("dst", 1152)) {
        // Three mantissa bits: within 2^-4 relative, or half the smallest step.
        let tol = (x.abs() / 16.0).max(2f32.powi(-10 + i32::from(scale)));
        assert!((g.to_f32() - x).abs() <= tol, "{x} came back as {g}");
    }
}

#[test]
fn parameters_out_of_range_are_refused() {
    for n in [0u32, 4, 12, 1001] {
        assert!(matches!(
            Fp8ToF16::new(n, 0).validate(),
            Err(KernelError::InvalidParams { .. })
        ));
        assert!(Fp8ToF16::new(n, 0).emit(0x4_C000).is_err());
    }
    for scale in [32i8, -32, i8::MIN] {
        assert!(Fp8ToF16::new(64, scale).validate().is_err());
    }
    // Past the tile (and past a worker's repeat count).
    assert!(Fp8ToF16::new(1 << 19, 0).validate().is_err());
    assert!(Fp8ToF16::new(8 * 6 * 4096, 0).validate().is_ok());
}

/// The contract's alignment is what the loads need: `src` 4 bytes off faults in
/// the simulator at the first 64-bit load, and the contract says why.
#[test]
fn misaligned_source_is_a_violation_and_faults() {
    let k = Fp8ToF16::new(96, 0);
    let mut addrs = layout(&k);
    addrs.insert("src", R1 + 4);
    let out = run(&k, &addrs, &[]);
    assert!(
        out.violations
            .iter()
            .any(|v| matches!(v, Violation::Misaligned { name, align: 8, .. } if name == "src")),
        "{:?}",
        out.violations
    );
    assert_eq!(out.report.status, Status::Fault);
    assert!(
        out.report
            .faults
            .iter()
            .all(|f| f.instruction.starts_with("{ ld64step")),
        "{:#?}",
        out.report.faults
    );
    // `src` and `dst` in one element pair: a conflict the contract names.
    let mut shared = layout(&k);
    shared.insert("dst", R1 + 0x100);
    shared.insert("src", R1);
    let out = run(&k, &shared, &[]);
    assert!(
        out.violations
            .iter()
            .any(|v| matches!(v, Violation::SharedElement { .. })),
        "{:?}",
        out.violations
    );
}

/// The layered form reads its layer's instance: `src` plus the loop's offset
/// (`$m13`), here 0x1000 past codes that would decode differently; the same
/// call at offset 0 reads the first instance.
#[test]
fn the_layered_form_reads_the_current_layers_instance() {
    let (n, scale) = (200u32, -3i8);
    let k = Fp8ToF16::layered(n, scale);
    assert!(k.symbol().ends_with("_l"));
    let addrs = layout(&k);
    let src = addrs.get("src").unwrap();
    let mut r = rng(41);
    let first: Vec<u8> = (0..n).map(|_| r.random::<u8>()).collect();
    let later: Vec<u8> = (0..n).map(|_| r.random::<u8>()).collect();
    for (layer, codes) in [(0u32, &first), (0x1000, &later)] {
        let out = run_at_layer(
            &k,
            &addrs,
            &[("src", first.clone())],
            layer,
            &[(src + 0x1000, later.clone())],
        );
        out.assert_ok();
        let got = out.read_f16("dst", n as usize);
        for (i, (&c, g)) in codes.iter().zip(&got).enumerate() {
            let want = fp8::decode(c, scale);
            assert!(
                (want.is_nan() && g.is_nan()) || g.to_bits() == f16::from_f32(want).to_bits(),
                "layer offset {layer:#x} element {i}: code {c:#04x} gave {g}"
            );
        }
    }
}

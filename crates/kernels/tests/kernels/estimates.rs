//! The cost model's per-kernel estimates against simulated cycles.

use tessera_kernels::{
    Add, AddBias, AmpMatmul, BlocksToRows, ColExpShift, ColMax, ExpShift, Fp8ToF16, Gelu, Kernel,
    LayerNorm, Rearrange, ReduceAdd, ReduceNorm, RowMax, ScaleCols, ScaleRows, Softmax,
    SoftmaxCols, TransposeBlocks, ZeroFill,
};

use crate::harness::{layout, run};

/// Simulated cycles of one call (zeroed operands: timing does not depend on data).
/// The harness's trailing `exit` is one supervisor issue (one cycle) outside the estimate.
fn check(k: &dyn Kernel) {
    check_within(k, 0.02);
}

/// Asserts `estimate_cycles` matches the simulator to the cycle.
fn check_exact(k: &dyn Kernel) {
    check_within(k, 0.0);
}

fn check_within(k: &dyn Kernel, tolerance: f64) {
    let out = run(k, &layout(k), &[]);
    out.assert_ok();
    let simulated = out.report.cycles;
    let estimate = k.estimate_cycles() + 1;
    let off = (estimate as f64 - simulated as f64).abs() / simulated as f64;
    println!(
        "{:44} simulated {simulated:7} estimate {estimate:7}",
        k.symbol()
    );
    assert!(
        off <= tolerance && (tolerance > 0.0 || estimate == simulated),
        "{}: estimate {estimate}, simulated {simulated}",
        k.symbol()
    );
}

#[test]
fn estimates_track_simulation() {
    for (r, kc, nb) in [
        (1, 1, 1),
        (5, 1, 1),
        (16, 1, 1),
        (40, 1, 3),
        (7, 2, 1),
        (12, 3, 2),
        (50, 4, 2),
        (30, 5, 4),
        (81, 10, 24),
        // Even splits walk a header table, chunks in pairs: odd and even chunk
        // counts on either side of the walked ones (the layer's fc2 and fc1).
        (162, 30, 4),
        (294, 18, 4),
        (36, 9, 2),
        (12, 11, 3),
        (24, 6, 1),
        (6, 7, 2),
        (162, 12, 10),
        (243, 8, 9),
        (32, 5, 46),
        (1, 46, 5),
        (16, 46, 5),
        (24, 1, 5),
        (36, 2, 3),
        (6, 3, 3),
        (8, 4, 4),
        (13, 3, 1),
        (804, 1, 2),
    ] {
        check_exact(&AmpMatmul::new(r, kc, nb));
        check_exact(&AmpMatmul::new(r, kc, nb).row_major());
        // The test layout has room for `init` beside the smaller shapes.
        if let Some(k) = AmpMatmul::new(r, kc, nb).row_major().continuing()
            && r * nb <= 400
        {
            check_exact(&k);
        }
        if let Some(k) = AmpMatmul::new(r, kc, nb).with_bias()
            && r * nb <= 700
        {
            check_exact(&k);
            check_exact(&k.row_major());
        }
    }
    for (r, k) in [
        (4, 16),
        (6, 32),
        (13, 48),
        (100, 64),
        (3, 16),
        (243, 128),
        (32, 736),
    ] {
        check_exact(&Rearrange::new(r, k));
    }
    for (r, w) in [
        (3, 4),
        (6, 8),
        (13, 64),
        (20, 100),
        (1, 24),
        (1, 1152),
        (2, 1152),
        (3, 100),
        (5, 28),
        (9, 1152),
    ] {
        check_exact(&LayerNorm::new(r, w, 1e-5));
    }
    for n in [8, 96, 1000] {
        check_exact(&Gelu::new(n));
        check_exact(&Gelu::new(n).with_half_input());
    }
    for n in [8, 96, 1000] {
        check(&Add::new(n));
    }
    for n in [4, 28, 48, 1000, 3456] {
        check_exact(&Add::apart(n));
    }
    for (r, n) in [(2, 24), (5, 100)] {
        check(&AddBias::new(r, n));
    }
    for (r, n) in [(140, 16), (13, 16), (3, 16), (1, 16), (25, 8), (6, 8)] {
        check_exact(&AddBias::new(r, n));
    }
    for (k, n) in [
        (2, 8),
        (2, 4),
        (3, 100),
        (6, 96),
        (17, 2224),
        (9, 3344),
        (18, 2448),
        (40, 2048),
    ] {
        check_exact(&ReduceAdd::new(k, n));
        check_exact(&ReduceAdd::new(k, n).with_addend());
        check_exact(&ReduceAdd::new(k, n).with_addends());
    }
    for (k, n) in [(2, 8), (3, 100), (23, 80), (46, 84), (5, 4)] {
        check_exact(&ReduceNorm::new(k, n));
    }
    for n in [1, 3, 4, 5, 8, 9, 31, 32, 729] {
        check_exact(&RowMax::new(n));
    }
    // Idle workers, the odd tail (with and without pairs), the attention's sizes.
    for n in [1, 2, 3, 7, 11, 12, 13, 16, 64, 80, 96, 97, 1000] {
        check_exact(&tessera_kernels::RecipSum::new(n));
    }
    for n in [1, 2, 9, 16, 729] {
        check_exact(&ColMax::new(n));
    }
    for (n, rows, g) in [
        (16, 16, 46),
        (9, 16, 46),
        (1, 1, 1),
        (5, 8, 2),
        (16, 16, 92),
    ] {
        check_exact(&ColExpShift::new(n, rows, g, 1.0));
    }
    for (n, ld, g) in [
        (32, 32, 23),
        (9, 16, 23),
        (16, 16, 46),
        (1, 4, 1),
        (6, 8, 2),
        (7, 16, 3),
        (729, 736, 4),
    ] {
        check_exact(&ExpShift::new(n, ld, g, 0.125));
    }
    for (r, n, ld) in [
        (1, 1, 4),
        (5, 3, 4),
        (6, 8, 8),
        (13, 100, 112),
        (2, 196, 196),
        (7, 729, 736),
        (12, 729, 732),
    ] {
        check(&Softmax::with_ld(r, n, ld, 0.125));
        check(&Softmax::with_ld(r, n, ld, 0.125).with_recip());
    }
    for (r, n, ld) in [
        (1, 1, 16),
        (5, 3, 16),
        (16, 729, 736),
        (32, 729, 736),
        (7, 100, 112),
    ] {
        check(&Softmax::with_ld(r, n, ld, 0.125).with_blocked());
    }
    for (r, nb) in [(1, 1), (5, 2), (13, 3), (32, 46), (100, 4)] {
        check_exact(&BlocksToRows::new(r, nb));
    }
    for (r, nb) in [(1, 1), (5, 2), (16, 5), (32, 5), (7, 46)] {
        check_exact(&ScaleRows::new(r, nb));
    }
    for (r, nb) in [(1, 1), (5, 2), (13, 3), (80, 1), (80, 2)] {
        check_exact(&ScaleCols::new(r, nb));
    }
    check_exact(&ScaleCols::new(72, 2).with_out_rows(80));
    for (blocks, rows, n) in [(1, 736, 729), (2, 736, 729), (1, 12, 12), (3, 40, 13)] {
        check_exact(&SoftmaxCols::new(blocks, rows, n, 0.125));
        check_exact(&SoftmaxCols::new(blocks, rows, n, 1.0));
    }
    for (blocks, rows, n) in [
        (1, 736, 729),
        (2, 736, 729),
        (1, 12, 12),
        (3, 40, 13),
        (4, 416, 416),
        (5, 320, 313),
    ] {
        check_exact(&SoftmaxCols::maxima(blocks, rows, n));
        for g in [1, 2, 6] {
            check_exact(&SoftmaxCols::shifted(blocks, rows, n, 0.125, g));
            check_exact(&SoftmaxCols::shifted(blocks, rows, n, 1.0, g));
        }
    }
    // Ranges of row groups that start inside a block, cross columns of blocks
    // within whole blocks and end in partial ones (the attention's 5 x 3, 4, 5).
    for (kc, tb) in [
        (1, 1),
        (1, 7),
        (2, 3),
        (3, 13),
        (5, 46),
        (5, 3),
        (5, 4),
        (3, 5),
        (4, 1),
        (2, 2),
    ] {
        check_exact(&TransposeBlocks::new(kc, tb));
    }
    for (runs, bytes, stride) in [
        (1, 8, 8),
        (5, 224, 224),
        (5, 224, 1472),
        (7, 40, 48),
        (100, 32, 96),
    ] {
        check_exact(&ZeroFill::new(runs, bytes, stride));
    }
}

/// The planner asks for estimates of shapes no tile holds (a batch of 1,000 gives
/// a row pass of 45,563 rows): they come back as too costly to choose, and the
/// supervisor code is never emitted with a `setzi` immediate out of range.
#[test]
fn estimates_of_shapes_beyond_a_tile_are_prohibitive_not_panics() {
    for rows in [32_768, 45_563, u32::MAX / 64] {
        let e = AmpMatmul::new(rows, 1, 1).estimate_cycles();
        assert!(e >= u64::MAX / 8, "rows {rows}: {e}");
    }
}

#[test]
fn fp8_to_f16_estimate_is_exact() {
    for (n, scale) in [
        (8, 0),
        (16, 3),
        (48, -1),
        (56, 0),
        (96, -7),
        (1152, 2),
        (4304, -12),
    ] {
        check_exact(&Fp8ToF16::new(n, scale));
        check_exact(&Fp8ToF16::layered(n, scale));
    }
}

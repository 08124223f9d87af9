use tessera_kernels::{Kernel, Rearrange, Violation, pack_chunk_major};
use tessera_sim::{FaultKind, Status};

use crate::harness::{self, R1, f16_bytes, layout, random_f16, rng, run};

#[test]
fn rearrange_matches_reference() {
    for (seed, &(rows, k)) in [(1, 16), (5, 32), (7, 48), (13, 256), (37, 144), (64, 64)]
        .iter()
        .enumerate()
    {
        let kern = Rearrange::new(rows, k);
        let x = random_f16(&mut rng(seed as u64), (rows * k) as usize, 4.0);
        let out = run(&kern, &layout(&kern), &[("in", f16_bytes(&x))]);
        out.assert_ok();
        assert!(out.violations.is_empty(), "{:?}", out.violations);
        let want = pack_chunk_major(rows as usize, (k / 16) as usize, &x);
        let got = out.read_f16("out", want.len());
        assert_eq!(got, want, "rows {rows} k {k}");
    }
}

/// The seed bug: a rearrangement contract that declared 2-byte alignment let
/// placement put the input at 2 mod 8, and the kernel's first 64-bit load faulted
/// in every worker. The understated contract passes its own check; the simulator
/// must catch it at the `ld64step`.
#[test]
fn understated_alignment_faults_at_ld64step() {
    let (rows, k) = (31, 80);
    let x = random_f16(&mut rng(99), (rows * k) as usize, 1.0);
    let mut weak = Rearrange::new(rows, k);
    weak.declared_align = 2;
    let mut addrs = layout(&weak);
    addrs.insert("in", R1 + 2);
    let out = run(&weak, &addrs, &[("in", f16_bytes(&x))]);
    assert!(
        out.violations.is_empty(),
        "the weak contract admits 2 mod 8"
    );
    assert_eq!(out.report.status, Status::Fault);
    assert_eq!(out.report.faults.len(), 6, "{:#?}", out.report.faults);
    let symbol = weak.symbol();
    for f in &out.report.faults {
        println!("{f}");
        assert_eq!(f.kind, FaultKind::InvalidMemoryAddress);
        assert_eq!(f.symbol.as_deref(), Some(symbol.as_str()));
        assert!(f.instruction.starts_with("ld64step"), "{}", f.instruction);
        assert_eq!(f.address.map(|a| a % 8), Some(2));
    }
    let workers: Vec<_> = out.report.faults.iter().map(|f| f.context).collect();
    assert_eq!(workers.len(), 6);

    // The true contract rejects that address, and an address it admits works.
    let strong = Rearrange::new(rows, k);
    let rejected = strong.contract().check(&harness::machine(), &addrs);
    assert!(
        rejected
            .iter()
            .any(|v| matches!(v, Violation::Misaligned { name, align: 8, .. } if name == "in")),
        "{rejected:?}"
    );
    let aligned = layout(&strong);
    let out = run(&strong, &aligned, &[("in", f16_bytes(&x))]);
    out.assert_ok();
    assert!(out.violations.is_empty());
    let want = pack_chunk_major(rows as usize, (k / 16) as usize, &x);
    assert_eq!(out.read_f16("out", want.len()), want);
}

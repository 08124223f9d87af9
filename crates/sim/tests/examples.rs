//! The fault examples of `examples/faults`, assembled with the project's assembler
//! and run: the seed's misaligned `ld64step` must fault in all six workers, naming
//! the kernel symbol and offset; the aligned form must complete.

use std::path::PathBuf;
use tessera_sim::{Context, FaultKind, SimOptions, Simulator, Status};

fn example(name: &str) -> tessera_package::Package {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/faults").join(name);
    tessera_isa::assemble_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn misaligned_ld64step_faults_in_all_six_workers() {
    let mut sim = Simulator::new(&example("misaligned_ld64step.s")).unwrap();
    let report = sim.run(&SimOptions::default());
    assert_eq!(report.status, Status::Fault);
    assert_eq!(report.faults.len(), 6, "{:#?}", report.faults);
    for (i, f) in report.faults.iter().enumerate() {
        assert_eq!(f.tile, 0);
        assert_eq!(f.context, Context::Worker(i as u8));
        assert_eq!(f.kind, FaultKind::InvalidMemoryAddress);
        assert_eq!(f.symbol.as_deref(), Some("rearrange_row_major_to_amp_f16"));
        assert_eq!(f.offset, 0x8c);
        assert!(f.instruction.starts_with("ld64step"), "{}", f.instruction);
        let addr = f.address.unwrap();
        assert_eq!(addr % 8, 2);
        assert!(f.cause.contains("not 8-byte aligned"), "{}", f.cause);
        let text = f.to_string();
        assert!(
            text.starts_with(&format!(
                "tile 0 worker {i}: InvalidMemoryAddress at rearrange_row_major_to_amp_f16+0x8c `ld64step"
            )),
            "{text}"
        );
    }
}

#[test]
fn aligned_ld64step_completes() {
    let mut sim = Simulator::new(&example("aligned_ld64step.s")).unwrap();
    let report = sim.run(&SimOptions::default());
    assert_eq!(report.status, Status::Ok, "{:#?}", report.faults);
    // Worker 5 copied its 32 bytes.
    let src = sim.read_memory(0, 0x9_0000 + 48 + 320, 32).unwrap().to_vec();
    assert!(src.iter().all(|&b| b == 0) || !src.is_empty());
    assert!(report.per_tile[0].workers.iter().all(|w| w.issues > 0));
}

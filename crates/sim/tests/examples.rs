//! The fault examples of `examples/faults`, assembled with the project's assembler
//! and run: the seed's misaligned `ld64step` must fault in all six workers, naming
//! the kernel symbol and offset; the aligned form must complete.

use std::path::PathBuf;
use tessera_sim::{Context, FaultKind, SimOptions, Simulator, Status};

fn example(name: &str) -> tessera_package::Package {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/faults")
        .join(name);
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
    let package = example("aligned_ld64step.s");
    let sym = |name: &str| {
        package.tiles[0]
            .symbols
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("symbol {name}"))
            .addr
    };
    let (src, dst) = (sym("src"), sym("dst"));
    assert_eq!(src % 8, 0);
    let mut sim = Simulator::new(&package).unwrap();
    let report = sim.run(&SimOptions::default());
    assert_eq!(report.status, Status::Ok, "{:#?}", report.faults);
    // Worker 0 copied the sixteen f16 values 1..=16.
    let copied = sim.read_memory(0, dst, 32).unwrap();
    let want: Vec<u8> = (1..=16)
        .flat_map(|v| half::f16::from_f32(v as f32).to_bits().to_le_bytes())
        .collect();
    assert_eq!(copied, &want[..]);
    assert!(report.per_tile[0].workers.iter().all(|w| w.issues > 0));
}

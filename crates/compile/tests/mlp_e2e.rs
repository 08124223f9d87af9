//! End to end at a small size: lower, place, emit, simulate, compare with the f32
//! reference.

use half::f16;
use tessera_compile::{CompileOptions, compile_mlp};
use tessera_graph::{MlpConfig, init_weights, mlp, random_inputs};
use tessera_machine::Machine;
use tessera_sim::{SimOptions, Simulator, Status};

fn to_f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()
}

fn from_f16_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

#[test]
fn tiny_mlp_runs_and_matches_the_reference() {
    let machine = Machine::small().with_tiles(16);
    let graph = mlp(&MlpConfig::tiny(2)).unwrap();
    let weights = init_weights(&graph, 1);
    let inputs = random_inputs(&graph, 2);
    let compiled = compile_mlp(&machine, &graph, &weights, &CompileOptions::default()).unwrap();
    let mut sim = Simulator::new(&compiled.package).unwrap();
    sim.set_binding("x", &to_f16_bytes(inputs.get("x").unwrap().data()))
        .unwrap();
    let report = sim.run(&SimOptions {
        preload_bindings: true,
        ..SimOptions::default()
    });
    for f in &report.faults {
        eprintln!("{f}");
    }
    assert_eq!(report.status, Status::Ok);
    let got = from_f16_bytes(sim.binding("y").unwrap());
    let want = tessera_reference::evaluate(&graph, &weights, &inputs).unwrap();
    let want = want.get("y").unwrap().data();
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!("cycles {} max_abs_error {err}", report.cycles);
    assert!(err < 0.05, "max abs error {err}");
}

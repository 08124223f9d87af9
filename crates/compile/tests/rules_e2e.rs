//! The rules that the vision tower only uses fused, on their own: GELU, a residual
//! add and a softmax as separate operations, lowered, placed, simulated and
//! compared with the f32 reference (the plan verifier runs inside the lowering).

use half::f16;
use tessera_compile::{CompileOptions, compile_model};
use tessera_graph::{DType, GraphBuilder, init_weights, random_inputs};
use tessera_machine::Machine;
use tessera_sim::{SimOptions, Simulator, Status};

#[test]
fn standalone_elementwise_and_softmax_run_and_match() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [24, 32], DType::F16).unwrap();
    let g = b.gelu(x).unwrap();
    let s = b.add(g, x).unwrap();
    let p = b.softmax(s).unwrap();
    b.output("p", p).unwrap();
    let graph = b.finish().unwrap();
    let machine = Machine::small().with_tiles(5);
    let weights = init_weights(&graph, 1);
    let inputs = random_inputs(&graph, 2);
    let compiled = compile_model(&machine, &graph, &weights, &CompileOptions::default()).unwrap();
    let kinds: Vec<&str> = compiled.plan_ops.iter().map(|o| o.kind.as_str()).collect();
    // The softmax leaves its result on the row owners, so the output needs no
    // exchange of its own.
    assert_eq!(kinds, ["elementwise", "elementwise", "softmax"]);
    let mut sim = Simulator::new(&compiled.package).unwrap();
    let bytes: Vec<u8> = inputs
        .get("x")
        .unwrap()
        .data()
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    sim.set_binding("x", &bytes).unwrap();
    let report = sim.run(&SimOptions {
        preload_bindings: false,
        ..SimOptions::default()
    });
    assert_eq!(report.status, Status::Ok, "{:?}", report.faults.first());
    let got: Vec<f32> = sim
        .binding("p")
        .unwrap()
        .chunks_exact(2)
        .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    let want = tessera_reference::evaluate(&graph, &weights, &inputs).unwrap();
    let want = want.get("p").unwrap().data();
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(err < 2e-3, "max abs error {err}");
}

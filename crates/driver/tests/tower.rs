//! Whole towers through the library: the tiny configuration with three encoder
//! layers, lowered once as a loop, compiles, runs and validates operation by
//! operation in every layer, with f16 and with FP8 weights (resident in their
//! layout where the planner keeps them, and all staged); and the loop keeps
//! the code a tile holds as it was at one layer.

use tessera_driver::{
    Compiled, LayerDims, Machine, Model, ModelKind, ModelSpec, NoProgress, Options, RunStatus,
    SimulateOptions, Size, WeightDtype,
};

fn tower(layers: usize) -> ModelSpec {
    ModelSpec {
        kind: ModelKind::Layer {
            dims: LayerDims::Preset(Size::Tiny),
            tokens: false,
            layers: Some(layers),
        },
        batch: 2,
        seed: 1,
    }
}

fn opts(weight_dtype: WeightDtype) -> Options {
    Options {
        finalists: 1,
        weight_dtype,
        ..Options::default()
    }
}

fn compile(spec: &ModelSpec, o: &Options) -> (Model, Compiled) {
    let machine = Machine::load("c600").expect("c600");
    let model = Model::build(spec, &machine).expect("model");
    let c = tessera_driver::compile(&machine, &model, o, &NoProgress).expect("compile");
    (model, c)
}

/// Runs `spec` and checks every operation of every layer passed.
fn validates(spec: &ModelSpec, o: &Options) -> Compiled {
    let (model, c) = compile(spec, o);
    let r = tessera_driver::simulate(&model, &c, &SimulateOptions::default(), &NoProgress)
        .expect("simulate");
    let v = tessera_driver::validate(&model, &c, &r, &NoProgress).expect("validate");
    assert_eq!(v.status, RunStatus::Ok, "{:?}", v.mismatch);
    // Every layer's operations were checked in their own iteration.
    for layer in 0..3 {
        let name = format!("layers.{layer}.mlp.fc2");
        let i = c
            .plan_ops
            .iter()
            .position(|o| o.name == name)
            .unwrap_or_else(|| panic!("{name} in the unrolled operations"));
        assert_eq!(v.ops[i].passed, Some(true), "{name}");
    }
    c
}

#[test]
fn three_layers_run_as_a_loop_in_f16() {
    let c = validates(&tower(3), &opts(WeightDtype::F16));
    assert_eq!(c.report.loop_count, Some(3));
    assert_eq!(c.report.weight_dtype, WeightDtype::F16);
}

#[test]
fn three_layers_run_as_a_loop_with_fp8_weights() {
    let c = validates(&tower(3), &opts(WeightDtype::Fp8));
    assert_eq!(c.report.loop_count, Some(3));
    assert_eq!(c.report.weight_dtype, WeightDtype::Fp8);
    // Every linear of every layer has its weight rounded for the reference.
    for layer in 0..3 {
        let fc1 = format!("layers.{layer}.mlp.fc1");
        assert!(c.fp8_weights.iter().any(|(n, _, _)| *n == fc1), "{fc1}");
    }
    // The tiny tower has room: the planner keeps linears' weights resident in
    // their layout, each layer widening its own instance (every layer's
    // operations validated above).
    assert!(
        c.report
            .resident_weights
            .contains(&"layers.0.mlp.fc1".to_string()),
        "{:?}",
        c.report.resident_weights
    );
}

/// The same with every weight staged each iteration, as a tower without room
/// for resident weights runs.
#[test]
fn three_layers_run_as_a_loop_with_fp8_weights_all_staged() {
    let o = Options {
        resident_weights: false,
        ..opts(WeightDtype::Fp8)
    };
    let c = validates(&tower(3), &o);
    assert_eq!(c.report.loop_count, Some(3));
    assert!(c.report.resident_weights.is_empty());
}

/// The loop's code per tile at three layers against one layer's: within 10%,
/// category by category, against one layer with its weights staged the same way,
/// and in all against one layer as it compiles by default.
#[test]
fn a_loop_keeps_one_layers_code() {
    let (_, three) = compile(&tower(3), &opts(WeightDtype::F16));
    let staged = Options {
        stage_weights: true,
        ..opts(WeightDtype::F16)
    };
    let (_, one_staged) = compile(&tower(1), &staged);
    let (_, one) = compile(&tower(1), &opts(WeightDtype::F16));
    let t = three.report.code.max_per_tile;
    let s = one_staged.report.code.max_per_tile;
    let within = |a: u64, b: u64| a as f64 <= 1.1 * b as f64;
    for (what, a, b) in [
        ("supervisor", t.supervisor, s.supervisor),
        ("kernels", t.kernels, s.kernels),
        ("exchange code", t.exchange_code, s.exchange_code),
    ] {
        assert!(within(a, b), "{what}: {a} bytes at 3 layers, {b} at one");
    }
    let sum = |c: &tessera_driver::CodeBytes| c.supervisor + c.kernels + c.exchange_code;
    let d = one.report.code.max_per_tile;
    assert!(
        within(sum(&t), sum(&d)),
        "{} bytes at 3 layers, {} at one",
        sum(&t),
        sum(&d)
    );
    // Unrolled, the same three layers take far more.
    let unrolled = Options {
        loop_layers: false,
        ..opts(WeightDtype::F16)
    };
    let (_, flat) = compile(&tower(3), &unrolled);
    assert!(!within(sum(&flat.report.code.max_per_tile), sum(&d)));
}

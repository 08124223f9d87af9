//! A layer loop's later layers' weights made from their parameters by the
//! body's recipes give every binding byte for byte as replaying the body for
//! each layer does (the oracle), with f16 and FP8 weights, staged and
//! resident, and the same products rounded to FP8.

use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};
use tessera_machine::Machine;
use tessera_plan::{Experimental, LowerOptions, TilePlan, WeightDtype, lower_exact, lower_fitted};

fn tower() -> (tessera_graph::Graph, tessera_graph::TensorMap) {
    let cfg = EncoderLayerConfig {
        layers: 3,
        ..EncoderLayerConfig::tiny(2)
    };
    let graph = encoder_layer(&cfg).unwrap();
    let weights = init_weights(&graph, 7);
    (graph, weights)
}

/// The plan at `o`'s fitted options, its later layers made by recipes and by
/// replays.
fn both(o: &LowerOptions) -> (TilePlan, TilePlan) {
    let (graph, weights) = tower();
    let machine = Machine::small();
    let (_, fitted) = lower_fitted(&machine, &graph, &weights, o).unwrap();
    let by_recipe = lower_exact(&machine, &graph, &weights, &fitted).unwrap();
    let replayed = LowerOptions {
        experimental: Experimental {
            replay_layers: true,
            ..fitted.experimental.clone()
        },
        ..fitted
    };
    let by_replay = lower_exact(&machine, &graph, &weights, &replayed).unwrap();
    (by_recipe, by_replay)
}

fn same_weights(a: &TilePlan, b: &TilePlan) {
    assert!(a.layer_weights_by_recipe, "the recipes were not used");
    assert!(!b.layer_weights_by_recipe);
    assert!(!a.layer_weights_pending && !b.layer_weights_pending);
    assert_eq!(a.bindings.len(), b.bindings.len());
    let mut layered = 0;
    for (x, y) in a.bindings.iter().zip(&b.bindings) {
        assert_eq!(x.name, y.name);
        assert_eq!(x.slices, y.slices, "{}", x.name);
        assert!(x.data == y.data, "`{}`: the images differ", x.name);
        layered += usize::from(x.name.starts_with("weights/layers.2."));
    }
    assert!(layered > 0, "no binding of the last layer");
    let sorted = |p: &TilePlan| {
        let mut v: Vec<String> = p
            .fp8_weights
            .iter()
            .map(|w| format!("{} {} {}", w.0, w.1, w.2))
            .collect();
        v.sort();
        v
    };
    assert_eq!(sorted(a), sorted(b));
}

#[test]
fn recipes_give_the_replays_images_with_f16_weights() {
    let (a, b) = both(&LowerOptions::default());
    same_weights(&a, &b);
}

#[test]
fn recipes_give_the_replays_images_with_fp8_weights_staged() {
    let (a, b) = both(&LowerOptions {
        weight_dtype: WeightDtype::Fp8,
        reside: false,
        ..LowerOptions::default()
    });
    assert!(a.resident_linears().is_empty());
    same_weights(&a, &b);
    assert!(a.fp8_weights.iter().any(|w| w.0 == "layers.2.mlp.fc2"));
}

#[test]
fn recipes_give_the_replays_images_with_fp8_weights_resident() {
    let (a, b) = both(&LowerOptions {
        weight_dtype: WeightDtype::Fp8,
        ..LowerOptions::default()
    });
    assert!(!a.resident_linears().is_empty());
    same_weights(&a, &b);
}

/// Where a parameter of the first layer stands for two of a later layer's,
/// the recipes cannot say which to read: the later layers are replayed.
#[test]
fn layers_without_parameter_correspondence_are_replayed() {
    let text = include_str!("graphs/shared_param.graph");
    let graph = tessera_graph::Graph::parse(text).unwrap();
    let weights = init_weights(&graph, 3);
    let plan = lower_exact(
        &Machine::small(),
        &graph,
        &weights,
        &LowerOptions::default(),
    )
    .unwrap();
    assert!(plan.layer_loop.is_some());
    assert!(!plan.layer_weights_by_recipe && !plan.layer_weights_pending);
}

/// A layer whose last product fuses with an operation after the layer (here
/// a GELU) would leave the body's result where no iteration ends: such a
/// tower lowers unrolled, whichever way its weights would have been made.
#[test]
fn a_product_fused_across_the_layers_end_lowers_unrolled() {
    let graph = tessera_graph::Graph::parse(include_str!("graphs/fused_across.graph")).unwrap();
    let weights = init_weights(&graph, 3);
    for replay_layers in [false, true] {
        let o = LowerOptions {
            experimental: Experimental {
                replay_layers,
                ..Experimental::default()
            },
            ..LowerOptions::default()
        };
        let plan = lower_exact(&Machine::small(), &graph, &weights, &o).unwrap();
        assert!(plan.layer_loop.is_none());
        assert_eq!(tessera_plan::verify(&plan), vec![]);
    }
}

//! Golden plans: each case lowers a small model and compares the plan's text form
//! with `tests/golden/NAME.plan`. Refresh with
//! `UPDATE_GOLDEN=1 cargo test -p tessera-plan --test golden`.

use std::path::Path;

use tessera_graph::{EncoderLayerConfig, MlpConfig, encoder_layer, init_weights, mlp};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, lower, verify};

fn check(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.plan"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        text == expected,
        "{} differs from the plan (UPDATE_GOLDEN=1 refreshes it):\n{text}",
        path.display()
    );
}

/// Lowers `graph` for `machine` with the default options and seed-1 weights, checks
/// the verifier finds nothing, and compares the plan's text with golden `name`.
fn lower_and_check(name: &str, graph: &tessera_graph::Graph, machine: &Machine) {
    let weights = init_weights(graph, 1);
    let plan = lower(machine, graph, &weights, &LowerOptions::default()).unwrap();
    assert_eq!(verify(&plan), vec![]);
    check(name, &plan.to_string());
}

#[test]
fn tiny_mlp_on_four_tiles() {
    let graph = mlp(&MlpConfig::tiny(2)).unwrap();
    lower_and_check("mlp_tiny_b2_small", &graph, &Machine::small());
}

/// On eight tiles `fc2` reduces in row pieces of whole workers' rows: each tile's
/// AMP writes its own piece into its slot of the piece buffer (`_own` in the
/// symbol), and the reduce-scatter sends only the other pieces.
#[test]
fn tiny_mlp_on_eight_tiles_writes_its_own_pieces_in_place() {
    let graph = mlp(&MlpConfig::tiny(2)).unwrap();
    let machine = Machine::small().with_tiles(8);
    lower_and_check("mlp_tiny_b2_8tiles", &graph, &machine);
    let plan = lower(
        &machine,
        &graph,
        &init_weights(&graph, 1),
        &LowerOptions::default(),
    )
    .unwrap();
    let text = plan.to_string();
    assert!(text.contains("amp_matmul_r18_kc3_nb1_own0x9"), "{text}");
    assert!(text.contains("amp_matmul_r18_kc3_nb1_own9x9"), "{text}");
}

/// Every rule once: the patch projection with the position embedding fused, the
/// layer norms, head-padded projections, attention, the MLP's GELU and residual
/// epilogues, and the pooling head's single shared query.
#[test]
fn tiny_layer_on_four_tiles() {
    let graph = encoder_layer(&EncoderLayerConfig::tiny(2)).unwrap();
    lower_and_check("layer_tiny_b2_small", &graph, &Machine::small());
}

/// Padding: 12 values per patch (the inner dimension zero-filled to 16), heads of
/// 12 stored in 16 columns, 16 tokens on 8 tiles (groups of two per head).
#[test]
fn padded_layer_on_eight_tiles() {
    let cfg = EncoderLayerConfig {
        image_size: 8,
        patch: 2,
        width: 48,
        heads: 4,
        mlp_hidden: 64,
        ..EncoderLayerConfig::tiny(1)
    };
    let graph = encoder_layer(&cfg).unwrap();
    lower_and_check(
        "layer_padded_b1_8tiles",
        &graph,
        &Machine::small().with_tiles(8),
    );
}

/// GELU, an add and a softmax as operations of their own (the tower only uses them
/// fused): parts as they stand, the add's second operand moved beside the first,
/// the softmax on whole rows.
#[test]
fn standalone_elementwise_and_softmax() {
    let mut b = tessera_graph::GraphBuilder::new();
    let x = b.input("x", [24, 32], tessera_graph::DType::F16).unwrap();
    let g = b.gelu(x).unwrap();
    let s = b.add(g, x).unwrap();
    let p = b.softmax(s).unwrap();
    b.output("p", p).unwrap();
    let graph = b.finish().unwrap();
    lower_and_check(
        "elementwise_softmax_5tiles",
        &graph,
        &Machine::small().with_tiles(5),
    );
}

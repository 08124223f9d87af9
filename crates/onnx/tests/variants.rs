//! The other forms the canonicalisation accepts, made by rewriting the dynamo
//! fixture: LayerNorm decomposed, GELU with erf, the attention scale as a `Div`
//! on the scores or a `Mul` on the query. The weights must come out the same.

use std::path::{Path, PathBuf};

use prost::Message;
use tessera_onnx::proto::{ModelProto, NodeProto, TensorProto};
use tessera_onnx::{OnnxVision, import, import_bytes};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/siglip-tiny/model-ext/model.onnx")
}

fn load() -> ModelProto {
    ModelProto::decode(std::fs::read(fixture()).unwrap().as_slice()).unwrap()
}

fn node(op: &str, name: &str, inputs: &[&str], output: &str) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

fn f32_const(name: &str, v: f32) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 1,
        float_data: vec![v],
        ..Default::default()
    }
}

fn i64_const(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: 7,
        dims: vec![v.len() as i64],
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

fn run(m: &ModelProto) -> OnnxVision {
    import_bytes(&m.encode_to_vec(), fixture().parent().unwrap()).unwrap()
}

fn same_tensors(a: &OnnxVision, b: &OnnxVision) {
    for (name, t) in a.tensors.iter() {
        assert!(t == b.tensors.get(name).unwrap(), "{name}");
    }
    assert_eq!(a.tensors.len(), b.tensors.len());
}

#[test]
fn decomposed_layer_norm() {
    let reference = import(&fixture()).unwrap();
    let mut m = load();
    let g = m.graph.as_mut().unwrap();
    g.initializer
        .extend([f32_const("two", 2.0), i64_const("last", &[-1])]);
    let lns: Vec<NodeProto> = g
        .node
        .iter()
        .filter(|n| n.op_type == "LayerNormalization")
        .cloned()
        .collect();
    g.node.retain(|n| n.op_type != "LayerNormalization");
    for (k, ln) in lns.iter().enumerate() {
        let eps = ln.attribute.iter().find(|a| a.name == "epsilon").unwrap().f;
        let e = format!("eps{k}");
        g.initializer.push(f32_const(&e, eps));
        let (x, gamma, beta, y) = (&ln.input[0], &ln.input[1], &ln.input[2], &ln.output[0]);
        let v = |s: &str| format!("ln{k}_{s}");
        g.node.extend([
            node("ReduceMean", &v("mean"), &[x, "last"], &v("mean")),
            node("Sub", &v("d"), &[x, &v("mean")], &v("d")),
            node("Pow", &v("sq"), &[&v("d"), "two"], &v("sq")),
            node("ReduceMean", &v("var"), &[&v("sq"), "last"], &v("var")),
            node("Add", &v("ve"), &[&e, &v("var")], &v("ve")),
            node("Sqrt", &v("sd"), &[&v("ve")], &v("sd")),
            node("Div", &v("n"), &[&v("d"), &v("sd")], &v("n")),
            node("Mul", &v("g"), &[gamma, &v("n")], &v("g")),
            node("Add", &v("y"), &[&v("g"), beta], y),
        ]);
    }
    let got = run(&m);
    assert_eq!(got.dims, reference.dims);
    same_tensors(&reference, &got);
}

#[test]
fn erf_gelu() {
    let reference = import(&fixture()).unwrap();
    let mut m = load();
    let g = m.graph.as_mut().unwrap();
    g.initializer.extend([
        f32_const("sqrt2", std::f32::consts::SQRT_2),
        f32_const("one", 1.0),
        f32_const("half", 0.5),
    ]);
    let gelus = [
        (
            "linear_4",
            "gelu",
            [
                "node_Pow_41",
                "node_Mul_43",
                "node_Add_44",
                "node_Mul_46",
                "node_Tanh_47",
                "node_Add_49",
                "node_Mul_51",
                "node_gelu",
            ],
        ),
        (
            "linear_10",
            "gelu_1",
            [
                "node_Pow_89",
                "node_Mul_91",
                "node_Add_92",
                "node_Mul_94",
                "node_Tanh_95",
                "node_Add_97",
                "node_Mul_99",
                "node_gelu_1",
            ],
        ),
        (
            "linear_15",
            "gelu_2",
            [
                "node_Pow_147",
                "node_Mul_149",
                "node_Add_150",
                "node_Mul_152",
                "node_Tanh_153",
                "node_Add_155",
                "node_Mul_157",
                "node_gelu_2",
            ],
        ),
    ];
    for (k, (x, out, names)) in gelus.iter().enumerate() {
        g.node.retain(|n| !names.contains(&n.name.as_str()));
        let v = |s: &str| format!("erf{k}_{s}");
        g.node.extend([
            node("Div", &v("a"), &[x, "sqrt2"], &v("a")),
            node("Erf", &v("e"), &[&v("a")], &v("e")),
            node("Add", &v("o"), &["one", &v("e")], &v("o")),
            node("Mul", &v("h"), &[&v("o"), x], &v("h")),
            node("Mul", &v("y"), &[&v("h"), "half"], out),
        ]);
    }
    let got = run(&m);
    assert_eq!(got.dims.hidden_act, "gelu");
    same_tensors(&reference, &got);
}

#[test]
fn scale_as_div_on_scores_or_mul_on_query() {
    let reference = import(&fixture()).unwrap();
    let mut m = load();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(f32_const("four", 4.0));
    // Layer 0: scores divided by sqrt(head_dim).
    let n = g.node.iter_mut().find(|n| n.name == "node_mul").unwrap();
    n.op_type = "Div".into();
    n.input[1] = "four".into();
    // Layer 1: the query scaled before the product, the scores left alone.
    let n = g.node.iter_mut().find(|n| n.name == "node_mul_1").unwrap();
    n.op_type = "Identity".into();
    n.input.truncate(1);
    g.node
        .iter_mut()
        .find(|n| n.name == "node_matmul_2")
        .unwrap()
        .input[0] = "q_scaled".into();
    g.node.push(node(
        "Mul",
        "scale_q",
        &["val_31", "transpose_6"],
        "q_scaled",
    ));
    let got = run(&m);
    assert_eq!(got.dims, reference.dims);
    same_tensors(&reference, &got);
}

#[test]
fn a_different_scale_is_folded_into_the_query() {
    let reference = import(&fixture()).unwrap();
    let mut m = load();
    let g = m.graph.as_mut().unwrap();
    g.initializer.push(f32_const("half_scale", 0.125));
    g.node
        .iter_mut()
        .find(|n| n.name == "node_mul")
        .unwrap()
        .input[1] = "half_scale".into();
    let got = run(&m);
    for suffix in ["weight", "bias"] {
        let name = format!("encoder.layers.0.self_attn.q_proj.{suffix}");
        let want: Vec<f32> = reference
            .tensors
            .get(&name)
            .unwrap()
            .data()
            .iter()
            .map(|v| v * 0.5)
            .collect();
        assert_eq!(
            got.tensors.get(&name).unwrap().data(),
            want.as_slice(),
            "{name}"
        );
    }
}

/// A tower exported without its head (`vision_use_head = False`, or only the
/// tokens kept): the head's nodes and weights are gone, the rest unchanged.
#[test]
fn tokens_only() {
    let reference = import(&fixture()).unwrap();
    let mut m = load();
    let g = m.graph.as_mut().unwrap();
    g.output.retain(|o| o.name == "last_hidden_state");
    // Keep only the nodes the tokens depend on.
    let mut needed: std::collections::HashSet<String> = ["last_hidden_state".to_string()].into();
    loop {
        let before = needed.len();
        for n in &g.node {
            if n.output.iter().any(|o| needed.contains(o)) {
                needed.extend(n.input.iter().cloned());
            }
        }
        if needed.len() == before {
            break;
        }
    }
    g.node
        .retain(|n| n.output.iter().any(|o| needed.contains(o)));
    let got = run(&m);
    assert!(!got.dims.vision_use_head);
    assert_eq!(got.outputs, ["last_hidden_state"]);
    assert_eq!(got.pooled_output, None);
    for (name, t) in reference.tensors.iter() {
        match got.tensors.get(name) {
            Some(g) => assert!(g == t, "{name}"),
            None => assert!(name.starts_with("head."), "{name} missing"),
        }
    }
    assert_eq!(
        got.tensors.len(),
        reference
            .tensors
            .names()
            .filter(|n| !n.starts_with("head."))
            .count()
    );
}

//! The attention's score scale goes into the query projection's weights only
//! where that is safe: a scale below 1 (the scaled weights cannot overflow f16) on
//! queries nothing else reads. Otherwise the column softmax keeps its multiply.

use tessera_graph::{DType, Graph, GraphBuilder, TensorId, init_weights};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, TilePlan, lower, verify};

/// Self-attention over 16 tokens of width 32 in 2 heads, its scores scaled by
/// `scale`; with `twice` the same split queries serve a second attention too (keys
/// and values swapped), so they have two readers.
fn attention(scale: f32, twice: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [16, 32], DType::F16).unwrap();
    let h = b.reshape(x, [1, 16, 32]).unwrap();
    let q = b.linear(h, "q", 32).unwrap();
    let k = b.linear(h, "k", 32).unwrap();
    let v = b.linear(h, "v", 32).unwrap();
    let (qh, kh, vh) = (
        b.split_heads(q, 2).unwrap(),
        b.split_heads(k, 2).unwrap(),
        b.split_heads(v, 2).unwrap(),
    );
    let pairs: &[(TensorId, TensorId)] = if twice {
        &[(kh, vh), (vh, kh)]
    } else {
        &[(kh, vh)]
    };
    for (i, &(keys, values)) in pairs.iter().enumerate() {
        let s = b.matmul_t(qh, keys).unwrap();
        let s = b.scale(s, scale).unwrap();
        let p = b.softmax(s).unwrap();
        let c = b.matmul(p, values).unwrap();
        let c = b.merge_heads(c).unwrap();
        let c = b.linear(c, &format!("out{i}"), 32).unwrap();
        let c = b.reshape(c, [16, 32]).unwrap();
        b.output(&format!("ctx{i}"), c).unwrap();
    }
    b.finish().unwrap()
}

fn lowered(graph: &Graph) -> TilePlan {
    let weights = init_weights(graph, 1);
    let plan = lower(&Machine::small(), graph, &weights, &LowerOptions::default()).unwrap();
    assert_eq!(verify(&plan), vec![]);
    plan
}

/// Whether the plan folded the scale, checked both ways: the decision, and the
/// column softmax's form without the multiply (`_u`).
fn folded(plan: &TilePlan) -> bool {
    let decided = plan
        .decisions
        .iter()
        .any(|d| d.contains("folded into the query projection"));
    let text = plan.to_string();
    let unscaled = text
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .any(|w| w.starts_with("softmax_cols_f16_") && w.ends_with("_u"));
    assert_eq!(decided, unscaled, "{:#?}", plan.decisions);
    decided
}

#[test]
fn a_scale_below_one_is_folded_into_the_queries() {
    assert!(folded(&lowered(&attention(0.25, false))));
}

#[test]
fn a_scale_above_one_stays_in_the_softmax() {
    assert!(!folded(&lowered(&attention(2.0, false))));
}

#[test]
fn queries_with_another_reader_keep_the_scale_in_the_softmax() {
    assert!(!folded(&lowered(&attention(0.25, true))));
}

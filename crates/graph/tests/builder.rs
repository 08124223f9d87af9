//! Shape inference and validation through the public builder.

use tessera_graph::{DType, GraphBuilder, GraphError, Init, OpKind, Shape};

const F32: DType = DType::F32;

fn shape_of(b: &GraphBuilder, t: tessera_graph::TensorId) -> Vec<usize> {
    b.shape(t).unwrap().dims().to_vec()
}

#[test]
fn every_op_infers_its_shape() -> Result<(), GraphError> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [2, 6, 8], F32)?;
    let w = b.parameter("w", [8, 5], F32, Init::Constant(0.5))?;
    let bias = b.parameter("bias", [5], F32, Init::Constant(0.0))?;
    let y = b.matmul_full(x, w, false, Some(bias))?;
    assert_eq!(shape_of(&b, y), [2, 6, 5]);
    let wt = b.parameter("wt", [5, 8], F32, Init::Constant(0.5))?;
    let t = b.matmul_t(x, wt)?;
    assert_eq!(shape_of(&b, t), [2, 6, 5]);
    // Batched with broadcasting of the batch dimensions.
    let q = b.input("q", [1, 4, 3, 7], F32)?;
    let k = b.input("k", [2, 4, 9, 7], F32)?;
    let t = b.matmul_t(q, k)?;
    assert_eq!(shape_of(&b, t), [2, 4, 3, 9]);

    let row = b.input("row", [8], F32)?;
    let t = b.add(x, row)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let col = b.input("col", [2, 1, 1], F32)?;
    let t = b.add(col, x)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let t = b.scale(x, 2.0)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let t = b.layer_norm(x, "ln", 1e-6)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let t = b.softmax(x)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let t = b.gelu(x)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let t = b.reshape(x, [12, 8])?;
    assert_eq!(shape_of(&b, t), [12, 8]);
    let t = b.transpose(x, &[2, 0, 1])?;
    assert_eq!(shape_of(&b, t), [8, 2, 6]);
    let h = b.split_heads(x, 4)?;
    assert_eq!(shape_of(&b, h), [2, 4, 6, 2]);
    let t = b.merge_heads(h)?;
    assert_eq!(shape_of(&b, t), [2, 6, 8]);
    let t = b.slice(x, 1, 2, 5)?;
    assert_eq!(shape_of(&b, t), [2, 3, 8]);
    let z = b.input("z", [2, 6, 3], F32)?;
    let t = b.concat(&[x, z, x], 2)?;
    assert_eq!(shape_of(&b, t), [2, 6, 19]);
    let c = b.cast(x, DType::F16)?;
    assert_eq!(b.dtype(c)?, DType::F16);
    b.output("y", y)?;
    let g = b.finish()?;
    g.validate()?;
    assert_eq!(g.inputs().len(), 6);
    assert_eq!(
        g.param("ln.gamma").map(|t| g.shape(t).dims().to_vec()),
        Some(vec![8])
    );
    Ok(())
}

#[test]
fn matmul_mismatch_names_op_operand_and_both_shapes() {
    let mut b = GraphBuilder::new();
    let y = b.with_scope("mlp", |b| {
        let x = b.input("x", [4, 10], F32)?;
        let w = b.parameter("fc1.weight", [12, 3], F32, Init::Constant(1.0))?;
        b.matmul(x, w)
    });
    let err = y.unwrap_err();
    match &err {
        GraphError::ShapeMismatch(m) => {
            let tessera_graph::ShapeMismatch {
                op,
                name,
                operand,
                found,
                other_shape,
                ..
            } = &**m;
            assert_eq!(*op, "matmul");
            assert_eq!(name, "mlp.matmul");
            assert_eq!(operand, "b");
            assert_eq!(found, &Shape::from([12, 3]));
            assert_eq!(other_shape, &Shape::from([4, 10]));
        }
        other => panic!("unexpected error {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("mlp.matmul") && text.contains("[12, 3]") && text.contains("[4, 10]"),
        "{text}"
    );
}

#[test]
fn linear_reports_its_own_name() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [4, 10], F32).unwrap();
    let h = b.linear(x, "fc1", 7).unwrap();
    // fc2 expects the 7-wide activation; feeding x instead is a user error.
    let w = b
        .parameter("fc2.weight", [7, 10], F32, Init::Constant(0.0))
        .unwrap();
    let err = b.matmul(x, w).unwrap_err().to_string();
    assert!(err.contains("[7, 10]") && err.contains("[4, 10]"), "{err}");
    assert_eq!(shape_of(&b, h), [4, 7]);
}

#[test]
fn shape_errors() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [2, 3, 4], F32).unwrap();
    let y = b.input("y", [3, 5], F32).unwrap();
    let h = b.input("h", [2, 3, 4], DType::F16).unwrap();

    let add = b.add(x, y).unwrap_err();
    assert!(
        matches!(&add, GraphError::ShapeMismatch(m) if m.op == "add"),
        "{add}"
    );
    assert!(matches!(b.add(x, h), Err(GraphError::DTypeMismatch { .. })));
    assert!(matches!(
        b.reshape(x, [5, 5]),
        Err(GraphError::BadOperand { op: "reshape", .. })
    ));
    assert!(b.transpose(x, &[0, 0, 1]).is_err());
    assert!(b.transpose(x, &[0, 1]).is_err());
    assert!(b.split_heads(x, 3).is_err());
    assert!(b.split_heads(x, 0).is_err());
    assert!(b.merge_heads(y).is_err());
    assert!(b.slice(x, 3, 0, 1).is_err());
    assert!(b.slice(x, 1, 2, 2).is_err());
    assert!(b.slice(x, 1, 0, 4).is_err());
    assert!(b.concat(&[], 0).is_err());
    assert!(b.concat(&[x, y], 0).is_err());
    assert!(b.scale(x, f32::NAN).is_err());
    assert!(b.layer_norm(x, "ln", 0.0).is_err());
    let gamma = b.parameter("g", [3], F32, Init::Constant(1.0)).unwrap();
    let ln = b.layer_norm_with(x, gamma, gamma, 1e-5).unwrap_err();
    assert!(
        matches!(&ln, GraphError::ShapeMismatch(m) if m.operand == "gamma"),
        "{ln}"
    );
    let bias = b.parameter("b", [4], F32, Init::Constant(0.0)).unwrap();
    let w = b.parameter("w", [4, 5], F32, Init::Constant(0.0)).unwrap();
    assert!(b.matmul_full(x, w, false, Some(bias)).is_err());
    assert!(b.matmul(y, x).is_err());
    let v = b.input("v", [4], F32).unwrap();
    assert!(b.matmul(v, w).is_err());
    // A batch mismatch that does not broadcast.
    let p = b.input("p", [3, 2, 4], F32).unwrap();
    assert!(b.matmul(x, p).is_err());
    assert!(b.input("empty", [3, 0], F32).is_err());
    assert!(b.input("scalar", Shape::new(vec![]), F32).is_err());
    assert!(matches!(
        b.parameter("w", [1], F32, Init::Constant(0.0)),
        Err(GraphError::DuplicateName {
            what: "parameter",
            ..
        })
    ));
    assert!(
        b.parameter(
            "n",
            [1],
            F32,
            Init::Normal {
                mean: 0.0,
                std: f32::INFINITY
            }
        )
        .is_err()
    );
    assert!(matches!(
        b.gelu(tessera_graph::TensorId(999)),
        Err(GraphError::UnknownTensor { .. })
    ));
    // Failed ops leave nothing behind: only the successful declarations remain.
    b.output("x", x).unwrap();
    assert!(b.output("x", y).is_err());
    let g = b.finish().unwrap();
    assert_eq!(g.ops().len(), 8);
    g.validate().unwrap();
}

#[test]
fn graph_without_outputs_is_refused() {
    let mut b = GraphBuilder::new();
    b.input("x", [1], F32).unwrap();
    assert!(matches!(b.finish(), Err(GraphError::NoOutputs)));
}

#[test]
fn auto_names_are_unique_and_scoped() -> Result<(), GraphError> {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [2, 2], F32)?;
    let (a, c) = b.with_scope("blk", |b| Ok((b.gelu(x)?, b.gelu(x)?)))?;
    let d = b.gelu(x)?;
    b.output("y", d)?;
    let g = b.finish()?;
    assert_eq!(g.tensor_name(a), "blk.gelu");
    assert_eq!(g.tensor_name(c), "blk.gelu_1");
    assert_eq!(g.tensor_name(d), "gelu");
    assert_eq!(format!("{a}"), "t1");
    assert!(matches!(g.producer(a).kind, OpKind::Gelu { .. }));
    assert_eq!(g.consumers()[x.index()].len(), 3);
    Ok(())
}

#[test]
fn json_round_trip_and_tampering_is_caught() {
    let g = tessera_graph::mlp(&tessera_graph::MlpConfig::tiny(1)).unwrap();
    let text = serde_json::to_string(&g).unwrap();
    let back: tessera_graph::Graph = serde_json::from_str(&text).unwrap();
    back.validate().unwrap();
    assert_eq!(back, g);
    // Make fc1 claim a wrong output width: validation must notice.
    let tampered = text.replacen("[16,96]", "[16,95]", 1);
    assert_ne!(tampered, text);
    let bad: tessera_graph::Graph = serde_json::from_str(&tampered).unwrap();
    assert!(bad.validate().is_err());
}

//! Each op against tiny hand-computed examples.

use tessera_graph::{DType, Graph, GraphBuilder, GraphError, HostTensor, TensorId, TensorMap};
use tessera_reference::{EvalOptions, evaluate, evaluate_with};

/// Builds a graph whose inputs are `vals` (f32), applies `f`, and returns the output.
fn run(
    vals: &[(&str, &[usize], &[f32])],
    f: impl FnOnce(&mut GraphBuilder, &[TensorId]) -> Result<TensorId, GraphError>,
) -> HostTensor {
    let mut b = GraphBuilder::new();
    let mut inputs = TensorMap::new();
    let mut ids = Vec::new();
    for (name, shape, data) in vals {
        ids.push(b.input(name, shape.to_vec(), DType::F32).unwrap());
        inputs.insert(
            *name,
            HostTensor::new(shape.to_vec(), data.to_vec()).unwrap(),
        );
    }
    let y = f(&mut b, &ids).unwrap();
    b.output("y", y).unwrap();
    let g: Graph = b.finish().unwrap();
    let out = evaluate(&g, &TensorMap::new(), &inputs).unwrap();
    out.get("y").unwrap().clone()
}

fn close(actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len(), "{actual:?} vs {expected:?}");
    for (a, e) in actual.iter().zip(expected) {
        assert!(
            (a - e).abs() <= 1e-5 * (1.0 + e.abs()),
            "{actual:?} vs {expected:?}"
        );
    }
}

#[test]
fn matmul_with_bias() {
    let y = run(
        &[
            ("a", &[2, 3], &[1., 2., 3., 4., 5., 6.]),
            ("b", &[3, 2], &[1., 0., 0., 1., 1., 1.]),
            ("bias", &[2], &[10., 20.]),
        ],
        |b, t| b.matmul_full(t[0], t[1], false, Some(t[2])),
    );
    assert_eq!(y.shape().dims(), [2, 2]);
    close(y.data(), &[14., 25., 20., 31.]);
}

#[test]
fn matmul_transposed_b() {
    // b stored as [n=2, k=3].
    let y = run(
        &[
            ("a", &[2, 3], &[1., 2., 3., 4., 5., 6.]),
            ("b", &[2, 3], &[1., 0., 1., 0., 1., 0.]),
        ],
        |b, t| b.matmul_t(t[0], t[1]),
    );
    close(y.data(), &[4., 2., 10., 5.]);
}

#[test]
fn matmul_batched_with_broadcast() {
    // a: [2 batches, 1x2], b: [1 batch, 2x2] broadcast to both.
    let y = run(
        &[
            ("a", &[2, 1, 2], &[1., 2., 3., 4.]),
            ("b", &[1, 2, 2], &[1., 2., 3., 4.]),
        ],
        |b, t| b.matmul(t[0], t[1]),
    );
    assert_eq!(y.shape().dims(), [2, 1, 2]);
    close(y.data(), &[7., 10., 15., 22.]);
    // Rank-3 a against a shared 2-D b folds the batch into rows.
    let y = run(
        &[
            ("a", &[2, 1, 2], &[1., 2., 3., 4.]),
            ("b", &[2, 3], &[1., 0., 1., 0., 1., 1.]),
        ],
        |b, t| b.matmul(t[0], t[1]),
    );
    close(y.data(), &[1., 2., 3., 3., 4., 7.]);
}

#[test]
fn add_broadcasting() {
    let y = run(
        &[
            ("a", &[2, 3], &[1., 2., 3., 4., 5., 6.]),
            ("b", &[3], &[10., 20., 30.]),
        ],
        |b, t| b.add(t[0], t[1]),
    );
    close(y.data(), &[11., 22., 33., 14., 25., 36.]);
    // Column against row: [2,1] + [1,3] -> [2,3].
    let y = run(
        &[("a", &[2, 1], &[1., 2.]), ("b", &[1, 3], &[10., 20., 30.])],
        |b, t| b.add(t[0], t[1]),
    );
    assert_eq!(y.shape().dims(), [2, 3]);
    close(y.data(), &[11., 21., 31., 12., 22., 32.]);
    // Position-embedding style: [2, 2, 2] + [2, 2].
    let y = run(
        &[
            ("a", &[2, 2, 2], &[0., 0., 0., 0., 1., 1., 1., 1.]),
            ("p", &[2, 2], &[1., 2., 3., 4.]),
        ],
        |b, t| b.add(t[0], t[1]),
    );
    close(y.data(), &[1., 2., 3., 4., 2., 3., 4., 5.]);
    let y = run(&[("a", &[2], &[1., 2.]), ("b", &[2], &[3., 5.])], |b, t| {
        b.add(t[0], t[1])
    });
    close(y.data(), &[4., 7.]);
}

#[test]
fn scale_and_gelu() {
    let y = run(&[("x", &[3], &[1., -2., 0.5])], |b, t| b.scale(t[0], -2.0));
    close(y.data(), &[-2., 4., -1.]);
    let y = run(&[("x", &[5], &[0., 1., -1., 3., -3.])], |b, t| b.gelu(t[0]));
    // 0.5 x (1 + tanh(0.7978845608 (x + 0.044715 x^3))) evaluated by hand.
    close(
        y.data(),
        &[0.0, 0.841_192, -0.158_808, 2.996_363_7, -0.003_637_392],
    );
}

#[test]
fn layer_norm_hand_computed() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [2, 4], DType::F32).unwrap();
    let g = b.input("g", [4], DType::F32).unwrap();
    let be = b.input("b", [4], DType::F32).unwrap();
    let y = b.layer_norm_with(x, g, be, 1e-5).unwrap();
    b.output("y", y).unwrap();
    let graph = b.finish().unwrap();
    let mut inputs = TensorMap::new();
    inputs.insert(
        "x",
        HostTensor::new([2, 4], vec![1., 2., 3., 4., 2., 2., 2., 2.]).unwrap(),
    );
    inputs.insert("g", HostTensor::new([4], vec![1., 1., 2., 2.]).unwrap());
    inputs.insert("b", HostTensor::new([4], vec![0., 0., 0., 1.]).unwrap());
    let out = evaluate(&graph, &TensorMap::new(), &inputs).unwrap();
    // Row 1: mean 2.5, biased variance 1.25. Row 2 is constant: normalises to 0.
    let s = 1.0 / (1.25f32 + 1e-5).sqrt();
    close(
        out.get("y").unwrap().data(),
        &[
            -1.5 * s,
            -0.5 * s,
            2.0 * 0.5 * s,
            2.0 * 1.5 * s + 1.0,
            0.,
            0.,
            0.,
            1.,
        ],
    );
}

#[test]
fn softmax_is_stable_and_rows_sum_to_one() {
    let y = run(
        &[("x", &[2, 3], &[1., 2., 3., 1000., 1000., 1000.])],
        |b, t| b.softmax(t[0]),
    );
    let e = [1f32.exp(), 2f32.exp(), 3f32.exp()];
    let s: f32 = e.iter().sum();
    close(
        y.data(),
        &[e[0] / s, e[1] / s, e[2] / s, 1. / 3., 1. / 3., 1. / 3.],
    );
    let data: Vec<f32> = (0..5 * 7)
        .map(|i| ((i * 37 % 11) as f32 - 5.0) * 3.0)
        .collect();
    let y = run(&[("x", &[5, 7], &data)], |b, t| b.softmax(t[0]));
    for row in y.data().chunks(7) {
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(row.iter().all(|&p| p > 0.0 && p.is_finite()));
    }
}

#[test]
fn data_movement() {
    let x: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let y = run(&[("x", &[2, 3], &x)], |b, t| b.transpose(t[0], &[1, 0]));
    assert_eq!(y.shape().dims(), [3, 2]);
    close(y.data(), &[0., 3., 1., 4., 2., 5.]);
    let y = run(&[("x", &[2, 3], &x)], |b, t| b.reshape(t[0], [3, 2]));
    close(y.data(), &x);
    let y = run(&[("x", &[2, 3], &x)], |b, t| b.slice(t[0], 1, 1, 3));
    close(y.data(), &[1., 2., 4., 5.]);
    let y = run(&[("x", &[2, 3], &x)], |b, t| b.slice(t[0], 0, 1, 2));
    close(y.data(), &[3., 4., 5.]);
    let y = run(&[("x", &[2, 3], &x), ("z", &[2, 1], &[9., 8.])], |b, t| {
        b.concat(&[t[0], t[1]], 1)
    });
    close(y.data(), &[0., 1., 2., 9., 3., 4., 5., 8.]);
    let y = run(
        &[("x", &[2, 3], &x), ("z", &[1, 3], &[9., 8., 7.])],
        |b, t| b.concat(&[t[1], t[0]], 0),
    );
    close(y.data(), &[9., 8., 7., 0., 1., 2., 3., 4., 5.]);
}

#[test]
fn split_and_merge_heads() {
    // [T=2, H*D=4] with 2 heads of 2: head h of token t is columns 2h..2h+2.
    let x = [0., 1., 2., 3., 10., 11., 12., 13.];
    let y = run(&[("x", &[2, 4], &x)], |b, t| b.split_heads(t[0], 2));
    assert_eq!(y.shape().dims(), [2, 2, 2]);
    close(y.data(), &[0., 1., 10., 11., 2., 3., 12., 13.]);
    let y = run(&[("x", &[2, 4], &x)], |b, t| {
        let h = b.split_heads(t[0], 2)?;
        b.merge_heads(h)
    });
    assert_eq!(y.shape().dims(), [2, 4]);
    close(y.data(), &x);
}

#[test]
fn cast_rounds_only_under_f16_storage() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", [2], DType::F32).unwrap();
    let h = b.cast(x, DType::F16).unwrap();
    b.output("h", h).unwrap();
    let g = b.finish().unwrap();
    let mut inputs = TensorMap::new();
    inputs.insert("x", HostTensor::new([2], vec![0.1, 70000.0]).unwrap());
    let exact = evaluate(&g, &TensorMap::new(), &inputs).unwrap();
    assert_eq!(exact.get("h").unwrap().data(), &[0.1, 70000.0]);
    let opts = EvalOptions::f16_storage();
    let rounded = evaluate_with(&g, &TensorMap::new(), &inputs, &opts).unwrap();
    assert_eq!(
        rounded.get("h").unwrap().data(),
        &[0.099975586, f32::INFINITY]
    );
}

/// A value given for a tensor replaces the computed one for the operations that
/// read it; the replaced value is handed back; a value is released after its
/// last reader, an output never.
#[test]
fn an_evaluator_steps_replaces_and_releases() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", vec![1, 4], DType::F32).unwrap();
    let y = b.add(x, x).unwrap();
    let z = b.add(y, y).unwrap();
    b.output("z", z).unwrap();
    let g: Graph = b.finish().unwrap();
    let mut inputs = TensorMap::new();
    inputs.insert("x", HostTensor::new(vec![1, 4], vec![1.0; 4]).unwrap());
    let (w, opts) = (TensorMap::new(), EvalOptions::default());
    let mut e = tessera_reference::Evaluator::new(&g, &w, &inputs, &opts).unwrap();
    assert_eq!(e.step().unwrap(), Some(x));
    assert_eq!(e.step().unwrap(), Some(y));
    // A value of the wrong shape is refused, naming the tensor.
    let wrong = HostTensor::new(vec![4], vec![0.0; 4]).unwrap();
    let err = e.replace(y, wrong).unwrap_err();
    assert!(err.to_string().contains("has shape"), "{err}");
    let given = HostTensor::new(vec![1, 4], vec![10.0; 4]).unwrap();
    let own = e.replace(y, given).unwrap();
    assert_eq!(own.data(), &[2.0; 4], "the replaced value is y's own");
    assert!(e.value(x).is_none(), "x is released after its last reader");
    assert_eq!(e.step().unwrap(), Some(z));
    assert!(e.value(y).is_none(), "y is released after its last reader");
    assert_eq!(e.step().unwrap(), None);
    let out = e.outputs().unwrap();
    assert_eq!(
        out.get("z").unwrap().data(),
        &[20.0; 4],
        "z is computed from the given y"
    );
    // A released tensor cannot be replaced.
    let mut e = tessera_reference::Evaluator::new(&g, &w, &inputs, &opts).unwrap();
    for _ in 0..3 {
        e.step().unwrap();
    }
    let again = HostTensor::new(vec![1, 4], vec![0.0; 4]).unwrap();
    assert!(e.replace(x, again).is_err());
}

/// An FP8 weight is evaluated as the tile holds it: times its factor, in f16,
/// encoded at its scale, decoded and divided back; a name that is not a
/// parameter is refused.
#[test]
fn fp8_weights_are_rounded_where_they_are_read() {
    use tessera_reference::Fp8Weight;
    let mut b = GraphBuilder::new();
    let p = b
        .parameter(
            "w",
            vec![1, 3],
            DType::F16,
            tessera_graph::Init::Constant(0.0),
        )
        .unwrap();
    b.output("w", p).unwrap();
    let g: Graph = b.finish().unwrap();
    let mut w = TensorMap::new();
    w.insert(
        "w",
        HostTensor::new(vec![1, 3], vec![1.0, 0.3, -1.7]).unwrap(),
    );
    let fp8 = Fp8Weight {
        scale: -4,
        factor: 0.5,
    };
    let opts = EvalOptions::default().with_fp8_weight("w", fp8);
    let got = tessera_reference::evaluate_with(&g, &w, &TensorMap::new(), &opts).unwrap();
    // At scale -4 a code is 16 times the value: 0.5 is 8 (exact); 0.15 (0.3 times
    // the factor) is 2.4, held as 2.5 (steps of 0.25 in [2, 4)), so 0.3125; -0.85
    // is -13.6, held as -14 (steps of 1 in [8, 16)), so -1.75.
    assert_eq!(got.get("w").unwrap().data(), &[1.0, 0.3125, -1.75]);
    let opts = EvalOptions::default().with_fp8_weight("nope", fp8);
    let e = tessera_reference::evaluate_with(&g, &w, &TensorMap::new(), &opts).unwrap_err();
    assert!(e.to_string().contains("`nope`"), "{e}");
}

//! Property tests: matmul and broadcasting add against index arithmetic.

use proptest::prelude::*;
use tessera_graph::{DType, GraphBuilder, HostTensor, TensorMap};
use tessera_reference::evaluate;

fn values(n: usize, salt: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + salt * 13) % 17) as f32 - 8.0) / 4.0)
        .collect()
}

fn eval2(
    a_shape: &[usize],
    b_shape: &[usize],
    op: impl FnOnce(
        &mut GraphBuilder,
        tessera_graph::TensorId,
        tessera_graph::TensorId,
    ) -> tessera_graph::TensorId,
) -> (Vec<f32>, Vec<f32>, HostTensor) {
    let mut g = GraphBuilder::new();
    let a = g.input("a", a_shape.to_vec(), DType::F32).unwrap();
    let b = g.input("b", b_shape.to_vec(), DType::F32).unwrap();
    let y = op(&mut g, a, b);
    g.output("y", y).unwrap();
    let graph = g.finish().unwrap();
    let av = values(a_shape.iter().product(), 1);
    let bv = values(b_shape.iter().product(), 2);
    let mut inputs = TensorMap::new();
    inputs.insert("a", HostTensor::new(a_shape.to_vec(), av.clone()).unwrap());
    inputs.insert("b", HostTensor::new(b_shape.to_vec(), bv.clone()).unwrap());
    let out = evaluate(&graph, &TensorMap::new(), &inputs).unwrap();
    (av, bv, out.get("y").unwrap().clone())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn batched_matmul(
        batch_a in 1usize..4, bcast in 0usize..3, m in 1usize..80, k in 1usize..20,
        n in 1usize..20, transpose_b: bool,
    ) {
        // bcast: 0 = b has the same batch, 1 = b's batch is 1, 2 = b is plain 2-D.
        let a_shape = vec![batch_a, m, k];
        let last2 = if transpose_b { [n, k] } else { [k, n] };
        let b_shape: Vec<usize> = match bcast {
            0 => vec![batch_a, last2[0], last2[1]],
            1 => vec![1, last2[0], last2[1]],
            _ => last2.to_vec(),
        };
        let (av, bv, y) = eval2(&a_shape, &b_shape, |g, a, b| g.matmul_full(a, b, transpose_b, None).unwrap());
        prop_assert_eq!(y.shape().dims(), &[batch_a, m, n][..]);
        for bi in 0..batch_a {
            let b_off = if bcast == 0 { bi * k * n } else { 0 };
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0f32;
                    for p in 0..k {
                        let bval = if transpose_b { bv[b_off + j * k + p] } else { bv[b_off + p * n + j] };
                        acc += av[(bi * m + i) * k + p] * bval;
                    }
                    let got = y.data()[(bi * m + i) * n + j];
                    prop_assert!((got - acc).abs() < 1e-4 * (1.0 + acc.abs()), "{} vs {}", got, acc);
                }
            }
        }
    }

    #[test]
    fn broadcast_add(dims in proptest::collection::vec(1usize..4, 1..4), mask_a: u8, mask_b: u8, drop in 0usize..2) {
        // Each operand keeps a dimension or sets it to 1 by its mask; b may also drop
        // leading dimensions.
        let a_shape: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if mask_a >> i & 1 == 1 { 1 } else { d }).collect();
        let b_full: Vec<usize> = dims.iter().enumerate().map(|(i, &d)| if mask_b >> i & 1 == 1 { 1 } else { d }).collect();
        let b_shape = b_full[drop.min(b_full.len() - 1)..].to_vec();
        let (av, bv, y) = eval2(&a_shape, &b_shape, |g, a, b| g.add(a, b).unwrap());
        let lead = dims.len() - b_shape.len();
        let out: Vec<usize> = (0..dims.len()).map(|i| a_shape[i].max(if i < lead { 1 } else { b_shape[i - lead] })).collect();
        prop_assert_eq!(y.shape().dims(), &out[..]);
        let rank = out.len();
        for (flat, &got) in y.data().iter().enumerate() {
            let mut idx = vec![0; rank];
            let mut rem = flat;
            for d in (0..rank).rev() { idx[d] = rem % out[d]; rem /= out[d]; }
            let at = |shape: &[usize], vals: &[f32]| {
                let lead = rank - shape.len();
                let mut off = 0;
                for (d, &s) in shape.iter().enumerate() { off = off * s + if s == 1 { 0 } else { idx[lead + d] }; }
                vals[off]
            };
            prop_assert_eq!(got, at(&a_shape, &av) + at(&b_shape, &bv));
        }
    }
}

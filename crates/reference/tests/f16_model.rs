//! The f16 storage model of compiled matmuls (`EvalOptions::round_matmul_chunks`) and
//! the ulp comparison, against hand-worked values and straightforward loops.

use half::f16;
use tessera_graph::{
    DType, EncoderLayerConfig, Graph, GraphBuilder, HostTensor, MlpConfig, TensorMap,
    encoder_layer, init_weights, mlp, random_inputs,
};
use tessera_reference::{
    EvalOptions, RefError, compare, compare_ulps, evaluate, evaluate_with, f16_ulp,
};

fn f16r(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// `out = a @ w + bias` on f16 inputs `a [m, k]`, `w [k, n]` (or `[n, k]` with
/// `transpose`), `bias [n]`, as one matmul op named `matmul`.
fn linear_graph(m: usize, k: usize, n: usize, transpose: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let a = b.input("a", [m, k], DType::F16).unwrap();
    let w_shape = if transpose { [n, k] } else { [k, n] };
    let w = b.input("w", w_shape, DType::F16).unwrap();
    let bias = b.input("bias", [n], DType::F16).unwrap();
    let y = b.matmul_full(a, w, transpose, Some(bias)).unwrap();
    b.output("y", y).unwrap();
    b.finish().unwrap()
}

fn linear_inputs(
    (m, k, n, transpose): (usize, usize, usize, bool),
    a: &[f32],
    w: &[f32],
    bias: &[f32],
) -> TensorMap {
    let mut x = TensorMap::new();
    x.insert("a", HostTensor::new([m, k], a.to_vec()).unwrap());
    let w_shape = if transpose { [n, k] } else { [k, n] };
    x.insert("w", HostTensor::new(w_shape, w.to_vec()).unwrap());
    x.insert("bias", HostTensor::new([n], bias.to_vec()).unwrap());
    x
}

fn run_linear(g: &Graph, x: &TensorMap, opts: &EvalOptions) -> Vec<f32> {
    let out = evaluate_with(g, &TensorMap::new(), x, opts).unwrap();
    out.get("y").unwrap().data().to_vec()
}

/// What the compiled program computes, written out element by element: per 16-wide
/// chunk (zero-padded) an exact dot product added to the f16 partial and rounded;
/// group partials summed in f32 and rounded once when there are several; then the
/// bias, rounded. `w_at(p, j)` reads the weight from input `p` to output `j`.
#[allow(clippy::too_many_arguments)]
fn naive_chunked(
    a: &[f32],
    m: usize,
    k: usize,
    n: usize,
    w_at: impl Fn(usize, usize) -> f32,
    bias: &[f32],
    per_group: usize,
) -> Vec<f32> {
    let chunks = k.div_ceil(16);
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut total = 0f32;
            let mut groups = 0;
            let mut c0 = 0;
            while c0 < chunks {
                let mut partial = 0f32;
                for c in c0..(c0 + per_group).min(chunks) {
                    let mut dot = 0f64;
                    for p in 16 * c..16 * (c + 1) {
                        if p < k {
                            dot += f64::from(a[i * k + p]) * f64::from(w_at(p, j));
                        }
                    }
                    partial = f16r(partial + dot as f32);
                }
                total += partial;
                groups += 1;
                c0 += per_group;
            }
            let y = if groups > 1 { f16r(total) } else { total };
            out[i * n + j] = f16r(y + bias[j]);
        }
    }
    out
}

/// k = 48 in three chunks whose dot products are exact, chosen so that rounding after
/// every chunk, per group, and only at the end all give different answers.
#[test]
fn chunked_rounding_of_a_hand_worked_matmul() {
    let (m, k, n) = (1, 48, 2);
    let a = vec![1.0f32; k];
    let mut w = vec![0.0f32; k * n];
    // Column 0: chunk dots 2049, 1, 1. Column 1: 1000.25, 0.25, 0.25.
    for (p, v0, v1) in [
        (0, 2048.0, 1000.0),
        (1, 1.0, 0.25),
        (16, 1.0, 0.25),
        (32, 1.0, 0.25),
    ] {
        w[p * n] = v0;
        w[p * n + 1] = v1;
    }
    let bias = [0.0, 23.5];
    let g = linear_graph(m, k, n, false);
    let x = linear_inputs((m, k, n, false), &a, &w, &bias);

    // Exact: 2051 and 1000.75 + 23.5.
    assert_eq!(
        run_linear(&g, &x, &EvalOptions::default()),
        [2051.0, 1024.25]
    );
    // Rounded once at the end: 2051 is a tie between 2050 and 2052 and goes to the even
    // significand; 1024.25 is below half of the spacing of 1 above 1024.
    assert_eq!(
        run_linear(&g, &x, &EvalOptions::f16_storage()),
        [2052.0, 1024.0]
    );
    // One group of three chunks: 2049 -> 2048 after the first chunk, and each later +1
    // is a tie that rounds back to 2048; 1000.25 -> 1000 likewise, then 1000 + 23.5.
    let one_group = EvalOptions::f16_machine();
    assert_eq!(run_linear(&g, &x, &one_group), [2048.0, 1023.5]);
    let three_chunks = EvalOptions::f16_machine().with_matmul_groups("matmul", 3);
    assert_eq!(run_linear(&g, &x, &three_chunks), [2048.0, 1023.5]);
    // Groups of one chunk: partials 2048, 1, 1 sum to 2050 in f32 (exact in f16);
    // 1000 + 0.25 + 0.25 = 1000.5, plus 23.5 is 1024.
    let one_chunk = EvalOptions::f16_machine().with_matmul_groups("matmul", 1);
    assert_eq!(run_linear(&g, &x, &one_chunk), [2050.0, 1024.0]);

    for per_group in [1, 3] {
        let want = naive_chunked(&a, m, k, n, |p, j| w[p * n + j], &bias, per_group);
        let opts = EvalOptions::f16_machine().with_matmul_groups("matmul", per_group as u32);
        assert_eq!(run_linear(&g, &x, &opts), want, "groups of {per_group}");
    }
}

/// A small xorshift generator, so the test data needs no extra dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Multiples of 1/8 in `[-range, range]`: products and 16-term sums stay exact in
    /// f32 whatever order sgemm adds them in, yet the partials need f16 rounding.
    fn eighths(&mut self, len: usize, range: i64) -> Vec<f32> {
        (0..len)
            .map(|_| {
                let span = (2 * range * 8 + 1) as u64;
                ((self.next() % span) as i64 - range * 8) as f32 / 8.0
            })
            .collect()
    }
}

#[test]
fn chunked_matmul_matches_a_straightforward_loop() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // (m, k, n, transpose_b, chunks per group; None = one group)
    let cases = [
        (5, 48, 7, false, None),
        (5, 48, 7, false, Some(1)),
        (5, 48, 7, false, Some(2)),
        (5, 48, 7, false, Some(3)),
        (3, 40, 5, false, Some(2)),
        (70, 72, 9, false, Some(2)),
        (4, 37, 6, true, None),
        (4, 80, 6, true, Some(2)),
        // Wider than the column tile the evaluator works in (128), with a short
        // last tile.
        (9, 48, 300, false, Some(2)),
        (6, 40, 257, true, Some(1)),
    ];
    for (m, k, n, transpose, per_group) in cases {
        let a = rng.eighths(m * k, 2);
        let w = rng.eighths(k * n, 8);
        let bias: Vec<f32> = rng.eighths(n, 4);
        let g = linear_graph(m, k, n, transpose);
        let x = linear_inputs((m, k, n, transpose), &a, &w, &bias);
        let mut opts = EvalOptions::f16_machine();
        if let Some(pg) = per_group {
            opts = opts.with_matmul_groups("matmul", pg);
        }
        let got = run_linear(&g, &x, &opts);
        let w_at = |p: usize, j: usize| {
            if transpose {
                w[j * k + p]
            } else {
                w[p * n + j]
            }
        };
        let want = naive_chunked(
            &a,
            m,
            k,
            n,
            w_at,
            &bias,
            per_group.map_or(usize::MAX, |g| g as usize),
        );
        assert_eq!(
            got, want,
            "{m}x{k}x{n} transpose {transpose} groups {per_group:?}"
        );
        // The data is chosen so that the chunk rounding is visible.
        let plain = run_linear(&g, &x, &EvalOptions::f16_storage());
        assert_ne!(got, plain, "{m}x{k}x{n}: chunk rounding changed nothing");
    }
}

#[test]
fn default_options_are_pure_f32() {
    let cfg = MlpConfig::tiny(2);
    let g = mlp(&cfg).unwrap();
    let w = init_weights(&g, 5);
    let x = random_inputs(&g, 6);
    let exact = evaluate(&g, &w, &x).unwrap();
    assert_eq!(
        evaluate_with(&g, &w, &x, &EvalOptions::default()).unwrap(),
        exact
    );
    // Splits alone change nothing: they only say where rounding would happen.
    let split_only = EvalOptions::default()
        .with_matmul_groups("mlp.fc1", 1)
        .with_matmul_groups("mlp.fc2", 2);
    assert_eq!(evaluate_with(&g, &w, &x, &split_only).unwrap(), exact);
}

#[test]
fn chunked_reference_of_the_tiny_mlp_is_close_to_f32_but_not_equal() {
    let cfg = MlpConfig::tiny(2);
    let g = mlp(&cfg).unwrap();
    let w = init_weights(&g, 2024);
    let x = random_inputs(&g, 7);
    let exact = evaluate(&g, &w, &x).unwrap();
    let exact = exact.get("y").unwrap();
    let stored = evaluate_with(&g, &w, &x, &EvalOptions::f16_storage()).unwrap();
    let stored = stored.get("y").unwrap();
    // fc1 contracts over 32 (two chunks, one group), fc2 over 96 (six chunks, three
    // groups of two).
    let opts = EvalOptions::f16_machine().with_matmul_groups("mlp.fc2", 2);
    let chunked = evaluate_with(&g, &w, &x, &opts).unwrap();
    let chunked = chunked.get("y").unwrap();

    let stats = compare(chunked, exact).unwrap();
    assert!(stats.max_abs > 0.0, "no rounding happened: {stats:?}");
    assert!(stats.max_abs < 0.02 * stats.expected_max_abs, "{stats:?}");
    assert!(stats.cosine > 0.9999, "{stats:?}");
    for &v in chunked.data() {
        assert_eq!(f16r(v), v, "output is stored in f16");
    }
    // The chunk rounding is a real difference from rounding only what is stored, of a
    // few ulps at the output's scale. Measured at each element's own magnitude it can
    // be far more where the residual add cancels, so only the mean is bounded there.
    let ulps = compare_ulps(chunked, stored).unwrap();
    let scale = compare(stored, exact).unwrap().expected_max_abs;
    assert!(ulps.max_abs > 0.0, "{ulps:?}");
    assert!(
        ulps.max_abs <= 4.0 * f16_ulp(scale),
        "{ulps:?} at scale {scale}"
    );
    assert!(ulps.mean_ulps < 2.0, "{ulps:?}");
    // Each split is its own model: a different one moves results again.
    let other = EvalOptions::f16_machine().with_matmul_groups("mlp.fc2", 1);
    let other = evaluate_with(&g, &w, &x, &other).unwrap();
    assert_ne!(other.get("y").unwrap(), chunked);
}

#[test]
fn matmul_groups_must_name_matmuls() {
    let g = linear_graph(1, 16, 4, false);
    let x = linear_inputs((1, 16, 4, false), &[0.0; 16], &[0.0; 64], &[0.0; 4]);
    let opts = EvalOptions::f16_machine().with_matmul_groups("fc9", 1);
    let err = evaluate_with(&g, &TensorMap::new(), &x, &opts).unwrap_err();
    assert!(
        matches!(&err, RefError::NotAMatmul(n) if n == "fc9"),
        "{err}"
    );
    let opts = EvalOptions::f16_machine().with_matmul_groups("matmul", 0);
    let err = evaluate_with(&g, &TensorMap::new(), &x, &opts).unwrap_err();
    assert!(
        matches!(&err, RefError::EmptyGroup(n) if n == "matmul"),
        "{err}"
    );
}

#[test]
fn f16_ulp_is_the_spacing_at_the_value() {
    assert_eq!(f16_ulp(1.0), 2f32.powi(-10));
    assert_eq!(f16_ulp(-1.999), 2f32.powi(-10));
    assert_eq!(f16_ulp(2048.0), 2.0);
    assert_eq!(f16_ulp(2047.0), 1.0);
    assert_eq!(f16_ulp(2f32.powi(-14)), 2f32.powi(-24));
    assert_eq!(f16_ulp(1e-6), 2f32.powi(-24));
    assert_eq!(f16_ulp(0.0), 2f32.powi(-24));
    assert_eq!(f16_ulp(65504.0), 32.0);
    assert_eq!(f16_ulp(1e9), 32.0);
    assert_eq!(f16_ulp(f32::INFINITY), 32.0);
    assert_eq!(f16_ulp(1e-40), 2f32.powi(-24));
    // Agrees with stepping to the next f16 at every finite f16 value below the
    // largest, and between it and the next (in the same binade), either sign.
    for b in 0..f16::MAX.to_bits() {
        let (h, next) = (f16::from_bits(b).to_f32(), f16::from_bits(b + 1).to_f32());
        let spacing = next - h;
        for v in [h, -h, h + spacing / 3.0, -(h + spacing / 3.0)] {
            assert_eq!(f16_ulp(v), spacing, "{v}");
        }
    }
}

#[test]
fn compare_ulps_measures_each_element_at_its_magnitude() {
    let t = |d: Vec<f32>| HostTensor::new([d.len()], d).unwrap();
    let expected = t(vec![1.0, 1000.0, 0.001, -4.0]);
    // One ulp at 1, half an ulp at 1000 (spacing 0.5), three at 0.001, none at -4.
    let actual = t(vec![
        1.0 + 2f32.powi(-10),
        1000.25,
        0.001 + 3.0 * 2f32.powi(-20),
        -4.0,
    ]);
    let s = compare_ulps(&actual, &expected).unwrap();
    assert_eq!(s.worst_index, 2);
    assert!((s.max_ulps - 3.0).abs() < 1e-3, "{s:?}");
    assert!((s.mean_ulps - 4.5 / 4.0).abs() < 1e-3, "{s:?}");
    assert_eq!(s.max_abs, 0.25);

    let nan = compare_ulps(&t(vec![f32::NAN, 1.0]), &t(vec![1.0, 1.0])).unwrap();
    assert_eq!(nan.max_ulps, f32::INFINITY);
    assert_eq!(nan.worst_index, 0);
    let inf = compare_ulps(&t(vec![f32::INFINITY]), &t(vec![f32::INFINITY])).unwrap();
    assert_eq!(inf.max_ulps, 0.0);
    assert!(matches!(
        compare_ulps(&t(vec![1.0]), &t(vec![1.0, 2.0])),
        Err(RefError::CompareShape { .. })
    ));
}

#[test]
fn a_one_percent_error_is_many_ulps() {
    // The point of the chunk model: against it, a kernel that is 1% off stands out.
    let cfg = MlpConfig::tiny(2);
    let g = mlp(&cfg).unwrap();
    let w = init_weights(&g, 11);
    let x = random_inputs(&g, 12);
    let opts = EvalOptions::f16_machine().with_matmul_groups("mlp.fc2", 2);
    let good = evaluate_with(&g, &w, &x, &opts).unwrap();
    let good = good.get("y").unwrap();
    let off: Vec<f32> = good.data().iter().map(|v| f16r(v * 1.01)).collect();
    let off = HostTensor::new(good.shape().clone(), off).unwrap();
    assert!(compare_ulps(&off, good).unwrap().max_ulps >= 5.0);
}

#[test]
fn cosine_similarity_of_tensors() {
    let t = |d: Vec<f32>| HostTensor::new([d.len()], d).unwrap();
    let c = |a: Vec<f32>, b: Vec<f32>| compare(&t(a), &t(b)).unwrap().cosine;
    assert_eq!(c(vec![1.0, 2.0], vec![2.0, 4.0]), 1.0);
    assert_eq!(c(vec![1.0, 0.0], vec![0.0, 1.0]), 0.0);
    assert_eq!(c(vec![1.0, 0.0], vec![-1.0, 0.0]), -1.0);
    assert_eq!(c(vec![0.0, 0.0], vec![0.0, 0.0]), 1.0);
    assert_eq!(c(vec![0.0, 0.0], vec![1.0, 0.0]), 0.0);
    assert!(c(vec![f32::NAN, 0.0], vec![1.0, 0.0]).is_nan());
}

#[test]
fn chunked_reference_runs_batched_attention_products() {
    let cfg = EncoderLayerConfig::tiny(2);
    let g = encoder_layer(&cfg).unwrap();
    let w = init_weights(&g, 3);
    let x = random_inputs(&g, 4);
    let exact = evaluate(&g, &w, &x).unwrap();
    let chunked = evaluate_with(&g, &w, &x, &EvalOptions::f16_machine()).unwrap();
    for (name, want) in exact.iter() {
        let got = chunked.get(name).unwrap();
        let stats = compare(got, want).unwrap();
        assert!(stats.max_abs > 0.0, "{name}: {stats:?}");
        assert!(stats.cosine > 0.999, "{name}: {stats:?}");
        assert!(got.data().iter().all(|&v| f16r(v) == v), "{name}");
    }
}

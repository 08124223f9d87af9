//! Seeded initialisation and safetensors I/O.

use tessera_graph::{
    DType, HostTensor, MlpConfig, TensorError, TensorMap, init_weights, mlp, random_inputs,
};

fn tiny() -> tessera_graph::Graph {
    mlp(&MlpConfig::tiny(2)).unwrap()
}

#[test]
fn init_is_deterministic_and_seed_dependent() {
    let g = tiny();
    let a = init_weights(&g, 7);
    assert_eq!(a, init_weights(&g, 7));
    assert_ne!(a, init_weights(&g, 8));
    assert_eq!(random_inputs(&g, 3), random_inputs(&g, 3));
    assert_ne!(random_inputs(&g, 3), random_inputs(&g, 4));
    a.check_params(&g).unwrap();
    random_inputs(&g, 3).check_inputs(&g).unwrap();
}

#[test]
fn a_parameter_does_not_depend_on_the_rest_of_the_model() {
    // fc1.weight has the same name, shape and init in both graphs; the streams are
    // keyed by name, so its values agree even though the graphs differ.
    let small = mlp(&MlpConfig::tiny(1)).unwrap();
    let mut other_cfg = MlpConfig::tiny(1);
    other_cfg.tokens = 5;
    let other = mlp(&other_cfg).unwrap();
    let a = init_weights(&small, 1);
    let b = init_weights(&other, 1);
    assert_eq!(a.get("mlp.fc1.weight"), b.get("mlp.fc1.weight"));
}

#[test]
fn init_follows_the_documented_distribution() {
    let mut cfg = MlpConfig::so400m(1);
    cfg.dtype = DType::F32;
    cfg.hidden = 512;
    let g = mlp(&cfg).unwrap();
    let w = init_weights(&g, 0);
    let stats = |name: &str| {
        let d = w.get(name).unwrap().data();
        let n = d.len() as f64;
        let mean = d.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = d
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        (mean, var.sqrt())
    };
    let (m, s) = stats("mlp.fc1.weight");
    assert!(
        m.abs() < 1e-3 && (s - 1.0 / 1152f64.sqrt()).abs() < 1e-3,
        "{m} {s}"
    );
    let (m, s) = stats("mlp.fc2.weight");
    assert!(
        m.abs() < 2e-3 && (s - 1.0 / 512f64.sqrt()).abs() < 2e-3,
        "{m} {s}"
    );
    let (m, s) = stats("mlp.ln.gamma");
    assert!((m - 1.0).abs() < 0.02 && (s - 0.1).abs() < 0.01, "{m} {s}");
    let (m, s) = stats("mlp.ln.beta");
    assert!(m.abs() < 0.005 && (s - 0.02).abs() < 0.005, "{m} {s}");
    let (m, s) = stats("mlp.fc1.bias");
    assert!(m.abs() < 0.005 && (s - 0.02).abs() < 0.005, "{m} {s}");
}

#[test]
fn f16_parameters_are_f16_representable() {
    let g = tiny();
    for (_, t) in init_weights(&g, 0).iter() {
        for &v in t.data() {
            assert_eq!(half::f16::from_f32(v).to_f32(), v);
        }
    }
}

#[test]
fn safetensors_round_trip() {
    let g = tiny();
    let w = init_weights(&g, 5);
    // f16 values survive both encodings exactly.
    for dtype in [DType::F32, DType::F16] {
        let bytes = w.to_safetensors(dtype).unwrap();
        let back = TensorMap::from_safetensors(&bytes).unwrap();
        assert_eq!(back, w);
        back.check_params(&g).unwrap();
        // Same contents, same bytes.
        assert_eq!(back.to_safetensors(dtype).unwrap(), bytes);
    }
    // Full f32 precision survives only the f32 encoding.
    let mut f = TensorMap::new();
    f.insert("x", HostTensor::new([3], vec![0.1, -2.5e-8, 1e6]).unwrap());
    let back = TensorMap::from_safetensors(&f.to_safetensors(DType::F32).unwrap()).unwrap();
    assert_eq!(back, f);
    let back16 = TensorMap::from_safetensors(&f.to_safetensors(DType::F16).unwrap()).unwrap();
    assert_eq!(
        back16.get("x").unwrap().data(),
        &[0.099975586, -0.0, f32::INFINITY]
    );

    let dir = std::env::temp_dir().join(format!("tessera-graph-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    w.save(&path, DType::F16).unwrap();
    assert_eq!(TensorMap::load(&path).unwrap(), w);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(matches!(
        TensorMap::load(&path),
        Err(TensorError::Io { .. })
    ));
}

#[test]
fn bad_weights_are_reported() {
    let g = tiny();
    let mut w = init_weights(&g, 5);
    w.insert("mlp.fc1.bias", HostTensor::zeros([3]));
    let err = w.check_params(&g).unwrap_err();
    assert!(matches!(err, TensorError::WrongShape { .. }), "{err}");
    assert!(err.to_string().contains("mlp.fc1.bias"));
    w.remove("mlp.fc1.bias");
    assert!(matches!(
        w.check_params(&g),
        Err(TensorError::Missing { .. })
    ));
    assert!(TensorMap::from_safetensors(b"not a safetensors file").is_err());
    assert!(HostTensor::new([2, 2], vec![0.0; 3]).is_err());
}

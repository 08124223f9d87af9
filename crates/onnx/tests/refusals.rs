//! Edited fixtures: node order, unknown ops, missing or escaping external data,
//! opsets, and corrupt bytes.

use std::path::{Path, PathBuf};

use prost::Message;
use tessera_onnx::proto::{ModelProto, NodeProto};
use tessera_onnx::{OnnxError, OnnxVision, import, import_bytes};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/siglip-tiny")
}

fn load(rel: &str) -> (ModelProto, PathBuf) {
    let path = fixtures().join(rel);
    let bytes = std::fs::read(&path).unwrap();
    (
        ModelProto::decode(bytes.as_slice()).unwrap(),
        path.parent().unwrap().to_owned(),
    )
}

/// A fixed-seed generator, so that every run edits the same way.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-onnx-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn same(a: &OnnxVision, b: &OnnxVision) {
    assert_eq!(a.dims, b.dims);
    assert_eq!(a.batch, b.batch);
    assert_eq!(a.outputs, b.outputs);
    let names: Vec<&str> = a.tensors.names().collect();
    assert_eq!(names, b.tensors.names().collect::<Vec<_>>());
    for (name, t) in a.tensors.iter() {
        assert!(t == b.tensors.get(name).unwrap(), "{name}");
    }
}

#[test]
fn node_order_does_not_matter() {
    for rel in ["model.onnx", "model-ext/model.onnx"] {
        let reference = import(&fixtures().join(rel)).unwrap();
        let (model, dir) = load(rel);
        for seed in [1u64, 7, 12345] {
            let mut m = model.clone();
            let nodes = &mut m.graph.as_mut().unwrap().node;
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            for i in (1..nodes.len()).rev() {
                let j = rng.below(i + 1);
                nodes.swap(i, j);
            }
            let shuffled = import_bytes(&m.encode_to_vec(), &dir).unwrap();
            same(&reference, &shuffled);
        }
        // Reversed: every producer after its readers.
        let mut m = model.clone();
        m.graph.as_mut().unwrap().node.reverse();
        same(&reference, &import_bytes(&m.encode_to_vec(), &dir).unwrap());
    }
}

fn node_named<'a>(m: &'a mut ModelProto, name: &str) -> &'a mut NodeProto {
    m.graph
        .as_mut()
        .unwrap()
        .node
        .iter_mut()
        .find(|n| n.name == name)
        .unwrap()
}

#[test]
fn unknown_ops_are_listed() {
    let (mut m, dir) = load("model.onnx");
    let tanh = "/m/encoder/layers.1/mlp/activation_fn/Tanh";
    node_named(&mut m, tanh).op_type = "FastTanh".into();
    let g = m.graph.as_mut().unwrap();
    g.node.push(NodeProto {
        name: "extra".into(),
        op_type: "Frobnicate".into(),
        input: vec!["last_hidden_state".into()],
        output: vec!["frob".into()],
        ..Default::default()
    });
    let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
    let OnnxError::Unmapped { nodes } = &err else {
        panic!("{err}")
    };
    let want = [
        ("FastTanh".to_string(), tanh.to_string()),
        ("Frobnicate".into(), "extra".into()),
    ];
    assert_eq!(nodes.as_slice(), want.as_slice());
    assert!(
        err.to_string()
            .contains("FastTanh `/m/encoder/layers.1/mlp/activation_fn/Tanh`"),
        "{err}"
    );
}

#[test]
fn a_graph_that_is_not_siglip_is_refused_naming_nodes() {
    // A known op where the GELU's tanh was: every op is known, the structure is not.
    let (mut m, dir) = load("model-ext/model.onnx");
    node_named(&mut m, "node_Tanh_47").op_type = "Sqrt".into();
    let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
    let OnnxError::Unmapped { nodes } = &err else {
        panic!("{err}")
    };
    assert!(
        nodes.contains(&("Sqrt".into(), "node_Tanh_47".into())),
        "{err}"
    );
    // The layer after it and the head still matched, so they are not listed.
    assert!(
        !nodes
            .iter()
            .any(|n| n.1 == "node_Tanh_95" || n.1 == "node_gelu_2"),
        "{err}"
    );
}

#[test]
fn a_node_output_left_dangling_is_refused() {
    let (mut m, dir) = load("model.onnx");
    // An extra runtime computation nobody reads.
    m.graph.as_mut().unwrap().node.push(NodeProto {
        name: "stray".into(),
        op_type: "Tanh".into(),
        input: vec!["last_hidden_state".into()],
        output: vec!["stray_out".into()],
        ..Default::default()
    });
    let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
    let OnnxError::Unmapped { nodes } = &err else {
        panic!("{err}")
    };
    assert_eq!(
        nodes.as_slice(),
        [("Tanh".to_string(), "stray".to_string())].as_slice()
    );
}

#[test]
fn missing_external_data_is_named() {
    let dir = scratch("missing");
    std::fs::copy(
        fixtures().join("model-ext/model.onnx"),
        dir.join("model.onnx"),
    )
    .unwrap();
    let err = import(&dir.join("model.onnx")).unwrap_err();
    assert!(matches!(err, OnnxError::ExternalMissing { .. }), "{err}");
    assert!(err.to_string().contains("model.onnx.data"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn external_data_outside_the_model_directory_is_refused() {
    let (mut m, dir) = load("model-ext/model.onnx");
    for location in ["../model-ext/model.onnx.data", "/etc/passwd"] {
        let t = &mut m.graph.as_mut().unwrap().initializer[0];
        t.external_data
            .iter_mut()
            .find(|e| e.key == "location")
            .unwrap()
            .value = location.into();
        let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
        assert!(matches!(err, OnnxError::ExternalEscapes { .. }), "{err}");
        assert!(err.to_string().contains(location), "{err}");
    }
}

#[test]
fn external_data_range_beyond_the_file_is_refused() {
    let (mut m, dir) = load("model-ext/model.onnx");
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    t.external_data
        .iter_mut()
        .find(|e| e.key == "offset")
        .unwrap()
        .value = "99999999".into();
    let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
    assert!(matches!(err, OnnxError::ExternalRange { .. }), "{err}");
}

#[test]
fn opsets_outside_17_and_18_are_refused() {
    let (m, dir) = load("model.onnx");
    for v in [13, 19] {
        let mut m = m.clone();
        m.opset_import[0].version = v;
        let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
        assert!(
            matches!(err, OnnxError::Opset { version, .. } if version == v),
            "{err}"
        );
    }
}

#[test]
fn unsupported_dtype_is_named() {
    let (mut m, dir) = load("model.onnx");
    let t = &mut m.graph.as_mut().unwrap().initializer[0];
    let name = t.name.clone();
    t.data_type = 11; // double
    let err = import_bytes(&m.encode_to_vec(), &dir).unwrap_err();
    assert!(matches!(err, OnnxError::Dtype { .. }), "{err}");
    assert!(err.to_string().contains(&name), "{err}");
}

/// Truncated and bit-flipped files: always an error or a result, never a panic.
/// A truncated file is always refused; a flipped bit may land in a weight and
/// import.
#[test]
fn corrupt_bytes_never_panic() {
    for rel in ["model.onnx", "model-ext/model.onnx"] {
        let path = fixtures().join(rel);
        let dir = path.parent().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let mut rng = Rng(0x5eed_0001);
        let mut cuts: Vec<usize> = (0..120).map(|_| rng.below(bytes.len())).collect();
        cuts.extend([0, 1, 2, bytes.len() - 1]);
        for cut in cuts {
            let r = std::panic::catch_unwind(|| import_bytes(&bytes[..cut], dir));
            let r = r.unwrap_or_else(|_| panic!("{rel} truncated at {cut} panics"));
            assert!(r.is_err(), "{rel} truncated at {cut} imports");
        }
        let (mut refused, mut imported) = (0, 0);
        for _ in 0..300 {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(b.len());
                b[at] ^= 1 << rng.below(8);
            }
            let r = std::panic::catch_unwind(|| import_bytes(&b, dir));
            match r {
                Err(_) => panic!("{rel}: bit flips panic"),
                Ok(Ok(_)) => imported += 1,
                Ok(Err(_)) => refused += 1,
            }
        }
        assert!(refused > 0, "{rel}: {refused} refused, {imported} imported");
    }
}

//! The committed fixtures (scripts/siglip_fixtures.py) imported and compared with
//! the Hugging Face checkpoint of the same model, read independently.

use std::path::{Path, PathBuf};

use tessera_onnx::{OnnxError, OnnxVision, import};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/siglip-tiny")
}

/// The checkpoint, by name: shape and f32 values.
fn checkpoint() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixtures().join("vision/model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let data = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (name, view.shape().to_vec(), data)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn check_against_checkpoint(v: &OnnxVision) {
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("vision/config.json")).unwrap(),
    )
    .unwrap();
    let d = &v.dims;
    let num = |k: &str| cfg[k].as_u64().unwrap() as usize;
    assert_eq!(d.hidden_size, num("hidden_size"));
    assert_eq!(d.intermediate_size, num("intermediate_size"));
    assert_eq!(d.num_hidden_layers, num("num_hidden_layers"));
    assert_eq!(d.num_attention_heads, num("num_attention_heads"));
    assert_eq!(d.image_size, num("image_size"));
    assert_eq!(d.patch_size, num("patch_size"));
    assert_eq!(d.num_channels, num("num_channels"));
    assert_eq!(
        d.layer_norm_eps,
        cfg["layer_norm_eps"].as_f64().unwrap() as f32
    );
    assert_eq!(d.hidden_act, cfg["hidden_act"].as_str().unwrap());
    assert_eq!(
        d.vision_use_head,
        cfg["vision_use_head"].as_bool().unwrap_or(true)
    );

    let want = checkpoint();
    let mut got: Vec<&str> = v.tensors.names().collect();
    got.sort_unstable();
    let names: Vec<&str> = want.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(got, names, "tensor names");
    for (name, shape, data) in &want {
        let t = v.tensors.get(name).unwrap();
        assert_eq!(&t.shape().0, shape, "{name} shape");
        // Exact: the importer only moves f32 values, never computes with them.
        assert!(t.data() == data.as_slice(), "{name} values differ");
    }
    assert_eq!(v.outputs, ["last_hidden_state", "pooler_output"]);
    assert_eq!(v.tokens_output.as_deref(), Some("last_hidden_state"));
    assert_eq!(v.pooled_output.as_deref(), Some("pooler_output"));
}

#[test]
fn torchscript_export_dynamic_batch() {
    let v = import(&fixtures().join("model.onnx")).unwrap();
    assert_eq!(v.batch, None);
    check_against_checkpoint(&v);
}

#[test]
fn dynamo_export_external_data_fixed_batch() {
    let v = import(&fixtures().join("model-ext/model.onnx")).unwrap();
    assert_eq!(v.batch, Some(2));
    check_against_checkpoint(&v);
}

#[test]
fn missing_file_is_named() {
    let err = import(&fixtures().join("nope.onnx")).unwrap_err();
    assert!(matches!(err, OnnxError::Io { .. }), "{err}");
    assert!(err.to_string().contains("nope.onnx"));
}

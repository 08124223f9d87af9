//! The importer against transformers' own files (fixtures/siglip-tiny, made by
//! scripts/siglip_fixtures.py): preprocessing equal to `SiglipImageProcessor`'s
//! `pixel_values`, the checkpoint and its sharded whole-`SiglipModel` form giving
//! the same weights, and refusals that name what is wrong.

use std::path::{Path, PathBuf};

use tessera_graph::{TensorMap, encoder_layer};
use tessera_import::{
    Checkpoint, ImportError, TensorSource, encoder_config, parse_config, patches, preprocess,
    weights, write_output,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/siglip-tiny")
}

fn images() -> Vec<PathBuf> {
    ["a.png", "b.jpg"]
        .iter()
        .map(|n| fixtures().join("images").join(n))
        .collect()
}

fn expected() -> TensorMap {
    TensorMap::load(fixtures().join("expected.safetensors")).expect("expected.safetensors")
}

/// The PNG through the same steps as Pillow, bit for bit: the codes after the
/// resize are equal, so each value is equal. The JPEG is decoded by zune-jpeg,
/// not Pillow's libjpeg-turbo: their IDCT and chroma upsampling (the fixture is
/// 4:2:0) round differently, by up to 3 codes on a third of the decoded pixels
/// (measured), which the resize averages down. Bound: at most 3 codes
/// (3/127.5 after normalisation) anywhere, at most 0.75 of a code on average (0.49 measured).
#[test]
fn preprocess_matches_siglip_image_processor() {
    let cfg = Checkpoint::open(fixtures().join("vision"))
        .unwrap()
        .config()
        .clone();
    let px = preprocess(&images(), &cfg).unwrap();
    let want = expected();
    let want = want.get("pixel_values").unwrap();
    assert_eq!(px.shape(), want.shape());
    let per = px.data().len() / 2;
    let diff = |img: usize| {
        let r = img * per..(img + 1) * per;
        px.data()[r.clone()]
            .iter()
            .zip(&want.data()[r])
            .map(|(a, b)| (a - b).abs())
            .collect::<Vec<f32>>()
    };
    let png = diff(0);
    assert!(
        png.iter().all(|&d| d == 0.0),
        "PNG: max {}",
        png.iter().cloned().fold(0.0, f32::max)
    );
    let jpg = diff(1);
    let code = 1.0 / 127.5;
    let max = jpg.iter().cloned().fold(0.0, f32::max);
    let off = jpg.iter().filter(|&&d| d > 0.0).count();
    eprintln!(
        "JPEG: {off} of {} values differ, max {} codes",
        jpg.len(),
        max / code
    );
    let mean = jpg.iter().sum::<f32>() / jpg.len() as f32;
    eprintln!("JPEG: mean {} codes", mean / code);
    assert!(max <= 3.0 * code + 1e-6, "JPEG: max {} codes", max / code);
    assert!(mean <= 0.75 * code, "JPEG: mean {} codes", mean / code);
}

#[test]
fn patches_follow_the_graph_input() {
    let cfg = Checkpoint::open(fixtures().join("vision"))
        .unwrap()
        .config()
        .clone();
    let px = preprocess(&images(), &cfg).unwrap();
    let p = patches(&px, &cfg).unwrap();
    assert_eq!(p.shape().0, vec![2 * 16, 8 * 8 * 3]);
    // The same as the graph crate's patchify of the channels-last image.
    let (side, c) = (32, 3);
    let mut hwc = vec![0.0; px.data().len()];
    for b in 0..2 {
        for ch in 0..c {
            for y in 0..side {
                for x in 0..side {
                    hwc[((b * side + y) * side + x) * c + ch] =
                        px.data()[((b * c + ch) * side + y) * side + x];
                }
            }
        }
    }
    let via = tessera_graph::models::patchify(&hwc, 2, side, c, 8).unwrap();
    assert_eq!(p.data(), &via[..]);
}

#[test]
fn whole_sharded_model_gives_the_vision_model_weights() {
    let v = Checkpoint::open(fixtures().join("vision")).unwrap();
    let f = Checkpoint::open(fixtures().join("full")).unwrap();
    assert_eq!(v.config(), f.config());
    assert_eq!(v.names(), f.names());
    let graph = encoder_layer(&encoder_config(v.config(), 2)).unwrap();
    let wv = weights(v.config(), &v, &graph).unwrap();
    let wf = weights(f.config(), &f, &graph).unwrap();
    assert_eq!(wv, wf);
    wv.check_params(&graph).unwrap();
}

/// The checkpoint's tensors held in memory (the ONNX importer's hand-over)
/// give the same weights.
#[test]
fn tensor_map_source_gives_the_same_weights() {
    let v = Checkpoint::open(fixtures().join("vision")).unwrap();
    let mut map = TensorMap::new();
    for n in v.names() {
        map.insert(n.clone(), v.tensor(&n).unwrap().unwrap());
    }
    let graph = encoder_layer(&encoder_config(v.config(), 1)).unwrap();
    assert_eq!(
        weights(v.config(), &map, &graph).unwrap(),
        weights(v.config(), &v, &graph).unwrap()
    );

    // A missing tensor and a wrong shape are refused by name.
    let mut missing = map.clone();
    missing.remove("encoder.layers.1.mlp.fc2.weight");
    let e = weights(v.config(), &missing, &graph).unwrap_err();
    assert!(
        matches!(&e, ImportError::MissingTensor { name, .. } if name == "encoder.layers.1.mlp.fc2.weight"),
        "{e}"
    );
    let mut wrong = map.clone();
    wrong.insert(
        "head.attention.in_proj_weight",
        tessera_graph::HostTensor::zeros(vec![64, 192]),
    );
    let e = weights(v.config(), &wrong, &graph).unwrap_err();
    assert!(
        e.to_string().contains("head.attention.in_proj_weight"),
        "{e}"
    );
    assert!(e.to_string().contains("[192, 64]"), "{e}");
    // A vision tensor nothing is made from: another variant of the model.
    let mut extra = map.clone();
    extra.insert(
        "head.extra.weight",
        tessera_graph::HostTensor::zeros(vec![4]),
    );
    let e = weights(v.config(), &extra, &graph).unwrap_err();
    assert!(e.to_string().contains("head.extra.weight"), "{e}");
    // The first layer only: the second layer's tensors are not in use, and that is fine.
    let mut one = encoder_config(v.config(), 1);
    one.layers = 1;
    let g1 = encoder_layer(&one).unwrap();
    weights(v.config(), &map, &g1)
        .unwrap()
        .check_params(&g1)
        .unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tessera-import-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn corrupt_and_foreign_files_are_refused_without_panic() {
    let d = scratch("corrupt");
    copy_dir(&fixtures().join("vision"), &d);
    let st = d.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    // Truncated, header garbled, empty.
    for broken in [
        bytes[..bytes.len() / 2].to_vec(),
        {
            let mut b = bytes.clone();
            b[12] = b'#';
            b
        },
        vec![],
        vec![0xff; 8],
    ] {
        std::fs::write(&st, &broken).unwrap();
        let e = Checkpoint::open(&d).err().expect("refused");
        assert!(e.to_string().contains("model.safetensors"), "{e}");
    }
    std::fs::write(&st, &bytes).unwrap();
    // A config with an activation Tessera does not compute.
    let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
    std::fs::write(
        d.join("config.json"),
        cfg.replace("gelu_pytorch_tanh", "quick_gelu"),
    )
    .unwrap();
    let e = Checkpoint::open(&d).err().expect("refused");
    assert!(
        e.to_string().contains("hidden_act") && e.to_string().contains("quick_gelu"),
        "{e}"
    );
    // Not a checkpoint at all.
    let e = Checkpoint::open(d.join("nothing")).err().expect("refused");
    assert!(e.to_string().contains("config.json"), "{e}");
    // A shard index pointing outside its directory.
    let s = scratch("shards");
    copy_dir(&fixtures().join("full"), &s);
    let idx = std::fs::read_to_string(s.join("model.safetensors.index.json")).unwrap();
    std::fs::write(
        s.join("model.safetensors.index.json"),
        idx.replacen("model-00001-of-00015.safetensors", "../x.safetensors", 1),
    )
    .unwrap();
    let e = Checkpoint::open(&s).err().expect("refused");
    assert!(e.to_string().contains("../x.safetensors"), "{e}");
    // An image that is not one.
    let bad = d.join("not.png");
    std::fs::write(&bad, b"\x89PNG\r\n\x1a\nnonsense").unwrap();
    let cfg = parse_config("{\"image_size\": 32, \"patch_size\": 8}", "c").unwrap();
    let e = preprocess(&[bad], &cfg).unwrap_err();
    assert!(e.to_string().contains("not.png"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
    let _ = std::fs::remove_dir_all(&s);
}

#[test]
fn outputs_round_trip() {
    let d = scratch("out");
    std::fs::create_dir_all(&d).unwrap();
    let pooled = tessera_graph::HostTensor::new(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]).unwrap();
    let tokens = tessera_graph::HostTensor::zeros(vec![2, 4, 3]);
    write_output(&d.join("o.safetensors"), Some(&pooled), Some(&tokens)).unwrap();
    let back = TensorMap::load(d.join("o.safetensors")).unwrap();
    assert_eq!(back.get("pooled"), Some(&pooled));
    assert_eq!(back.get("tokens"), Some(&tokens));
    write_output(&d.join("o.npy"), Some(&pooled), None).unwrap();
    let e = write_output(&d.join("o.txt"), Some(&pooled), None).unwrap_err();
    assert!(e.to_string().contains("o.txt"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

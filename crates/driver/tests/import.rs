//! Tessera's simulated run of transformers' own SigLIP vision tower against
//! transformers' outputs (fixtures/siglip-tiny, made by
//! scripts/siglip_fixtures.py; no Python here): the checkpoint and its sharded
//! whole-`SiglipModel` form, the images, f16 and FP8 weights, and the
//! refusals.
//!
//! Tolerances are relative to the RMS of transformers' output, since the
//! embeddings' scale is the model's and the error's is f16 storage on the
//! tiles (2^-11 relative a rounding, a few dozen roundings deep) against f32
//! in torch. Measured with f16 weights on transformers' own pixels: max abs
//! error 0.31% of the RMS for `pooled`, 0.45% for `tokens`, cosine 0.999999;
//! the bound is 1% and 0.9999, twice the measured error and far below what a
//! wrong layout gives (a weight left untransposed: errors of the order of the
//! RMS). FP8 weights (3 mantissa bits, 2^-4 relative a weight) measure 18%
//! (`pooled`) and 26% (`tokens`, a few outlying values) and cosine 0.998:
//! bound 40% and 0.995. Decoding the JPEG fixture with another decoder than
//! Pillow's (up to 3 codes a pixel, `tessera-import`'s tests) moves that
//! image's outputs by 3.6% (`pooled`) and 4.5% (`tokens`) of the RMS, cosine
//! 0.99989: its bound is 7% and 0.999; the PNG, decoded as Pillow decodes it,
//! keeps the checkpoint's bound (0.27% and 0.41% measured).

use std::path::{Path, PathBuf};

use tessera_driver::{
    Checkpoint, Error, HostTensor, Import, Machine, Model, ModelKind, ModelSpec, NoProgress,
    Options, TensorSource, WeightDtype,
};
use tessera_graph::TensorMap;
use tessera_import::VisionConfig;

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

fn spec(dir: &str, images: Vec<PathBuf>, batch: usize, layers: Option<usize>) -> ModelSpec {
    ModelSpec {
        kind: ModelKind::HuggingFace {
            dir: fixtures().join(dir),
            tokens: true,
            layers,
            images,
        },
        batch,
        seed: 1,
    }
}

/// Compiles and simulates `model`; the run must pass Tessera's own validation
/// too. Returns (pooled, tokens).
fn run(model: &Model, dtype: WeightDtype) -> (HostTensor, HostTensor) {
    let machine = Machine::load("c600").unwrap();
    let o = Options {
        finalists: 1,
        weight_dtype: dtype,
        ..Options::default()
    };
    let c = tessera_driver::compile(&machine, model, &o, &NoProgress).expect("compile");
    let r = tessera_driver::simulate(model, &c, &Default::default(), &NoProgress).expect("run");
    let v = tessera_driver::validate(model, &c, &r, &NoProgress).expect("validate");
    assert!(v.passed(), "{:?}", v.mismatch);
    let (p, t) = model.embeddings(&r, 2).expect("embeddings");
    (p.expect("pooled"), t.expect("tokens"))
}

/// (max abs error / RMS of the expected, smallest cosine over rows of `row`
/// values) of `got` against `want` for images `which`.
fn compare(got: &HostTensor, want: &HostTensor, which: &[usize]) -> (f64, f64) {
    assert_eq!(got.shape(), want.shape());
    let per = want.data().len() / want.shape().dims()[0];
    let row = *want.shape().dims().last().unwrap();
    let (mut err, mut sq, mut n, mut cos) = (0f64, 0f64, 0usize, 1f64);
    for &i in which {
        let (g, w) = (
            &got.data()[i * per..(i + 1) * per],
            &want.data()[i * per..(i + 1) * per],
        );
        for (a, b) in g.iter().zip(w) {
            err = err.max(f64::from((a - b).abs()));
            sq += f64::from(*b) * f64::from(*b);
            n += 1;
        }
        for (gr, wr) in g.chunks(row).zip(w.chunks(row)) {
            let dot: f64 = gr
                .iter()
                .zip(wr)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let na: f64 = gr.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
            let nb: f64 = wr.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>().sqrt();
            cos = cos.min(dot / (na * nb));
        }
    }
    (err / (sq / n as f64).sqrt(), cos)
}

/// The model `config` and `source` give, with transformers' own
/// `pixel_values` as its input: Tessera's numerics alone, no decoder in between.
fn on_transformers_pixels(config: &VisionConfig, source: &dyn TensorSource) -> Model {
    let machine = Machine::load("c600").unwrap();
    let mut model = Model::import(
        &Import {
            config,
            source,
            images: &[],
            batch: 2,
            tokens: true,
            layers: None,
            seed: 1,
        },
        &machine,
    )
    .unwrap();
    let px = expected().get("pixel_values").unwrap().clone();
    let mut p = tessera_import::patches(&px, config).unwrap();
    p.round_to_f16();
    model.inputs.insert("patches", p);
    model
}

fn check(what: &str, got: &HostTensor, want: &HostTensor, which: &[usize], err: f64, cos: f64) {
    let (e, c) = compare(got, want, which);
    eprintln!(
        "{what}: max abs error {:.3}% of RMS, cosine {c:.7}",
        100.0 * e
    );
    assert!(
        e <= err && c >= cos,
        "{what}: error {e:.5} of RMS (bound {err}), cosine {c:.7} (bound {cos})"
    );
}

#[test]
fn checkpoint_matches_transformers_f16_and_fp8() {
    let want = expected();
    let ckpt = Checkpoint::open(fixtures().join("vision")).unwrap();
    let model = on_transformers_pixels(ckpt.config(), &ckpt);
    let (p, t) = run(&model, WeightDtype::F16);
    check(
        "f16 pooled",
        &p,
        want.get("pooled").unwrap(),
        &[0, 1],
        0.01,
        0.9999,
    );
    check(
        "f16 tokens",
        &t,
        want.get("tokens").unwrap(),
        &[0, 1],
        0.01,
        0.9999,
    );
    let (p, t) = run(&model, WeightDtype::Fp8);
    check(
        "fp8 pooled",
        &p,
        want.get("pooled").unwrap(),
        &[0, 1],
        0.40,
        0.995,
    );
    check(
        "fp8 tokens",
        &t,
        want.get("tokens").unwrap(),
        &[0, 1],
        0.40,
        0.995,
    );
}

/// (pooled, tokens) of a run on the fixture's images against transformers':
/// the PNG (image 0, decoded as Pillow decodes it) within the checkpoint's
/// bound, the JPEG (image 1) within the decoder's.
fn check_images(what: &str, got: (&HostTensor, &HostTensor), want: (&HostTensor, &HostTensor)) {
    for (image, err, cos) in [("PNG", 0.01, 0.9999), ("JPEG", 0.07, 0.999)] {
        let which = [usize::from(image == "JPEG")];
        check(
            &format!("{what} {image} pooled"),
            got.0,
            want.0,
            &which,
            err,
            cos,
        );
        check(
            &format!("{what} {image} tokens"),
            got.1,
            want.1,
            &which,
            err,
            cos,
        );
    }
}

/// From the images through the sharded whole model, as `tessera run --weights
/// full --image a.png --image b.jpg` does: the PNG, decoded as Pillow decodes
/// it, within the checkpoint's bound; the JPEG within the decoder's.
#[test]
fn whole_model_from_images_matches_transformers() {
    let machine = Machine::load("c600").unwrap();
    let want = expected();
    for dir in ["full", "vision"] {
        let model = Model::build(&spec(dir, images(), 2, None), &machine).unwrap();
        let (p, t) = run(&model, WeightDtype::F16);
        let (wp, wt) = (want.get("pooled").unwrap(), want.get("tokens").unwrap());
        check_images(dir, (&p, &t), (wp, wt));
    }
}

#[test]
fn refusals_name_what_is_wrong() {
    let machine = Machine::load("c600").unwrap();
    let build = |s: &ModelSpec| Model::build(s, &machine).expect_err("refused");
    let e = build(&spec("vision", images(), 3, None));
    assert!(
        matches!(
            e,
            Error::ImageBatch {
                images: 2,
                batch: 3
            }
        ),
        "{e}"
    );
    let e = build(&spec("vision", vec![], 1, Some(3)));
    assert!(
        matches!(e, Error::CheckpointLayers { asked: 3, has: 2 }),
        "{e}"
    );
    // The first layer alone is a model of its own.
    Model::build(&spec("full", vec![], 1, Some(1)), &machine).unwrap();

    let ckpt = Checkpoint::open(fixtures().join("vision")).unwrap();
    let mut map = TensorMap::new();
    for n in ckpt.names() {
        map.insert(n.clone(), ckpt.tensor(&n).unwrap().unwrap());
    }
    let import = |source: &dyn TensorSource| {
        Model::import(
            &Import {
                config: ckpt.config(),
                source,
                images: &[],
                batch: 1,
                tokens: false,
                layers: None,
                seed: 1,
            },
            &machine,
        )
    };
    import(&map).unwrap();
    let mut missing = map.clone();
    missing.remove("head.probe");
    let e = import(&missing).expect_err("refused").to_string();
    assert!(e.contains("head.probe"), "{e}");
    let mut wrong = map.clone();
    wrong.insert(
        "encoder.layers.0.mlp.fc1.weight",
        HostTensor::zeros(vec![64, 128]),
    );
    let e = import(&wrong).expect_err("refused").to_string();
    assert!(
        e.contains("encoder.layers.0.mlp.fc1.weight") && e.contains("[128, 64]"),
        "{e}"
    );
    let mut cfg = ckpt.config().clone();
    cfg.hidden_act = "relu".into();
    let e = Model::import(
        &Import {
            config: &cfg,
            source: &map,
            images: &[],
            batch: 1,
            tokens: false,
            layers: None,
            seed: 1,
        },
        &machine,
    )
    .expect_err("refused")
    .to_string();
    assert!(e.contains("hidden_act") && e.contains("relu"), "{e}");
}

/// `vision_use_head: false`: the tower without the pooling head, whose only
/// output is the tokens, transformers' `last_hidden_state` all the same.
#[test]
fn without_the_head_the_tokens_still_match() {
    let machine = Machine::load("c600").unwrap();
    let ckpt = Checkpoint::open(fixtures().join("vision")).unwrap();
    let mut map = TensorMap::new();
    for n in ckpt.names().into_iter().filter(|n| !n.starts_with("head.")) {
        map.insert(n.clone(), ckpt.tensor(&n).unwrap().unwrap());
    }
    let mut cfg = ckpt.config().clone();
    cfg.vision_use_head = false;
    let mut model = Model::import(
        &Import {
            config: &cfg,
            source: &map,
            images: &[],
            batch: 2,
            tokens: false,
            layers: None,
            seed: 1,
        },
        &machine,
    )
    .unwrap();
    let px = expected().get("pixel_values").unwrap().clone();
    let mut p = tessera_import::patches(&px, &cfg).unwrap();
    p.round_to_f16();
    model.inputs.insert("patches", p);
    let o = Options {
        finalists: 1,
        ..Options::default()
    };
    let c = tessera_driver::compile(&machine, &model, &o, &NoProgress).expect("compile");
    let r = tessera_driver::simulate(&model, &c, &Default::default(), &NoProgress).unwrap();
    let (pooled, tokens) = model.embeddings(&r, 2).unwrap();
    assert!(pooled.is_none());
    let want = expected();
    check(
        "no head, tokens",
        &tokens.unwrap(),
        want.get("tokens").unwrap(),
        &[0, 1],
        0.01,
        0.9999,
    );
}

fn onnx_spec(file: &str, images: Vec<PathBuf>, batch: usize) -> ModelSpec {
    ModelSpec {
        kind: ModelKind::Onnx {
            file: fixtures().join(file),
            tokens: true,
            layers: None,
            images,
        },
        batch,
        seed: 1,
    }
}

/// The same tower from its ONNX exports (TorchScript at opset 17 with a dynamic
/// batch; dynamo at opset 18, batch fixed at 2, external data), as `tessera run
/// --onnx FILE --image a.png --image b.jpg` builds it: within the checkpoint's
/// bounds on transformers' own pixels, and the images' bounds from the files.
#[test]
fn onnx_exports_match_transformers() {
    let machine = Machine::load("c600").unwrap();
    let want = expected();
    let (wp, wt) = (want.get("pooled").unwrap(), want.get("tokens").unwrap());
    for file in ["model.onnx", "model-ext/model.onnx"] {
        let onnx = tessera_onnx::import(&fixtures().join(file)).unwrap();
        let ckpt = Checkpoint::open(fixtures().join("vision")).unwrap();
        let model = on_transformers_pixels(ckpt.config(), &onnx.tensors);
        let (p, t) = run(&model, WeightDtype::F16);
        check(&format!("{file} pooled"), &p, wp, &[0, 1], 0.01, 0.9999);
        check(&format!("{file} tokens"), &t, wt, &[0, 1], 0.01, 0.9999);

        let model = Model::build(&onnx_spec(file, images(), 2), &machine).unwrap();
        let (p, t) = run(&model, WeightDtype::F16);
        check_images(file, (&p, &t), (wp, wt));
    }
}

/// A file that fixes its batch is refused at another, naming both; one whose
/// batch is dynamic takes any.
#[test]
fn an_onnx_files_fixed_batch_is_kept() {
    let machine = Machine::load("c600").unwrap();
    match Model::build(&onnx_spec("model-ext/model.onnx", vec![], 1), &machine) {
        Err(Error::OnnxBatch {
            fixed: 2, batch: 1, ..
        }) => {}
        other => panic!("expected OnnxBatch, got {:?}", other.map(|_| ())),
    }
    assert_eq!(
        tessera_driver::onnx_fixed_batch(&fixtures().join("model-ext/model.onnx")).unwrap(),
        Some(2)
    );
    assert!(Model::build(&onnx_spec("model.onnx", vec![], 3), &machine).is_ok());
}

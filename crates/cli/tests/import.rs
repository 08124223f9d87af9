//! `--weights`, `--image` and `--output` through the binary: a Hugging Face
//! checkpoint's embedding of two images written to a file that reads back with
//! transformers' values, and the refusals, each exit 2 naming what is wrong.

mod common;

use common::{scratch, tessera};
use std::path::{Path, PathBuf};
use tessera_graph::TensorMap;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/siglip-tiny")
}

fn f(rel: &str) -> String {
    fixtures().join(rel).display().to_string()
}

/// Reads a NumPy 1.0 f32 file as the test's own independent reader: shape
/// and values.
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let shape = header.split("'shape': (").nth(1).unwrap();
    let shape: Vec<usize> = shape[..shape.find(')').unwrap()]
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let data = b[10 + hlen..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, data)
}

/// Largest |got - want| and the RMS of `want`: errors are bounded relative to
/// the embedding's own scale (crates/driver/tests/import.rs says why).
fn error_and_rms(got: &[f32], want: &[f32]) -> (f32, f32) {
    let rms = (want.iter().map(|v| v * v).sum::<f32>() / want.len() as f32).sqrt();
    let err = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    (err, rms)
}

#[test]
fn run_writes_the_embeddings_of_the_images() {
    let d = scratch("import-npy");
    let out = d.join("x.npy");
    let r = tessera(&[
        "run",
        "--weights",
        &f("vision"),
        "--image",
        &f("images/a.png"),
        "--image",
        &f("images/b.jpg"),
        "--output",
        out.to_str().unwrap(),
        "--finalists",
        "1",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.text());
    let json: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(json["output"], out.to_str().unwrap());
    assert_eq!(json["status"], "ok");
    let (shape, got) = read_npy(&out);
    assert_eq!(shape, vec![2, 64]);
    let want = TensorMap::load(fixtures().join("expected.safetensors")).unwrap();
    let (err, rms) = error_and_rms(&got, want.get("pooled").unwrap().data());
    // The bound of the driver's image test (crates/driver/tests/import.rs):
    // the JPEG's decoder difference dominates.
    assert!(err <= 0.07 * rms, "max abs error {err}, RMS {rms}");

    // safetensors with the tokens.
    let st = d.join("x.safetensors");
    let r = tessera(&[
        "run",
        "--weights",
        &f("full"),
        "--image",
        &f("images/a.png"),
        "--tokens",
        "--output",
        st.to_str().unwrap(),
        "--finalists",
        "1",
    ]);
    assert_eq!(r.code, 0, "{}", r.text());
    assert!(r.stdout.contains("embeddings written to"), "{}", r.stdout);
    let back = TensorMap::load(&st).unwrap();
    assert_eq!(back.get("pooled").unwrap().shape().dims(), &[1, 64]);
    assert_eq!(back.get("tokens").unwrap().shape().dims(), &[1, 16, 64]);
}

#[test]
fn refusals_exit_2_naming_the_problem() {
    let d = scratch("import-bad");
    let bad_cfg = d.join("bad");
    std::fs::create_dir_all(&bad_cfg).unwrap();
    std::fs::copy(
        fixtures().join("vision/model.safetensors"),
        bad_cfg.join("model.safetensors"),
    )
    .unwrap();
    let cfg = std::fs::read_to_string(fixtures().join("vision/config.json")).unwrap();
    std::fs::write(
        bad_cfg.join("config.json"),
        cfg.replace("gelu_pytorch_tanh", "gelu"),
    )
    .unwrap();
    let corrupt = d.join("corrupt");
    std::fs::create_dir_all(&corrupt).unwrap();
    std::fs::write(corrupt.join("config.json"), &cfg).unwrap();
    std::fs::write(
        corrupt.join("model.safetensors"),
        b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}",
    )
    .unwrap();
    let text = d.join("not-an-image.png");
    std::fs::write(&text, "hello").unwrap();
    let (bad_cfg, corrupt, text) = (
        bad_cfg.display().to_string(),
        corrupt.display().to_string(),
        text.display().to_string(),
    );
    let out = d.join("o.txt").display().to_string();
    let vision = f("vision");
    let a = f("images/a.png");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--weights", &vision, "--image", &a, "--batch", "2"],
            "--batch 2 conflicts with the 1 --image",
        ),
        (
            vec!["run", "--weights", &vision, "--layers", "3"],
            "3 encoder layers asked for, but the checkpoint has 2",
        ),
        (
            vec!["run", "--weights", &vision, "--size", "tiny"],
            "--size cannot be given",
        ),
        (
            vec!["run", "--image", &a],
            "--image is an input of an imported model",
        ),
        (
            vec!["run", "--weights", &bad_cfg],
            "`hidden_act` = \"gelu\"",
        ),
        (
            vec!["run", "--weights", &corrupt],
            "invalid safetensors file",
        ),
        (
            vec!["run", "--weights", &vision, "--image", &text],
            "not-an-image.png",
        ),
        (
            vec!["run", "--weights", &vision, "--output", &out],
            "as .npy or .safetensors",
        ),
        (
            vec!["run", "--weights", "/nonexistent/dir"],
            "no config.json",
        ),
    ];
    for (args, needle) in cases {
        let r = tessera(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.text());
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
        assert!(!r.stderr.contains("panicked"), "{args:?}: {}", r.stderr);
    }
}

/// `--onnx` as the README shows it: the dynamic-batch export takes its batch
/// from the images, the fixed one from the file; an unmappable file and a
/// batch the file does not fix exit 2.
#[test]
fn run_from_an_onnx_file() {
    let d = scratch("import-onnx");
    let out = d.join("o.npy");
    let r = tessera(&[
        "run",
        "--onnx",
        &f("model.onnx"),
        "--image",
        &f("images/a.png"),
        "--output",
        out.to_str().unwrap(),
        "--finalists",
        "1",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.text());
    let (shape, got) = read_npy(&out);
    assert_eq!(shape, vec![1, 64]);
    let want = TensorMap::load(fixtures().join("expected.safetensors")).unwrap();
    let (err, rms) = error_and_rms(&got, &want.get("pooled").unwrap().data()[..64]);
    // The PNG's bound in the driver's test: f16 on the tiles against f32.
    assert!(err <= 0.01 * rms, "max abs error {err}, RMS {rms}");

    let pkg = d.join("o.tsp");
    let pkg = pkg.to_str().unwrap();
    let r = tessera(&[
        "compile",
        "--onnx",
        &f("model-ext/model.onnx"),
        "--output",
        pkg,
        "--finalists",
        "1",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.text());
    let r = tessera(&[
        "compile",
        "--onnx",
        &f("model-ext/model.onnx"),
        "--output",
        pkg,
        "--batch",
        "3",
    ]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(r.stderr.contains("fixes the batch at 2"), "{}", r.stderr);
    let bad = d.join("bad.onnx");
    std::fs::write(&bad, b"not a protobuf at all").unwrap();
    let r = tessera(&["compile", "--onnx", bad.to_str().unwrap(), "--output", pkg]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(r.stderr.contains("bad.onnx"), "{}", r.stderr);
}

//! Model configuration files: the fields of `EncoderLayerConfig`, validated with
//! errors that name the file and the problem.

use tessera_graph::{EncoderLayerConfig, MlpConfig, encoder_layer, mlp};

#[test]
fn presets_and_files() {
    let m = MlpConfig::base(2);
    assert_eq!((m.rows(), m.width, m.hidden), (392, 768, 3072));
    mlp(&m).unwrap();
    let base = EncoderLayerConfig::base(2);
    assert_eq!(
        (base.tokens(), base.head_dim(), base.patch_dim()),
        (196, 64, 768)
    );
    base.validate().unwrap();
    let so = EncoderLayerConfig::so400m(4);
    assert_eq!((so.tokens(), so.head_dim()), (729, 72));
    // A file that restates So400m gives So400m; missing fields default to it.
    let text = "image_size = 378\nchannels = 3\npatch = 14\nwidth = 1152\nheads = 16\n\
                mlp_hidden = 4304\nlayers = 1\neps = 1e-6\n";
    assert_eq!(
        EncoderLayerConfig::from_toml(text, "so.toml", 4).unwrap(),
        so
    );
    assert_eq!(
        EncoderLayerConfig::from_toml("layers = 1", "x.toml", 4).unwrap(),
        so
    );
    let small = EncoderLayerConfig::from_toml(
        "image_size = 32\npatch = 8\nwidth = 48\nheads = 3\nmlp_hidden = 96\n",
        "small.toml",
        2,
    )
    .unwrap();
    assert_eq!((small.tokens(), small.head_dim(), small.batch), (16, 16, 2));
    encoder_layer(&small).unwrap();
}

#[test]
fn bad_files_say_what_and_where() {
    let cases = [
        (
            "width = 1000\nheads = 16",
            "width 1000 is not divisible into 16 heads",
        ),
        (
            "image_size = 380",
            "image_size 380 is not a multiple of patch 14",
        ),
        ("heads = 0", "heads must be > 0"),
        ("layers = 0", "layers must be > 0"),
        ("eps = -1.0", "eps -1 must be finite and > 0"),
        ("widht = 768", "widht"),
        ("width = \"wide\"", "width"),
        ("width = -3", "width"),
    ];
    for (text, want) in cases {
        let err = EncoderLayerConfig::from_toml(text, "bad.toml", 2)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bad.toml") && err.contains(want),
            "{text}: {err}"
        );
        // The prefix once: `invalid model config: bad.toml: ...`, not twice.
        assert_eq!(err.matches("invalid model config").count(), 1, "{err}");
        assert!(err.starts_with("invalid model config: bad.toml: "), "{err}");
    }
    let err = EncoderLayerConfig::from_toml("width = 768", "b.toml", 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("batch must be > 0"), "{err}");
}

/// docs/limits.md: dimensions past the accepted ranges are configuration errors
/// naming the field and the limit, never an overflow.
#[test]
fn limits_are_errors_not_overflows() {
    use tessera_graph::{MAX_BATCH, MAX_DIM};
    let e = mlp(&MlpConfig::tiny(usize::MAX)).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "batch {} is above the largest accepted, {MAX_BATCH}",
            usize::MAX
        )),
        "{e}"
    );
    // Each dimension in range, their product (rows) not.
    let mut m = MlpConfig::tiny(MAX_BATCH);
    m.tokens = MAX_DIM;
    let e = mlp(&m).unwrap_err().to_string();
    assert!(
        e.contains("rows, batch x tokens (1048576 x 1048576)"),
        "{e}"
    );
    let mut c = EncoderLayerConfig::so400m(1);
    c.width = MAX_DIM + 1;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("width 1048577 is above the largest accepted"),
        "{e}"
    );
    mlp(&MlpConfig::tiny(MAX_BATCH)).unwrap();
}

/// Found by `tessera bench fuzz --target config`: dimensions that each pass the
/// positivity and divisibility checks overflowed shape arithmetic in the graph
/// builder (a panic in debug builds, a wrapped shape in release), and a huge layer
/// count built operations until memory ran out. All are refused when read (the
/// per-dimension limit of docs/limits.md catches the first three; the
/// 2^40-element bound stays behind it for products of dimensions in range).
#[test]
fn fuzz_found_huge_dimensions_are_refused_when_read() {
    let cases = [
        (
            "patch = 178510\nimage_size = 2856160\nchannels = 6\nheads = 2\n\
             width = 9223372036854775808\nlayers = 2\neps = 1\n",
            "image_size 2856160 is above the largest accepted",
        ),
        (
            "patch = 7\nimage_size = 56\nchannels = 9223372036854775807\nheads = 3\n\
             width = 39\nmlp_hidden = 11\nlayers = 4\n",
            "channels 9223372036854775807 is above the largest accepted",
        ),
        (
            "image_size = 4294967296\npatch = 1\nwidth = 16\nheads = 1\n",
            "image_size 4294967296 is above the largest accepted",
        ),
        (
            "layers = 1099511627776",
            "layers 1099511627776 is above the largest accepted",
        ),
        ("layers = 5000", "layers 5000 is more than 1024"),
    ];
    for (text, want) in cases {
        let err = match EncoderLayerConfig::from_toml(text, "fuzz.toml", 2) {
            Ok(cfg) => panic!("{text}: accepted {cfg:?}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(want), "{text}: {err}");
    }
    // The most layers still build.
    let cfg = EncoderLayerConfig::from_toml(
        "image_size = 16\npatch = 4\nwidth = 32\nheads = 4\nmlp_hidden = 64\nlayers = 1024\n",
        "ok.toml",
        2,
    )
    .unwrap();
    encoder_layer(&cfg).unwrap();
}

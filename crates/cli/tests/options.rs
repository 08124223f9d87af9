//! What a new user of `tessera` meets first: options that conflict or go unused
//! refused before any work, outputs that cannot be written found before the
//! compile, help that says what `--json` does, error messages that say things
//! once.

mod common;

use common::{scratch, tessera};
use std::path::{Path, PathBuf};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Options that conflict, or that the command would not use, are refused with
/// exit 2 before any work, naming the option.
#[test]
fn conflicting_and_unused_options_are_refused() {
    let dir = scratch("conflicts");
    let config = write(&dir, "l.toml", "width = 64\nheads = 2\n");
    let out = dir.join("o.tpk");
    for (args, needle) in [
        (
            vec!["run", "--config", s(&config), "--size", "base"],
            "--size and --config both set the layer's dimensions",
        ),
        (
            vec![
                "compile",
                "--size",
                "tiny",
                "--profile",
                "p.html",
                "-o",
                s(&out),
            ],
            "--profile writes what a run did: `tessera compile` does not run the model",
        ),
        (
            vec![
                "compile",
                "--size",
                "tiny",
                "--trace",
                "t.json",
                "-o",
                s(&out),
            ],
            "--trace writes what a run did",
        ),
        (
            vec![
                "run",
                "--size",
                "tiny",
                "--finalists",
                "1",
                "--simulate-finalists",
                "2",
            ],
            "--simulate-finalists selects among finalists: it needs --finalists above 1",
        ),
        (
            vec!["run", "--model", "mlp", "--size", "tiny", "--row-attention"],
            "--row-attention lowers attentions; it applies to --model layer only",
        ),
        (
            vec!["run", "--size", "tiny", "--mutate-kernel", "fc9"],
            "--mutate-kernel: `fc9` has no constant to mutate",
        ),
        (
            vec!["run", "--size", "tiny", "--layers", "0"],
            "--layers must be at least 1",
        ),
        (
            vec!["run", "--model", "mlp", "--size", "tiny", "--layers", "2"],
            "--layers sets the encoder's layer count; it applies to --model layer only",
        ),
    ] {
        let r = tessera(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.text());
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
        assert!(!out.exists(), "{args:?} wrote a package");
    }
}

/// An output that cannot be written is found before the compile, not after a
/// run of minutes: exit 2 at once, naming the option and the path, nothing
/// written anywhere.
#[test]
fn unwritable_outputs_are_refused_before_any_work() {
    let dir = scratch("unwritable");
    let missing = dir.join("no/such/dir/p.html");
    let m = s(&missing);
    let start = std::time::Instant::now();
    for (args, flag) in [
        (vec!["run", "--size", "so400m", "--profile", m], "--profile"),
        (vec!["run", "--size", "so400m", "--trace", m], "--trace"),
        (vec!["compile", "--size", "so400m", "-o", m], "--output"),
        (
            vec!["compile", "--size", "so400m", "-o", s(&dir)],
            "--output",
        ),
    ] {
        let r = tessera(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.text());
        assert!(
            r.stderr.starts_with(&format!("error: {flag} ")),
            "{args:?}: {}",
            r.stderr
        );
    }
    // Refused before the So400m layer's weights exist, let alone its compile.
    assert!(start.elapsed().as_secs() < 20, "{:?}", start.elapsed());
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// `--json` says what it does; the seed-bug switch is not in the help.
#[test]
fn help_describes_json_and_hides_internal_switches() {
    for cmd in ["run", "compile", "sim", "place"] {
        let r = tessera(&[cmd, "--help"]);
        assert_eq!(r.code, 0, "{}", r.text());
        let json = r
            .stdout
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--json"))
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(json.contains("JSON"), "{cmd}: {json:?}");
        assert!(
            !r.stdout.contains("weaken-rearrange-contract"),
            "{cmd}: {}",
            r.stdout
        );
    }
}

/// A bad layer configuration is named once, after one prefix.
#[test]
fn a_bad_config_is_reported_with_one_prefix() {
    let dir = scratch("prefix");
    let bad = write(&dir, "img.toml", "image_size = 100\npatch = 14\n");
    let r = tessera(&["run", "--config", s(&bad)]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert_eq!(
        r.stderr.matches("invalid model config").count(),
        1,
        "{}",
        r.stderr
    );
    assert!(
        r.stderr
            .contains(&format!("invalid model config: {}: ", s(&bad))),
        "{}",
        r.stderr
    );
}

/// `--layers N` stacks N encoder layers, with `--size` or over a config file's
/// own `layers`: every layer's operations are in the plan, and no others.
#[test]
fn layers_sets_the_encoder_layer_count() {
    let dir = scratch("layers");
    let config = write(
        &dir,
        "l.toml",
        "width = 64\nheads = 2\nmlp_hidden = 128\nimage_size = 42\nlayers = 5\n",
    );
    for (extra, layers) in [
        (vec!["--size", "tiny", "--layers", "3"], 3),
        (vec!["--config", s(&config), "--layers", "2"], 2),
    ] {
        let out = dir.join(format!("l{layers}.tpk"));
        let mut args = vec![
            "compile",
            "--machine",
            "small",
            "--finalists",
            "1",
            "--json",
            "-o",
            s(&out),
        ];
        args.extend(extra);
        let r = tessera(&args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.text());
        // The identical layers are lowered once and run as a loop of that
        // many iterations; its weights are bound once a layer.
        let json: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
        assert_eq!(json["loop_count"], layers, "{args:?}");
        assert!(r.stdout.contains("layers.0.mlp.fc2"), "{args:?}");
        assert!(
            !r.stdout.contains(&format!("layers.{layers}.")),
            "{args:?}: a layer too many"
        );
    }
}

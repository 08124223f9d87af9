//! The whole vision tower through the `tessera` binary, on the tiny configuration:
//! what `run`, `compile` and the benches print and write, their exit codes, and
//! what needs a process of its own (a thread count). The compiler's paths and
//! validation's test hooks are tested through the library
//! (`crates/driver/tests/layer.rs`).

use std::process::Command;

mod common;

/// Exit code and everything printed.
fn tessera(args: &[&str]) -> (i32, String) {
    let r = common::tessera(args);
    (r.code, r.text())
}

#[test]
fn tiny_layer_runs_and_validates() {
    let (code, text) = tessera(&[
        "run",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--tokens",
        "--json",
    ]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["status"], "ok");
    let outputs: Vec<&str> = v["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(outputs, ["tokens", "pooled"], "{text}");
    // Exchange is code in the tiles' SRAM, reported by category.
    let code = &v["code"];
    let x = code["max_per_tile"]["exchange_code"].as_u64().unwrap();
    assert!(x > 0, "{code}");
    assert!(
        code["total"]["exchange_code"].as_u64().unwrap() >= x,
        "{code}"
    );
    assert!(code["exchange_messages_on_that_tile"].as_u64().unwrap() > 0);
    // Every operation's floor is one of the three bounds and never above what the
    // simulator achieved: a floor above it would mean the machine model or the
    // floor is wrong.
    for op in v["ops"].as_array().expect("ops") {
        let bound = op["bound"].as_str().unwrap();
        assert!(["amp", "exchange", "host", "none"].contains(&bound), "{op}");
        let share = op["floor_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&share), "{op}");
        if op["kind"] == "linear" {
            assert!(op["floor_cycles"].as_u64().unwrap() > 0, "{op}");
        }
    }
    // The inference's input transfer belongs to the first operation, its outputs'
    // to the output operation.
    let ops = v["ops"].as_array().unwrap();
    assert!(ops[0]["host"].as_u64().unwrap() > 0, "{}", ops[0]);
    let last = ops.last().unwrap();
    assert_eq!(last["kind"], "output");
    assert!(last["host"].as_u64().unwrap() > 0, "{last}");
    assert!(v["encoder"]["cycles"].as_u64().unwrap() > 0);
    let ops = v["ops"].as_array().unwrap();
    for kind in ["linear", "attention", "layer_norm"] {
        assert!(
            ops.iter().any(|o| o["kind"] == kind),
            "no {kind} in {ops:?}"
        );
    }
    assert!(v["max_abs_error"].as_f64().unwrap() <= v["tolerance"].as_f64().unwrap());
    assert!(v["cosine"].as_f64().unwrap() > 0.9999);
    // The run's FLOP are what the tiles execute, the rows' sum: the pooling head's
    // absorbed key and value projections run on no tile and are not credited.
    let executed: u64 = ops.iter().map(|o| o["flop"].as_u64().unwrap()).sum();
    assert_eq!(v["flop"].as_u64(), Some(executed), "{text}");
    // Each linear says which AMP mode its FLOP are held to; nothing else claims one.
    for op in ops {
        let want = (op["kind"] == "linear").then_some("f16");
        assert_eq!(op["partials"].as_str(), want, "{op}");
    }
}

/// `bench sensitivity --model layer`: every assumption halved and doubled, the
/// layer at the two ends of the shared-bus exchange rule, the same measurements as
/// the halved cells where those are the same machines, and with exchange code and
/// bytes overlapped.
#[test]
fn sensitivity_reports_the_exchange_rules_at_their_ends() {
    let r = common::tessera(&[
        "bench",
        "sensitivity",
        "--model",
        "layer",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--batch",
        "1",
        "--json",
    ]);
    assert_eq!(r.code, 0, "{}", r.text());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v["model"], "layer");
    let bounds = v["exchange_rule_bounds"].as_array().expect("bounds");
    let ends: Vec<_> = bounds
        .iter()
        .map(|b| (b["field"].as_str().unwrap(), b["value"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        ends,
        [
            ("tiles_per_shared_exchange_bus", 1),
            ("exchange_bytes_per_cycle", 2)
        ]
    );
    let rows = v["rows"].as_array().expect("rows");
    for b in bounds {
        assert!(b["cycles"].as_u64().unwrap() > 0, "{b}");
        assert!(!b["reading"].as_str().unwrap().is_empty(), "{b}");
        let row = rows.iter().find(|r| r["field"] == b["field"]).unwrap();
        assert_eq!(row["halved"]["value"], b["value"], "{row}");
        assert_eq!(row["halved"]["cycles"], b["cycles"], "{row}");
    }
    // The machine charges code and bytes one after the other; overlapping them can
    // only shorten a layer whose tiles run exchange code beside their bytes.
    let code = v["exchange_code_bounds"].as_array().expect("code bounds");
    assert_eq!(code.len(), 1, "{code:?}");
    let b = &code[0];
    assert_eq!(b["field"], "exchange_code_overlap_percent", "{b}");
    assert_eq!(b["value"], 100, "{b}");
    assert!(!b["reading"].as_str().unwrap().is_empty(), "{b}");
    let overlapped = b["cycles"].as_u64().unwrap();
    let baseline = v["baseline_cycles"].as_u64().unwrap();
    assert!(overlapped < baseline, "{overlapped} against {baseline}");
    assert!(b["change"].as_f64().unwrap() < 0.0, "{b}");
}

/// The layer's result is `pooled`; the tokens go to the host only when asked for,
/// and only the layer has them.
#[test]
fn the_tokens_are_an_output_on_request() {
    let (code, text) = tessera(&["run", "--size", "tiny", "--finalists", "1", "--json"]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let outputs = v["outputs"].as_array().expect("outputs");
    assert_eq!(outputs.len(), 1, "{text}");
    assert_eq!(outputs[0]["name"], "pooled");
    let (code, text) = tessera(&["run", "--model", "mlp", "--size", "tiny", "--tokens"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("--tokens"), "{text}");
}

#[test]
fn config_files_are_checked() {
    let dir = std::env::temp_dir().join(format!("tessera-layer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "width = 50\nheads = 4\n").unwrap();
    let (code, text) = tessera(&[
        "compile",
        "--config",
        bad.to_str().unwrap(),
        "-o",
        "/dev/null",
    ]);
    assert_ne!(code, 0);
    assert!(text.contains("not divisible into 4 heads"), "{text}");
    let huge = dir.join("huge.toml");
    std::fs::write(&huge, "width = 65536\nmlp_hidden = 1048576\nheads = 16\n").unwrap();
    let (code, text) = tessera(&[
        "compile",
        "--config",
        huge.to_str().unwrap(),
        "-o",
        "/dev/null",
    ]);
    assert_ne!(code, 0);
    assert!(text.contains("cannot fit"), "{text}");
}

/// `--finalists`: every finalist reported, the selected one feasible and the best
/// estimated of the feasible ones, and the same finalists, choice and package bytes
/// on a second run and on one thread.
#[test]
fn finalists_are_reported_and_selection_is_deterministic() {
    let run = |threads: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args([
            "compile",
            "--size",
            "tiny",
            "--tiles",
            "8",
            "--finalists",
            "4",
            "--json",
            "-o",
        ]);
        let path = std::env::temp_dir().join(format!("finalists-{}.pkg", std::process::id()));
        cmd.arg(&path);
        if let Some(t) = threads {
            cmd.env("RAYON_NUM_THREADS", t);
        }
        let out = cmd.output().expect("run tessera");
        let package = std::fs::read(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let f = v["finalists"].as_array().unwrap().clone();
        assert_eq!(f.len(), 4);
        let selected = v["selected"].as_u64().unwrap();
        let best = f
            .iter()
            .filter(|x| x["feasible"] == true)
            .min_by_key(|x| (x["estimated_cycles"].as_u64(), x["rank"].as_u64()))
            .unwrap();
        assert_eq!(best["rank"].as_u64(), Some(selected));
        // Timings differ between runs; everything else may not.
        let stable: Vec<(serde_json::Value, serde_json::Value, serde_json::Value)> = f
            .iter()
            .map(|x| {
                (
                    x["rank"].clone(),
                    x["choices"].clone(),
                    x["estimated_cycles"].clone(),
                )
            })
            .collect();
        assert!(!package.is_empty(), "no package written");
        (stable, selected, package)
    };
    let first = run(None);
    assert_eq!(first, run(None));
    assert_eq!(first, run(Some("1")));
}

/// When no finalist fits, the run stops with the best-ranked finalist's
/// out-of-memory report and exit 1 (a result, not a tool error). The machine is the
/// `small` preset with its interleaved region cut to 7 elements, too few for the
/// weights of a 128-wide layer.
#[test]
fn no_finalist_fits_exits_1_with_the_out_of_memory_report() {
    let (code, small) = tessera(&["machine", "show", "small"]);
    assert_eq!(code, 0, "{small}");
    let end = 524_288 + 7 * 32_768;
    let machine = small
        .replace("end = 950272", &format!("end = {end}"))
        .replace(
            "loader_limit = 949168",
            &format!("loader_limit = {}", end - 1104),
        );
    assert_ne!(machine, small, "the preset changed: update this test");
    let dir = std::env::temp_dir().join(format!("no-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (m, c, o) = (dir.join("m.toml"), dir.join("c.toml"), dir.join("out.pkg"));
    std::fs::write(&m, machine).unwrap();
    std::fs::write(
        &c,
        "image_size = 112\nchannels = 3\npatch = 14\nwidth = 128\nheads = 2\nmlp_hidden = 512\nlayers = 1\neps = 1e-6\n",
    )
    .unwrap();
    let args = [
        "compile",
        "--config",
        c.to_str().unwrap(),
        "--machine",
        m.to_str().unwrap(),
        "--finalists",
        "3",
        "-o",
        o.to_str().unwrap(),
    ];
    let (code, text) = tessera(&args);
    // With `--json` the same refusal is a JSON report on stdout: what is
    // missing in all and tile by tile, and the message.
    let json = common::tessera(&[&args[..], &["--json"]].concat());
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("tile(s) do not fit"), "{text}");
    assert!(text.contains("first request refused"), "{text}");
    assert_eq!(json.code, 1, "{}", json.text());
    let v: serde_json::Value = serde_json::from_str(&json.stdout).expect("a JSON report");
    assert_eq!(v["status"], "does_not_fit", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("tile(s) do not fit"),
        "{v}"
    );
    let tiles = v["tiles"].as_array().expect("tiles");
    assert!(!tiles.is_empty(), "{v}");
    // The total is every tile's live bytes over its capacity.
    let over: Vec<u64> = tiles
        .iter()
        .map(|t| t["live_bound_missing"].as_u64().unwrap())
        .filter(|&b| b > 0)
        .collect();
    assert_eq!(v["bytes_over"].as_u64(), Some(over.iter().sum()), "{v}");
    assert_eq!(v["tiles_over"].as_u64(), Some(over.len() as u64), "{v}");
}

/// `bench select` simulates every feasible finalist and reports the estimate's
/// median absolute error; `run --simulate-finalists` selects the fewest simulated
/// cycles among those it simulated.
#[test]
fn bench_select_simulates_every_finalist() {
    let (code, text) = tessera(&[
        "bench",
        "select",
        "--size",
        "tiny",
        "--tiles",
        "8",
        "--finalists",
        "3",
        "--json",
    ]);
    assert_eq!(code, 0, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let f = v["finalists"].as_array().unwrap();
    assert_eq!(f.len(), 3);
    for x in f {
        assert!(x["simulated_cycles"].as_u64().unwrap() > 0, "{x}");
    }
    let fewest = f
        .iter()
        .min_by_key(|x| (x["simulated_cycles"].as_u64(), x["rank"].as_u64()))
        .unwrap();
    assert_eq!(v["selected"], fewest["rank"]);
    let e = v["median_abs_error"].as_f64().unwrap();
    assert!((0.0..0.5).contains(&e), "{e}");
}

/// `run --trace` writes a trace-event file a viewer can open: the format checked
/// event by event, slices nesting on every track, chip and tile tracks named, the
/// encoder layer on a track of its own.
#[test]
fn run_writes_a_well_formed_chrome_trace() {
    let path = std::env::temp_dir().join(format!("trace-{}.json", std::process::id()));
    let (code, text) = tessera(&[
        "run",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--trace",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let json = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let events = tessera_profile::check_trace(&json).unwrap();
    assert!(events > 50, "{events} events");
    for name in [
        "supersteps",
        "operations",
        "tile 0: all workers",
        "layers.0.mlp.fc1",
        r#""name":"layers""#,
        r#""name":"layer 0""#,
    ] {
        assert!(json.contains(name), "no `{name}` in the trace");
    }
}

/// Same inputs, byte-identical package (ARCHITECTURE.md, determinism): two compiles,
/// and one on a single rayon thread against the default pool.
#[test]
fn compiles_are_byte_identical_across_runs_and_thread_counts() {
    let compile = |threads: Option<&str>, k: u32| {
        let path = std::env::temp_dir().join(format!("determinism-{}-{k}.tpk", std::process::id()));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(["compile", "--size", "tiny", "--machine", "small", "-o"])
            .arg(&path);
        if let Some(t) = threads {
            cmd.env("RAYON_NUM_THREADS", t);
        }
        let out = cmd.output().expect("run tessera");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let bytes = std::fs::read(&path).expect("package");
        let _ = std::fs::remove_file(&path);
        bytes
    };
    let first = compile(None, 0);
    assert!(first == compile(None, 1), "two compiles differ");
    assert!(
        first == compile(Some("1"), 2),
        "one thread differs from the default"
    );
}

/// The machine's SRAM bounds the capacity.
#[test]
fn a_capacity_beyond_the_sram_is_refused() {
    let (code, text) = tessera(&[
        "compile",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--capacity",
        "99999999",
        "-o",
        "/dev/null",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--capacity 99999999 is out of range"),
        "{text}"
    );
}

/// The hidden test hooks reach the driver: a mutated kernel and a perturbed
/// operation are mismatches (exit 1); a kind with no constant is refused.
#[test]
fn the_test_hooks_reach_the_driver() {
    let base = [
        "run",
        "--size",
        "tiny",
        "--machine",
        "small",
        "--finalists",
        "1",
        "--json",
    ];
    for hook in [
        ["--mutate-kernel", "gelu"],
        ["--perturb", "layers.0.mlp.fc2"],
    ] {
        let args: Vec<&str> = base.iter().chain(&hook).copied().collect();
        let (code, text) = tessera(&args);
        assert_eq!(code, 1, "{hook:?}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["status"], "mismatch", "{hook:?}");
    }
    let args: Vec<&str> = base
        .iter()
        .chain(&["--mutate-kernel", "fc1"])
        .copied()
        .collect();
    let (code, text) = tessera(&args);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("--mutate-kernel: `fc1` has no constant to mutate (one of gelu, layernorm, softmax, amp_matmul)"),
        "{text}"
    );
}

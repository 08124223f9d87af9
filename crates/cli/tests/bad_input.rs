//! Bad input never crashes: each kind of defect a user can feed, through the
//! `tessera` binary. Each input is refused with exit 2 and a message naming what is
//! wrong, or gives its result (exit 1) with a readable reason; none aborts, panics
//! or runs for minutes.

mod common;

use common::{Run, scratch, tessera, tessera_env};
use std::path::{Path, PathBuf};

/// `tessera compile --size tiny --machine small` with `args` after.
fn compile_tiny(args: &[&str]) -> Run {
    let mut all = vec!["compile", "--size", "tiny", "--machine", "small"];
    all.extend_from_slice(args);
    tessera(&all)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Refused before weights or inputs exist: exit 2 (not an allocation abort, 134),
/// with the bytes needed and available, and no package written.
#[test]
fn models_that_cannot_fit_are_refused_before_generation() {
    let dir = scratch("fit");
    let out = dir.join("o.tpk");
    for (args, needle) in [
        (
            vec!["compile", "--batch", "100000"],
            "take 86024796992 bytes, the whole chip (1472 tiles) has 940572672",
        ),
        (
            vec!["run", "--size", "tiny", "--batch", "4294967295"],
            "batch 4294967295 is above the largest accepted, 1048576",
        ),
        (
            vec!["compile", "--batch", "18446744073709551615"],
            "batch 18446744073709551615 is above the largest accepted",
        ),
        (
            vec![
                "compile",
                "--model",
                "mlp",
                "--batch",
                "18446744073709551615",
            ],
            "is above the largest accepted",
        ),
        // Fits the chip in total (the tokens are not an output), but a row pass
        // of `attn.q` is 45,563 rows: its AMP estimate is refused as too large
        // for `setzi` instead of panicking in the emitter.
        (
            vec!["compile", "--batch", "1000"],
            "cannot fit: the tensors of matmul `layers.0.attn.q` on its busiest tile",
        ),
        // Passes the chip-wide count; its fc1 cannot fit one tile's SRAM even in
        // the most row passes, and is refused as soon as that is known, not
        // after a search.
        (
            vec!["compile", "--batch", "200"],
            "cannot fit: the tensors of matmul `layers.0.mlp.fc1` on its busiest tile",
        ),
    ] {
        let mut args = args.clone();
        if args[0] == "compile" {
            args.extend(["-o", s(&out)]);
        }
        let r = tessera(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.text());
        assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
        assert!(!out.exists(), "{args:?} wrote a package");
    }
}

#[test]
fn tiles_beyond_the_machine_are_refused_with_the_range() {
    for tiles in ["4294967295", "100000", "0"] {
        let r = tessera(&[
            "compile",
            "--size",
            "tiny",
            "--tiles",
            tiles,
            "-o",
            "/dev/null",
        ]);
        assert_eq!(r.code, 2, "{}", r.text());
        assert!(
            r.stderr.contains(&format!(
                "`tiles` = {tiles} is out of range (accepted: 1 to 16384)"
            )),
            "{}",
            r.stderr
        );
    }
}

/// A `small` machine with four workers would compile, run on four workers and
/// report a mismatch with nothing on stderr, were it accepted: the kernels split
/// their work six ways. It is refused before anything is built, naming the field and what the
/// kernels accept; so is a repeat limit below the counts the kernels emit.
#[test]
fn machines_the_kernels_cannot_target_are_refused() {
    let dir = scratch("machine");
    let show = tessera(&["machine", "show", "small"]);
    assert_eq!(show.code, 0, "{}", show.text());
    for (edit, needle) in [
        (
            ("workers = 6", "workers = 4"),
            "`workers` = 4 is out of range (accepted: 6, the worker count every kernel is written for)",
        ),
        (
            ("rpt_max_count = 4095", "rpt_max_count = 255"),
            "`rpt_max_count` = 255 is out of range (accepted: 4095 to 65535)",
        ),
    ] {
        assert!(show.stdout.contains(edit.0), "{}", show.stdout);
        let toml = write(&dir, "m.toml", &show.stdout.replace(edit.0, edit.1));
        let out = dir.join("o.tpk");
        for args in [
            vec![
                "compile",
                "--size",
                "tiny",
                "--machine",
                s(&toml),
                "-o",
                s(&out),
            ],
            vec!["run", "--size", "tiny", "--machine", s(&toml)],
        ] {
            let r = tessera(&args);
            assert_eq!(r.code, 2, "{args:?}: {}", r.text());
            assert!(r.stderr.contains(needle), "{args:?}: {}", r.stderr);
            assert!(r.stderr.contains("m.toml"), "{args:?}: {}", r.stderr);
            assert!(!out.exists(), "{args:?} wrote a package");
        }
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const REQ: &str = r#"{"name": "a", "size": 64, "first": 0, "last": 1}"#;

#[test]
fn place_refuses_questionable_problems() {
    let dir = scratch("place");
    let dup = write(
        &dir,
        "dup.json",
        &format!(
            "{{\"tiles\": [\n  {{\"tile\": 1, \"requests\": [{REQ}]}},\n  {{\"tile\": 1}}\n]}}\n"
        ),
    );
    let far = write(
        &dir,
        "far.json",
        &format!(r#"{{"tiles": [{{"tile": 5000, "requests": [{REQ}]}}]}}"#),
    );
    let one = write(&dir, "one.json", &format!(r#"{{"requests": [{REQ}]}}"#));
    let neg = write(&dir, "neg.csv", "id,lower,upper,size\na,0,2,4\nb,-1,2,4\n");
    let csv = write(&dir, "ok.csv", "id,lower,upper,size\na,0,2,4\n");
    let huge = write(
        &dir,
        "huge.json",
        r#"{"requests": [{"name": "a", "size": 18446744073709551615, "first": 0, "last": 1}]}"#,
    );
    let typed = write(
        &dir,
        "typed.json",
        "{\"requests\": [\n  {\"name\": \"a\", \"size\": \"big\", \"first\": 0, \"last\": 1}\n]}\n",
    );
    for (args, needles) in [
        (
            vec!["place", s(&dup)],
            vec!["dup.json:3: tiles[1].tile = 1", "listed twice"],
        ),
        (
            vec!["place", s(&far)],
            vec!["far.json:1: tiles[0].tile = 5000", "tiles 0 to 1471"],
        ),
        (
            vec!["place", s(&far), "--machine", "small"],
            vec!["tiles[0].tile = 5000", "machine `small` has tiles 0 to 3"],
        ),
        (
            vec!["place", s(&neg)],
            vec!["neg.csv:3", "lower -1 is negative"],
        ),
        (
            vec!["place", s(&one), "--capacity", "99999999"],
            vec!["--capacity 99999999", "638976 bytes of SRAM"],
        ),
        (
            vec!["place", s(&csv), "--machine", "c600"],
            vec!["--machine c600", "ok.csv is a CSV problem", "no machine"],
        ),
        (
            vec!["place", s(&huge)],
            vec!["huge.json: invalid problem: tile 0: `a`: size or tail beyond 2^50"],
        ),
        (
            vec!["place", s(&typed)],
            vec![
                "typed.json:2:",
                "invalid type: string \"big\", expected u64",
            ],
        ),
    ] {
        let r = tessera(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.text());
        for n in needles {
            assert!(r.stderr.contains(n), "{args:?}: `{n}` not in {}", r.stderr);
        }
    }
}

#[test]
fn place_reports_read_as_words() {
    let dir = scratch("words");
    // Live for no step: its lower bound is 0, and a ratio to it means nothing.
    let empty = write(&dir, "empty.csv", "id,lower,upper,size\na,3,3,4\n");
    let r = tessera(&["place", s(&empty)]);
    assert_eq!(r.code, 0, "{}", r.text());
    assert!(r.stdout.contains("(lower bound 0)"), "{}", r.stdout);
    assert!(!r.stdout.contains("x lower bound"), "{}", r.stdout);

    let big = write(&dir, "big.csv", "id,lower,upper,size\na,0,2,40\nb,1,3,40\n");
    let r = tessera(&["place", s(&big), "--capacity", "50"]);
    assert_eq!(r.code, 1, "{}", r.text());
    assert!(!r.stdout.contains("Some("), "{}", r.stdout);
    assert!(
        r.stdout
            .contains("80 bytes are live at once, above the capacity 50")
            && r.stdout.contains("missing 30 bytes"),
        "{}",
        r.stdout
    );

    let r = tessera(&["place", s(&big), "--capacity", "50", "--json"]);
    assert_eq!(r.code, 1, "{}", r.text());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v["fits"], false);
    assert!(
        v["reason"].as_str().unwrap().contains("live at once"),
        "{v}"
    );
    assert_eq!(v["missing_bytes"], 30);

    // A tile problem that does not fit: the reason is the tile's diagnosis.
    let over = Path::new(env!("CARGO_MANIFEST_DIR")).join("../place/tests/data/overflow.json");
    let r = tessera(&["place", s(&over), "--json"]);
    assert_eq!(r.code, 1, "{}", r.text());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v["fits"], false);
    assert!(
        v["reason"]
            .as_str()
            .unwrap()
            .starts_with("1 of 1 tiles does not fit; tile 7"),
        "{v}"
    );
    assert!(v["missing_bytes"].as_u64().unwrap() > 0, "{v}");

    // Fitting problems carry no reason.
    let r = tessera(&["place", s(&big), "--json"]);
    assert_eq!(r.code, 0, "{}", r.text());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert!(
        v.get("reason").is_none() && v.get("missing_bytes").is_none(),
        "{v}"
    );
}

/// The OS error once, and the file named in every error about a file.
#[test]
fn file_errors_name_the_file_and_say_it_once() {
    let dir = scratch("files");
    let missing = dir.join("missing.tpk");
    for cmd in ["sim", "disasm"] {
        let r = tessera(&[cmd, s(&missing)]);
        assert_eq!(r.code, 2, "{}", r.text());
        assert_eq!(r.stderr.matches("No such file").count(), 1, "{}", r.stderr);
        assert!(r.stderr.contains("missing.tpk"), "{}", r.stderr);
    }
    let src = write(
        &dir,
        "ok.s",
        ".machine small\n.tile 0\n.section code 0x4c000 rx\nmain:\n    exit\n",
    );
    let r = tessera(&["asm", s(&src), "-o", s(&dir)]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert_eq!(
        r.stderr.matches("Is a directory").count(),
        1,
        "{}",
        r.stderr
    );

    let pkg = dir.join("ok.tpk");
    assert_eq!(tessera(&["asm", s(&src), "-o", s(&pkg)]).code, 0);
    let bytes = std::fs::read(&pkg).unwrap();
    let cut = dir.join("cut.tpk");
    std::fs::write(&cut, &bytes[..bytes.len() - 3]).unwrap();
    let flipped = dir.join("flipped.tpk");
    let mut f = bytes.clone();
    let last = f.len() - 1;
    f[last] ^= 0xff;
    std::fs::write(&flipped, &f).unwrap();
    for bad in [&cut, &flipped] {
        for cmd in ["sim", "disasm"] {
            let r = tessera(&[cmd, s(bad)]);
            assert_eq!(r.code, 2, "{}", r.text());
            let name = bad.file_name().unwrap().to_str().unwrap();
            assert!(
                r.stderr.starts_with(&format!("error: {}: ", s(bad))),
                "{cmd} {name}: {}",
                r.stderr
            );
        }
    }
}

#[test]
fn compile_json_has_each_key_once() {
    let dir = scratch("json");
    let out = dir.join("t.tpk");
    let r = compile_tiny(&["--json", "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.text());
    assert_eq!(r.stdout.matches("\"package_bytes\"").count(), 1);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(
        v["package_bytes"].as_u64(),
        Some(std::fs::metadata(&out).unwrap().len())
    );
}

/// `docs/asm.md`: a full disassembly re-assembles to identical bytes, for a compiled
/// package too (per-call state sections, weight symbols outside every section,
/// weight bindings' host contents).
#[test]
fn a_compiled_package_disassembles_and_reassembles_to_identical_bytes() {
    let dir = scratch("roundtrip");
    let (pkg, listing, again) = (dir.join("t.tpk"), dir.join("t.s"), dir.join("t2.tpk"));
    let r = compile_tiny(&["-o", s(&pkg)]);
    assert_eq!(r.code, 0, "{}", r.text());
    let r = tessera(&["disasm", s(&pkg)]);
    assert_eq!(r.code, 0, "{}", r.text());
    std::fs::write(&listing, &r.stdout).unwrap();
    let r = tessera(&["asm", s(&listing), "-o", s(&again)]);
    assert_eq!(r.code, 0, "{}", r.text());
    let (a, b) = (std::fs::read(&pkg).unwrap(), std::fs::read(&again).unwrap());
    assert!(a == b, "{} and {} differ", pkg.display(), again.display());
}

/// A program that never ends stops at the default cycle budget with a Timeout
/// fault naming the tile, the context and the loop.
#[test]
fn an_endless_loop_stops_at_the_cycle_budget() {
    let dir = scratch("loop");
    let src = write(
        &dir,
        "loop.s",
        ".machine small\n.tile 0\n.section code 0x4c000 rx\nspin:\n    bri spin\n",
    );
    let pkg = dir.join("loop.tpk");
    assert_eq!(tessera(&["asm", s(&src), "-o", s(&pkg)]).code, 0);
    let r = tessera(&["sim", s(&pkg)]);
    assert_eq!(r.code, 1, "{}", r.text());
    assert!(
        r.stdout.contains(
            "tile 0 supervisor: Timeout at spin+0x0 `bri 0x4c000`: cycle budget of 200000000 cycles exhausted"
        ),
        "{}",
        r.stdout
    );
}

/// A program longer than the budget times out on every tile; the text report
/// lists the first timeouts and counts the rest, naming the flag that helps.
#[test]
fn timeouts_on_many_tiles_are_counted_not_listed() {
    let dir = scratch("timeouts");
    let mut text = String::from(".machine c600\n");
    for t in 0..12 {
        text += &format!(".tile {t}\n.section code 0x4c000 rx\nspin{t}:\n    bri spin{t}\n");
    }
    let src = write(&dir, "spin.s", &text);
    let pkg = dir.join("spin.tpk");
    assert_eq!(tessera(&["asm", s(&src), "-o", s(&pkg)]).code, 0);
    let r = tessera(&["sim", s(&pkg), "--cycle-budget", "1000"]);
    assert_eq!(r.code, 1, "{}", r.text());
    assert_eq!(r.stdout.matches(": Timeout at ").count(), 8, "{}", r.stdout);
    assert!(
        r.stdout.contains(
            "... and 4 more timeouts: 12 contexts on 12 tiles reached the cycle budget of 1000 cycles; a longer program needs a larger --cycle-budget"
        ),
        "{}",
        r.stdout
    );
    // JSON keeps every fault.
    let r = tessera(&["sim", s(&pkg), "--cycle-budget", "1000", "--json"]);
    assert_eq!(r.code, 1, "{}", r.text());
    assert_eq!(r.stdout.matches("\"Timeout\"").count(), 12, "{}", r.stdout);
}

#[test]
fn bench_place_says_where_the_suites_are() {
    let dir = scratch("bench");
    let r = tessera_env(
        &["bench", "place"],
        &[("TESSERA_BENCHMARKS", "/nonexistent/benchmarks")],
    );
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(
        r.stderr
            .contains("TESSERA_BENCHMARKS /nonexistent/benchmarks: not a directory"),
        "{}",
        r.stderr
    );
    let r = tessera(&["bench", "place", "--dir", s(&dir)]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(r.stderr.contains("no benchmark instances"), "{}", r.stderr);
    // A filter that matches nothing is an error, not an empty table.
    let suite = dir.join("minimalloc/examples");
    std::fs::create_dir_all(&suite).unwrap();
    std::fs::write(suite.join("one.csv"), "id,lower,upper,size\na,0,2,4\n").unwrap();
    let r = tessera(&["bench", "place", "--dir", s(&dir), "--filter", "nothing"]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(
        r.stderr
            .contains("--filter `nothing` matches none of the 1 instances"),
        "{}",
        r.stderr
    );
    let r = tessera(&["bench", "place", "--dir", s(&dir), "--json"]);
    assert_eq!(r.code, 0, "{}", r.text());
    // No progress bar under --json (nor off a terminal).
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

#[test]
fn extreme_options_are_refused_or_handled() {
    let dir = scratch("options");
    let out = dir.join("o.tpk");
    // Every seed is valid: the inputs' seed wraps instead of overflowing.
    let r = compile_tiny(&["--seed", "18446744073709551615", "-o", s(&out)]);
    assert_eq!(r.code, 0, "{}", r.text());
    // A million finalists would be a million whole compiles, silently.
    let r = tessera(&[
        "compile",
        "--size",
        "tiny",
        "--finalists",
        "1000000",
        "-o",
        s(&out),
    ]);
    assert_eq!(r.code, 2, "{}", r.text());
    assert!(
        r.stderr
            .contains("1000000 is above the largest accepted, 64"),
        "{}",
        r.stderr
    );
}

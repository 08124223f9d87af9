//! A short run of every target: no panic, no hang, and several distinct outcomes
//! reached (a generator stuck on one error would pass the first two checks and test
//! nothing). Counts are about 10^4 per target; the package target runs the
//! simulator on every accepted input and gets fewer. The full campaign is
//! `tessera bench fuzz` (docs/fuzz.md).

use std::collections::BTreeSet;
use tessera_fuzz::{Report, RunOptions, Seed, Target, run_one, run_target, target, targets};

fn short(name: &str, execs: u64, min_errors: usize) -> Report {
    let t = target(name).expect("a target of that name");
    let r = run_target(
        &*t,
        &RunOptions {
            execs,
            // Tests assert no timings (a loaded machine must not fail them): only an
            // input that effectively never ends counts here; `tessera bench fuzz`
            // applies the 1 s limit.
            hang_after: std::time::Duration::from_secs(10),
            ..RunOptions::default()
        },
        &|_| {},
    )
    .expect("no crash directory, no I/O");
    eprintln!(
        "{name}: {} execs, {} ok ({} kinds), {} distinct errors, slowest {:.1} ms",
        r.executions, r.ok, r.distinct_ok, r.distinct_errors, r.slowest_ms
    );
    for c in &r.crashes {
        eprintln!("  {} at input {}: {}", c.kind, c.index, c.message);
    }
    assert_eq!(r.executions, execs);
    assert_eq!(r.panics, 0, "{name} panicked: {:#?}", r.crashes);
    assert_eq!(r.hangs, 0, "{name} hung: {:#?}", r.crashes);
    assert!(r.ok > 0, "{name}: nothing was accepted");
    assert!(
        r.distinct_errors >= min_errors,
        "{name}: only {} distinct errors: {:#?}",
        r.distinct_errors,
        r.error_classes.keys().collect::<Vec<_>>()
    );
    r
}

#[test]
fn package_short_run() {
    // Every accepted package is simulated: fewer executions.
    short("package", 10_000, 15);
}

#[test]
fn asm_short_run() {
    short("asm", 10_000, 20);
}

#[test]
fn place_csv_short_run() {
    short("place-csv", 10_000, 8);
}

#[test]
fn place_json_short_run() {
    short("place-json", 10_000, 10);
}

#[test]
fn machine_short_run() {
    short("machine", 10_000, 10);
}

#[test]
fn config_short_run() {
    short("config", 10_000, 8);
}

#[test]
fn safetensors_short_run() {
    short("safetensors", 10_000, 8);
}

#[test]
fn every_seed_is_accepted_and_every_corpus_file_is_listed() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for t in targets() {
        let on_disk: BTreeSet<String> = std::fs::read_dir(dir.join(t.name()))
            .expect("a corpus directory per target")
            .map(|e| format!("{}/{}", t.name(), e.unwrap().file_name().to_string_lossy()))
            .collect();
        let listed: BTreeSet<String> = t.corpus().iter().map(|s| s.name.to_string()).collect();
        assert_eq!(
            listed,
            on_disk,
            "src/corpus.rs is out of date for {}",
            t.name()
        );
        assert!(!t.corpus().is_empty());
        for s in t.corpus() {
            match run_one(&*t, s.bytes) {
                Ok(Ok(_)) => {}
                other => panic!("seed {} is not accepted: {other:?}", s.name),
            }
        }
    }
}

#[test]
fn runs_are_reproducible() {
    let t = target("machine").unwrap();
    let opts = RunOptions {
        execs: 500,
        seed: 3,
        ..RunOptions::default()
    };
    let a = run_target(&*t, &opts, &|_| {}).unwrap();
    let b = run_target(&*t, &opts, &|_| {}).unwrap();
    let counts = |r: &Report| {
        r.error_classes
            .iter()
            .map(|(k, v)| (k.clone(), v.count, v.first_index))
            .collect::<Vec<_>>()
    };
    assert_eq!(counts(&a), counts(&b));
    assert_eq!((a.ok, a.errors), (b.ok, b.errors));
}

/// A reader with a planted bug: the runner must catch the panic, count it, keep
/// the input and say where it happened, and still finish the run.
struct Planted;

impl Target for Planted {
    fn name(&self) -> &'static str {
        "planted"
    }
    fn about(&self) -> &'static str {
        "panics on inputs that start with a zero byte"
    }
    fn corpus(&self) -> &'static [Seed] {
        &[Seed {
            name: "one",
            bytes: b"\x01abc",
        }]
    }
    fn generate(&self, rng: &mut tessera_fuzz::Rng) -> Vec<u8> {
        use rand::Rng as _;
        vec![rng.random_range(0..4u8), 1, 2]
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        match input.first() {
            Some(0) => panic!("planted bug"),
            Some(1) => Ok("one".into()),
            _ => Err(format!("starts with {:?}", input.first())),
        }
    }
}

#[test]
fn a_planted_panic_is_caught_and_kept() {
    let dir = std::env::temp_dir().join(format!("tessera-fuzz-planted-{}", std::process::id()));
    let r = run_target(
        &Planted,
        &RunOptions {
            execs: 2_000,
            crash_dir: Some(dir.clone()),
            ..RunOptions::default()
        },
        &|_| {},
    )
    .unwrap();
    assert_eq!(r.executions, 2_000);
    assert!(r.panics > 0);
    let c = &r.crashes[0];
    assert_eq!(c.kind, "panic");
    assert!(
        c.message.contains("planted bug") && c.message.contains("short.rs"),
        "{}",
        c.message
    );
    assert_eq!(c.input.first(), Some(&0));
    let file = c.file.as_ref().expect("written to the crash directory");
    assert_eq!(std::fs::read(file).unwrap(), c.input);
    std::fs::remove_dir_all(dir).unwrap();
}

//! The runner: derives input `i` from `(seed, target, i)`, executes it under
//! `catch_unwind` with a silent panic hook, times it, and tallies outcomes. Inputs
//! run in parallel in fixed chunks and the tallies merge in chunk order, so every
//! count in a report depends only on the seed and the number of executions.

use crate::{Rng, Target, classify, mutate};
use rand::{Rng as _, SeedableRng};
use rayon::prelude::*;
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a run is set up.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub seed: u64,
    pub execs: u64,
    /// An execution slower than this is reported as a hang.
    pub hang_after: Duration,
    /// Where to write the input of every panic and hang (`<target>-<seed>-<index>.bin`).
    pub crash_dir: Option<PathBuf>,
    /// An execution still running after this long is a stall. A running execution
    /// cannot be stopped, so the watchdog writes its input to the crash directory,
    /// says so on stderr and ends the process with status 3, rather than let the
    /// run wait forever. `None`: no watchdog.
    pub stall_after: Option<Duration>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            seed: 12,
            execs: 10_000,
            hang_after: Duration::from_secs(1),
            crash_dir: None,
            stall_after: None,
        }
    }
}

/// A panic or a hang, with the input that caused it.
#[derive(Debug, Clone, Serialize)]
pub struct Crash {
    pub index: u64,
    /// `panic` or `hang`.
    pub kind: &'static str,
    pub message: String,
    pub millis: f64,
    /// The file the input was written to, when a crash directory was given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip)]
    pub input: Vec<u8>,
}

/// One class of outcome: how often it was reached and the first input reaching it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Outcome {
    pub count: u64,
    pub first_index: u64,
}

/// What a run of one target found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub target: &'static str,
    pub seed: u64,
    pub executions: u64,
    /// Inputs the reader accepted.
    pub ok: u64,
    /// Inputs the reader rejected with an error.
    pub errors: u64,
    pub distinct_errors: usize,
    pub distinct_ok: usize,
    pub panics: u64,
    pub hangs: u64,
    pub slowest_ms: f64,
    pub slowest_index: u64,
    pub wall_ms: f64,
    pub execs_per_sec: f64,
    /// Error classes with their counts, in class order.
    pub error_classes: BTreeMap<String, Outcome>,
    /// Accepted-outcome classes (what ran after the read).
    pub ok_classes: BTreeMap<String, Outcome>,
    /// The first crashes found (at most [`MAX_CRASHES`] are kept).
    pub crashes: Vec<Crash>,
}

/// Crashes kept per report; the count goes on regardless.
pub const MAX_CRASHES: usize = 16;
const CHUNK: u64 = 64;

/// Input `index` of a run: the corpus seeds first, verbatim; then, from a generator
/// seeded by `(seed, target, index)`, a structure-aware input, a mutated seed, or a
/// mutated structure-aware input.
pub fn input_for(target: &dyn Target, seed: u64, index: u64) -> Vec<u8> {
    let corpus = target.corpus();
    if let Some(s) = usize::try_from(index).ok().and_then(|i| corpus.get(i)) {
        return s.bytes.to_vec();
    }
    let mut rng = Rng::seed_from_u64(seed ^ fnv1a(target.name()));
    rng.set_stream(index);
    let pick = |rng: &mut Rng| -> &'static [u8] {
        if corpus.is_empty() {
            &[]
        } else {
            corpus[rng.random_range(0..corpus.len())].bytes
        }
    };
    match rng.random_range(0..100u32) {
        0..45 => target.generate(&mut rng),
        45..85 => {
            let mut v = pick(&mut rng).to_vec();
            let other = pick(&mut rng);
            mutate::mutate(&mut v, other, &mut rng);
            target.fixup(&mut v, &mut rng);
            v
        }
        _ => {
            let mut v = target.generate(&mut rng);
            let other = pick(&mut rng);
            mutate::mutate(&mut v, other, &mut rng);
            target.fixup(&mut v, &mut rng);
            v
        }
    }
}

/// 64-bit FNV-1a: a fixed hash so that targets draw independent streams.
fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

thread_local! {
    /// Where the last panic on this thread happened, recorded by the silent hook.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Whether this thread is inside [`run_one`]: a panic anywhere else is not one
    /// the runner will catch, and must be printed rather than swallowed.
    static IN_RUN: Cell<bool> = const { Cell::new(false) };
}

/// Serialises hook swaps: two runs in one process must not restore each other's
/// hooks out of order.
static HOOK: Mutex<()> = Mutex::new(());

/// Runs one input, catching a panic. `Err` carries the panic message.
pub fn run_one(target: &dyn Target, input: &[u8]) -> Result<Result<String, String>, String> {
    guarded(|| target.execute(input))
}

/// Runs `f`, catching a panic; `Err` carries its message and location.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    let was = IN_RUN.with(|r| r.replace(true));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    IN_RUN.with(|r| r.set(was));
    r.map_err(|payload| {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(non-text panic payload)".into());
        match LAST_PANIC.with(|l| l.borrow_mut().take()) {
            Some(at) => format!("{text} (at {at})"),
            None => text,
        }
    })
}

#[derive(Default)]
struct Tally {
    execs: u64,
    ok: u64,
    errors: u64,
    panics: u64,
    hangs: u64,
    slowest: (Duration, u64),
    error_classes: BTreeMap<String, Outcome>,
    ok_classes: BTreeMap<String, Outcome>,
    crashes: Vec<Crash>,
}

fn note(map: &mut BTreeMap<String, Outcome>, class: String, index: u64) {
    let e = map.entry(class).or_insert(Outcome {
        count: 0,
        first_index: index,
    });
    e.count += 1;
    e.first_index = e.first_index.min(index);
}

impl Tally {
    fn merge(&mut self, o: Tally) {
        self.execs += o.execs;
        self.ok += o.ok;
        self.errors += o.errors;
        self.panics += o.panics;
        self.hangs += o.hangs;
        if o.slowest.0 > self.slowest.0 {
            self.slowest = o.slowest;
        }
        for (k, v) in o.error_classes {
            let e = self.error_classes.entry(k).or_insert(Outcome {
                count: 0,
                first_index: v.first_index,
            });
            e.count += v.count;
            e.first_index = e.first_index.min(v.first_index);
        }
        for (k, v) in o.ok_classes {
            let e = self.ok_classes.entry(k).or_insert(Outcome {
                count: 0,
                first_index: v.first_index,
            });
            e.count += v.count;
            e.first_index = e.first_index.min(v.first_index);
        }
        for c in o.crashes {
            if self.crashes.len() < MAX_CRASHES {
                self.crashes.push(c);
            }
        }
    }
}

/// What each worker thread is executing, for the watchdog: the input index plus
/// one (0 when idle) and its start in nanoseconds since the run began.
struct InFlight {
    began: Instant,
    slots: Vec<(AtomicU64, AtomicU64)>,
}

impl InFlight {
    fn new() -> Self {
        // One slot per rayon worker and one for a caller outside the pool.
        let n = rayon::current_num_threads() + 1;
        InFlight {
            began: Instant::now(),
            slots: (0..n)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
        }
    }
    fn now(&self) -> u64 {
        u64::try_from(self.began.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
    /// Marks `index` as running on this thread; returns what to restore after it.
    /// A thread blocked inside a reader's own parallel loop may run another chunk
    /// (work stealing), so slots nest and are restored, not cleared.
    fn enter(&self, index: u64) -> (usize, u64, u64) {
        let slot = rayon::current_thread_index()
            .map_or(self.slots.len() - 1, |i| i.min(self.slots.len() - 1));
        let (idx, start) = &self.slots[slot];
        let saved = (
            slot,
            idx.load(Ordering::SeqCst),
            start.load(Ordering::SeqCst),
        );
        start.store(self.now(), Ordering::SeqCst);
        idx.store(index + 1, Ordering::SeqCst);
        saved
    }
    fn leave(&self, (slot, idx, start): (usize, u64, u64)) {
        self.slots[slot].0.store(idx, Ordering::SeqCst);
        self.slots[slot].1.store(start, Ordering::SeqCst);
    }
    /// The first execution running for longer than `limit`, with its duration.
    fn stalled(&self, limit: Duration) -> Option<(u64, Duration)> {
        let now = self.now();
        self.slots.iter().find_map(|(idx, start)| {
            let i = idx.load(Ordering::SeqCst);
            let ran = Duration::from_nanos(now.saturating_sub(start.load(Ordering::SeqCst)));
            (i != 0 && ran > limit).then(|| (i - 1, ran))
        })
    }
}

/// Polls `flight` until `done`; on a stall, keeps the input and ends the process.
fn watchdog(
    target: &dyn Target,
    opts: &RunOptions,
    limit: Duration,
    flight: &InFlight,
    done: &AtomicBool,
) {
    let tick = (limit / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(tick);
        let Some((index, ran)) = flight.stalled(limit) else {
            continue;
        };
        // The input is a function of (seed, target, index): make it again.
        let input = input_for(target, opts.seed, index);
        let kept = match &opts.crash_dir {
            Some(dir) => {
                let path = dir.join(format!("{}-{}-{index}.bin", target.name(), opts.seed));
                match std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &input)) {
                    Ok(()) => format!("; input in {}", path.display()),
                    Err(e) => format!("; cannot write {}: {e}", path.display()),
                }
            }
            None => String::new(),
        };
        eprintln!(
            "stall: {} input {index} (seed {}) still running after {:.1} s{kept}",
            target.name(),
            opts.seed,
            ran.as_secs_f64()
        );
        std::process::exit(3);
    }
}

fn run_chunk(
    target: &dyn Target,
    opts: &RunOptions,
    flight: &InFlight,
    range: std::ops::Range<u64>,
) -> Tally {
    let mut t = Tally::default();
    for index in range {
        // A generator bug is reported like a reader's, with no input to keep.
        let (input, start, r) = match guarded(|| input_for(target, opts.seed, index)) {
            Ok(input) => {
                let start = Instant::now();
                let saved = flight.enter(index);
                let r = run_one(target, &input);
                flight.leave(saved);
                (input, start, r)
            }
            Err(m) => (
                Vec::new(),
                Instant::now(),
                Err(format!("in the generator: {m}")),
            ),
        };
        let took = start.elapsed();
        t.execs += 1;
        if took > t.slowest.0 {
            t.slowest = (took, index);
        }
        let millis = took.as_secs_f64() * 1e3;
        let mut crash = |kind: &'static str, message: String| {
            if t.crashes.len() < MAX_CRASHES {
                t.crashes.push(Crash {
                    index,
                    kind,
                    message,
                    millis,
                    file: None,
                    input: input.clone(),
                });
            }
        };
        match r {
            Ok(Ok(class)) => {
                t.ok += 1;
                note(&mut t.ok_classes, classify(&class), index);
            }
            Ok(Err(text)) => {
                t.errors += 1;
                note(&mut t.error_classes, classify(&text), index);
            }
            Err(message) => {
                t.panics += 1;
                crash("panic", message);
            }
        }
        if took > opts.hang_after {
            t.hangs += 1;
            crash("hang", format!("took {millis:.0} ms"));
        }
    }
    t
}

/// Runs `opts.execs` inputs of `target`; `progress` is called with the number of
/// executions finished since its previous call.
pub fn run_target(
    target: &dyn Target,
    opts: &RunOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> std::io::Result<Report> {
    let start = Instant::now();
    let chunks = opts.execs.div_ceil(CHUNK);
    let tallies: Vec<Tally> = {
        let _guard = HOOK.lock().unwrap_or_else(|e| e.into_inner());
        let previous = panic::take_hook();
        panic::set_hook(Box::new(|info| {
            if IN_RUN.with(Cell::get) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                LAST_PANIC.with(|l| *l.borrow_mut() = at);
            } else {
                // A thread the reader started, or the runner itself: still a
                // finding, reported where it happens.
                eprintln!("panic outside a fuzz execution: {info}");
            }
        }));
        let flight = InFlight::new();
        let done = AtomicBool::new(false);
        let tallies = std::thread::scope(|s| {
            if let Some(limit) = opts.stall_after {
                let (flight, done) = (&flight, &done);
                s.spawn(move || watchdog(target, opts, limit, flight, done));
            }
            let tallies = (0..chunks)
                .into_par_iter()
                .map(|c| {
                    let lo = c * CHUNK;
                    let hi = (lo + CHUNK).min(opts.execs);
                    let t = run_chunk(target, opts, &flight, lo..hi);
                    progress(hi - lo);
                    t
                })
                .collect();
            done.store(true, Ordering::SeqCst);
            tallies
        });
        panic::set_hook(previous);
        tallies
    };
    let mut all = Tally::default();
    for t in tallies {
        all.merge(t);
    }
    if let Some(dir) = &opts.crash_dir
        && !all.crashes.is_empty()
    {
        std::fs::create_dir_all(dir)?;
        for c in &mut all.crashes {
            let path = dir.join(format!("{}-{}-{}.bin", target.name(), opts.seed, c.index));
            std::fs::write(&path, &c.input)?;
            c.file = Some(path.display().to_string());
        }
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(Report {
        target: target.name(),
        seed: opts.seed,
        executions: all.execs,
        ok: all.ok,
        errors: all.errors,
        distinct_errors: all.error_classes.len(),
        distinct_ok: all.ok_classes.len(),
        panics: all.panics,
        hangs: all.hangs,
        slowest_ms: all.slowest.0.as_secs_f64() * 1e3,
        slowest_index: all.slowest.1,
        wall_ms: wall * 1e3,
        execs_per_sec: all.execs as f64 / wall.max(1e-9),
        error_classes: all.error_classes,
        ok_classes: all.ok_classes,
        crashes: all.crashes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_sees_a_long_execution_and_nested_ones_restore_it() {
        let f = InFlight::new();
        assert_eq!(f.stalled(Duration::ZERO), None);
        let outer = f.enter(7);
        std::thread::sleep(Duration::from_millis(20));
        // A chunk stolen while the reader waits runs on the same slot...
        let inner = f.enter(9);
        assert_eq!(f.stalled(Duration::from_millis(10)), None);
        f.leave(inner);
        // ...and the outer execution is watched again once it returns.
        let (index, ran) = f.stalled(Duration::from_millis(10)).expect("outer is long");
        assert_eq!(index, 7);
        assert!(ran >= Duration::from_millis(20));
        f.leave(outer);
        assert_eq!(f.stalled(Duration::ZERO), None);
    }
}

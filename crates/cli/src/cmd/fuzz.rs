//! `tessera bench fuzz`: runs the readers of outside input against generated and
//! mutated inputs (`tessera-fuzz`) and reports executions and distinct outcomes.
use crate::Outcome;
use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_fuzz::{Report, RunOptions, Target, input_for, run_one, run_target, target, targets};

#[derive(Args)]
pub struct BenchFuzzArgs {
    /// Only this target (default: every target; `--list` names them).
    #[arg(long)]
    pub target: Option<String>,
    /// Executions per target.
    #[arg(long, default_value_t = 100_000)]
    pub execs: u64,
    /// Seed of the input generator: the same seed and count give the same inputs.
    #[arg(long, default_value_t = 12)]
    pub seed: u64,
    /// An execution slower than this many milliseconds counts as a hang.
    #[arg(long, default_value_t = 1_000)]
    pub hang_ms: u64,
    /// An execution still running after this many seconds stops the whole run
    /// (exit status 3), its input kept in the crash directory.
    #[arg(long, default_value_t = 60)]
    pub stall_s: u64,
    /// Where the inputs of panics and hangs are written.
    #[arg(long, default_value = "fuzz-crashes")]
    pub crash_dir: PathBuf,
    /// Run one input file through `--target` and print what happened.
    #[arg(long, requires = "target")]
    pub replay: Option<PathBuf>,
    /// Run only input number N of `--target` (under `--seed`), e.g. a report's
    /// slowest input, and print what happened.
    #[arg(long, requires = "target", conflicts_with = "replay")]
    pub index: Option<u64>,
    /// With `--index`: also write that input to this file.
    #[arg(long, requires = "index")]
    pub save: Option<PathBuf>,
    /// List the targets and exit.
    #[arg(long)]
    pub list: bool,
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Campaign<'a> {
    seed: u64,
    execs_per_target: u64,
    wall_ms: f64,
    targets: &'a [Report],
}

pub fn bench(a: BenchFuzzArgs) -> anyhow::Result<Outcome> {
    if a.list {
        for t in targets() {
            println!("{:<12} {}", t.name(), t.about());
        }
        return Ok(Outcome::Ok);
    }
    let chosen: Vec<Box<dyn Target>> = match &a.target {
        Some(name) => match target(name) {
            Some(t) => vec![t],
            None => {
                let names: Vec<&str> = targets().iter().map(|t| t.name()).collect();
                bail!(
                    "unknown fuzz target `{name}` (targets: {})",
                    names.join(", ")
                );
            }
        },
        None => targets(),
    };
    if let Some(path) = &a.replay {
        let input =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        return replay(&*chosen[0], &input, a.json);
    }
    if let Some(i) = a.index {
        let input = input_for(&*chosen[0], a.seed, i);
        if let Some(path) = &a.save {
            std::fs::write(path, &input)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        return replay(&*chosen[0], &input, a.json);
    }
    let opts = RunOptions {
        seed: a.seed,
        execs: a.execs,
        hang_after: Duration::from_millis(a.hang_ms),
        crash_dir: Some(a.crash_dir.clone()),
        stall_after: Some(Duration::from_secs(a.stall_s)),
    };
    let start = Instant::now();
    let mut reports = Vec::with_capacity(chosen.len());
    for t in &chosen {
        let pb = if a.json {
            ProgressBar::hidden()
        } else {
            ProgressBar::new(a.execs)
        };
        pb.set_style(
            ProgressStyle::with_template("{msg:<12} {bar:30} {pos}/{len} ({elapsed}, eta {eta})")
                .expect("valid template"),
        );
        pb.set_message(t.name());
        let report = run_target(&**t, &opts, &|n| pb.inc(n))
            .with_context(|| format!("writing crash inputs to {}", a.crash_dir.display()))?;
        pb.finish_and_clear();
        reports.push(report);
    }
    let failed = reports.iter().any(|r| r.panics > 0 || r.hangs > 0);
    if a.json {
        crate::cmd::print_json(&Campaign {
            seed: a.seed,
            execs_per_target: a.execs,
            wall_ms: start.elapsed().as_secs_f64() * 1e3,
            targets: &reports,
        })?;
    } else {
        print_table(&reports);
    }
    Ok(if failed { Outcome::Failed } else { Outcome::Ok })
}

fn print_table(reports: &[Report]) {
    println!(
        "{:<12} {:>10} {:>9} {:>8} {:>6} {:>6} {:>6} {:>11} {:>9} {:>10}",
        "target",
        "execs",
        "ok",
        "distinct",
        "ok-kd",
        "panics",
        "hangs",
        "slowest ms",
        "wall s",
        "execs/s"
    );
    for r in reports {
        println!(
            "{:<12} {:>10} {:>9} {:>8} {:>6} {:>6} {:>6} {:>11.2} {:>9.1} {:>10.0}",
            r.target,
            r.executions,
            r.ok,
            r.distinct_errors,
            r.distinct_ok,
            r.panics,
            r.hangs,
            r.slowest_ms,
            r.wall_ms / 1e3,
            r.execs_per_sec
        );
    }
    println!("distinct: error classes reached; ok-kd: kinds of accepted outcome");
    for r in reports {
        for c in &r.crashes {
            println!(
                "{} {} at input {} ({:.0} ms): {}{}",
                r.target,
                c.kind,
                c.index,
                c.millis,
                c.message,
                c.file
                    .as_ref()
                    .map_or(String::new(), |f| format!(" [input in {f}]"))
            );
        }
    }
}

#[derive(Serialize)]
struct Replay<'a> {
    target: &'a str,
    outcome: &'a str,
    message: String,
    millis: f64,
}

fn replay(t: &dyn Target, input: &[u8], json: bool) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let r = run_one(t, input);
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let (outcome, message) = match r {
        Ok(Ok(m)) => ("ok", m),
        Ok(Err(m)) => ("error", m),
        Err(m) => ("panic", m),
    };
    if json {
        crate::cmd::print_json(&Replay {
            target: t.name(),
            outcome,
            message: message.clone(),
            millis,
        })?;
    } else {
        println!("{}: {outcome} in {millis:.2} ms: {message}", t.name());
    }
    Ok(if outcome == "panic" {
        Outcome::Failed
    } else {
        Outcome::Ok
    })
}

//! Owned by the placement work: `tessera place` and `tessera bench place`.
use crate::Outcome;
use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::{Path, PathBuf};
use tessera_machine::Machine;
use tessera_place::{
    Allocation, FlatOutcome, Mode, ModeSelect, Options, Problem, SearchVerdict, TileOutcome, bench,
    parse_csv, place_flat, place_tiles,
};

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    Lifetime,
    Retry,
    Search,
}

#[derive(Args)]
pub struct PlaceArgs {
    /// A minimalloc-format CSV (`id,lower,upper,size`) or a JSON problem.
    pub problem: PathBuf,
    /// Usable bytes: the arena size for CSV; for JSON, bytes from the first SRAM
    /// address. Without it a CSV's peak is minimised.
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Run one mode only (default: lifetime order, then retry, then search).
    #[arg(long, value_enum)]
    pub mode: Option<ModeArg>,
    /// Machine preset or TOML (JSON problems; overrides the file's `machine`).
    #[arg(long)]
    pub machine: Option<String>,
    /// Search nodes per search order.
    #[arg(long, default_value_t = 2_000_000)]
    pub node_budget: u64,
    /// Draw the placed tile with the highest peak as an SVG picture (JSON problems)
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchPlaceArgs {
    /// Directory of the benchmark suites (`minimalloc/`, `idealloc/`: copies of the
    /// public suites). Default: $TESSERA_BENCHMARKS, else `../shared/benchmarks`
    /// beside the repository.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Only instances whose path contains this text.
    #[arg(long)]
    pub filter: Option<String>,
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
}

fn options(a: &PlaceArgs) -> Options {
    Options {
        modes: match a.mode {
            None => ModeSelect::Ladder,
            Some(ModeArg::Lifetime) => ModeSelect::Only(Mode::Lifetime),
            Some(ModeArg::Retry) => ModeSelect::Only(Mode::Retry),
            Some(ModeArg::Search) => ModeSelect::Only(Mode::Search),
        },
        capacity: a.capacity,
        node_budget: a.node_budget,
        diagnose: true,
        stop_after_refusals: None,
    }
}

#[derive(Serialize)]
struct Report<'a> {
    fits: bool,
    /// Why the problem does not fit (absent when it fits).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// Bytes missing: for a CSV, the extra arena the best placement found needs; for
    /// tiles, the most any failing tile is missing (`None` when unknown or when no
    /// amount of memory helps).
    #[serde(skip_serializing_if = "Option::is_none")]
    missing_bytes: Option<u64>,
    peak: Option<u64>,
    lower_bound: u64,
    time_ms: f64,
    mode_used: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allocations: Option<&'a [Allocation]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tiles: Option<&'a [TileOutcome]>,
}

/// Why a CSV problem found no placement at its capacity, in words.
fn flat_reason(r: &FlatOutcome, capacity: u64) -> String {
    match r.search {
        Some(SearchVerdict::InfeasibleLiveBytes) => format!(
            "{} bytes are live at once, above the capacity {capacity}: no placement exists",
            r.lower_bound
        ),
        Some(SearchVerdict::Exhausted) => format!(
            "the search ruled out every placement at capacity {capacity} ({} nodes): none exists",
            r.search_nodes
        ),
        Some(SearchVerdict::GaveUp) => format!(
            "no placement found at capacity {capacity}: the greedy modes failed and the search \
             gave up after {} nodes (raise --node-budget to search longer)",
            r.search_nodes
        ),
        Some(SearchVerdict::Found) | None => format!(
            "no placement found at capacity {capacity} by the modes run (the search did not run)"
        ),
    }
}

pub fn run(a: PlaceArgs) -> anyhow::Result<Outcome> {
    let text = std::fs::read_to_string(&a.problem)
        .with_context(|| format!("cannot read {}", a.problem.display()))?;
    let origin = a.problem.display().to_string();
    let opts = options(&a);
    let is_json =
        a.problem.extension().is_some_and(|e| e == "json") || text.trim_start().starts_with('{');
    if !is_json {
        if let Some(m) = &a.machine {
            anyhow::bail!(
                "--machine {m}: {origin} is a CSV problem, one arena with no machine; \
                 give its size with --capacity, or use a JSON problem for a machine's tiles"
            );
        }
        let p = parse_csv(&text, &origin)?;
        let r = place_flat(&p, &opts)?;
        let (reason, missing_bytes) = match (r.fits, r.capacity) {
            (false, Some(cap)) => {
                // The lowest peak found without a capacity says how much is missing.
                let best = place_flat(
                    &p,
                    &Options {
                        capacity: None,
                        ..opts
                    },
                )?;
                // Unknown when even that peak is within the capacity (the search
                // at the capacity gave up where a minimising order succeeded).
                let missing = best
                    .peak
                    .and_then(|pk| pk.checked_sub(cap))
                    .filter(|&m| m > 0);
                (Some(flat_reason(&r, cap)), missing)
            }
            _ => (None, None),
        };
        if a.json {
            crate::cmd::print_json(&Report {
                fits: r.fits,
                reason,
                missing_bytes,
                peak: r.peak,
                lower_bound: r.lower_bound,
                time_ms: r.time_ms,
                mode_used: r.mode_used.map(Mode::name),
                allocations: Some(&r.allocations),
                tiles: None,
            })?;
        } else {
            let cap = r
                .capacity
                .map_or("none (minimising the peak)".to_string(), |c| c.to_string());
            println!(
                "{}: {} buffers, capacity {cap}, live-bytes lower bound {}",
                a.problem.display(),
                p.buffers.len(),
                r.lower_bound
            );
            match r.peak {
                Some(pk) => println!(
                    "fits: peak {pk} ({}), mode {}, {:.1} ms{}",
                    // No buffer is live at any step: a ratio to 0 means nothing.
                    if r.lower_bound == 0 {
                        "lower bound 0".to_string()
                    } else {
                        format!("{:.4} x lower bound", pk as f64 / r.lower_bound as f64)
                    },
                    r.mode_used.map_or("-", Mode::name),
                    r.time_ms,
                    if r.search_nodes > 0 {
                        format!(", {} search nodes", r.search_nodes)
                    } else {
                        String::new()
                    }
                ),
                None => println!(
                    "does not fit: {}; {}; {:.1} ms",
                    reason.as_deref().unwrap_or("no placement found"),
                    missing_bytes.map_or("missing bytes unknown".to_string(), |m| format!(
                        "missing {m} bytes"
                    )),
                    r.time_ms
                ),
            }
        }
        return Ok(if r.fits { Outcome::Ok } else { Outcome::Failed });
    }
    let problem = Problem::parse(&text, &origin)?;
    let machine_name = a
        .machine
        .clone()
        .or(problem.machine.clone())
        .unwrap_or_else(|| "c600".into());
    let machine = Machine::load(&machine_name)?;
    problem.check_tiles(&machine, &origin, &text)?;
    opts.check_capacity(&machine)?;
    let results = place_tiles(&machine, &problem.tiles, &opts);
    let mut tiles = Vec::with_capacity(results.len());
    for r in results {
        tiles.push(r.with_context(|| origin.clone())?);
    }
    let fits = tiles.iter().all(|t| t.fits);
    if let Some(path) = &a.svg {
        let drawn = tiles
            .iter()
            .zip(&problem.tiles)
            .filter_map(|(t, p)| t.placement.as_ref().map(|pl| (pl, p)))
            .max_by_key(|(pl, p)| (pl.peak, std::cmp::Reverse(p.tile)));
        let Some((pl, p)) = drawn else {
            anyhow::bail!("no tile was placed: nothing to draw in {}", path.display());
        };
        let svg = tessera_place::svg::render_svg(&machine, p, pl);
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    let worst_mode = tiles
        .iter()
        .filter_map(|t| t.mode_used)
        .max_by_key(|m| *m as u8)
        .map(Mode::name);
    if a.json {
        let single = (tiles.len() == 1)
            .then(|| {
                tiles[0]
                    .placement
                    .as_ref()
                    .map(|p| p.allocations.as_slice())
            })
            .flatten();
        let failing: Vec<&TileOutcome> = tiles.iter().filter(|t| !t.fits).collect();
        let reason = failing.first().map(|t| {
            let first = t
                .diagnosis
                .as_ref()
                .map_or(format!("tile {}: does not fit", t.tile), |d| {
                    d.summary.clone()
                });
            format!(
                "{} of {} tiles {} not fit; {first}",
                failing.len(),
                tiles.len(),
                if failing.len() == 1 { "does" } else { "do" }
            )
        });
        let missing_bytes = failing
            .iter()
            .filter_map(|t| t.diagnosis.as_ref().and_then(|d| d.missing_bytes))
            .max();
        crate::cmd::print_json(&Report {
            fits,
            reason,
            missing_bytes,
            peak: tiles.iter().filter_map(|t| t.peak).max(),
            lower_bound: tiles.iter().map(|t| t.lower_bound).max().unwrap_or(0),
            time_ms: tiles.iter().map(|t| t.time_ms).sum(),
            mode_used: worst_mode,
            allocations: single,
            tiles: Some(&tiles),
        })?;
    } else {
        for t in &tiles {
            match (&t.placement, &t.diagnosis) {
                (Some(p), _) => println!(
                    "tile {}: fits, peak {:#x}, {} bytes live at most of {}, mode {}, {:.1} ms",
                    t.tile,
                    p.peak,
                    t.lower_bound,
                    t.capacity,
                    p.mode_used.name(),
                    t.time_ms
                ),
                (None, Some(d)) => println!("{}", d.summary),
                (None, None) => println!("tile {}: does not fit", t.tile),
            }
        }
        println!(
            "{} of {} tiles fit",
            tiles.iter().filter(|t| t.fits).count(),
            tiles.len()
        );
    }
    Ok(if fits { Outcome::Ok } else { Outcome::Failed })
}

/// The environment variable naming the benchmark directory.
const BENCH_ENV: &str = "TESSERA_BENCHMARKS";

/// The benchmark directory: `--dir`, else `$TESSERA_BENCHMARKS`, else
/// `../shared/benchmarks` beside the repository (where this workplace keeps the
/// suites; a fresh clone elsewhere has no such directory).
fn locate_bench(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let given = dir
        .map(|d| (d, "--dir"))
        .or_else(|| std::env::var_os(BENCH_ENV).map(|d| (PathBuf::from(d), BENCH_ENV)));
    if let Some((d, from)) = given {
        if !d.is_dir() {
            anyhow::bail!(
                "{from} {}: not a directory; it must hold the benchmark suites \
                 (`minimalloc/`, `idealloc/`)",
                d.display()
            );
        }
        return Ok(d);
    }
    let cwd = std::env::current_dir()?;
    let top = std::process::Command::new("git")
        .args(["rev-parse", "--show-toplevel"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let fallback = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for start in top
        .iter()
        .map(PathBuf::as_path)
        .chain([cwd.as_path(), fallback.as_path()])
    {
        if let Some(d) = bench::find_bench_dir(start) {
            return Ok(d);
        }
    }
    anyhow::bail!(
        "no benchmark suites found: pass --dir DIR or set {BENCH_ENV}=DIR. The suites are \
         copies of public data, not part of this repository: the `benchmarks/` directories \
         of github.com/google/minimalloc (as DIR/minimalloc) and \
         github.com/cappadokes/idealloc (as DIR/idealloc); without either, \
         `../shared/benchmarks` beside the repository is used when it exists"
    )
}

pub fn bench(a: BenchPlaceArgs) -> anyhow::Result<Outcome> {
    let dir = locate_bench(a.dir)?;
    let mut paths = bench::instances(&dir)?;
    let found = paths.len();
    if let Some(f) = &a.filter {
        paths.retain(|p| p.display().to_string().contains(f.as_str()));
    }
    if paths.is_empty() {
        match &a.filter {
            Some(f) => anyhow::bail!(
                "--filter `{f}` matches none of the {found} instances under {}",
                dir.display()
            ),
            None => anyhow::bail!("no benchmark instances (CSV files) under {}", dir.display()),
        }
    }
    let opts = Options::default();
    let mut rows = Vec::new();
    // Drawn only on a terminal (indicatif hides itself otherwise), never with --json.
    let pb = (!a.json).then(|| {
        let pb = indicatif::ProgressBar::new(paths.len() as u64);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{pos}/{len} {msg} ({elapsed})")
                .expect("valid template"),
        );
        pb.enable_steady_tick(std::time::Duration::from_millis(120));
        pb
    });
    for p in &paths {
        if let Some(pb) = &pb {
            pb.set_message(p.display().to_string());
        }
        rows.push(bench::run_instance(&dir, p, &opts)?);
        if let Some(pb) = &pb {
            pb.inc(1);
        }
    }
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    if a.json {
        crate::cmd::print_json(&rows)?;
        return Ok(Outcome::Ok);
    }
    println!("benchmarks: {}", dir.display());
    println!(
        "{:<46} {:>6} {:>13} {:>13} {:>9} {:>5} {:>10} {:>8} {:>9} {:>9}  {:<24} goal",
        "instance",
        "bufs",
        "lower bound",
        "peak",
        "peak/LB",
        "fits",
        "time ms",
        "mode",
        "greedy/LB",
        "greedy ms",
        "peer",
    );
    for r in &rows {
        let peer = match r.reference {
            Some(rf) => match rf.ratio {
                Some(x) => format!("{} {x} in {} ms", rf.peer, rf.time_ms),
                None => format!("{} fits in {} ms", rf.peer, rf.time_ms),
            },
            None => "-".into(),
        };
        println!(
            "{:<46} {:>6} {:>13} {:>13} {:>9} {:>5} {:>10.1} {:>8} {:>9} {:>9.1}  {:<24} {}",
            r.instance,
            r.buffers,
            r.lower_bound,
            r.peak.map_or("-".into(), |p| p.to_string()),
            r.ratio.map_or("-".into(), |x| format!("{x:.6}")),
            r.fits.map_or("-", |f| if f { "yes" } else { "NO" }),
            r.time_ms,
            r.mode_used.as_deref().unwrap_or("-"),
            r.first_ratio.map_or("-".into(), |x| format!("{x:.4}")),
            r.first_ms,
            peer,
            match r.goal_met {
                Some(true) => "met",
                Some(false) => "NOT met",
                None => "-",
            }
        );
    }
    Ok(Outcome::Ok)
}

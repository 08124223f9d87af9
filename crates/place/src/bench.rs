//! The benchmark runner: every instance of the public suites under
//! `shared/benchmarks`, with the peers' published figures beside ours.
//!
//! The peer figures are the ones the suites' READMEs record for this machine class
//! (minimalloc wall times on 2 cores; idealloc single-iteration peaks and times).

use crate::{FlatOutcome, Options, PlaceError, parse_csv, place_flat};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// A peer's published figure for one instance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Reference {
    pub peer: &'static str,
    /// Peak / lower bound the peer reached (`None`: it reaches the capacity).
    pub ratio: Option<f64>,
    pub time_ms: f64,
    /// Our time must be at most `time_ms / time_factor`.
    pub time_factor: f64,
}

/// One benchmark instance's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchRow {
    pub suite: String,
    pub instance: String,
    pub buffers: usize,
    pub lower_bound: u64,
    pub capacity: Option<u64>,
    pub peak: Option<u64>,
    pub ratio: Option<f64>,
    pub fits: Option<bool>,
    pub time_ms: f64,
    pub mode_used: Option<String>,
    /// The first greedy stage alone.
    pub first_peak: Option<u64>,
    pub first_ratio: Option<f64>,
    pub first_ms: f64,
    pub reference: Option<Reference>,
    /// Whether this instance meets the goal against the reference.
    pub goal_met: Option<bool>,
}

/// `shared/benchmarks` beside the repository holding `start` (or its git top level).
pub fn find_bench_dir(start: &Path) -> Option<PathBuf> {
    let mut dir = Some(start);
    while let Some(d) = dir {
        let cand = d.join("../shared/benchmarks");
        if cand.is_dir() && d.join("Cargo.toml").is_file() {
            return cand.canonicalize().ok();
        }
        dir = d.parent();
    }
    None
}

fn reference(suite: &str, name: &str) -> Option<Reference> {
    // minimalloc wall times (s) on this machine class, from its README.
    const MM: &[(&str, f64)] = &[
        ("A", 13.5),
        ("B", 9.7),
        ("C", 1.7),
        ("D", 6.4),
        ("E", 9.6),
        ("F", 14.6),
        ("G", 3.4),
        ("H", 5.1),
        ("I", 9.4),
        ("J", 2.7),
        ("K", 1.8),
    ];
    // idealloc -l 1: best peak / LB and time (s), from its README.
    const IA: &[(&str, f64, f64)] = &[
        ("A", 1.2900, 0.002),
        ("B", 1.3467, 0.002),
        ("C", 1.3635, 0.002),
        ("D", 1.3094, 0.006),
        ("E", 1.3691, 0.002),
        ("F", 1.3672, 0.002),
        ("G", 1.3701, 0.002),
        ("H", 1.2812, 0.002),
        ("I", 1.4102, 0.004),
        ("J", 1.3126, 0.013),
        ("K", 1.2773, 0.005),
        ("G_1", 1.0028, 0.06),
        ("S_1", 1.0293, 11.4),
        ("Y_1", 1.0036, 74.0),
        ("resnet50", 1.0064, 0.08),
        ("pangu_2.6B", 1.0334, 3.1),
        ("tiny_bert", 1.0003, 0.09),
        ("bert_base", 1.0000105, 1.0),
        ("bert_large", 1.0000027, 2.9),
        ("bert_nezha", 1.0000037, 3.5),
        ("pangu_13B", 1.0000, 2.1),
        ("non_existent", 1.0000, 0.001),
        ("iree_mobilenet", 1.0000, 0.001),
        ("iree_mobilebert", 1.1356, 0.003),
    ];
    let mut stem = name.trim_end_matches(".csv").trim_end_matches(".halfopen");
    if let Some((head, tail)) = stem.rsplit_once('.')
        && tail.bytes().all(|b| b.is_ascii_digit())
    {
        stem = head;
    }
    if suite == "minimalloc" {
        return MM
            .iter()
            .find(|(k, _)| *k == stem)
            .map(|&(_, s)| Reference {
                peer: "minimalloc",
                ratio: None,
                time_ms: s * 1e3,
                time_factor: 10.0,
            });
    }
    IA.iter()
        .find(|(k, _, _)| *k == stem)
        .map(|&(_, r, s)| Reference {
            peer: "idealloc -l 1",
            ratio: Some(r),
            time_ms: s * 1e3,
            time_factor: 1.0,
        })
}

/// Every `*.csv` under `dir`, sorted, except raw exports with an `offset` column.
pub fn instances(dir: &Path) -> Result<Vec<PathBuf>, PlaceError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| PlaceError::Io {
            path: d.display().to_string(),
            message: e.to_string(),
        })?;
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "csv") {
                let head = std::fs::read_to_string(&p)
                    .ok()
                    .and_then(|t| t.lines().next().map(str::to_string))
                    .unwrap_or_default();
                if !head.split(',').any(|c| c.trim() == "offset") {
                    out.push(p);
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The capacity in a file name such as `A.1048576.csv`.
pub fn capacity_from_name(name: &str) -> Option<u64> {
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() >= 3 {
        parts[parts.len() - 2].parse().ok()
    } else {
        None
    }
}

/// Runs one instance file.
pub fn run_instance(dir: &Path, path: &Path, opts: &Options) -> Result<BenchRow, PlaceError> {
    let text = std::fs::read_to_string(path).map_err(|e| PlaceError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    let rel = path.strip_prefix(dir).unwrap_or(path);
    let suite = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .unwrap_or_default();
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_default();
    let p = parse_csv(&text, &rel.display().to_string())?;
    let capacity = capacity_from_name(&name);
    let o = Options { capacity, ..*opts };
    let r: FlatOutcome = place_flat(&p, &o)?;
    let lb = r.lower_bound.max(1) as f64;
    let reference = reference(&suite, &name);
    let ratio = r.peak.map(|pk| pk as f64 / lb);
    let goal_met = reference.map(|rf| {
        let time_ok = r.time_ms <= rf.time_ms / rf.time_factor;
        match rf.ratio {
            None => r.fits && time_ok,
            Some(x) => ratio.is_some_and(|q| q <= x + 1e-9) && time_ok,
        }
    });
    Ok(BenchRow {
        suite,
        instance: rel.display().to_string(),
        buffers: p.buffers.len(),
        lower_bound: r.lower_bound,
        capacity,
        peak: r.peak,
        ratio,
        fits: capacity.map(|_| r.fits),
        time_ms: r.time_ms,
        mode_used: r.mode_used.map(|m| m.name().to_string()),
        first_peak: r.first_peak,
        first_ratio: r.first_peak.map(|pk| pk as f64 / lb),
        first_ms: r.first_ms,
        reference,
        goal_met,
    })
}

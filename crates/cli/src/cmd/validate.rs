//! `tessera run`'s per-operation validation: every graph tensor an operation leaves
//! on the tiles is copied out by the simulator at the superstep boundary where the
//! operation's last step has ended, mapped back into the tensor through its
//! distributed layout, and compared with the f16-storage reference. The output
//! check alone misses a wrong block: the pooled output averages every token.

use anyhow::Context as _;
use half::f16;
use serde::Serialize;
use tessera_compile::Compiled;
use tessera_compile::probe::{PlacedPart, ProbeAt, ResultProbe};
use tessera_graph::{Graph, HostTensor, TensorId};
use tessera_sim::{Capture, CapturePoint, Perturb};

use super::compile::tolerance;

/// One graph tensor of an operation, checked (or why not).
#[derive(Debug, Clone, Serialize)]
pub struct TensorCheck {
    /// The graph operation whose output it is.
    pub tensor: String,
    /// Largest `|run - reference|` over every stored copy of every element
    /// (against the f16-storage reference); `None` when not checked.
    pub max_abs_error: Option<f32>,
    /// [`super::compile::ULPS`] f16 ulps at the tensor's largest magnitude in the
    /// f32 reference (floor 1), as for the outputs.
    pub tolerance: Option<f32>,
    /// The tile holding the element with the largest error.
    pub worst_tile: Option<u32>,
    pub passed: Option<bool>,
    /// Where it was read: `before exchange #N` or `end of run`.
    pub read_at: Option<String>,
    /// How it is stored, or why it was not checked.
    pub note: Option<String>,
}

/// The check of one plan operation: its tensors, and the worst of them against
/// its own tolerance.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OpCheck {
    pub max_abs_error: Option<f32>,
    pub tolerance: Option<f32>,
    pub worst_tile: Option<u32>,
    /// `None` when none of its tensors was checked.
    pub passed: Option<bool>,
    pub tensors: Vec<TensorCheck>,
}

/// The first operation, in program order, whose check failed.
#[derive(Debug, Clone, Serialize)]
pub struct Mismatch {
    pub op: String,
    pub tensor: String,
    pub worst_tile: Option<u32>,
    pub max_abs_error: Option<f32>,
    pub tolerance: Option<f32>,
}

/// The test hook's perturbation: one tile's part of an operation's output scaled
/// where the operation ends.
#[derive(Debug, Clone, Serialize)]
pub struct Perturbed {
    pub op: String,
    pub tensor: String,
    pub tile: u32,
    pub factor: f32,
}

/// What the simulator is asked to copy out (and, under the test hook, perturb).
pub struct Requests {
    pub captures: Vec<Capture>,
    pub perturb: Vec<Perturb>,
    pub perturbed: Option<Perturbed>,
    /// Per probe of `Compiled::results`, the index of its first part's capture.
    first: Vec<Option<usize>>,
}

fn point(at: &ProbeAt) -> CapturePoint {
    at.exchange
        .map_or(CapturePoint::End, CapturePoint::Exchange)
}

/// Captures of every readable result's parts, and with `perturb` (a plan
/// operation's name) its first readable tensor's first part scaled by `factor`.
pub fn requests(c: &Compiled, perturb: Option<&str>, factor: f32) -> anyhow::Result<Requests> {
    let mut captures = Vec::new();
    let mut first = Vec::with_capacity(c.results.len());
    for r in &c.results {
        let Some(at) = &r.at else {
            first.push(None);
            continue;
        };
        first.push(Some(captures.len()));
        for p in &at.parts {
            captures.push(Capture {
                at: point(at),
                tile: p.tile,
                addr: p.addr,
                len: p.bytes(),
            });
        }
    }
    let (mut pert, mut perturbed) = (Vec::new(), None);
    if let Some(op) = perturb {
        let (r, at, part) = c
            .results
            .iter()
            .filter(|r| c.plan_ops.get(r.op).is_some_and(|o| o.name == op))
            .find_map(|r| {
                let at = r.at.as_ref()?;
                Some((r, at, at.parts.first()?))
            })
            .with_context(|| format!("--perturb: `{op}` leaves no readable tensor on the tiles"))?;
        pert.push(Perturb {
            at: point(at),
            tile: part.tile,
            addr: part.addr,
            len: part.bytes(),
            factor,
        });
        perturbed = Some(Perturbed {
            op: op.to_string(),
            tensor: r.tensor.clone(),
            tile: part.tile,
            factor,
        });
    }
    Ok(Requests {
        captures,
        perturb: pert,
        perturbed,
        first,
    })
}

/// The graph tensors the checks compare with: those of every readable result.
pub fn wanted(g: &Graph, c: &Compiled) -> anyhow::Result<Vec<TensorId>> {
    c.results
        .iter()
        .filter(|r| r.at.is_some())
        .map(|r| {
            g.ops()
                .iter()
                .find(|o| o.name == r.tensor)
                .map(|o| o.output)
                .with_context(|| format!("the plan names `{}`, not in the graph", r.tensor))
        })
        .collect()
}

/// The flat index into the graph tensor (of dims `dims`) of stored element
/// (`row`, `col`) of `at`, or `None` for a padding column or another tensor's
/// column (siblings stored side by side).
fn element(at: &ProbeAt, dims: &[usize], row: u32, col: u32) -> Option<usize> {
    let s = &at.stored;
    let rel = col.checked_sub(s.offset)?;
    let (logical, split) = match s.heads {
        None => (rel, None),
        Some((heads, d, dp)) => {
            let (h, j) = (rel / dp, rel % dp);
            if h >= heads || j >= d {
                return None;
            }
            (h * d + j, Some((h, j, d)))
        }
    };
    if logical >= s.logical_cols() {
        return None;
    }
    let (row, logical) = (row as usize, logical as usize);
    match (split, dims) {
        // `[batch, heads, tokens, d]` stored merged: `[batch * tokens, heads * dp]`.
        (Some((h, j, d)), &[_, heads, tokens, dd]) if dd == d as usize => {
            let (b, t) = (row / tokens, row % tokens);
            Some(((b * heads + h as usize) * tokens + t) * dd + j as usize)
        }
        _ => Some(row * s.logical_cols() as usize + logical),
    }
}

/// Compares every readable result with the reference (`want16`, `want32`: the
/// values of [`wanted`]'s tensors, in its order) and groups the checks by plan
/// operation; `captured` is the simulator's copy of [`Requests::captures`] (a
/// tensor the run did not reach, having faulted before, is reported unread).
pub fn check(
    c: &Compiled,
    req: &Requests,
    captured: &[Option<Vec<u8>>],
    want16: &[HostTensor],
    want32: &[HostTensor],
) -> Vec<OpCheck> {
    let mut ops = vec![OpCheck::default(); c.plan_ops.len()];
    let mut k = 0;
    for (r, first) in c.results.iter().zip(&req.first) {
        let check = match (&r.at, first) {
            (Some(at), Some(first)) => {
                let i = k;
                k += 1;
                compare(r, at, &captured[*first..], &want16[i], &want32[i])
            }
            _ => TensorCheck {
                tensor: r.tensor.clone(),
                max_abs_error: None,
                tolerance: None,
                worst_tile: None,
                passed: None,
                read_at: None,
                note: r.note.clone(),
            },
        };
        if let Some(op) = ops.get_mut(r.op) {
            op.tensors.push(check);
        }
    }
    for op in &mut ops {
        let ratio = |t: &TensorCheck| match (t.max_abs_error, t.tolerance) {
            (Some(e), Some(tol)) => e / tol,
            _ => f32::NEG_INFINITY,
        };
        // The tensor furthest from the reference against its own tolerance.
        if let Some(w) = op
            .tensors
            .iter()
            .filter(|t| t.passed.is_some())
            .max_by(|x, y| ratio(x).total_cmp(&ratio(y)))
        {
            op.max_abs_error = w.max_abs_error;
            op.tolerance = w.tolerance;
            op.worst_tile = w.worst_tile;
            op.passed = Some(op.tensors.iter().all(|t| t.passed != Some(false)));
        }
    }
    ops
}

fn compare(
    r: &ResultProbe,
    at: &ProbeAt,
    captured: &[Option<Vec<u8>>],
    want16: &HostTensor,
    want32: &HostTensor,
) -> TensorCheck {
    let scale = at.stored.scale;
    let magnitude = want32.data().iter().fold(0.0f32, |m, v| m.max(v.abs())) * scale.abs();
    let tol = tolerance(magnitude);
    let dims = want16.shape().dims().to_vec();
    let mut worst: Option<(f32, u32)> = None;
    let mut unread = false;
    for (p, bytes) in at.parts.iter().zip(captured) {
        let Some(bytes) = bytes else {
            unread = true;
            continue;
        };
        let e = part_error(at, p, bytes, &dims, want16.data(), scale);
        if worst.is_none_or(|(w, _)| e > w) {
            worst = Some((e, p.tile));
        }
    }
    let read_at = Some(match at.exchange {
        Some(id) => format!("before exchange #{id}"),
        None => "end of run".to_string(),
    });
    match worst {
        Some((e, tile)) if !unread => TensorCheck {
            tensor: r.tensor.clone(),
            max_abs_error: Some(e),
            tolerance: Some(tol),
            worst_tile: Some(tile),
            passed: Some(e <= tol),
            read_at,
            note: r.note.clone(),
        },
        _ => TensorCheck {
            tensor: r.tensor.clone(),
            max_abs_error: None,
            tolerance: Some(tol),
            worst_tile: None,
            passed: None,
            read_at,
            note: Some("not read: the run stopped before it".to_string()),
        },
    }
}

/// Largest error of one part's elements; a NaN counts as infinite.
fn part_error(
    at: &ProbeAt,
    p: &PlacedPart,
    bytes: &[u8],
    dims: &[usize],
    want: &[f32],
    scale: f32,
) -> f32 {
    let mut worst = 0.0f32;
    for row in p.rows.clone() {
        for col in p.cols.clone() {
            let Some(i) = element(at, dims, row, col) else {
                continue;
            };
            let (Some(off), Some(&w)) = (p.offset_of(row, col), want.get(i)) else {
                worst = f32::INFINITY;
                continue;
            };
            let off = off as usize;
            let got = f16::from_le_bytes([bytes[off], bytes[off + 1]]).to_f32();
            let d = (got - w * scale).abs();
            worst = worst.max(if d.is_nan() { f32::INFINITY } else { d });
        }
    }
    worst
}

/// The first failing operation in program order.
pub fn first_mismatch(c: &Compiled, checks: &[OpCheck]) -> Option<Mismatch> {
    c.plan_ops.iter().zip(checks).find_map(|(o, ch)| {
        (ch.passed == Some(false)).then(|| {
            let t = ch
                .tensors
                .iter()
                .find(|t| t.passed == Some(false))
                .expect("a failing operation has a failing tensor");
            Mismatch {
                op: o.name.clone(),
                tensor: t.tensor.clone(),
                worst_tile: t.worst_tile,
                max_abs_error: t.max_abs_error,
                tolerance: t.tolerance,
            }
        })
    })
}

/// The text report: one line per graph tensor of every operation.
pub fn render(c: &Compiled, checks: &[OpCheck]) -> String {
    let mut out = format!(
        "{:44} {:44} {:>10} {:>10} {:>6} {:>6}  read at / note\n",
        "operation", "tensor", "max_err", "tolerance", "ratio", "tile"
    );
    for (o, ch) in c.plan_ops.iter().zip(checks) {
        for t in &ch.tensors {
            let num = |v: Option<f32>| v.map_or("-".to_string(), |v| format!("{v:.6}"));
            let ratio = match (t.max_abs_error, t.tolerance) {
                (Some(e), Some(tol)) => format!("{:.2}", e / tol),
                _ => "-".to_string(),
            };
            let place = [t.read_at.clone(), t.note.clone()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ");
            out += &format!(
                "{:44} {:44} {:>10} {:>10} {:>6} {:>6}  {}{}\n",
                o.name,
                t.tensor,
                num(t.max_abs_error),
                num(t.tolerance),
                ratio,
                t.worst_tile.map_or("-".to_string(), |t| t.to_string()),
                place,
                if t.passed == Some(false) {
                    "  MISMATCH"
                } else {
                    ""
                }
            );
        }
    }
    out
}

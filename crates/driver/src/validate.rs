//! Validation of a run: every output against the f32 reference and against the
//! reference that stores f16 where the program does, and every graph tensor an
//! operation leaves on the tiles, copied out by the simulator at the superstep
//! boundary where the operation's last step has ended, mapped back into the tensor
//! through its distributed layout, and compared with the f16-storage reference.
//! The output check alone misses a wrong block: the pooled output averages every
//! token.

use std::time::Instant;

use half::f16;
use serde::Serialize;
use std::collections::HashMap;
use tessera_compile::Compiled;

use tessera_compile::probe::{PlacedPart, ProbeAt, ResultProbe};
use tessera_graph::{Graph, HostTensor, OpKind, TensorId};
use tessera_reference::{CHUNK, EvalOptions, Evaluator, Fp8Weight};
use tessera_sim::{Capture, CapturePoint, Perturb, Status};

use crate::{Error, Model, Progress, Run, Step};

/// f16 ulps, at the output's largest magnitude, that a run may differ from the
/// reference rounding where the program stores f16: the kernels' own roundings
/// (GELU in f16 arithmetic, softmax's f16 exponentials, LayerNorm's reciprocal
/// square root) and the order of f32 sums. See docs/compile.md for how it was set.
pub const ULPS: f32 = 4.0;

/// The validation tolerance for an output of magnitude up to `scale`.
pub fn tolerance(scale: f32) -> f32 {
    ULPS * tessera_reference::f16_ulp(scale.max(1.0))
}

/// The tolerance of a model's outputs after `layers` encoder layers: each
/// layer's own roundings (each operation is held to [`tolerance`] against the
/// reference fed the program's own inputs) carry into the next, and such
/// independent errors add like a random walk, so the end-to-end rule grows with
/// the square root of the depth. One layer keeps [`tolerance`].
pub fn output_tolerance(scale: f32, layers: usize) -> f32 {
    tolerance(scale) * (layers.max(1) as f32).sqrt()
}

/// Encoder layers in `g` (at least one), the depth the output rule scales
/// with: the layers its operations' names say ([`crate::layers_in`]).
pub fn encoder_layers(g: &Graph) -> usize {
    crate::layers_in(g.ops().iter().map(|o| o.name.as_str()))
        .len()
        .max(1)
}

/// One output compared with the f32 reference.
#[derive(Debug, Clone, Serialize)]
pub struct OutputCheck {
    pub name: String,
    /// Against the reference that rounds to f16 where the program stores f16.
    pub max_abs_error: Option<f32>,
    /// [`ULPS`] f16 ulps at the output's scale, times the square root of the
    /// encoder layers ([`output_tolerance`]).
    pub tolerance: f32,
    /// Against the pure f32 reference.
    pub max_abs_error_f32: Option<f32>,
    /// Largest `|reference|`.
    pub scale: f32,
    pub cosine: Option<f64>,
    pub passed: bool,
}

/// How a validated run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    /// Completed, every output and operation within its tolerance.
    Ok,
    /// Completed, something beyond its tolerance.
    Mismatch,
    /// Stopped at a fault.
    Fault,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Mismatch => "mismatch",
            RunStatus::Fault => "fault",
        }
    }
}

/// A run held to the references.
#[derive(Debug, Clone)]
pub struct Validation {
    /// One per graph output, in the graph's order.
    pub outputs: Vec<OutputCheck>,
    /// One per plan operation, in program order (empty checks when the run kept
    /// no probes).
    pub ops: Vec<OpCheck>,
    /// The first operation, in program order, whose tensors differ from the
    /// reference beyond their tolerance.
    pub mismatch: Option<Mismatch>,
    pub status: RunStatus,
    /// Wall time of the two reference evaluations.
    pub reference_ms: f64,
}

impl Validation {
    pub fn passed(&self) -> bool {
        self.status == RunStatus::Ok
    }

    /// The output furthest from its reference against its own tolerance: the one
    /// that speaks for the run.
    pub fn worst_output(&self) -> Option<&OutputCheck> {
        self.outputs.iter().max_by(|x, y| {
            let r = |o: &OutputCheck| o.max_abs_error.map_or(f32::INFINITY, |e| e / o.tolerance);
            r(x).total_cmp(&r(y))
        })
    }

    /// The largest error of any output against the pure f32 reference.
    pub fn max_abs_error_f32(&self) -> Option<f32> {
        self.outputs
            .iter()
            .filter_map(|o| o.max_abs_error_f32)
            .reduce(f32::max)
    }

    /// The smallest cosine similarity of any output with its reference.
    pub fn min_cosine(&self) -> Option<f64> {
        self.outputs
            .iter()
            .filter_map(|o| o.cosine)
            .reduce(f64::min)
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (f64::from(x), f64::from(y));
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    ab / (aa.sqrt() * bb.sqrt()).max(f64::MIN_POSITIVE)
}

/// Evaluates the references of `model` and holds `run` (of `compiled`) to them:
/// its outputs, and with the run's probes every operation where it ends.
pub fn validate(
    model: &Model,
    compiled: &Compiled,
    run: &Run,
    progress: &dyn Progress,
) -> Result<Validation, Error> {
    let (g, c) = (&model.graph, compiled);
    let t = Instant::now();
    let ops_in_graph = g.ops().len() as u64;
    progress.start(Step::Reference, Some(2 * ops_in_graph));
    // The f32 reference gives the outputs' f32 error and cosine only: every
    // check is held to the f16-storage one, at its magnitudes. It runs the
    // model's own weights, so that with FP8 its error and cosine say what FP8
    // costs.
    let f32_opts = EvalOptions::default();
    let want32 = Evaluator::new(g, &model.weights, &model.inputs, &f32_opts)?
        .finish_with(|n| progress.advance(n, None))?;
    // With probes, the f16-storage references ran beside the simulation and
    // checked each capture as the run copied it out (`Run::streamed`).
    let (want16, checks) = match &run.streamed {
        Some(streamed) => {
            progress.advance(2 * ops_in_graph, None);
            streamed.clone()
        }
        None => stream(g, c, model, None, &|n| {
            progress.advance(ops_in_graph + n, None)
        })?,
    };
    progress.finish();
    let completed = run.report.status == Status::Ok;
    let mut outputs = Vec::new();
    for out in g.outputs() {
        let missing = || Error::MissingOutput(out.name.clone());
        let want = want16.get(&out.name).ok_or_else(missing)?;
        let want32 = want32.get(&out.name).ok_or_else(missing)?;
        let scale = want.data().iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let tol = output_tolerance(scale, encoder_layers(g));
        let (max_err, max_err32, cosine) = if completed {
            let got = run.output(&out.name).ok_or_else(missing)?;
            let got = HostTensor::new(want.shape().clone(), got)?;
            (
                Some(tessera_reference::max_abs_error(&got, want)?),
                Some(tessera_reference::max_abs_error(&got, want32)?),
                Some(cosine(got.data(), want32.data())),
            )
        } else {
            (None, None, None)
        };
        outputs.push(OutputCheck {
            name: out.name.clone(),
            max_abs_error: max_err,
            tolerance: tol,
            max_abs_error_f32: max_err32,
            scale,
            cosine,
            passed: max_err.is_some_and(|e| e <= tol),
        });
    }
    if outputs.is_empty() {
        return Err(Error::NoOutput);
    }
    let ops = match checks {
        Some(checks) => by_op(c, checks),
        None => vec![OpCheck::default(); c.plan_ops.len()],
    };
    let mismatch = first_mismatch(c, &ops);
    let status = if !completed {
        RunStatus::Fault
    } else if outputs.iter().all(|o| o.passed) && mismatch.is_none() {
        RunStatus::Ok
    } else {
        RunStatus::Mismatch
    };
    Ok(Validation {
        outputs,
        ops,
        mismatch,
        status,
        reference_ms: t.elapsed().as_secs_f64() * 1e3 + run.checks_after_ms,
    })
}

/// The reference that stores f16 where the program does: chunk partials, the
/// plan's inner groups, every f16 tensor, and the weights the tiles hold as
/// FP8. The program may differ from it only by the kernels' own roundings, a
/// few ulps.
fn machine_options(g: &Graph, c: &Compiled) -> Result<EvalOptions, Error> {
    let mut opts = EvalOptions::f16_machine();
    let by_name: HashMap<&str, &tessera_graph::Op> =
        g.ops().iter().map(|o| (o.name.as_str(), o)).collect();
    let is_matmul = |name: &str| {
        by_name
            .get(name)
            .is_some_and(|o| matches!(o.kind, OpKind::MatMul { .. }))
    };
    for op in &c.plan_ops {
        if let Some(chunks) = op.inner_chunks {
            // Sibling projections fused into one matmul share its inner groups.
            for name in std::iter::once(&op.name).chain(&op.fused) {
                if is_matmul(name) {
                    opts = opts.with_matmul_groups(name.clone(), chunks);
                }
            }
        }
    }
    for (name, scale, factor) in &c.fp8_weights {
        let Some(OpKind::MatMul { b, .. }) = by_name.get(name.as_str()).map(|o| &o.kind) else {
            continue;
        };
        if let OpKind::Parameter { name: param, .. } = &g.producer(*b).kind {
            let w = Fp8Weight {
                scale: *scale,
                factor: *factor,
            };
            opts = opts.with_fp8_weight(param.clone(), w);
        }
    }
    Ok(opts)
}

/// What [`stream`] gives: the f16-storage reference's outputs, and with probes
/// one check per readable result of `Compiled::results` (by its index).
pub(crate) type Streamed = (tessera_graph::Outputs, Option<Vec<Option<TensorCheck>>>);

/// The captures of a run as the simulator copies them out
/// (`SimOptions::on_capture`), each held from its arrival until its result is
/// checked: the run and the checks go together, and what a whole tower's run
/// copies out is never all held at once.
pub(crate) struct Captured {
    rx: std::sync::mpsc::Receiver<(usize, Vec<u8>)>,
    arrived: HashMap<usize, Vec<u8>>,
    /// The run has ended: what has not arrived never will.
    ended: bool,
}

impl Captured {
    pub(crate) fn new(rx: std::sync::mpsc::Receiver<(usize, Vec<u8>)>) -> Self {
        Captured {
            rx,
            arrived: HashMap::new(),
            ended: false,
        }
    }

    /// Captures `first..first + n`, waiting for each until it arrives or the
    /// run ends (`None`: never copied out).
    fn take(&mut self, first: usize, n: usize) -> Vec<Option<Vec<u8>>> {
        (first..first + n)
            .map(|k| {
                loop {
                    if let Some(b) = self.arrived.remove(&k) {
                        return Some(b);
                    }
                    if self.ended {
                        return None;
                    }
                    match self.rx.recv() {
                        Ok((i, b)) => {
                            self.arrived.insert(i, b);
                        }
                        Err(_) => self.ended = true,
                    }
                }
            })
            .collect()
    }
}

/// Evaluates the f16-storage reference of the whole model and, with probes,
/// the same reference fed the program's own values, in lockstep, checking each
/// readable result as its tensor is computed: its own error (against the
/// reference fed the program's values of what it reads) and what it inherits
/// (against the whole model's). Nothing is kept past its last reader but one
/// attention's scores and values until its product is checked, so the memory
/// is one layer's, whatever the depth; keeping every result, as the checks
/// once did, needed 0.55 GB a So400m layer at batch 2. With probes, what
/// [`crate::simulate`] runs beside the simulation, fed the captures as the
/// simulator copies them out.
pub(crate) fn stream(
    g: &Graph,
    c: &Compiled,
    model: &Model,
    probes: Option<(&Requests, &mut Captured)>,
    advance: &dyn Fn(u64),
) -> Result<Streamed, Error> {
    let opts = &machine_options(g, c)?;
    let mut whole = Evaluator::new(g, &model.weights, &model.inputs, opts)?;
    let Some((req, captured)) = probes else {
        return Ok((whole.finish_with(advance)?, None));
    };
    let mut own = Evaluator::new(g, &model.weights, &model.inputs, opts)?;
    let by_tensor = readable(g, c, req)?;
    // A softmax product's floor is read from the scores and values its own
    // evaluation computed: each is held from its operation to the product's.
    let products = softmax_products(g, by_tensor.keys().copied());
    let floor_inputs: std::collections::HashSet<TensorId> =
        products.values().flat_map(|&(s, v)| [s, v]).collect();
    let mut held: HashMap<TensorId, HostTensor> = HashMap::new();
    let mut checks: Vec<Option<TensorCheck>> = vec![None; c.results.len()];
    let mut done = 0;
    while let Some(t) = whole.step()? {
        own.step()?;
        done += 1;
        advance(done);
        let (Some(w), Some(o)) = (whole.value(t), own.value(t)) else {
            return Err(tessera_reference::RefError::Released(t).into());
        };
        if floor_inputs.contains(&t) {
            held.insert(t, o.clone());
        }
        let Some(results) = by_tensor.get(&t) else {
            continue;
        };
        let floor = products
            .get(&t)
            .and_then(|(s, v)| softmax_floor(held.get(s)?, held.get(v)?))
            .unwrap_or(0.0);
        if let Some((s, v)) = products.get(&t) {
            held.remove(s);
            held.remove(v);
        }
        let mut given = None;
        for &(ri, first) in results {
            let r = &c.results[ri];
            let Some(at) = &r.at else {
                continue;
            };
            let parts = captured.take(first, at.parts.len());
            let mut check = compare(r, at, &parts, o, floor);
            check.max_abs_error_inherited = compare(r, at, &parts, w, floor).max_abs_error;
            checks[ri] = Some(check);
            given = program_value(at, &parts, w).or(given);
        }
        // Each operation after is held to the reference fed the values the
        // program gave it, so that its check measures its own error.
        if let Some(v) = given {
            own.replace(t, v)?;
        }
    }
    Ok((whole.outputs()?, Some(checks)))
}

/// One graph tensor of an operation, checked (or why not).
#[derive(Debug, Clone, Serialize)]
pub struct TensorCheck {
    /// The graph operation whose output it is.
    pub tensor: String,
    /// Largest `|run - reference|` over every stored copy of every element,
    /// against the f16-storage reference fed the program's own values of the
    /// tensors the operation reads: the operation's own error. `None` when not
    /// checked.
    pub max_abs_error: Option<f32>,
    /// The same against the f16-storage reference of the whole model: with what
    /// the operation inherits from those before it.
    pub max_abs_error_inherited: Option<f32>,
    /// [`ULPS`] f16 ulps at the tensor's largest magnitude in the
    /// f16-storage reference it is compared with (floor 1), as for the outputs.
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
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    pub captures: Vec<Capture>,
    pub perturb: Vec<Perturb>,
    pub perturbed: Option<Perturbed>,
    /// Per probe of `Compiled::results`, the index of its first part's capture.
    first: Vec<Option<usize>>,
}

fn point(at: &ProbeAt) -> CapturePoint {
    at.exchange
        .map_or(CapturePoint::End, |id| CapturePoint::Exchange(id, at.nth))
}

/// Captures of every readable result's parts, and with `perturb` (a plan
/// operation's name) its first readable tensor's first part scaled by `factor`.
pub(crate) fn requests(
    c: &Compiled,
    perturb: Option<&str>,
    factor: f32,
) -> Result<Requests, Error> {
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
            .ok_or_else(|| Error::NothingToPerturb(op.to_string()))?;
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

/// Per graph tensor of a readable result of `Compiled::results`, its results:
/// (index in `Compiled::results`, index of its first part's capture).
fn readable(
    g: &Graph,
    c: &Compiled,
    req: &Requests,
) -> Result<HashMap<TensorId, Vec<(usize, usize)>>, Error> {
    let tensors: HashMap<&str, TensorId> = g
        .ops()
        .iter()
        .map(|o| (o.name.as_str(), o.output))
        .collect();
    let mut by = HashMap::<TensorId, Vec<(usize, usize)>>::new();
    for (ri, (r, first)) in c.results.iter().zip(&req.first).enumerate() {
        let (Some(_), Some(first)) = (&r.at, first) else {
            continue;
        };
        let t = tensors
            .get(r.tensor.as_str())
            .ok_or_else(|| Error::UnknownTensor(r.tensor.clone()))?;
        by.entry(*t).or_default().push((ri, *first));
    }
    Ok(by)
}

/// Of `tensors`, those that are a softmax's probabilities times values, with
/// the softmax's input (the scores) and the values.
fn softmax_products(
    g: &Graph,
    tensors: impl Iterator<Item = TensorId>,
) -> HashMap<TensorId, (TensorId, TensorId)> {
    tensors
        .filter_map(|t| {
            let OpKind::MatMul {
                a,
                b,
                transpose_b: false,
                ..
            } = g.producer(t).kind
            else {
                return None;
            };
            let OpKind::Softmax { x } = g.producer(a).kind else {
                return None;
            };
            Some((t, (x, b)))
        })
        .collect()
}

/// Ulps of a score the program and the reference may disagree by: each rounds
/// the f16 partial sum after every 16-wide chunk of the contraction (a head of
/// 72 dimensions: four roundings before the last, each up to half an ulp of the
/// score), and they do so at different points (the program's query projection
/// carries the scale, the reference scales the scores after).
const SCORE_ULPS: f64 = 2.0;

/// f16's unit roundoff (2^-11): the largest relative error of one rounding to f16.
const F16_UNIT: f64 = 1.0 / 2048.0;

/// The column softmax's exponential of an f16 argument `a` is within
/// `2^-11 + EXP_ARG * |a|` of `exp(a)`, relative (its f16 subtraction, then
/// `f16v2exp` and the f16 result: `crates/kernels/src/softmax_cols.rs`).
const EXP_ARG: f64 = 1.25 / 1024.0;

/// The chance, for one softmax product of a correct run, that the roundings of
/// its running sums carry some element past the floor: the floor's statistical
/// part is set by it and the number of elements compared.
const FALSE_ALARM: f64 = 1e-3;

/// The least tolerance of a softmax product `out = sum_j p_j v_j`: what the
/// program's and the reference's roundings may make them differ by where the
/// output's own magnitude says little (deep in a tower the values cancel, the
/// running sums stand well above the output, and scores grow while outputs do
/// not). Scores `[.., q, k]`, values `[.., k, d]`. Per query row and value
/// column `c`, with `p` the probabilities, `z` the exponentials' sum (the
/// program multiplies the exponentials `e = z p` by the values and scales by
/// `1/z` after) and `P_k` the running sum `sum p_j v_jc` at the end of chunk `k`:
/// - the program's exponentials, each within `SCORE_ULPS ulp(s_j)` (the scores'
///   roundings) plus `2^-11 + EXP_ARG |s_j - max|` (its own) relative, which its
///   normalisation by their own sum turns into `p_j |v_jc - out_c|` each;
/// - the reference's probabilities rounded to f16, not renormalised:
///   `2^-11 p_j |v_jc|` each;
/// - the program's scaling by `1/z`: the factor rounded to f16 and the product
///   rounded, `2^-11 |out_c| + ulp(out_c) / 2`;
/// - the chunk roundings of the running sums, in the program at the exponentials'
///   scale (`ulp(z P_k) / z`) and in the reference at the probabilities'
///   (`ulp(P_k)`), each uniform within half its ulp and independent: their sum is
///   near normal with variance `sum_k (ulp(z P_k)^2 / z^2 + ulp(P_k)^2) / 12`, and
///   is allowed `K` standard deviations, `K = sqrt(2 ln(2 N / FALSE_ALARM))` for
///   the product's `N` elements (a uniform rounding is sub-Gaussian with its own
///   variance, so `2 exp(-K^2 / 2)` bounds each element's tail and the union
///   over `N` elements is `FALSE_ALARM`), or their worst case, every rounding
///   half an ulp the same way, where that is less (a few chunks). At 729 keys
///   the worst case is some 46 ulps: no check at all.
///
/// The first three are worst cases. The worst over rows and columns; rows in
/// parallel.
fn softmax_floor(s: &HostTensor, v: &HostTensor) -> Option<f32> {
    use rayon::prelude::*;
    let (sd, vd) = (s.shape().dims(), v.shape().dims());
    let (&tk, &d) = (sd.last()?, vd.last()?);
    let tq = *sd.get(sd.len().checked_sub(2)?)?;
    if vd.get(vd.len().checked_sub(2)?) != Some(&tk) || tk == 0 || tq == 0 || d == 0 {
        return None;
    }
    let groups = s.data().len() / (tq * tk);
    if v.data().len() != groups * tk * d {
        return None;
    }
    let elements = (groups * tq * d) as f64;
    let k = (2.0 * (2.0 * elements / FALSE_ALARM).ln()).sqrt();
    let ulp = |x: f64| f64::from(tessera_reference::f16_ulp(x as f32));
    let row_bound = |r: usize| -> f64 {
        let g = r / tq;
        let vg = &v.data()[g * tk * d..(g + 1) * tk * d];
        let row = &s.data()[r * tk..(r + 1) * tk];
        let m = row.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        let mut p: Vec<f64> = row.iter().map(|&x| f64::from(x - m).exp()).collect();
        let z: f64 = p.iter().sum();
        p.iter_mut().for_each(|x| *x /= z);
        let mut out = vec![0.0f64; d];
        // Per column: `sum_j p_j |v_jc|`, for the reference's probabilities.
        let mut mass = vec![0.0f64; d];
        // Per column: the chunk roundings' variance (times 12) and worst case.
        let mut var = vec![0.0f64; d];
        let mut most = vec![0.0f64; d];
        for (j, &pj) in p.iter().enumerate() {
            for ((o, a), &x) in out.iter_mut().zip(&mut mass).zip(&vg[j * d..(j + 1) * d]) {
                let x = f64::from(x);
                *o += pj * x;
                *a += pj * x.abs();
            }
            if (j + 1) % CHUNK == 0 || j + 1 == tk {
                for ((w, a), &o) in var.iter_mut().zip(&mut most).zip(&out) {
                    let (prog, refr) = (ulp(z * o) / z, ulp(o));
                    *w += prog * prog + refr * refr;
                    *a += (prog + refr) / 2.0;
                }
            }
        }
        let mut bound: Vec<f64> = (0..d)
            .map(|c| {
                let o = out[c];
                (k * (var[c] / 12.0).sqrt()).min(most[c])
                    + F16_UNIT * (o.abs() + mass[c])
                    + ulp(o) / 2.0
            })
            .collect();
        // The exponentials' own errors, weighted by how far each value is from
        // the output (the second pass: it needs the output).
        for (j, (&pj, &sj)) in p.iter().zip(row).enumerate() {
            let w = pj
                * (SCORE_ULPS * ulp(f64::from(sj.abs()))
                    + F16_UNIT
                    + EXP_ARG * f64::from(sj - m).abs());
            for ((b, &x), &o) in bound.iter_mut().zip(&vg[j * d..(j + 1) * d]).zip(&out) {
                *b += w * (f64::from(x) - o).abs();
            }
        }
        bound.into_iter().fold(0.0, f64::max)
    };
    let worst = (0..groups * tq)
        .into_par_iter()
        .map(row_bound)
        .reduce(|| 0.0, f64::max);
    Some(worst as f32)
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

/// Groups the results' checks (by index in `Compiled::results`; `None` for
/// one not read) by plan operation, each with its worst tensor.
fn by_op(c: &Compiled, checks: Vec<Option<TensorCheck>>) -> Vec<OpCheck> {
    let mut ops = vec![OpCheck::default(); c.plan_ops.len()];
    for (r, check) in c.results.iter().zip(checks) {
        let check = check.unwrap_or_else(|| TensorCheck {
            tensor: r.tensor.clone(),
            max_abs_error: None,
            max_abs_error_inherited: None,
            tolerance: None,
            worst_tile: None,
            passed: None,
            read_at: None,
            note: r.note.clone(),
        });
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
    floor: f32,
) -> TensorCheck {
    let scale = at.stored.scale;
    // Ulps at the magnitude of the values compared. The f32 reference runs the
    // model's own weights from the first layer on: with FP8 weights, deep in a
    // tower its magnitudes drift from those the program computes (by several
    // percent at 27 layers), and a rule read off them would not be the program's.
    let magnitude = want16.data().iter().fold(0.0f32, |m, v| m.max(v.abs())) * scale.abs();
    let tol = tolerance(magnitude).max(floor * scale.abs());
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
            max_abs_error_inherited: None,
            tolerance: Some(tol),
            worst_tile: Some(tile),
            passed: Some(e <= tol),
            read_at,
            note: r.note.clone(),
        },
        _ => TensorCheck {
            tensor: r.tensor.clone(),
            max_abs_error: None,
            max_abs_error_inherited: None,
            tolerance: Some(tol),
            worst_tile: None,
            passed: None,
            read_at,
            note: Some("not read: the run stopped before it".to_string()),
        },
    }
}

/// The program's value of a result's tensor (`want`: the reference's) as the
/// run left it on the tiles: each element from the first stored copy that
/// holds it, unscaled, and the reference's value where no read part holds it;
/// `None` when no part was read.
fn program_value(at: &ProbeAt, parts: &[Option<Vec<u8>>], want: &HostTensor) -> Option<HostTensor> {
    let scale = at.stored.scale;
    if scale == 0.0 || !scale.is_finite() {
        return None;
    }
    let dims = want.shape().dims().to_vec();
    let mut data = want.data().to_vec();
    let mut set = vec![false; data.len()];
    let mut read = false;
    for (p, bytes) in at.parts.iter().zip(parts) {
        let Some(bytes) = bytes else {
            continue;
        };
        read = true;
        for row in p.rows.clone() {
            for col in p.cols.clone() {
                let Some(e) = element(at, &dims, row, col) else {
                    continue;
                };
                let Some(off) = p.offset_of(row, col) else {
                    continue;
                };
                let off = off as usize;
                if let (Some(&[lo, hi]), Some(false)) = (bytes.get(off..off + 2), set.get(e)) {
                    data[e] = f16::from_le_bytes([lo, hi]).to_f32() / scale;
                    set[e] = true;
                }
            }
        }
    }
    if !read {
        return None;
    }
    HostTensor::new(want.shape().clone(), data).ok()
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
            let Some(&[lo, hi]) = bytes.get(off..off + 2) else {
                worst = f32::INFINITY;
                continue;
            };
            let got = f16::from_le_bytes([lo, hi]).to_f32();
            let d = (got - w * scale).abs();
            worst = worst.max(if d.is_nan() { f32::INFINITY } else { d });
        }
    }
    worst
}

/// The first failing operation in program order.
fn first_mismatch(c: &Compiled, checks: &[OpCheck]) -> Option<Mismatch> {
    c.plan_ops.iter().zip(checks).find_map(|(o, ch)| {
        if ch.passed != Some(false) {
            return None;
        }
        let t = ch.tensors.iter().find(|t| t.passed == Some(false))?;
        Some(Mismatch {
            op: o.name.clone(),
            tensor: t.tensor.clone(),
            worst_tile: t.worst_tile,
            max_abs_error: t.max_abs_error,
            tolerance: t.tolerance,
        })
    })
}

#[cfg(test)]
mod floor_tests {
    use half::f16;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use tessera_graph::HostTensor;

    use super::{CHUNK, softmax_floor};

    fn r16(x: f32) -> f32 {
        f16::from_f32(x).to_f32()
    }

    /// A running sum rounded to f16 after every chunk of `w[j] * v[j]`.
    fn chunked(w: &[f32], v: &[f32]) -> f32 {
        w.chunks(CHUNK)
            .zip(v.chunks(CHUNK))
            .fold(0.0, |acc, (w, v)| {
                r16(acc + w.iter().zip(v).map(|(a, b)| a * b).sum::<f32>())
            })
    }

    /// Row `r`, column `c` of the product the program's way (f16 exponentials
    /// of f16 arguments, their f32 sum, the product at their scale, then the
    /// f16 `1/sum`) and the reference's (f16 probabilities, then the product).
    fn both(s: &[f32], v: &[f32], d: usize, c: usize) -> (f32, f32) {
        let m = s.iter().fold(f32::NEG_INFINITY, |a, &x| a.max(x));
        let e: Vec<f32> = s.iter().map(|&x| r16(r16(x - m).exp())).collect();
        let z: f32 = e.iter().sum();
        let col: Vec<f32> = v.chunks(d).map(|row| row[c]).collect();
        let program = r16(chunked(&e, &col) * r16(1.0 / z));
        let exact: Vec<f64> = s.iter().map(|&x| f64::from(x - m).exp()).collect();
        let total: f64 = exact.iter().sum();
        let p: Vec<f32> = exact.iter().map(|&x| r16((x / total) as f32)).collect();
        (program, chunked(&p, &col))
    }

    /// A diffuse attention over 729 keys whose values do not cancel (running
    /// sums of 2 to 4, as deep in the So400m tower at batch 1): the program's
    /// and the reference's roundings, computed here independently of the
    /// floor, stay within it over every element, and the floor is still well
    /// under the output (a check, not a licence). At this many elements
    /// (147,456) the floor's chunk term at a random walk's size for one element
    /// (`K` = 2.45, the rule before) fails: 0.0176 against 0.0155.
    #[test]
    fn a_diffuse_products_roundings_stay_within_its_floor() {
        let (groups, tq, tk, d) = (16, 128, 729, 72);
        let mut rng = ChaCha8Rng::seed_from_u64(44);
        let s: Vec<f32> = (0..groups * tq * tk)
            .map(|_| r16(rng.random_range(-1.5f32..1.5)))
            .collect();
        let v: Vec<f32> = (0..groups * tk * d)
            .map(|_| r16(rng.random_range(1.0f32..4.5)))
            .collect();
        let st = HostTensor::new(vec![groups, tq, tk], s.clone()).unwrap();
        let vt = HostTensor::new(vec![groups, tk, d], v.clone()).unwrap();
        let floor = softmax_floor(&st, &vt).expect("shapes agree");
        let (mut worst, mut largest) = (0.0f32, 0.0f32);
        for r in 0..groups * tq {
            let g = r / tq;
            let row = &s[r * tk..(r + 1) * tk];
            let vg = &v[g * tk * d..(g + 1) * tk * d];
            for c in 0..d {
                let (program, reference) = both(row, vg, d, c);
                worst = worst.max((program - reference).abs());
                largest = largest.max(reference.abs());
            }
        }
        assert!(worst <= floor, "error {worst} over the floor {floor}");
        assert!(
            floor < 0.01 * largest,
            "floor {floor} at outputs up to {largest}"
        );
    }
}

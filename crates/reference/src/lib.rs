//! The reference evaluator: runs a `tessera-graph` graph on the host in f32 and is the
//! yardstick every compiled and simulated run is compared against.
//!
//! It owns the numerical meaning of each op (accumulation in f32 or wider, a stable
//! softmax, the tanh GELU) and the comparison helpers. It must never model the
//! machine's tiles or kernels, and depends on nothing beyond the graph and maths
//! crates and `tessera-machine`'s FP8 format (for [`quantize_fp8`] and
//! [`fp8_round`], the rounding of weights stored as FP8). Its concessions to the
//! hardware are opt-in and stated in graph terms, so
//! tolerances can be reasoned about: rounding f16-typed tensors to f16
//! ([`EvalOptions::round_f16_storage`]), and rounding a matmul's running partial sum
//! to f16 after every 16-wide chunk of its contraction dimension
//! ([`EvalOptions::round_matmul_chunks`]), which is where the compiled program stores
//! f16 and what lets a comparison in f16 ulps ([`compare_ulps`]) be tight. Results
//! are deterministic: GEMM tasks are split by matrix size, never by thread count.

mod fp8;
mod kernels;

use std::collections::BTreeMap;

pub use fp8::{Fp8Weight, fp8_round, quantize_fp8};
pub use kernels::{CHUNK, gelu_scalar};
use tessera_graph::{
    DType, Graph, GraphError, HostTensor, Inputs, OpKind, Outputs, Shape, TensorError, TensorId,
    Weights,
};

/// Why an evaluation or comparison could not run.
#[derive(Debug, thiserror::Error)]
pub enum RefError {
    #[error("invalid graph: {0}")]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Tensor(#[from] TensorError),
    #[error("cannot compare tensors of shapes {actual} and {expected}")]
    CompareShape { actual: Shape, expected: Shape },
    #[error("graph output `{0}` is not among the evaluated tensors")]
    MissingOutput(String),
    #[error("internal: value of {0} was released before its last use")]
    Released(TensorId),
    #[error("matmul groups name `{0}`, which is not a matmul op of the graph")]
    NotAMatmul(String),
    #[error("an FP8 weight names `{0}`, which is not a parameter of the graph")]
    NotAParameter(String),
    #[error("matmul `{0}`: an inner group must hold at least one chunk")]
    EmptyGroup(String),
    #[error("a value given for {tensor} has shape {given}, the graph's is {expected}")]
    OverrideShape {
        tensor: TensorId,
        given: Shape,
        expected: Shape,
    },
}

/// How to evaluate. The default is pure f32, the ground truth; the other settings model
/// where the compiled program stores f16, so that a simulated run can be held to a
/// tolerance of a few f16 ulps instead of one loose enough to hide a kernel bug.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalOptions {
    /// Round every tensor whose dtype is f16 (parameters, inputs and op results) to
    /// f16 after it is produced, as the machine stores it. Arithmetic inside each op
    /// stays f32. Off: every tensor keeps full f32 precision.
    pub round_f16_storage: bool,
    /// In every matmul with an f16 result, round the running partial sum to f16 after
    /// each [`CHUNK`]-wide chunk of the contraction dimension, sum the inner groups'
    /// partials in f32 and round once, then add the bias and round (see
    /// [`EvalOptions::matmul_groups`]). The result is f16 whether or not
    /// `round_f16_storage` is set; the operands are rounded only by that setting, so
    /// the two are meant to be used together ([`EvalOptions::f16_machine`]).
    pub round_matmul_chunks: bool,
    /// Chunks per inner group, by matmul op name ([`tessera_graph::Op::name`]): the
    /// compiled program splits the contraction dimension into consecutive groups of
    /// this many chunks (the last may be shorter), each accumulated on its own tile.
    /// An absent op is one group over the whole contraction dimension (attention
    /// products, unsplit projections). Only read under `round_matmul_chunks`, but
    /// every name is checked against the graph.
    pub matmul_groups: BTreeMap<String, u32>,
    /// Parameters stored on the tiles as FP8, by parameter name: each is
    /// evaluated as the tile holds it ([`Fp8Weight::round`]) wherever it is read.
    /// Rounded as it is produced rather than in a copy of the weights, which at
    /// 27 So400m layers would be 1.6 GB more.
    pub fp8_weights: BTreeMap<String, Fp8Weight>,
}

impl EvalOptions {
    /// Every f16 tensor rounded as stored; matmuls in exact f32.
    pub fn f16_storage() -> EvalOptions {
        EvalOptions {
            round_f16_storage: true,
            ..EvalOptions::default()
        }
    }

    /// Rounding wherever the compiled program stores f16, matmul partials included;
    /// add the plan's inner splits with [`EvalOptions::with_matmul_groups`].
    pub fn f16_machine() -> EvalOptions {
        EvalOptions {
            round_f16_storage: true,
            round_matmul_chunks: true,
            ..EvalOptions::default()
        }
    }

    /// Sets the inner split of matmul `op` to groups of `chunks_per_group` chunks.
    pub fn with_matmul_groups(mut self, op: impl Into<String>, chunks_per_group: u32) -> Self {
        self.matmul_groups.insert(op.into(), chunks_per_group);
        self
    }

    /// Stores parameter `name` as FP8 ([`EvalOptions::fp8_weights`]).
    pub fn with_fp8_weight(mut self, name: impl Into<String>, weight: Fp8Weight) -> Self {
        self.fp8_weights.insert(name.into(), weight);
        self
    }

    /// Checks that every split names a matmul of `graph` and is not empty, and
    /// that every FP8 weight names a parameter.
    fn check(&self, graph: &Graph) -> Result<(), RefError> {
        for name in self.fp8_weights.keys() {
            let is_param = graph
                .ops()
                .iter()
                .any(|op| matches!(&op.kind, OpKind::Parameter { name: n, .. } if n == name));
            if !is_param {
                return Err(RefError::NotAParameter(name.clone()));
            }
        }
        for (name, &chunks) in &self.matmul_groups {
            let is_matmul = graph
                .ops()
                .iter()
                .any(|op| op.name == *name && matches!(op.kind, OpKind::MatMul { .. }));
            if !is_matmul {
                return Err(RefError::NotAMatmul(name.clone()));
            }
            if chunks == 0 {
                return Err(RefError::EmptyGroup(name.clone()));
            }
        }
        Ok(())
    }

    /// Chunks per inner group for matmul `op` if its partials are to be rounded.
    fn chunking(&self, op: &str, dtype: DType) -> Option<usize> {
        (self.round_matmul_chunks && dtype == DType::F16).then(|| {
            self.matmul_groups
                .get(op)
                .map_or(usize::MAX, |&g| g as usize)
        })
    }
}

/// Evaluates `graph` in full f32 and returns its outputs by name.
pub fn evaluate(graph: &Graph, weights: &Weights, inputs: &Inputs) -> Result<Outputs, RefError> {
    evaluate_with(graph, weights, inputs, &EvalOptions::default())
}

/// Evaluates `graph` under `options` and returns its outputs by name. Intermediate
/// values are released after their last use.
pub fn evaluate_with(
    graph: &Graph,
    weights: &Weights,
    inputs: &Inputs,
    options: &EvalOptions,
) -> Result<Outputs, RefError> {
    Evaluator::new(graph, weights, inputs, options)?.finish()
}

/// Evaluates `graph` and returns the value of every tensor, indexed by
/// [`TensorId::index`], for debugging a mismatch op by op.
pub fn evaluate_all(
    graph: &Graph,
    weights: &Weights,
    inputs: &Inputs,
    options: &EvalOptions,
) -> Result<Vec<HostTensor>, RefError> {
    let mut e = Evaluator::with_liveness(graph, weights, inputs, options, false)?;
    while e.step()?.is_some() {}
    e.values
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or(RefError::Released(TensorId(i as u32))))
        .collect()
}

/// A graph evaluated one operation at a time, each value released after its
/// last reader: what lets a caller look at every tensor as it is produced (and
/// replace it, [`Evaluator::replace`]) while holding only the live ones. At 27
/// encoder layers the tensors of the whole graph are tens of gigabytes; the
/// live ones at any point are one layer's.
pub struct Evaluator<'a> {
    graph: &'a Graph,
    weights: &'a Weights,
    inputs: &'a Inputs,
    options: &'a EvalOptions,
    /// Per tensor, the operation after which nothing reads it (`usize::MAX`:
    /// never released; outputs and tensors nothing reads).
    last_use: Vec<usize>,
    values: Vec<Option<HostTensor>>,
    next: usize,
}

impl<'a> Evaluator<'a> {
    /// Checks the graph, weights, inputs and options, and starts before the
    /// first operation.
    pub fn new(
        graph: &'a Graph,
        weights: &'a Weights,
        inputs: &'a Inputs,
        options: &'a EvalOptions,
    ) -> Result<Self, RefError> {
        Self::with_liveness(graph, weights, inputs, options, true)
    }

    /// `release: false` keeps every value (for [`evaluate_all`]).
    fn with_liveness(
        graph: &'a Graph,
        weights: &'a Weights,
        inputs: &'a Inputs,
        options: &'a EvalOptions,
        release: bool,
    ) -> Result<Self, RefError> {
        graph.validate()?;
        weights.check_params(graph)?;
        inputs.check_inputs(graph)?;
        options.check(graph)?;
        let n = graph.tensors().len();
        let mut last_use = vec![usize::MAX; n];
        if release {
            for (i, op) in graph.ops().iter().enumerate() {
                for t in op.kind.inputs() {
                    last_use[t.index()] = i;
                }
            }
            for o in graph.outputs() {
                last_use[o.tensor.index()] = usize::MAX;
            }
        }
        Ok(Evaluator {
            graph,
            weights,
            inputs,
            options,
            last_use,
            values: vec![None; n],
            next: 0,
        })
    }

    /// Computes the next operation and releases the inputs it was the last to
    /// read; its result, which [`Evaluator::value`] then gives, or `None` after
    /// the last operation.
    pub fn step(&mut self) -> Result<Option<TensorId>, RefError> {
        let i = self.next;
        let Some(op) = self.graph.ops().get(i) else {
            return Ok(None);
        };
        let info = &self.graph.tensors()[i];
        let chunking = self.options.chunking(&op.name, info.dtype);
        let mut data = eval_op(
            &op.kind,
            info.shape.dims(),
            chunking,
            &self.values,
            self.weights,
            self.inputs,
        )?;
        if let OpKind::Parameter { name, .. } = &op.kind
            && let Some(w) = self.options.fp8_weights.get(name)
        {
            w.round(&mut data);
        }
        let mut value = HostTensor::new(info.shape.clone(), data)?;
        if self.options.round_f16_storage && info.dtype == DType::F16 {
            value.round_to_f16();
        }
        self.values[i] = Some(value);
        for t in op.kind.inputs() {
            if self.last_use[t.index()] == i {
                self.values[t.index()] = None;
            }
        }
        self.next += 1;
        Ok(Some(op.output))
    }

    /// The value of `t`, if it has been computed and not released.
    pub fn value(&self, t: TensorId) -> Option<&HostTensor> {
        self.values.get(t.index()).and_then(Option::as_ref)
    }

    /// Gives `t` (already computed) the value `v` for every operation still
    /// to read it, and returns the value it had: a program's own value fed to
    /// the operations after it, so that each is held to what it computes from
    /// what it was given.
    pub fn replace(&mut self, t: TensorId, v: HostTensor) -> Result<HostTensor, RefError> {
        let expected = self
            .graph
            .tensors()
            .get(t.index())
            .map(|i| i.shape.clone())
            .ok_or(RefError::Released(t))?;
        if v.shape() != &expected {
            return Err(RefError::OverrideShape {
                tensor: t,
                given: v.shape().clone(),
                expected,
            });
        }
        let slot = self
            .values
            .get_mut(t.index())
            .ok_or(RefError::Released(t))?;
        let old = slot.take().ok_or(RefError::Released(t))?;
        *slot = Some(v);
        Ok(old)
    }

    /// The graph's outputs by name, once every operation has run.
    pub fn outputs(&self) -> Result<Outputs, RefError> {
        collect_outputs(self.graph, &self.values)
    }

    /// Runs the remaining operations and returns the outputs.
    pub fn finish(self) -> Result<Outputs, RefError> {
        self.finish_with(|_| {})
    }

    /// [`Evaluator::finish`], calling `ran(n)` after each operation with the
    /// count run so far (a caller's progress).
    pub fn finish_with(mut self, mut ran: impl FnMut(u64)) -> Result<Outputs, RefError> {
        let mut n = 0;
        while self.step()?.is_some() {
            n += 1;
            ran(n);
        }
        self.outputs()
    }
}

fn collect_outputs(graph: &Graph, values: &[Option<HostTensor>]) -> Result<Outputs, RefError> {
    let mut outputs = Outputs::new();
    for o in graph.outputs() {
        let v = values
            .get(o.tensor.index())
            .and_then(Option::as_ref)
            .ok_or_else(|| RefError::MissingOutput(o.name.clone()))?;
        outputs.insert(o.name.clone(), v.clone());
    }
    Ok(outputs)
}

/// `chunking` is the chunks per inner group when a matmul's partials are rounded.
fn eval_op(
    kind: &OpKind,
    out_shape: &[usize],
    chunking: Option<usize>,
    values: &[Option<HostTensor>],
    weights: &Weights,
    inputs: &Inputs,
) -> Result<Vec<f32>, RefError> {
    let get = |t: TensorId| -> Result<&HostTensor, RefError> {
        values
            .get(t.index())
            .and_then(Option::as_ref)
            .ok_or(RefError::Released(t))
    };
    use OpKind::*;
    Ok(match kind {
        // Presence and shape were checked up front; the lookups cannot fail here
        // unless the maps changed, which they cannot behind a shared borrow.
        Parameter { name, .. } => weights
            .get(name)
            .map(|t| t.data().to_vec())
            .unwrap_or_default(),
        Input { name, .. } => inputs
            .get(name)
            .map(|t| t.data().to_vec())
            .unwrap_or_default(),
        MatMul {
            a,
            b,
            transpose_b,
            bias,
        } => {
            let (a, b) = (get(*a)?, get(*b)?);
            let bias = bias.map(get).transpose()?.map(HostTensor::data);
            let (ad, ash, bd, bsh) = (a.data(), a.shape().dims(), b.data(), b.shape().dims());
            match chunking {
                None => kernels::matmul(ad, ash, bd, bsh, *transpose_b, bias),
                Some(g) => kernels::matmul_f16_chunked(ad, ash, bd, bsh, *transpose_b, bias, g),
            }
        }
        Add { a, b } => {
            let (a, b) = (get(*a)?, get(*b)?);
            kernels::add(
                a.data(),
                a.shape().dims(),
                b.data(),
                b.shape().dims(),
                out_shape,
            )
        }
        Scale { x, factor } => kernels::scale(get(*x)?.data(), *factor),
        LayerNorm {
            x,
            gamma,
            beta,
            eps,
        } => {
            let x = get(*x)?;
            kernels::layer_norm(
                x.data(),
                x.shape().last(),
                get(*gamma)?.data(),
                get(*beta)?.data(),
                *eps,
            )
        }
        Softmax { x } => {
            let x = get(*x)?;
            kernels::softmax(x.data(), x.shape().last())
        }
        Gelu { x } => kernels::gelu(get(*x)?.data()),
        Reshape { x, .. } | Cast { x, .. } => get(*x)?.data().to_vec(),
        Transpose { x, perm } => {
            let x = get(*x)?;
            kernels::permute(x.data(), x.shape().dims(), perm)
        }
        SplitHeads { x, heads } => {
            let x = get(*x)?;
            kernels::split_heads(x.data(), x.shape().dims(), *heads)
        }
        MergeHeads { x } => {
            let x = get(*x)?;
            kernels::merge_heads(x.data(), x.shape().dims())
        }
        Slice {
            x,
            axis,
            start,
            end,
        } => {
            let x = get(*x)?;
            kernels::slice(x.data(), x.shape().dims(), *axis, *start, *end)
        }
        Concat { xs, axis } => {
            let parts = xs
                .iter()
                .map(|&t| get(t).map(|v| (v.data(), v.shape().dims()[*axis])))
                .collect::<Result<Vec<_>, _>>()?;
            let outer: usize = out_shape[..*axis].iter().product();
            let inner: usize = out_shape[axis + 1..].iter().product();
            kernels::concat(&parts, outer, inner)
        }
    })
}

/// Largest `|actual - expected|` over all elements; a NaN on either side counts as
/// infinite error, so a NaN never passes a tolerance check.
pub fn max_abs_error(actual: &HostTensor, expected: &HostTensor) -> Result<f32, RefError> {
    compare(actual, expected).map(|s| s.max_abs)
}

/// Error statistics of `actual` against `expected`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ErrorStats {
    /// Largest absolute difference (infinite if any element is NaN).
    pub max_abs: f32,
    /// Mean absolute difference (NaN-free elements only).
    pub mean_abs: f32,
    /// Flat index of the element with the largest difference.
    pub worst_index: usize,
    /// Largest `|expected|`, the scale against which `max_abs` should be read.
    pub expected_max_abs: f32,
    /// Cosine similarity of the two tensors as vectors, summed in f64: 1 when both are
    /// zero, 0 when only one is, NaN if any element is NaN (so it fails any threshold).
    pub cosine: f32,
}

/// Compares two tensors of the same shape.
pub fn compare(actual: &HostTensor, expected: &HostTensor) -> Result<ErrorStats, RefError> {
    if actual.shape() != expected.shape() {
        return Err(RefError::CompareShape {
            actual: actual.shape().clone(),
            expected: expected.shape().clone(),
        });
    }
    let mut stats = ErrorStats {
        max_abs: 0.0,
        mean_abs: 0.0,
        worst_index: 0,
        expected_max_abs: 0.0,
        cosine: 0.0,
    };
    let mut sum = 0.0f64;
    let mut counted = 0usize;
    let (mut dot, mut aa, mut ee) = (0.0f64, 0.0f64, 0.0f64);
    for (i, (&a, &e)) in actual.data().iter().zip(expected.data()).enumerate() {
        let (a64, e64) = (f64::from(a), f64::from(e));
        dot += a64 * e64;
        aa += a64 * a64;
        ee += e64 * e64;
        let d = (a - e).abs();
        let d = if d.is_nan() { f32::INFINITY } else { d };
        if d > stats.max_abs {
            stats.max_abs = d;
            stats.worst_index = i;
        }
        if d.is_finite() {
            sum += f64::from(d);
            counted += 1;
        }
        if e.abs() > stats.expected_max_abs {
            stats.expected_max_abs = e.abs();
        }
    }
    stats.mean_abs = if counted == 0 {
        0.0
    } else {
        (sum / counted as f64) as f32
    };
    stats.cosine = if aa == 0.0 && ee == 0.0 {
        1.0
    } else if aa == 0.0 || ee == 0.0 {
        0.0
    } else {
        (dot / (aa.sqrt() * ee.sqrt())) as f32
    };
    Ok(stats)
}

/// Error of `actual` against `expected` in f16 ulps, each element measured at its own
/// magnitude: a relative yardstick for tensors stored in f16, where an absolute
/// tolerance is either too loose for small values or too tight for large ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UlpStats {
    /// Largest `|actual - expected| / f16_ulp(expected)` (infinite if any element is
    /// NaN, or one side is infinite and the other is not).
    pub max_ulps: f32,
    /// Mean over the elements with a finite error.
    pub mean_ulps: f32,
    /// Flat index of the element with the largest error in ulps.
    pub worst_index: usize,
    /// Largest absolute difference, for reading the ulps against.
    pub max_abs: f32,
}

/// The spacing of f16 values at `|x|`: `2^(e-10)` in the binade `[2^e, 2^(e+1))`,
/// the subnormal spacing `2^-24` below the normal range, and the top binade's spacing
/// at and beyond the largest finite f16 (so values past it measure as finite).
/// Read from the exponent bits alone: validation asks for millions a softmax
/// product (`softmax_floor`).
#[inline]
pub fn f16_ulp(x: f32) -> f32 {
    // The binade of `|x|`, held within f16's normal exponents (-14..=15): below
    // them the subnormal spacing, above them (infinity and NaN too) the top
    // binade's.
    let e = (((x.to_bits() >> 23) & 0xff) as i32 - 127).clamp(-14, 15);
    f32::from_bits(((e - 10 + 127) as u32) << 23)
}

/// Compares two tensors of the same shape in f16 ulps of `expected`.
pub fn compare_ulps(actual: &HostTensor, expected: &HostTensor) -> Result<UlpStats, RefError> {
    if actual.shape() != expected.shape() {
        return Err(RefError::CompareShape {
            actual: actual.shape().clone(),
            expected: expected.shape().clone(),
        });
    }
    let mut stats = UlpStats {
        max_ulps: 0.0,
        mean_ulps: 0.0,
        worst_index: 0,
        max_abs: 0.0,
    };
    let mut sum = 0.0f64;
    let mut counted = 0usize;
    for (i, (&a, &e)) in actual.data().iter().zip(expected.data()).enumerate() {
        // Equal infinities are exact; `inf - inf` would otherwise read as NaN.
        let d = if a == e { 0.0 } else { (a - e).abs() };
        let d = if d.is_nan() { f32::INFINITY } else { d };
        let ulps = d / f16_ulp(e);
        if ulps > stats.max_ulps {
            stats.max_ulps = ulps;
            stats.worst_index = i;
        }
        stats.max_abs = stats.max_abs.max(d);
        if ulps.is_finite() {
            sum += f64::from(ulps);
            counted += 1;
        }
    }
    stats.mean_ulps = if counted == 0 {
        0.0
    } else {
        (sum / counted as f64) as f32
    };
    Ok(stats)
}

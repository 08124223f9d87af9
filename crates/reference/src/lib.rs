//! The reference evaluator: runs a `tessera-graph` graph on the host in f32 and is the
//! yardstick every compiled and simulated run is compared against.
//!
//! It owns the numerical meaning of each op (accumulation in f32 or wider, a stable
//! softmax, the tanh GELU) and the comparison helpers. It must never model the
//! machine: no tiles, no kernels' rounding tricks, no dependency beyond the graph and
//! maths crates. Its one concession to the hardware is the opt-in rounding of
//! f16-typed tensors to f16 ([`EvalOptions::round_f16_storage`]), so tolerances can be
//! reasoned about. Results are deterministic: GEMM tasks are split by matrix size,
//! never by thread count.

mod kernels;

pub use kernels::gelu_scalar;
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
}

/// How to evaluate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvalOptions {
    /// Round every tensor whose dtype is f16 (parameters, inputs and op results) to
    /// f16 after it is produced, as the machine stores it. Arithmetic inside each op
    /// stays f32. Off: every tensor keeps full f32 precision.
    pub round_f16_storage: bool,
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
    let values = run(graph, weights, inputs, options, false)?;
    collect_outputs(graph, &values)
}

/// Evaluates `graph` and returns the value of every tensor, indexed by
/// [`TensorId::index`], for debugging a mismatch op by op.
pub fn evaluate_all(
    graph: &Graph,
    weights: &Weights,
    inputs: &Inputs,
    options: &EvalOptions,
) -> Result<Vec<HostTensor>, RefError> {
    let values = run(graph, weights, inputs, options, true)?;
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| v.ok_or(RefError::Released(TensorId(i as u32))))
        .collect()
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

fn run(
    graph: &Graph,
    weights: &Weights,
    inputs: &Inputs,
    options: &EvalOptions,
    keep_all: bool,
) -> Result<Vec<Option<HostTensor>>, RefError> {
    graph.validate()?;
    weights.check_params(graph)?;
    inputs.check_inputs(graph)?;

    let n = graph.tensors().len();
    let mut last_use = vec![usize::MAX; n];
    if !keep_all {
        for (i, op) in graph.ops().iter().enumerate() {
            for t in op.kind.inputs() {
                last_use[t.index()] = i;
            }
        }
        for o in graph.outputs() {
            last_use[o.tensor.index()] = usize::MAX;
        }
    }

    let mut values: Vec<Option<HostTensor>> = vec![None; n];
    for (i, op) in graph.ops().iter().enumerate() {
        let info = &graph.tensors()[i];
        let data = eval_op(&op.kind, info.shape.dims(), &values, weights, inputs)?;
        let mut value = HostTensor::new(info.shape.clone(), data)?;
        if options.round_f16_storage && info.dtype == DType::F16 {
            value.round_to_f16();
        }
        values[i] = Some(value);
        for t in op.kind.inputs() {
            if last_use[t.index()] == i {
                values[t.index()] = None;
            }
        }
    }
    Ok(values)
}

fn eval_op(
    kind: &OpKind,
    out_shape: &[usize],
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
            let bias = bias.map(get).transpose()?;
            kernels::matmul(
                a.data(),
                a.shape().dims(),
                b.data(),
                b.shape().dims(),
                *transpose_b,
                bias.map(HostTensor::data),
            )
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
    };
    let mut sum = 0.0f64;
    let mut counted = 0usize;
    for (i, (&a, &e)) in actual.data().iter().zip(expected.data()).enumerate() {
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
    Ok(stats)
}

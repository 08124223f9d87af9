//! The IR proper: ids, element types, shapes, operations and the validated graph.

use crate::error::GraphError;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::fmt;

/// Names one tensor of one graph; prints as `t12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TensorId(pub u32);

/// Names one operation of one graph; prints as `op12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl OpId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op{}", self.0)
    }
}

/// Element type a tensor is stored in. Arithmetic semantics are always f32 (see
/// `docs/graph.md`); the type says how a value is rounded when it is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F16,
    F32,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 => 2,
            DType::F32 => 4,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F16 => "f16",
            DType::F32 => "f32",
        })
    }
}

/// Dimensions, outermost first (row-major). Every tensor in a graph has rank >= 1 and
/// no zero dimension: the builder refuses empty tensors so that no kernel or reference
/// routine has to define what a reduction over nothing means.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.0.iter().product()
    }
    /// Size of the innermost dimension (1 for rank 0, which graphs never hold).
    pub fn last(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }
    /// Row-major strides in elements.
    pub fn strides(&self) -> Vec<usize> {
        let mut strides = vec![1; self.0.len()];
        for i in (0..self.0.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * self.0[i + 1];
        }
        strides
    }
    /// Numpy broadcasting: dimensions aligned from the right, each pair equal or one
    /// of them 1. `None` when the shapes do not broadcast.
    pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Shape> {
        let rank = a.len().max(b.len());
        let mut out = vec![0; rank];
        for (i, slot) in out.iter_mut().enumerate() {
            let da = dim_from_right(a, rank - 1 - i);
            let db = dim_from_right(b, rank - 1 - i);
            *slot = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
        }
        Some(Shape(out))
    }
}

/// The `k`-th dimension counting from the innermost (0), 1 past the rank.
fn dim_from_right(dims: &[usize], k: usize) -> usize {
    if k < dims.len() {
        dims[dims.len() - 1 - k]
    } else {
        1
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape(v)
    }
}

impl From<&[usize]> for Shape {
    fn from(v: &[usize]) -> Self {
        Shape(v.to_vec())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(v: [usize; N]) -> Self {
        Shape(v.to_vec())
    }
}

/// How a parameter is initialised when no checkpoint supplies it. Declared by the
/// model next to the parameter so the distribution is part of the model definition.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Init {
    /// Independent normal samples.
    Normal { mean: f32, std: f32 },
    /// Every element the same value.
    Constant(f32),
}

impl fmt::Display for Init {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Init::Normal { mean, std } => write!(f, "normal(mean={mean}, std={std})"),
            Init::Constant(c) => write!(f, "constant({c})"),
        }
    }
}

/// What an operation computes. Operands are the tensors named inside each variant;
/// [`OpKind::inputs`] lists them in a fixed order for generic traversals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpKind {
    /// A learned tensor supplied by [`crate::Weights`] under `name`.
    Parameter {
        name: String,
        shape: Shape,
        dtype: DType,
        init: Init,
    },
    /// A tensor supplied by the host per run under `name`.
    Input {
        name: String,
        shape: Shape,
        dtype: DType,
    },
    /// `a @ b (+ bias)`: `a` is `[..., m, k]`, `b` is `[..., k, n]` (or `[..., n, k]`
    /// with `transpose_b`), leading batch dimensions broadcast numpy-style, `bias` is
    /// `[n]`. Products accumulate in f32.
    MatMul {
        a: TensorId,
        b: TensorId,
        transpose_b: bool,
        bias: Option<TensorId>,
    },
    /// Elementwise `a + b` with numpy broadcasting.
    Add { a: TensorId, b: TensorId },
    /// Elementwise `x * factor`.
    Scale { x: TensorId, factor: f32 },
    /// Normalise over the last axis (biased variance), then `* gamma + beta`.
    LayerNorm {
        x: TensorId,
        gamma: TensorId,
        beta: TensorId,
        eps: f32,
    },
    /// Softmax over the last axis.
    Softmax { x: TensorId },
    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu { x: TensorId },
    /// Same elements in row-major order, new shape.
    Reshape { x: TensorId, shape: Shape },
    /// Output dimension `i` is input dimension `perm[i]`.
    Transpose { x: TensorId, perm: Vec<usize> },
    /// `[..., T, heads * D]` -> `[..., heads, T, D]`.
    SplitHeads { x: TensorId, heads: usize },
    /// `[..., H, T, D]` -> `[..., T, H * D]`; the inverse of `SplitHeads`.
    MergeHeads { x: TensorId },
    /// Indices `start..end` of `axis`.
    Slice {
        x: TensorId,
        axis: usize,
        start: usize,
        end: usize,
    },
    /// Join along `axis`; all other dimensions equal.
    Concat { xs: Vec<TensorId>, axis: usize },
    /// Change the storage type.
    Cast { x: TensorId, to: DType },
}

impl OpKind {
    /// Operand tensors in a fixed order (MatMul: a, b, bias; LayerNorm: x, gamma, beta).
    pub fn inputs(&self) -> SmallVec<[TensorId; 3]> {
        use OpKind::*;
        match self {
            Parameter { .. } | Input { .. } => SmallVec::new(),
            MatMul { a, b, bias, .. } => {
                let mut v: SmallVec<[TensorId; 3]> = SmallVec::from_slice(&[*a, *b]);
                v.extend(bias.iter().copied());
                v
            }
            Add { a, b } => SmallVec::from_slice(&[*a, *b]),
            LayerNorm { x, gamma, beta, .. } => SmallVec::from_slice(&[*x, *gamma, *beta]),
            Scale { x, .. }
            | Softmax { x }
            | Gelu { x }
            | Reshape { x, .. }
            | Transpose { x, .. }
            | SplitHeads { x, .. }
            | MergeHeads { x }
            | Slice { x, .. }
            | Cast { x, .. } => SmallVec::from_slice(&[*x]),
            Concat { xs, .. } => xs.iter().copied().collect(),
        }
    }

    /// Short lowercase mnemonic used in errors, dumps and default op names.
    pub fn mnemonic(&self) -> &'static str {
        use OpKind::*;
        match self {
            Parameter { .. } => "param",
            Input { .. } => "input",
            MatMul { .. } => "matmul",
            Add { .. } => "add",
            Scale { .. } => "scale",
            LayerNorm { .. } => "layer_norm",
            Softmax { .. } => "softmax",
            Gelu { .. } => "gelu",
            Reshape { .. } => "reshape",
            Transpose { .. } => "transpose",
            SplitHeads { .. } => "split_heads",
            MergeHeads { .. } => "merge_heads",
            Slice { .. } => "slice",
            Concat { .. } => "concat",
            Cast { .. } => "cast",
        }
    }

    /// True for operations that only move elements (the lowering may treat them as
    /// views or copies; no arithmetic happens).
    pub fn is_data_movement(&self) -> bool {
        use OpKind::*;
        matches!(
            self,
            Reshape { .. }
                | Transpose { .. }
                | SplitHeads { .. }
                | MergeHeads { .. }
                | Slice { .. }
                | Concat { .. }
        )
    }
}

/// One operation; it defines exactly one tensor, `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Dotted scope path, unique within the graph (e.g. `mlp.fc1`).
    pub name: String,
    pub kind: OpKind,
    pub output: TensorId,
}

/// Static facts about one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorInfo {
    pub shape: Shape,
    pub dtype: DType,
    /// The single op that defines it (SSA).
    pub producer: OpId,
}

/// A named graph result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Output {
    pub name: String,
    pub tensor: TensorId,
}

/// A validated, shaped SSA graph. Ops are stored in a topological order (every
/// operand is defined by an earlier op); build one with [`crate::GraphBuilder`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) ops: Vec<Op>,
    pub(crate) inputs: Vec<TensorId>,
    pub(crate) params: Vec<TensorId>,
    pub(crate) outputs: Vec<Output>,
}

impl Graph {
    /// Every tensor, indexed by [`TensorId::index`].
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    /// Every op in topological order, indexed by [`OpId::index`].
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }
    /// Host inputs in declaration order.
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }
    /// Parameters in declaration order.
    pub fn params(&self) -> &[TensorId] {
        &self.params
    }
    pub fn outputs(&self) -> &[Output] {
        &self.outputs
    }

    /// Ids are minted only by the graph that owns them, so a foreign id is a
    /// programming error; [`Graph::get_tensor`] is the checked form.
    ///
    /// # Panics
    /// If `id` does not belong to this graph.
    pub fn tensor(&self, id: TensorId) -> &TensorInfo {
        &self.tensors[id.index()]
    }
    pub fn get_tensor(&self, id: TensorId) -> Option<&TensorInfo> {
        self.tensors.get(id.index())
    }
    /// # Panics
    /// If `id` does not belong to this graph.
    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.index()]
    }
    /// The op that defines `id`.
    ///
    /// # Panics
    /// If `id` does not belong to this graph.
    pub fn producer(&self, id: TensorId) -> &Op {
        self.op(self.tensor(id).producer)
    }
    pub fn shape(&self, id: TensorId) -> &Shape {
        &self.tensor(id).shape
    }
    pub fn dtype(&self, id: TensorId) -> DType {
        self.tensor(id).dtype
    }
    /// Name of the op that defines `id`.
    pub fn tensor_name(&self, id: TensorId) -> &str {
        &self.producer(id).name
    }

    /// The parameter tensor registered under `name`.
    pub fn param(&self, name: &str) -> Option<TensorId> {
        self.params.iter().copied().find(
            |&t| matches!(&self.producer(t).kind, OpKind::Parameter { name: n, .. } if n == name),
        )
    }
    /// The input tensor registered under `name`.
    pub fn input(&self, name: &str) -> Option<TensorId> {
        self.inputs
            .iter()
            .copied()
            .find(|&t| matches!(&self.producer(t).kind, OpKind::Input { name: n, .. } if n == name))
    }
    /// The output tensor registered under `name`.
    pub fn output(&self, name: &str) -> Option<TensorId> {
        self.outputs
            .iter()
            .find(|o| o.name == name)
            .map(|o| o.tensor)
    }

    /// `(name, shape, dtype, init)` for every parameter, in declaration order.
    pub fn param_specs(&self) -> impl Iterator<Item = (&str, &Shape, DType, Init)> {
        self.params
            .iter()
            .filter_map(move |&t| match &self.producer(t).kind {
                OpKind::Parameter {
                    name,
                    shape,
                    dtype,
                    init,
                } => Some((name.as_str(), shape, *dtype, *init)),
                _ => None,
            })
    }
    /// `(name, shape, dtype)` for every host input, in declaration order.
    pub fn input_specs(&self) -> impl Iterator<Item = (&str, &Shape, DType)> {
        self.inputs
            .iter()
            .filter_map(move |&t| match &self.producer(t).kind {
                OpKind::Input { name, shape, dtype } => Some((name.as_str(), shape, *dtype)),
                _ => None,
            })
    }

    /// For each tensor, the ops that read it, in op order.
    pub fn consumers(&self) -> Vec<Vec<OpId>> {
        let mut users = vec![Vec::new(); self.tensors.len()];
        for (i, op) in self.ops.iter().enumerate() {
            for t in op.kind.inputs() {
                if let Some(list) = users.get_mut(t.index()) {
                    let id = OpId(i as u32);
                    if list.last() != Some(&id) {
                        list.push(id);
                    }
                }
            }
        }
        users
    }

    /// Number of parameter elements (for sizing reports).
    pub fn param_count(&self) -> usize {
        self.params.iter().map(|&t| self.shape(t).numel()).sum()
    }

    /// Re-check every invariant the builder establishes: ids in range, SSA and
    /// topological order, shape and dtype rules, unique names. A graph read back from
    /// JSON should pass through this before anyone trusts it.
    pub fn validate(&self) -> Result<(), GraphError> {
        if self.tensors.len() != self.ops.len() {
            return Err(GraphError::Malformed(format!(
                "{} tensors but {} ops (each op defines exactly one tensor)",
                self.tensors.len(),
                self.ops.len()
            )));
        }
        let mut names = std::collections::HashSet::new();
        let mut param_names = std::collections::HashSet::new();
        let mut input_names = std::collections::HashSet::new();
        let (mut inputs, mut params) = (Vec::new(), Vec::new());
        for (i, op) in self.ops.iter().enumerate() {
            if op.output.index() != i || self.tensors[i].producer.index() != i {
                return Err(GraphError::Malformed(format!(
                    "op {} (`{}`) must define t{i} and be its producer",
                    OpId(i as u32),
                    op.name
                )));
            }
            if !names.insert(op.name.as_str()) {
                return Err(GraphError::DuplicateName {
                    what: "op",
                    name: op.name.clone(),
                });
            }
            for t in op.kind.inputs() {
                if t.index() >= i {
                    return Err(GraphError::UnknownTensor {
                        op: op.kind.mnemonic(),
                        name: op.name.clone(),
                        tensor: t,
                    });
                }
            }
            let (shape, dtype) = crate::infer::infer(&op.kind, &op.name, &self.tensors[..i])?;
            let info = &self.tensors[i];
            if info.shape != shape || info.dtype != dtype {
                return Err(GraphError::Malformed(format!(
                    "t{i} (`{}`) records {}{} but its op yields {dtype}{shape}",
                    op.name, info.dtype, info.shape
                )));
            }
            match &op.kind {
                OpKind::Parameter { name, .. } => {
                    if !param_names.insert(name.as_str()) {
                        return Err(GraphError::DuplicateName {
                            what: "parameter",
                            name: name.clone(),
                        });
                    }
                    params.push(op.output);
                }
                OpKind::Input { name, .. } => {
                    if !input_names.insert(name.as_str()) {
                        return Err(GraphError::DuplicateName {
                            what: "input",
                            name: name.clone(),
                        });
                    }
                    inputs.push(op.output);
                }
                _ => {}
            }
        }
        if inputs != self.inputs || params != self.params {
            return Err(GraphError::Malformed(
                "input/parameter lists disagree with the ops".into(),
            ));
        }
        if self.outputs.is_empty() {
            return Err(GraphError::NoOutputs);
        }
        let mut out_names = std::collections::HashSet::new();
        for o in &self.outputs {
            if o.tensor.index() >= self.tensors.len() {
                return Err(GraphError::Malformed(format!(
                    "output `{}` names {}, which this graph does not have",
                    o.name, o.tensor
                )));
            }
            if !out_names.insert(o.name.as_str()) {
                return Err(GraphError::DuplicateName {
                    what: "output",
                    name: o.name.clone(),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for Graph {
    /// One line per op: `t3: f16[1458, 4304] = matmul t0, t1, bias=t2  # mlp.fc1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for op in &self.ops {
            let info = &self.tensors[op.output.index()];
            write!(f, "{}: {}{} = ", op.output, info.dtype, info.shape)?;
            use OpKind::*;
            match &op.kind {
                Parameter { name, init, .. } => write!(f, "param \"{name}\" {init}")?,
                Input { name, .. } => write!(f, "input \"{name}\"")?,
                MatMul {
                    a,
                    b,
                    transpose_b,
                    bias,
                } => {
                    write!(f, "matmul {a}, {b}")?;
                    if *transpose_b {
                        f.write_str(", transpose_b")?;
                    }
                    if let Some(bias) = bias {
                        write!(f, ", bias={bias}")?;
                    }
                }
                Add { a, b } => write!(f, "add {a}, {b}")?,
                Scale { x, factor } => write!(f, "scale {x}, {factor}")?,
                LayerNorm {
                    x,
                    gamma,
                    beta,
                    eps,
                } => write!(f, "layer_norm {x}, gamma={gamma}, beta={beta}, eps={eps}")?,
                Softmax { x } => write!(f, "softmax {x}")?,
                Gelu { x } => write!(f, "gelu {x}")?,
                Reshape { x, .. } => write!(f, "reshape {x}")?,
                Transpose { x, perm } => write!(f, "transpose {x}, perm={perm:?}")?,
                SplitHeads { x, heads } => write!(f, "split_heads {x}, heads={heads}")?,
                MergeHeads { x } => write!(f, "merge_heads {x}")?,
                Slice {
                    x,
                    axis,
                    start,
                    end,
                } => write!(f, "slice {x}, axis={axis}, {start}..{end}")?,
                Concat { xs, axis } => {
                    f.write_str("concat ")?;
                    for (i, x) in xs.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(f, "{x}")?;
                    }
                    write!(f, ", axis={axis}")?;
                }
                Cast { x, to } => write!(f, "cast {x} to {to}")?,
            }
            writeln!(f, "  # {}", op.name)?;
        }
        for o in &self.outputs {
            writeln!(f, "output \"{}\" = {}", o.name, o.tensor)?;
        }
        Ok(())
    }
}

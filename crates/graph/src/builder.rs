//! The builder: every method checks shapes immediately, so a model definition fails at
//! the line that is wrong, with the op's scoped name in the message.

use crate::error::GraphError;
use crate::infer::infer;
use crate::ir::{DType, Graph, Init, Op, OpId, OpKind, Output, Shape, TensorId, TensorInfo};
use std::collections::HashSet;

/// Standard deviation of bias, LayerNorm-beta and embedding initialisers: small enough
/// to keep activations dominated by the matmuls, non-zero so a kernel that forgets a
/// bias is caught by comparison with the reference.
pub const SMALL_STD: f32 = 0.02;
/// Spread of LayerNorm gamma around 1, for the same reason.
pub const GAMMA_STD: f32 = 0.1;

/// Builds a [`Graph`] op by op. Names are dotted scope paths: inside
/// `with_scope("mlp", ..)`, `linear(x, "fc1", n)` creates op `mlp.fc1` and the
/// parameters `mlp.fc1.weight` and `mlp.fc1.bias`.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    tensors: Vec<TensorInfo>,
    ops: Vec<Op>,
    inputs: Vec<TensorId>,
    params: Vec<TensorId>,
    outputs: Vec<Output>,
    scope: Vec<String>,
    op_names: HashSet<String>,
}

impl GraphBuilder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with `scope` appended to the name prefix. When `f` fails, the prefix
    /// and everything `f` added are rolled back.
    pub fn with_scope<R>(
        &mut self,
        scope: &str,
        f: impl FnOnce(&mut Self) -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        self.scope.push(scope.to_string());
        let result = self.atomically(f);
        self.scope.pop();
        result
    }

    /// Runs `f`; on failure removes every op, tensor and name it created, so a failed
    /// composite call (`linear`, `layer_norm`, a scope) leaves no orphan parameters.
    fn atomically<R>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<R, GraphError>,
    ) -> Result<R, GraphError> {
        let (ops, outputs) = (self.ops.len(), self.outputs.len());
        let result = f(self);
        if result.is_err() {
            for op in self.ops.drain(ops..) {
                self.op_names.remove(&op.name);
            }
            self.tensors.truncate(ops);
            self.outputs.truncate(outputs);
            let live = |t: &TensorId| t.index() < ops;
            self.params.retain(live);
            self.inputs.retain(live);
        }
        result
    }

    /// `name` prefixed with the current scope.
    pub fn scoped(&self, name: &str) -> String {
        if self.scope.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.scope.join("."))
        }
    }

    /// Shape of a tensor built so far.
    pub fn shape(&self, t: TensorId) -> Result<&Shape, GraphError> {
        self.info(t).map(|i| &i.shape)
    }

    pub fn dtype(&self, t: TensorId) -> Result<DType, GraphError> {
        self.info(t).map(|i| i.dtype)
    }

    fn info(&self, t: TensorId) -> Result<&TensorInfo, GraphError> {
        self.tensors
            .get(t.index())
            .ok_or_else(|| GraphError::UnknownTensor {
                op: "query",
                name: self.scoped(""),
                tensor: t,
            })
    }

    /// A unique op name derived from `base` in the current scope: `mlp.gelu`, then
    /// `mlp.gelu_1`, ...
    fn fresh_name(&self, base: &str) -> String {
        let name = self.scoped(base);
        if !self.op_names.contains(&name) {
            return name;
        }
        (1..)
            .map(|i| format!("{name}_{i}"))
            .find(|n| !self.op_names.contains(n))
            .unwrap_or(name)
    }

    fn push(&mut self, name: String, kind: OpKind) -> Result<TensorId, GraphError> {
        let (shape, dtype) = infer(&kind, &name, &self.tensors)?;
        let id = TensorId(self.tensors.len() as u32);
        let op = OpId(self.ops.len() as u32);
        match &kind {
            OpKind::Parameter { .. } => self.params.push(id),
            OpKind::Input { .. } => self.inputs.push(id),
            _ => {}
        }
        self.tensors.push(TensorInfo {
            shape,
            dtype,
            producer: op,
        });
        self.op_names.insert(name.clone());
        self.ops.push(Op {
            name,
            kind,
            output: id,
        });
        Ok(id)
    }

    /// An operation named `name` exactly (no scope, no suffix): the text form's
    /// names are already the scoped ones.
    pub(crate) fn push_named(
        &mut self,
        name: String,
        kind: OpKind,
    ) -> Result<TensorId, GraphError> {
        self.claim("operation", &name)?;
        self.push(name, kind)
    }

    fn push_auto(&mut self, base: &str, kind: OpKind) -> Result<TensorId, GraphError> {
        let name = self.fresh_name(base);
        self.push(name, kind)
    }

    fn claim(&self, what: &'static str, name: &str) -> Result<(), GraphError> {
        if self.op_names.contains(name) {
            Err(GraphError::DuplicateName {
                what,
                name: name.to_string(),
            })
        } else {
            Ok(())
        }
    }

    /// A host input named `name` (not scoped: inputs are the graph's interface).
    pub fn input(
        &mut self,
        name: &str,
        shape: impl Into<Shape>,
        dtype: DType,
    ) -> Result<TensorId, GraphError> {
        self.claim("input", name)?;
        self.push(
            name.to_string(),
            OpKind::Input {
                name: name.to_string(),
                shape: shape.into(),
                dtype,
            },
        )
    }

    /// A learned parameter named `scope.name`.
    pub fn parameter(
        &mut self,
        name: &str,
        shape: impl Into<Shape>,
        dtype: DType,
        init: Init,
    ) -> Result<TensorId, GraphError> {
        let full = self.scoped(name);
        self.claim("parameter", &full)?;
        self.push(
            full.clone(),
            OpKind::Parameter {
                name: full,
                shape: shape.into(),
                dtype,
                init,
            },
        )
    }

    /// Registers `t` as the graph output `name`.
    pub fn output(&mut self, name: &str, t: TensorId) -> Result<(), GraphError> {
        self.info(t)?;
        if self.outputs.iter().any(|o| o.name == name) {
            return Err(GraphError::DuplicateName {
                what: "output",
                name: name.to_string(),
            });
        }
        self.outputs.push(Output {
            name: name.to_string(),
            tensor: t,
        });
        Ok(())
    }

    /// `a @ b`.
    pub fn matmul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.matmul_full(a, b, false, None)
    }

    /// `a @ b^T` (b's last two dimensions swapped), as in attention scores `q k^T`.
    pub fn matmul_t(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.matmul_full(a, b, true, None)
    }

    /// The general form; see [`OpKind::MatMul`].
    pub fn matmul_full(
        &mut self,
        a: TensorId,
        b: TensorId,
        transpose_b: bool,
        bias: Option<TensorId>,
    ) -> Result<TensorId, GraphError> {
        self.push_auto(
            "matmul",
            OpKind::MatMul {
                a,
                b,
                transpose_b,
                bias,
            },
        )
    }

    /// A dense layer: parameters `name.weight` `[in, out]` (normal, std
    /// `1/sqrt(in)`) and `name.bias` `[out]` (normal, std [`SMALL_STD`]), in `x`'s
    /// dtype; one MatMul op named `name`. `x` is `[..., in]`.
    pub fn linear(
        &mut self,
        x: TensorId,
        name: &str,
        out_features: usize,
    ) -> Result<TensorId, GraphError> {
        self.atomically(|b| b.linear_inner(x, name, out_features))
    }

    fn linear_inner(
        &mut self,
        x: TensorId,
        name: &str,
        out_features: usize,
    ) -> Result<TensorId, GraphError> {
        let (in_features, dtype) = {
            let i = self.info(x)?;
            (i.shape.last(), i.dtype)
        };
        let std = 1.0 / (in_features as f32).sqrt();
        let w = self.parameter(
            &format!("{name}.weight"),
            [in_features, out_features],
            dtype,
            Init::Normal { mean: 0.0, std },
        )?;
        let bias = self.parameter(
            &format!("{name}.bias"),
            [out_features],
            dtype,
            Init::Normal {
                mean: 0.0,
                std: SMALL_STD,
            },
        )?;
        let op_name = self.scoped(name);
        self.claim("op", &op_name)?;
        self.push(
            op_name,
            OpKind::MatMul {
                a: x,
                b: w,
                transpose_b: false,
                bias: Some(bias),
            },
        )
    }

    /// `a + b` with numpy broadcasting.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.push_auto("add", OpKind::Add { a, b })
    }

    /// `x * factor`.
    pub fn scale(&mut self, x: TensorId, factor: f32) -> Result<TensorId, GraphError> {
        self.push_auto("scale", OpKind::Scale { x, factor })
    }

    /// LayerNorm over the last axis with parameters `name.gamma` (normal, mean 1, std
    /// [`GAMMA_STD`]) and `name.beta` (normal, std [`SMALL_STD`]); op named `name`.
    pub fn layer_norm(
        &mut self,
        x: TensorId,
        name: &str,
        eps: f32,
    ) -> Result<TensorId, GraphError> {
        self.atomically(|b| b.layer_norm_inner(x, name, eps))
    }

    fn layer_norm_inner(
        &mut self,
        x: TensorId,
        name: &str,
        eps: f32,
    ) -> Result<TensorId, GraphError> {
        let (width, dtype) = {
            let i = self.info(x)?;
            (i.shape.last(), i.dtype)
        };
        let gamma = self.parameter(
            &format!("{name}.gamma"),
            [width],
            dtype,
            Init::Normal {
                mean: 1.0,
                std: GAMMA_STD,
            },
        )?;
        let beta = self.parameter(
            &format!("{name}.beta"),
            [width],
            dtype,
            Init::Normal {
                mean: 0.0,
                std: SMALL_STD,
            },
        )?;
        let op_name = self.scoped(name);
        self.claim("op", &op_name)?;
        self.push(
            op_name,
            OpKind::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            },
        )
    }

    /// LayerNorm with caller-supplied gamma and beta tensors.
    pub fn layer_norm_with(
        &mut self,
        x: TensorId,
        gamma: TensorId,
        beta: TensorId,
        eps: f32,
    ) -> Result<TensorId, GraphError> {
        self.push_auto(
            "layer_norm",
            OpKind::LayerNorm {
                x,
                gamma,
                beta,
                eps,
            },
        )
    }

    /// Softmax over the last axis.
    pub fn softmax(&mut self, x: TensorId) -> Result<TensorId, GraphError> {
        self.push_auto("softmax", OpKind::Softmax { x })
    }

    /// GELU, tanh form.
    pub fn gelu(&mut self, x: TensorId) -> Result<TensorId, GraphError> {
        self.push_auto("gelu", OpKind::Gelu { x })
    }

    pub fn reshape(
        &mut self,
        x: TensorId,
        shape: impl Into<Shape>,
    ) -> Result<TensorId, GraphError> {
        self.push_auto(
            "reshape",
            OpKind::Reshape {
                x,
                shape: shape.into(),
            },
        )
    }

    /// Output dimension `i` is input dimension `perm[i]`.
    pub fn transpose(&mut self, x: TensorId, perm: &[usize]) -> Result<TensorId, GraphError> {
        self.push_auto(
            "transpose",
            OpKind::Transpose {
                x,
                perm: perm.to_vec(),
            },
        )
    }

    /// `[..., T, heads * D]` -> `[..., heads, T, D]`.
    pub fn split_heads(&mut self, x: TensorId, heads: usize) -> Result<TensorId, GraphError> {
        self.push_auto("split_heads", OpKind::SplitHeads { x, heads })
    }

    /// `[..., H, T, D]` -> `[..., T, H * D]`.
    pub fn merge_heads(&mut self, x: TensorId) -> Result<TensorId, GraphError> {
        self.push_auto("merge_heads", OpKind::MergeHeads { x })
    }

    /// Indices `start..end` of `axis`.
    pub fn slice(
        &mut self,
        x: TensorId,
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<TensorId, GraphError> {
        self.push_auto(
            "slice",
            OpKind::Slice {
                x,
                axis,
                start,
                end,
            },
        )
    }

    pub fn concat(&mut self, xs: &[TensorId], axis: usize) -> Result<TensorId, GraphError> {
        self.push_auto(
            "concat",
            OpKind::Concat {
                xs: xs.to_vec(),
                axis,
            },
        )
    }

    pub fn cast(&mut self, x: TensorId, to: DType) -> Result<TensorId, GraphError> {
        self.push_auto("cast", OpKind::Cast { x, to })
    }

    /// Finishes the graph; it must have at least one output.
    pub fn finish(self) -> Result<Graph, GraphError> {
        if self.outputs.is_empty() {
            return Err(GraphError::NoOutputs);
        }
        Ok(Graph {
            tensors: self.tensors,
            ops: self.ops,
            inputs: self.inputs,
            params: self.params,
            outputs: self.outputs,
        })
    }
}

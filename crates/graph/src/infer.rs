//! Shape and dtype inference: the single place where each op's shape rule lives. The
//! builder calls it for every new op and `Graph::validate` replays it.

use crate::error::{GraphError, ShapeMismatch};
use crate::ir::{DType, Init, OpKind, Shape, TensorId, TensorInfo};

struct Ctx<'a> {
    op: &'static str,
    name: &'a str,
    tensors: &'a [TensorInfo],
}

impl<'a> Ctx<'a> {
    fn get(&self, id: TensorId) -> Result<&'a TensorInfo, GraphError> {
        self.tensors
            .get(id.index())
            .ok_or_else(|| GraphError::UnknownTensor {
                op: self.op,
                name: self.name.to_string(),
                tensor: id,
            })
    }

    fn bad_operand(&self, operand: &str, shape: &Shape, reason: impl Into<String>) -> GraphError {
        GraphError::BadOperand {
            op: self.op,
            name: self.name.to_string(),
            operand: operand.to_string(),
            shape: shape.clone(),
            reason: reason.into(),
        }
    }

    fn mismatch(
        &self,
        operand: &str,
        found: &Shape,
        other: &str,
        other_shape: &Shape,
        reason: impl Into<String>,
    ) -> GraphError {
        GraphError::ShapeMismatch(Box::new(ShapeMismatch {
            op: self.op,
            name: self.name.to_string(),
            operand: operand.to_string(),
            found: found.clone(),
            other: other.to_string(),
            other_shape: other_shape.clone(),
            reason: reason.into(),
        }))
    }

    fn attr(&self, reason: impl Into<String>) -> GraphError {
        GraphError::BadAttribute {
            op: self.op,
            name: self.name.to_string(),
            reason: reason.into(),
        }
    }

    fn same_dtype(&self, operand: &str, t: &TensorInfo, expected: DType) -> Result<(), GraphError> {
        if t.dtype == expected {
            Ok(())
        } else {
            Err(GraphError::DTypeMismatch {
                op: self.op,
                name: self.name.to_string(),
                operand: operand.to_string(),
                found: t.dtype,
                expected,
            })
        }
    }

    fn min_rank(&self, operand: &str, t: &TensorInfo, rank: usize) -> Result<(), GraphError> {
        if t.shape.rank() >= rank {
            Ok(())
        } else {
            Err(self.bad_operand(operand, &t.shape, format!("needs rank >= {rank}")))
        }
    }
}

/// Checks a declared (parameter or input) shape: rank >= 1, no zero dimension.
pub(crate) fn check_declared_shape(
    op: &'static str,
    name: &str,
    shape: &Shape,
) -> Result<(), GraphError> {
    if shape.rank() == 0 || shape.dims().contains(&0) {
        return Err(GraphError::BadAttribute {
            op,
            name: name.to_string(),
            reason: format!("shape {shape} must have rank >= 1 and no zero dimension"),
        });
    }
    Ok(())
}

/// Output shape and dtype of `kind` given the already-defined `tensors`.
pub(crate) fn infer(
    kind: &OpKind,
    name: &str,
    tensors: &[TensorInfo],
) -> Result<(Shape, DType), GraphError> {
    let cx = Ctx {
        op: kind.mnemonic(),
        name,
        tensors,
    };
    use OpKind::*;
    match kind {
        Parameter {
            shape, dtype, init, ..
        } => {
            check_declared_shape(cx.op, name, shape)?;
            let ok = match *init {
                Init::Normal { mean, std } => mean.is_finite() && std.is_finite() && std >= 0.0,
                Init::Constant(c) => c.is_finite(),
            };
            if !ok {
                return Err(cx.attr(format!("initialiser {init} is not finite")));
            }
            Ok((shape.clone(), *dtype))
        }
        Input { shape, dtype, .. } => {
            check_declared_shape(cx.op, name, shape)?;
            Ok((shape.clone(), *dtype))
        }
        MatMul {
            a,
            b,
            transpose_b,
            bias,
        } => {
            let (ta, tb) = (cx.get(*a)?, cx.get(*b)?);
            cx.min_rank("a", ta, 2)?;
            cx.min_rank("b", tb, 2)?;
            cx.same_dtype("b", tb, ta.dtype)?;
            let (ad, bd) = (ta.shape.dims(), tb.shape.dims());
            let (m, k) = (ad[ad.len() - 2], ad[ad.len() - 1]);
            let (kb, n) = if *transpose_b {
                (bd[bd.len() - 1], bd[bd.len() - 2])
            } else {
                (bd[bd.len() - 2], bd[bd.len() - 1])
            };
            if k != kb {
                let which = if *transpose_b {
                    "last"
                } else {
                    "second-to-last"
                };
                return Err(cx.mismatch(
                    "b",
                    &tb.shape,
                    "a",
                    &ta.shape,
                    format!(
                        "contraction length differs (a has k={k}, b's {which} dimension is {kb})"
                    ),
                ));
            }
            let batch =
                Shape::broadcast(&ad[..ad.len() - 2], &bd[..bd.len() - 2]).ok_or_else(|| {
                    cx.mismatch(
                        "b",
                        &tb.shape,
                        "a",
                        &ta.shape,
                        "batch dimensions do not broadcast",
                    )
                })?;
            if let Some(bias) = bias {
                let tbias = cx.get(*bias)?;
                cx.same_dtype("bias", tbias, ta.dtype)?;
                if tbias.shape.dims() != [n] {
                    return Err(cx.mismatch(
                        "bias",
                        &tbias.shape,
                        "b",
                        &tb.shape,
                        format!("bias must be [{n}], one value per output column"),
                    ));
                }
            }
            let mut out = batch.0;
            out.extend([m, n]);
            Ok((Shape(out), ta.dtype))
        }
        Add { a, b } => {
            let (ta, tb) = (cx.get(*a)?, cx.get(*b)?);
            cx.same_dtype("b", tb, ta.dtype)?;
            let out = Shape::broadcast(ta.shape.dims(), tb.shape.dims()).ok_or_else(|| {
                cx.mismatch(
                    "b",
                    &tb.shape,
                    "a",
                    &ta.shape,
                    "shapes do not broadcast (dimensions aligned from the right must be equal or 1)",
                )
            })?;
            Ok((out, ta.dtype))
        }
        Scale { x, factor } => {
            let t = cx.get(*x)?;
            if !factor.is_finite() {
                return Err(cx.attr(format!("factor {factor} is not finite")));
            }
            Ok((t.shape.clone(), t.dtype))
        }
        LayerNorm {
            x,
            gamma,
            beta,
            eps,
        } => {
            let t = cx.get(*x)?;
            if !(eps.is_finite() && *eps > 0.0) {
                return Err(cx.attr(format!("eps {eps} must be finite and > 0")));
            }
            let width = t.shape.last();
            for (label, id) in [("gamma", gamma), ("beta", beta)] {
                let p = cx.get(*id)?;
                cx.same_dtype(label, p, t.dtype)?;
                if p.shape.dims() != [width] {
                    return Err(cx.mismatch(
                        label,
                        &p.shape,
                        "x",
                        &t.shape,
                        format!("{label} must be [{width}], the size of x's last axis"),
                    ));
                }
            }
            Ok((t.shape.clone(), t.dtype))
        }
        Softmax { x } | Gelu { x } => {
            let t = cx.get(*x)?;
            Ok((t.shape.clone(), t.dtype))
        }
        Reshape { x, shape } => {
            let t = cx.get(*x)?;
            if shape.rank() == 0 || shape.numel() != t.shape.numel() {
                return Err(cx.bad_operand(
                    "x",
                    &t.shape,
                    format!(
                        "has {} elements, target shape {shape} has {}",
                        t.shape.numel(),
                        shape.numel()
                    ),
                ));
            }
            Ok((shape.clone(), t.dtype))
        }
        Transpose { x, perm } => {
            let t = cx.get(*x)?;
            let rank = t.shape.rank();
            let mut seen = vec![false; rank];
            let valid = perm.len() == rank
                && perm
                    .iter()
                    .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
            if !valid {
                return Err(cx.bad_operand(
                    "x",
                    &t.shape,
                    format!("perm {perm:?} is not a permutation of 0..{rank}"),
                ));
            }
            let dims = perm.iter().map(|&p| t.shape.dims()[p]).collect();
            Ok((Shape(dims), t.dtype))
        }
        SplitHeads { x, heads } => {
            let t = cx.get(*x)?;
            cx.min_rank("x", t, 2)?;
            let d = t.shape.dims();
            let (tokens, width) = (d[d.len() - 2], d[d.len() - 1]);
            if *heads == 0 || width % heads != 0 {
                return Err(cx.bad_operand(
                    "x",
                    &t.shape,
                    format!("last dimension {width} is not divisible into {heads} heads"),
                ));
            }
            let mut out = d[..d.len() - 2].to_vec();
            out.extend([*heads, tokens, width / heads]);
            Ok((Shape(out), t.dtype))
        }
        MergeHeads { x } => {
            let t = cx.get(*x)?;
            cx.min_rank("x", t, 3)?;
            let d = t.shape.dims();
            let r = d.len();
            let mut out = d[..r - 3].to_vec();
            out.extend([d[r - 2], d[r - 3] * d[r - 1]]);
            Ok((Shape(out), t.dtype))
        }
        Slice {
            x,
            axis,
            start,
            end,
        } => {
            let t = cx.get(*x)?;
            let Some(&dim) = t.shape.dims().get(*axis) else {
                return Err(cx.bad_operand("x", &t.shape, format!("axis {axis} out of range")));
            };
            if !(start < end && *end <= dim) {
                return Err(cx.bad_operand(
                    "x",
                    &t.shape,
                    format!("range {start}..{end} is empty or exceeds axis {axis} of size {dim}"),
                ));
            }
            let mut out = t.shape.0.clone();
            out[*axis] = end - start;
            Ok((Shape(out), t.dtype))
        }
        Concat { xs, axis } => {
            let Some(first) = xs.first() else {
                return Err(cx.attr("needs at least one operand"));
            };
            let t0 = cx.get(*first)?;
            if *axis >= t0.shape.rank() {
                return Err(cx.bad_operand(
                    "xs[0]",
                    &t0.shape,
                    format!("axis {axis} out of range"),
                ));
            }
            let mut out = t0.shape.0.clone();
            for (i, id) in xs.iter().enumerate().skip(1) {
                let t = cx.get(*id)?;
                let label = format!("xs[{i}]");
                cx.same_dtype(&label, t, t0.dtype)?;
                let same_elsewhere = t.shape.rank() == t0.shape.rank()
                    && (0..t0.shape.rank())
                        .all(|d| d == *axis || t.shape.dims()[d] == t0.shape.dims()[d]);
                if !same_elsewhere {
                    return Err(cx.mismatch(
                        &label,
                        &t.shape,
                        "xs[0]",
                        &t0.shape,
                        format!("dimensions other than axis {axis} must match"),
                    ));
                }
                out[*axis] += t.shape.dims()[*axis];
            }
            Ok((Shape(out), t0.dtype))
        }
        Cast { x, to } => {
            let t = cx.get(*x)?;
            Ok((t.shape.clone(), *to))
        }
    }
}

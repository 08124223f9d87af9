//! Errors for graph construction and validation.

use crate::ir::{DType, Shape, TensorId};

/// A problem with the graph a user is building or loading. Every variant that is
/// about one op names the op (mnemonic and scoped name) and the offending operand.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error(transparent)]
    ShapeMismatch(Box<ShapeMismatch>),
    #[error("{op} `{name}`: operand `{operand}` of shape {shape}: {reason}")]
    BadOperand {
        op: &'static str,
        name: String,
        operand: String,
        shape: Shape,
        reason: String,
    },
    #[error("{op} `{name}`: operand `{operand}` is {found}, expected {expected}")]
    DTypeMismatch {
        op: &'static str,
        name: String,
        operand: String,
        found: DType,
        expected: DType,
    },
    #[error("{op} `{name}`: {reason}")]
    BadAttribute {
        op: &'static str,
        name: String,
        reason: String,
    },
    #[error("{op} `{name}`: operand {tensor} is not defined before this op")]
    UnknownTensor {
        op: &'static str,
        name: String,
        tensor: TensorId,
    },
    #[error("duplicate {what} name `{name}`")]
    DuplicateName { what: &'static str, name: String },
    #[error("graph has no outputs")]
    NoOutputs,
    #[error("malformed graph: {0}")]
    Malformed(String),
    #[error("invalid model config: {0}")]
    Config(String),
}

/// Two operands of one op whose shapes do not fit together. Boxed inside
/// [`GraphError`] to keep the error small on the happy path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{op} `{name}`: operand `{operand}` has shape {found}, incompatible with `{other}` of shape {other_shape}: {reason}"
)]
pub struct ShapeMismatch {
    pub op: &'static str,
    /// Scoped name of the op.
    pub name: String,
    pub operand: String,
    pub found: Shape,
    /// The operand it was checked against.
    pub other: String,
    pub other_shape: Shape,
    pub reason: String,
}

//! The tile plan: how each operation of a model is spread over the tiles, what each
//! tile holds, and what moves between tiles. This crate owns the mapping policy and
//! the cost model it is ranked by (built on the machine description's rates). It
//! must never choose SRAM addresses (placement does) nor emit code (the kernels and
//! emission do); its figures are estimates, the simulator's cycles are the truth.

pub mod dist;
pub mod ir;
pub mod matmul;
pub mod mlp;
mod text;
pub mod verify;

pub use dist::{DistError, DistTensor, Part, redistribute};
pub use ir::*;
pub use matmul::{MatmulCost, MatmulMapping, MatmulShape, map_matmul};
pub use mlp::{LowerOptions, lower_mlp};
pub use verify::{Site, VerifyError, verify};

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "matmul [{rows}x{k}] x [{k}x{n}] does not fit: the best mapping needs {needed} bytes \
         on one tile, {budget} are available for tensors"
    )]
    DoesNotFit {
        rows: u32,
        k: u32,
        n: u32,
        needed: u64,
        budget: u64,
    },
    #[error("the graph is outside what this lowering handles: {0}")]
    Unsupported(String),
    #[error("weight `{0}` is missing or has the wrong size")]
    MissingWeight(String),
    #[error("matmul has an empty dimension ({rows}x{k}x{n})")]
    Empty { rows: u32, k: u32, n: u32 },
}

//! The tile plan: how each operation of a model is spread over the tiles, what each
//! tile holds, and what moves between tiles. This crate owns the mapping policy and
//! the cost model it is ranked by (built on the machine description's rates). It
//! must never choose SRAM addresses (placement does) nor emit code (the kernels and
//! emission do); its figures are estimates, the simulator's cycles are the truth.

pub mod dist;
pub mod estimate;
pub mod exchange_code;
pub mod ir;
mod lower;
pub mod matmul;
mod text;
pub mod unroll;
pub mod verify;

pub use dist::{DistError, DistTensor, Part, redistribute};
pub use estimate::{PlanEstimate, estimate, estimate_steps};
pub use ir::*;
pub use lower::{
    Experimental, FIT_SHARE, LowerOptions, WeightDtype, busiest, fit_limit, fit_limit_within,
    lower, lower_exact, lower_fitted, lower_fitted_shape, lower_layer_weights, lower_shape,
    max_live_bytes, placement_retry_budget,
};
pub use matmul::{MatmulCost, MatmulMapping, MatmulShape, map_matmul, map_matmul_capped};
pub use unroll::{Unrolled, unroll};
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
    #[error("the model cannot fit: {what} take {needed} bytes, {scope} has {available}")]
    TooLarge {
        what: String,
        needed: u64,
        available: u64,
        scope: String,
    },
    /// What a tile holds for the whole program (weights, their store, vertex
    /// states, exchange code) exceeds its SRAM at the fit loop's first budgets
    /// and at its smallest: no lowering is expected to fit, so none is placed.
    /// The figures from `tile` to `categories` are those of the two plans
    /// whose `total_missing` is less (`budgets`: "first" or "smallest").
    #[error(
        "the model cannot fit: what lives for the whole program exceeds a tile at the fit loop's first budgets and at its smallest; at the {budgets} budgets, tile {tile} holds {needed} bytes for the whole program ({}), above its {available}; {missing} bytes missing on that tile, {total_missing} over the {tiles} tiles short of room, before any operation's own buffers (what is missing is at least that); with their operations' buffers at each tile's busiest step, the plan at the smallest budgets misses {floor_missing} bytes on {floor_tiles} tiles, the first {live_missing} on {live_tiles}",
        .categories.iter().map(|(c, b)| format!("{c} {b}")).collect::<Vec<_>>().join(", ")
    )]
    Resident {
        budgets: String,
        tile: u32,
        needed: u64,
        available: u64,
        missing: u64,
        total_missing: u64,
        tiles: u32,
        /// Bytes on that tile by category, largest first.
        categories: Vec<(String, u64)>,
        /// The first plan's bytes over capacity at each tile's busiest step
        /// (its buffers live then and its exchange code), summed over the
        /// tiles over: what that plan misses, not every plan.
        live_missing: u64,
        live_tiles: u32,
        /// The same for the plan at the fit loop's smallest budgets (every
        /// lever at its least, where the loop would have ended): the report's
        /// total for what the chip misses.
        floor_missing: u64,
        floor_tiles: u32,
    },
    #[error("matmul has an empty dimension ({rows}x{k}x{n})")]
    Empty { rows: u32, k: u32, n: u32 },
}

/// The bytes a graph needs at the least, checked against the machine before any
/// weight or input is generated, so that a model that cannot fit is refused in
/// microseconds with the figures, not after gigabytes of allocation.
///
/// Counted: every parameter, input and output once in f16 (replication and
/// activations only add to it) against the whole chip's SRAM; per tile, the keys of
/// one attention head and one 16-query block of its scores (each row tile of a
/// head's group holds both at once, whichever attention path it takes) against one
/// tile's SRAM; per linear, the best mapping of
/// its smallest row pass with the whole of one tile's SRAM as its budget (the
/// lowering only ever has less).
pub fn precheck(
    machine: &tessera_machine::Machine,
    graph: &tessera_graph::Graph,
) -> Result<(), PlanError> {
    use tessera_graph::OpKind;
    let chip = u64::from(machine.tiles) * u64::from(machine.sram_bytes());
    let elems = |t: tessera_graph::TensorId| {
        graph
            .shape(t)
            .dims()
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d as u64))
    };
    let mut total = 0u64;
    for op in graph.ops() {
        if matches!(op.kind, OpKind::Parameter { .. } | OpKind::Input { .. }) {
            total = total.saturating_add(elems(op.output).unwrap_or(u64::MAX).saturating_mul(2));
        }
    }
    for out in graph.outputs() {
        total = total.saturating_add(elems(out.tensor).unwrap_or(u64::MAX).saturating_mul(2));
    }
    if total > chip {
        return Err(PlanError::TooLarge {
            what: "its parameters, inputs and outputs (f16, once each)".into(),
            needed: total,
            available: chip,
            scope: format!("the whole chip ({} tiles)", machine.tiles),
        });
    }
    let sram = u64::from(machine.sram_bytes());
    let params: std::collections::HashSet<_> = graph
        .ops()
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Parameter { .. }))
        .map(|o| o.output)
        .collect();
    for op in graph.ops() {
        // Linears only (a matmul by a 2-D weight): the lowering maps exactly these
        // with `map_matmul`; attention's products have their own rule.
        if let OpKind::MatMul {
            a,
            b,
            transpose_b: false,
            ..
        } = op.kind
            && params.contains(&b)
            && graph.shape(b).rank() == 2
        {
            let dims = graph.shape(a).dims();
            let k = dims.last().copied().unwrap_or(1);
            let rows = dims[..dims.len().saturating_sub(1)]
                .iter()
                .try_fold(1usize, |x, &d| x.checked_mul(d));
            let n = graph.shape(op.output).last();
            let passes = lower::ROW_PASSES[lower::ROW_PASSES.len() - 1];
            let shape = match (
                rows.and_then(|r| u32::try_from(r).ok()),
                u32::try_from(k),
                u32::try_from(n),
            ) {
                // The bound on what must fit: a row-major input's copy counts.
                (Some(rows), Ok(k), Ok(n)) => MatmulShape::new(rows.div_ceil(passes), k, n),
                _ => {
                    return Err(PlanError::Unsupported(format!(
                        "matmul `{}` has a dimension above 2^32 - 1",
                        op.name
                    )));
                }
            };
            if let Err(PlanError::DoesNotFit { needed, .. }) = map_matmul(machine, shape, sram) {
                return Err(PlanError::TooLarge {
                    what: format!(
                        "the tensors of matmul `{}` on its busiest tile ([{}x{k}] x [{k}x{n}] \
                         in {passes} row passes, best mapping)",
                        op.name,
                        rows.unwrap_or(0)
                    ),
                    needed,
                    available: sram,
                    scope: "one tile".into(),
                });
            }
        }
        if let OpKind::MatMul {
            b,
            transpose_b: true,
            ..
        } = op.kind
        {
            let dims = graph.shape(b).dims();
            let (t, d) = (dims[dims.len() - 2] as u64, dims[dims.len() - 1] as u64);
            let t16 = t.next_multiple_of(16);
            let need = t16 * d.next_multiple_of(16) * 2 + t16 * 32;
            if need > u64::from(machine.sram_bytes()) {
                return Err(PlanError::TooLarge {
                    what: format!(
                        "the keys and one 16-query block of scores of one head of `{}`",
                        op.name
                    ),
                    needed: need,
                    available: u64::from(machine.sram_bytes()),
                    scope: "one tile".into(),
                });
            }
        }
    }
    Ok(())
}

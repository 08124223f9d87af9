//! Kernel emitters. This crate owns the code generation of the compute kernels (as
//! `tessera_isa::Word`s), each kernel's access contract (what placement must
//! guarantee about every operand: alignment, memory class, over-read tail, element
//! separation), each kernel's vertex-state layout and the supervisor snippet that
//! calls it, and a cycle estimate for the tile-plan cost model. It must never choose
//! addresses — placement does, and emitters take them as inputs — and it must never
//! depend on the compiler driver, on the graph, or on the simulator at run time (the
//! simulator is only a test dependency, the oracle the emitted code is checked on).
//!
//! Calling convention, shared by every kernel (see `docs/kernels.md`):
//! - Worker code is emitted by [`Kernel::emit`] at an 8-byte aligned `code_base`; its
//!   size never depends on `code_base` nor on operand addresses, so it can be sized
//!   before placement ([`Kernel::code_bytes`]).
//! - The supervisor starts the six workers with `runall entry, state + runall_offset,
//!   stride`; worker `i` reads its record at `$m0 = state + runall_offset + i*stride`.
//!   [`Kernel::state`] builds the bytes of the whole state buffer.
//! - [`Kernel::supervisor`] returns the supervisor words for one call (it starts the
//!   workers, waits for them with `sync local` and falls through; never `exit`), which
//!   the compiler splices into the tile's supervisor program. The snippet clobbers
//!   `$m0..=$m12` and nothing else.

mod asm;
mod blocks_to_rows;
pub mod contract;
mod convert;
mod elementwise;
pub mod exchange;
mod gelu;
mod layernorm;
mod matmul;
mod mutation;
mod rearrange;
mod recip_sum;
mod scale_cols;
mod scale_rows;
mod softmax;
mod softmax_cols;
mod split_softmax;
mod timing;
mod transpose_blocks;
mod zero_fill;

use std::collections::BTreeMap;

use tessera_isa::{Inst, MReg, Word};
use tessera_machine::{Machine, Timing};

pub use asm::{code_bytes, word_bytes};
pub use blocks_to_rows::BlocksToRows;
pub use contract::{CodeRequirement, Contract, MemClass, Operand, Role, Violation};
pub use convert::Fp8ToF16;
pub use elementwise::{Add, AddBias, ReduceAdd, ReduceNorm};
pub use gelu::Gelu;
pub use layernorm::LayerNorm;
pub use matmul::{AmpMatmul, AmpStart, pack_chunk_major, pack_weights};
pub use mutation::{KernelMutation, MUTABLE, MutableKernel, UnknownMutableKernel, mutated};
pub use rearrange::Rearrange;
pub use recip_sum::RecipSum;
pub use scale_cols::ScaleCols;
pub use scale_rows::ScaleRows;
pub use softmax::Softmax;
pub use softmax_cols::{SoftmaxCols, SoftmaxColsMode};
pub use split_softmax::{ColExpShift, ColMax, ExpShift, RowMax};
pub use transpose_blocks::TransposeBlocks;
pub use zero_fill::ZeroFill;

// The worker count and repeat limit the kernels are written for are the machine's
// facts, which `Machine::validate` holds every description to.
pub use tessera_machine::{RPT_MAX, WORKERS};

/// Errors from building a kernel call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    #[error("kernel `{kernel}`: {message}")]
    InvalidParams { kernel: String, message: String },
    #[error("kernel `{kernel}`: no address for operand `{operand}`")]
    MissingOperand { kernel: String, operand: String },
    #[error("kernel `{kernel}`: {what} address {addr:#x} is not usable: {message}")]
    BadAddress {
        kernel: String,
        what: String,
        addr: u32,
        message: String,
    },
}

/// Operand name -> absolute tile address, as placement decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OperandAddrs(pub BTreeMap<String, u32>);

impl OperandAddrs {
    pub fn new() -> OperandAddrs {
        OperandAddrs::default()
    }
    pub fn with(mut self, name: &str, addr: u32) -> OperandAddrs {
        self.0.insert(name.to_string(), addr);
        self
    }
    pub fn insert(&mut self, name: &str, addr: u32) {
        self.0.insert(name.to_string(), addr);
    }
    pub fn get(&self, name: &str) -> Option<u32> {
        self.0.get(name).copied()
    }
}

/// Emitted worker code of one kernel instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCode {
    pub symbol: String,
    /// The address the words were emitted for (branch targets are absolute).
    pub code_base: u32,
    pub words: Vec<Word>,
    /// Worker entry point (currently always `code_base`).
    pub entry: u32,
}

impl KernelCode {
    pub fn bytes(&self) -> u32 {
        code_bytes(&self.words)
    }
}

/// The contents of a kernel's state buffer and how workers index it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VertexState {
    pub bytes: Vec<u8>,
    /// Offset of worker 0's record: `runall` gets `state + runall_offset`.
    pub runall_offset: u32,
    /// Distance between worker records.
    pub stride: u16,
}

/// Where one call's pieces live, for the supervisor snippet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call<'a> {
    /// Worker entry (the `entry` of the emitted [`KernelCode`]).
    pub entry: u32,
    /// Address of the state buffer (the `state` operand).
    pub state: u32,
    pub addrs: &'a OperandAddrs,
}

/// One kernel instance: parameters plus everything derived from them.
pub trait Kernel {
    /// A symbol naming the kernel and its parameters.
    fn symbol(&self) -> String;
    /// Checks the parameters against the kernel's and the ISA's limits.
    fn validate(&self) -> Result<(), KernelError>;
    /// Worker code at `code_base` (8-byte aligned).
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError>;
    /// The access contract, including the state buffer (operand `state`).
    fn contract(&self) -> Contract;
    /// The state buffer for these operand addresses.
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError>;
    /// Supervisor words for one call at `code_base` (4-byte aligned): start the
    /// workers, wait for them, fall through. Clobbers `$m0..=$m12`. Size independent
    /// of `code_base` and of every address.
    fn supervisor(&self, call: &Call<'_>, code_base: u32) -> Result<Vec<Word>, KernelError> {
        // Most kernels are single-shot: start the workers once and wait.
        let _ = code_base;
        let st = self.state(call.addrs)?;
        runall_snippet(&self.symbol(), call, &st)
    }
    /// Estimated tile cycles of one call, from the first word of its supervisor
    /// snippet until the supervisor can issue the word after it.
    fn estimate_cycles_with(&self, timing: &Timing) -> u64;

    /// [`Kernel::estimate_cycles_with`] on the c600 tile (same timing as bow).
    fn estimate_cycles(&self) -> u64 {
        self.estimate_cycles_with(&Machine::c600().timing)
    }

    /// Size of the worker code (same for every code base).
    fn code_bytes(&self) -> Result<u32, KernelError> {
        Ok(self.emit(0)?.bytes())
    }
}

pub(crate) fn invalid(kernel: &str, message: impl Into<String>) -> KernelError {
    KernelError::InvalidParams {
        kernel: kernel.to_string(),
        message: message.into(),
    }
}

pub(crate) fn operand(addrs: &OperandAddrs, kernel: &str, name: &str) -> Result<u32, KernelError> {
    addrs.get(name).ok_or_else(|| KernelError::MissingOperand {
        kernel: kernel.to_string(),
        operand: name.to_string(),
    })
}

/// Splits `total` units into `WORKERS` contiguous `(start, count)` ranges, the first
/// `total % WORKERS` ranges one unit longer.
pub(crate) fn split(total: u32) -> Vec<(u32, u32)> {
    let base = total / WORKERS;
    let extra = total % WORKERS;
    let mut start = 0;
    (0..WORKERS)
        .map(|i| {
            let n = base + u32::from(i < extra);
            let r = (start, n);
            start += n;
            r
        })
        .collect()
}

/// Little-endian builder for state records.
#[derive(Default)]
pub(crate) struct StateBuf(pub Vec<u8>);

impl StateBuf {
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn f32(&mut self, v: f32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// The finished state of a kernel whose workers' records start at offset 0.
    pub(crate) fn finish(self, stride: u16) -> VertexState {
        VertexState {
            bytes: self.0,
            runall_offset: 0,
            stride,
        }
    }

    pub(crate) fn pad_to(&mut self, len: usize) -> &mut Self {
        assert!(self.0.len() <= len, "state record overflows its stride");
        self.0.resize(len, 0);
        self
    }
}

/// The supervisor snippet of a single-shot kernel: start the workers and wait.
pub(crate) fn runall_snippet(
    kernel: &str,
    call: &Call<'_>,
    state: &VertexState,
) -> Result<Vec<Word>, KernelError> {
    let state_addr = runall_state(kernel, call, state)?;
    Ok(vec![
        Word::Single(asm::setzi(MReg(0), call.entry)),
        Word::Single(asm::setzi(MReg(1), state_addr)),
        Word::Single(Inst::RunAll {
            entry: MReg(0),
            state: MReg(1),
            stride: state.stride,
        }),
        Word::Single(Inst::SyncLocal),
    ])
}

/// The state address a single-shot call's `runall` takes, once its entry and
/// it are checked to fit `setzi` and be 4-byte aligned.
pub(crate) fn runall_state(
    kernel: &str,
    call: &Call<'_>,
    state: &VertexState,
) -> Result<u32, KernelError> {
    let bad = |what: &str, addr: u32, message: &str| KernelError::BadAddress {
        kernel: kernel.to_string(),
        what: what.to_string(),
        addr,
        message: message.to_string(),
    };
    let state_addr = call.state + state.runall_offset;
    if !call.entry.is_multiple_of(4) || call.entry >= 1 << 20 {
        return Err(bad(
            "entry",
            call.entry,
            "must be 4-byte aligned and below 2^20",
        ));
    }
    if !state_addr.is_multiple_of(4) || state_addr >= 1 << 20 {
        return Err(bad(
            "state",
            state_addr,
            "must be 4-byte aligned and below 2^20",
        ));
    }
    Ok(state_addr)
}

/// Worker code with one entry at its start, emitted after the kernel's parameter
/// and code-base checks: how most kernels implement [`Kernel::emit`].
pub(crate) fn single_entry(
    kernel: &impl Kernel,
    code_base: u32,
    words: impl FnOnce() -> Vec<Word>,
) -> Result<KernelCode, KernelError> {
    kernel.validate()?;
    check_code_base(&kernel.symbol(), code_base, 8)?;
    Ok(KernelCode {
        symbol: kernel.symbol(),
        code_base,
        entry: code_base,
        words: words(),
    })
}

/// Worker code needs an 8-byte aligned base (bundle padding is computed from it);
/// supervisor snippets, which hold no bundles, a 4-byte aligned one.
pub(crate) fn check_code_base(kernel: &str, code_base: u32, align: u32) -> Result<(), KernelError> {
    if !code_base.is_multiple_of(align) || code_base >= 1 << 20 {
        return Err(KernelError::BadAddress {
            kernel: kernel.to_string(),
            what: "code base".into(),
            addr: code_base,
            message: format!("must be {align}-byte aligned and below 2^20"),
        });
    }
    Ok(())
}

/// Bytes of [`runall_snippet`].
pub(crate) const RUNALL_SNIPPET_BYTES: u32 = 16;

/// Issue slots of a worker, counting the extra slots its f32 transcendentals hold.
pub(crate) fn issue_slots(t: &Timing, issues: u64, transcendentals: u64) -> u64 {
    issues + transcendentals * u64::from(t.f32_transcendental_issues.saturating_sub(1))
}

/// Cycles from a `runall` issue until the supervisor resumes after `sync local`:
/// `runall` hands every barrel slot to the workers, worker `w` issuing first `w + 1`
/// cycles after it and then once per round; the supervisor gets a slot back only as
/// workers exit, and `sync local` waits for the last.
pub(crate) fn run_cycles(t: &Timing, worker_slots: impl IntoIterator<Item = u64>) -> u64 {
    let interval = u64::from(t.worker_issue_interval);
    worker_slots
        .into_iter()
        .enumerate()
        .map(|(w, slots)| 1 + w as u64 + slots * interval)
        .max()
        .unwrap_or(0)
}

/// A [`runall_snippet`] call: two `setzi` (one cycle each, the supervisor holding
/// every slot), `runall` waiting for the second's result, then the round trip.
pub(crate) fn single_shot_cycles(t: &Timing, worker_slots: impl IntoIterator<Item = u64>) -> u64 {
    1 + u64::from(t.supervisor_result_latency) + run_cycles(t, worker_slots)
}

/// Where the cost model lays out a supervisor snippet it walks.
pub(crate) const ESTIMATE_CODE_BASE: u32 = 0x4_C000;

pub(crate) use timing::supervisor_cycles;

#[cfg(test)]
mod tests;

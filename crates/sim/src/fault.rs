//! Faults, named after the architecture's exception types, and how they print.

use serde::{Serialize, Serializer};
use std::fmt;

/// A hardware context of a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Context {
    Supervisor,
    /// Worker 0..=5.
    Worker(u8),
}

impl Context {
    /// Index into per-context tables: supervisor 0, worker i at i + 1.
    pub fn index(self) -> usize {
        match self {
            Context::Supervisor => 0,
            Context::Worker(w) => w as usize + 1,
        }
    }
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Context::Supervisor => f.write_str("supervisor"),
            Context::Worker(w) => write!(f, "worker {w}"),
        }
    }
}

impl Serialize for Context {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Exception types (`$WSR.ETYPE` / `$SSR.ETYPE` names, plus the simulator's own
/// timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum FaultKind {
    /// Misaligned, outside SRAM, or in a region the instruction may not access.
    InvalidMemoryAddress,
    /// Two accesses of one issue served by the same memory element.
    MemoryConflict,
    /// Undecodable word, or an instruction not allowed in this context or position.
    InvalidInstruction,
    /// Fetch outside executable code, or a branch/entry to an invalid address.
    InvalidProgramCounter,
    /// An operand value out of range (repeat count, host descriptor fields).
    InvalidOperand,
    /// An exchange that the tiles do not agree on, or that conflicts.
    InvalidExchangeConfiguration,
    /// The cycle budget ran out (not an architectural exception).
    Timeout,
    /// Two contexts of a tile touch the same bytes or the AMP weights in an order
    /// that depends on the barrel's interleaving (not an architectural exception:
    /// the simulator's own check, `docs/sim.md`).
    ExecutionHazard,
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// One faulting context.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fault {
    pub tile: u32,
    pub context: Context,
    pub kind: FaultKind,
    /// Why, in words, with the values involved.
    pub cause: String,
    /// Address of the faulting instruction.
    pub pc: u32,
    /// The code symbol containing `pc`, if any.
    pub symbol: Option<String>,
    /// `pc` minus the symbol's address (or `pc` itself without a symbol).
    pub offset: u32,
    /// The disassembled instruction at `pc` (empty when nothing could be fetched).
    pub instruction: String,
    /// The effective address involved, if any.
    pub address: Option<u32>,
    /// Tile cycle at which the context faulted.
    pub cycle: u64,
    /// For an ExecutionHazard: the context it races.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub races: Option<Context>,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tile {} {}: {} at ", self.tile, self.context, self.kind)?;
        match &self.symbol {
            Some(s) => write!(f, "{s}+{:#x}", self.offset)?,
            None => write!(f, "{:#x}", self.pc)?,
        }
        if !self.instruction.is_empty() {
            write!(f, " `{}`", self.instruction)?;
        }
        write!(f, ": {}", self.cause)
    }
}

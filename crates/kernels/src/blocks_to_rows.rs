//! `blocks_to_rows_f16`: the AMP's block layout `[nb][rows][16]` f16 (what
//! `amp_matmul` writes as `out`) back to row-major `[rows][16*nb]` f16, the inverse
//! of `rearrange_row_major_to_amp_f16`.
//!
//! Worker `w` owns a contiguous range of rows and, for every block, copies its rows'
//! 32-byte pieces, one `ldst64pace` per 8-byte word (the piece copy it shares with
//! the rearrangement). The input pointer runs linearly through the worker's part of
//! a block; the output pointer is bumped by one row minus 32 bytes after each piece.
//! `in` and `out` must be distinct buffers in different memory elements: a worker's
//! stores land in rows other workers are still reading, and every issue both loads
//! and stores.

use tessera_machine::Timing;

use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, VertexState, invalid, operand,
};

/// Parameters of one block-to-row conversion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlocksToRows {
    pub rows: u32,
    /// 16-wide column blocks; the output row has `16*nb` elements.
    pub nb: u32,
}

impl BlocksToRows {
    pub const NAME: &'static str = "blocks_to_rows_f16";

    pub fn new(rows: u32, nb: u32) -> BlocksToRows {
        BlocksToRows { rows, nb }
    }

    /// Bytes of each operand.
    pub fn bytes(&self) -> u32 {
        self.rows * self.nb * 32
    }
}

impl Kernel for BlocksToRows {
    fn symbol(&self) -> String {
        format!("{}_r{}_nb{}", Self::NAME, self.rows, self.nb)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.rows == 0 || self.nb == 0 {
            return Err(invalid(&name, "rows and nb must be positive"));
        }
        if self.rows.div_ceil(crate::WORKERS) > RPT_MAX {
            return Err(invalid(&name, "more than 4095 rows per worker"));
        }
        if u64::from(self.rows) * u64::from(self.nb) * 32 >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || {
            crate::rearrange::piece_copy(code_base, crate::rearrange::Strided::Destination)
        })
    }

    fn contract(&self) -> Contract {
        Contract {
            kernel: self.symbol(),
            code: CodeRequirement {
                bytes: self.code_bytes().unwrap_or(0),
                align: 8,
                mem_class: MemClass::Executable,
            },
            supervisor_bytes: crate::RUNALL_SNIPPET_BYTES,
            operands: crate::rearrange::piece_copy_operands(
                Operand::new("in", Role::Input, self.bytes(), 8),
                Operand::new("out", Role::Output, self.bytes(), 8),
            ),
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        Ok(crate::rearrange::piece_copy_state(
            out, inp, self.rows, self.nb,
        ))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::rearrange::piece_copy_cycles(t, self.rows, self.nb)
    }
}

//! `scale_rows_f16`: every row of an f16 matrix in the AMP's block layout
//! `[nb][rows][16]` multiplied in place by its own f32 factor, in f32, rounded once
//! to f16.
//!
//! It finishes a softmax whose normalisation was left to the caller
//! (`Softmax::with_recip`): scaling the few rows of `P V` by `1/sum` costs a sixth
//! of scaling every probability (`rows x 16 nb` products instead of `rows x ld`),
//! and rounds once instead of twice.
//!
//! Workers own contiguous row ranges; per row, the factor is loaded and broadcast,
//! then a repeat over the blocks scales the row's 32-byte piece of each block (four
//! 4-element groups at immediate offsets from a cursor that steps by a block).

use tessera_isa::{FBinOp, FVec, Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32, ld32m, m, mov};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{bcast2, fbin, simple_contract, to_f16, to_f32};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// A worker record: its first row of `x`, its first factor, rows, blocks, bytes
/// between blocks.
const STRIDE: u16 = 24;

/// `x[b][r][..] *= f[r]` for every block `b < nb` and row `r < rows`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleRows {
    pub rows: u32,
    /// 16-wide column blocks.
    pub nb: u32,
}

impl ScaleRows {
    pub const NAME: &'static str = "scale_rows_f16";

    pub fn new(rows: u32, nb: u32) -> ScaleRows {
        ScaleRows { rows, nb }
    }

    /// Issues of a worker with `r` rows (load the count, branch, exit without).
    fn worker_issues(&self, r: u32) -> u64 {
        if r == 0 {
            return 3;
        }
        // The count, its branch and four more record loads, then per row: the factor, its pointer,
        // its broadcast, the cursor, `rpt`, 33 issues a block, the row pointer, the
        // count and the loop branch; `exit`.
        6 + u64::from(r) * (8 + 33 * u64::from(self.nb)) + 1
    }

    fn code(&self, code_base: u32) -> Vec<tessera_isa::Word> {
        let mut s = Asm::new(code_base);
        let done = s.label();
        let row = s.label();
        s.i(ld32m(m(4), m(0), 2)); // rows
        s.brz(m(4), done);
        s.i(ld32m(m(2), m(0), 0)); // x at the worker's first row
        s.i(ld32m(m(3), m(0), 1)); // its first factor
        s.i(ld32m(m(5), m(0), 3)); // blocks
        s.i(ld32m(m(6), m(0), 4)); // bytes between blocks
        s.bind(row);
        s.i(ld32(a(8), m(3), 0));
        s.i(inti(IntOp::Add, m(3), m(3), 4));
        s.i(bcast2(8, 8));
        s.i(mov(m(7), m(2)));
        s.rpt(m(5), |b| {
            for j in 0..4u16 {
                b.i(Inst::Ld64 {
                    d: a(0),
                    base: m(7),
                    imm: j,
                });
                b.i(to_f32(2, 0));
                b.i(to_f32(4, 1));
                b.i(fbin(FBinOp::Mul, FVec::F32V2, 2, 2, 8));
                b.i(fbin(FBinOp::Mul, FVec::F32V2, 4, 4, 8));
                b.i(to_f16(0, 2));
                b.i(to_f16(1, 4));
                b.i(Inst::St64 {
                    s: a(0),
                    base: m(7),
                    imm: j,
                });
            }
            b.i(int(IntOp::Add, m(7), m(7), m(6)));
        });
        s.i(inti(IntOp::Add, m(2), m(2), 32));
        s.i(inti(IntOp::Sub, m(4), m(4), 1));
        s.brnz(m(4), row);
        s.bind(done);
        s.i(Inst::Exit);
        s.finish()
    }
}

/// The checks a `[nb][rows][16]` f16 operand shares in the row and column scalings:
/// some rows and blocks, and less than the tile's memory.
pub(crate) fn check_blocks(name: &str, rows: u32, nb: u32) -> Result<(), KernelError> {
    if rows == 0 || nb == 0 {
        return Err(invalid(name, "rows and nb must be positive"));
    }
    if u64::from(rows) * u64::from(nb) * 32 >= 1 << 20 {
        return Err(invalid(name, "operand larger than tile memory"));
    }
    Ok(())
}

impl Kernel for ScaleRows {
    fn symbol(&self) -> String {
        format!("{}_r{}_nb{}", Self::NAME, self.rows, self.nb)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.nb > RPT_MAX {
            return Err(invalid(&name, "more than 4095 blocks"));
        }
        check_blocks(&name, self.rows, self.nb)
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || self.code(code_base))
    }

    fn contract(&self) -> Contract {
        simple_contract(
            self,
            vec![
                Operand::new("x", Role::InOut, self.rows * self.nb * 32, 8),
                Operand::new("f", Role::Input, self.rows * 4, 8),
            ],
            u32::from(STRIDE) * WORKERS,
        )
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let x = operand(addrs, &name, "x")?;
        let f = operand(addrs, &name, "f")?;
        let mut buf = StateBuf::default();
        for (i, (r0, r)) in split(self.rows).into_iter().enumerate() {
            buf.u32(x + r0 * 32)
                .u32(f + r0 * 4)
                .u32(r)
                .u32(self.nb)
                .u32(self.rows * 32)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(
            t,
            split(self.rows)
                .into_iter()
                .map(|(_, r)| self.worker_issues(r)),
        )
    }
}

//! `transpose_blocks_f16`: a `[16·tb, 16·kc]` matrix X in block layout
//! `[kc][16·tb][16]` f16 to the AMP weight layout `[tb][kc][16][16]` of Xᵀ:
//! `out[b][c][kk][j] = in[c][16b + j][kk] = X[16b + j][16c + kk]`. With it,
//! `amp_matmul` with `a` = Q (block layout, `[rows, 16·kc]`) and `w` = `out`
//! computes Q·Xᵀ (attention's Q·Kᵀ).
//!
//! Every 16×16 input block (512 contiguous bytes) becomes one transposed output
//! block. Workers own contiguous ranges of input blocks, taken in input order so the
//! input pointer is linear; the output block steps by `kc` blocks and jumps back to
//! the next column of blocks after the `tb`-th. The ISA has no 16-bit accesses and
//! no lane shuffle, so the transpose goes through `$m` registers: the 32-bit words
//! holding `(j, 2p..2p+1)` and `(j+1, 2p..2p+1)` make the words `(2p, j..j+1)` (low
//! halves) and `(2p+1, j..j+1)` (high halves) with masks and shifts. A repeat
//! handles one row pair of a block (all addresses are immediate offsets from the two
//! block pointers), eight times per block: 10 issues per four elements. The copy is
//! bit-exact (NaN payloads included).

use tessera_isa::{Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, MZ, int, inti, ld32m, m, mov, setzi, st32m};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, StateBuf, VertexState, invalid, operand, split,
};

/// Parameters of one block transpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransposeBlocks {
    /// 16-wide column blocks of X (input chunks of the matmul that reads `out`).
    pub kc: u32,
    /// 16-row blocks of X (output blocks of that matmul).
    pub tb: u32,
}

const STRIDE: u16 = 32;
const BLOCK: u32 = 512;

impl TransposeBlocks {
    pub const NAME: &'static str = "transpose_blocks_f16";

    pub fn new(kc: u32, tb: u32) -> TransposeBlocks {
        TransposeBlocks { kc, tb }
    }

    /// Bytes of each operand.
    pub fn bytes(&self) -> u32 {
        self.kc * self.tb * BLOCK
    }

    /// Issues of the worker with `n` blocks from input block `v0`.
    fn worker_issues(&self, v0: u32, n: u32) -> u64 {
        if n == 0 {
            return 5;
        }
        // Column-of-blocks changes inside the range, each a 3-issue output jump.
        let wraps = (v0 + n - 1) / self.tb - v0 / self.tb;
        9 + 662 * u64::from(n) + 3 * u64::from(wraps)
    }
}

impl Kernel for TransposeBlocks {
    fn symbol(&self) -> String {
        format!("{}_kc{}_tb{}", Self::NAME, self.kc, self.tb)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.kc == 0 || self.tb == 0 {
            return Err(invalid(&name, "kc and tb must be positive"));
        }
        if u64::from(self.kc) * u64::from(self.tb) * u64::from(BLOCK) >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        let block = s.label();
        let (lo, hi) = (m(11), m(12));
        let (x0, x1, t0, t1) = (m(9), m(10), m(13), m(14));
        s.i(ld32m(m(2), m(0), 0)); // input block, linear
        s.i(ld32m(m(3), m(0), 1)); // output block
        s.i(ld32m(m(4), m(0), 2)); // blocks left
        s.brz(m(4), done);
        s.i(ld32m(m(5), m(0), 3)); // blocks left in this column of blocks
        s.i(ld32m(m(6), m(0), 4)); // tb
        s.i(ld32m(m(7), m(0), 5)); // output step to the next row of blocks
        s.i(ld32m(m(8), m(0), 6)); // output jump to the next column of blocks
        s.i(setzi(lo, 0xffff));
        s.i(inti(IntOp::Shl, hi, lo, 16));
        s.bind(block);
        s.rpti(8, |b| {
            for p in 0..8u16 {
                b.i(ld32m(x0, m(2), p));
                b.i(ld32m(x1, m(2), 8 + p));
                b.i(int(IntOp::And, t0, x0, lo));
                b.i(inti(IntOp::Shl, t1, x1, 16));
                b.i(int(IntOp::Or, t0, t0, t1));
                b.i(st32m(t0, m(3), 16 * p));
                b.i(inti(IntOp::Shr, x0, x0, 16));
                b.i(int(IntOp::And, x1, x1, hi));
                b.i(int(IntOp::Or, x0, x0, x1));
                b.i(st32m(x0, m(3), 16 * p + 8));
            }
            // Two input rows on, two output columns (4 bytes) on.
            b.i(inti(IntOp::Add, m(2), m(2), 64));
            b.i(inti(IntOp::Add, m(3), m(3), 4));
        });
        s.i(int(IntOp::Add, m(3), m(3), m(7)));
        s.i(inti(IntOp::Sub, m(4), m(4), 1));
        s.brz(m(4), done);
        s.i(inti(IntOp::Sub, m(5), m(5), 1));
        s.brnz(m(5), block);
        s.i(int(IntOp::Add, m(3), m(3), m(8)));
        s.i(mov(m(5), m(6)));
        s.brz(MZ, block);
        s.bind(done);
        s.i(Inst::Exit);
        Ok(KernelCode {
            symbol: self.symbol(),
            code_base,
            entry: code_base,
            words: s.finish(),
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
            operands: vec![
                Operand::new("in", Role::Input, self.bytes(), 8),
                Operand::new("out", Role::Output, self.bytes(), 8),
                Operand::new("state", Role::State, u32::from(STRIDE) * crate::WORKERS, 8),
            ],
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let mut buf = StateBuf::default();
        for (i, (v0, n)) in split(self.kc * self.tb).into_iter().enumerate() {
            let (c0, b0) = (v0 / self.tb, v0 % self.tb);
            buf.u32(inp + v0 * BLOCK)
                .u32(out + (b0 * self.kc + c0) * BLOCK)
                .u32(n)
                .u32(self.tb - b0)
                .u32(self.tb)
                .u32(self.kc * BLOCK - 32)
                // From past the last row of blocks back to the next column of blocks
                // (wrapping: the jump is negative).
                .u32(BLOCK.wrapping_sub(self.bytes()))
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(
            t,
            split(self.kc * self.tb)
                .into_iter()
                .map(|(v0, n)| self.worker_issues(v0, n)),
        )
    }
}

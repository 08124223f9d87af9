//! `transpose_blocks_f16`: a `[16·tb, 16·kc]` matrix X in block layout
//! `[kc][16·tb][16]` f16 to the AMP weight layout `[tb][kc][16][16]` of Xᵀ:
//! `out[b][c][kk][j] = in[c][16b + j][kk] = X[16b + j][16c + kk]`. With it,
//! `amp_matmul` with `a` = K (block layout, `[rows, 16·kc]`) and `w` = `out` for
//! X = Q computes K·Qᵀ (the attention's transposed scores).
//!
//! Every 16×16 input block (512 contiguous bytes) becomes one transposed output
//! block. Workers own contiguous ranges of row groups (four input rows of a
//! block), taken in input order so the input pointer is linear: a range may start
//! and end inside a block, so `kc · tb` blocks spread over the six workers to
//! within one row group (twenty blocks: 14 row groups on the busiest worker, where
//! whole blocks gave 16). The output block steps by `kc` blocks and jumps back to
//! the next column of blocks after the `tb`-th. A 4×4 sub-block is four `ld64` (a
//! row's four elements each), eight `sort4x16lo/hi` (each pairs the same half of two
//! rows' words: the 2×2 transposes) and four `st64` (an output row's four elements):
//! 13 issues for 16 elements with the stores beside the shuffles, 12 when the next
//! sub-block's first load goes beside the last shuffle. A repeat handles a group of
//! four input rows (the four sub-blocks across them, every address an immediate
//! offset from the two block pointers), four times a block. The copy is bit-exact
//! (NaN payloads included).

use tessera_isa::{Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m, mov};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::softmax::{End, Issue, ai, bi, block, ld64, mi};
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

/// A worker record: nine words (see [`Kernel::state`]), 8-byte aligned.
const STRIDE: u16 = 40;
/// Row groups in a block.
const GROUPS: u32 = 4;
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

    /// A worker's range of row groups from `u0`, `n` of them, as its first
    /// block's groups (to the end of that block, or of the range), then whole
    /// blocks, then the groups of a last, partial block.
    fn worker_range(u0: u32, n: u32) -> (u32, u32, u32) {
        let first = n.min(GROUPS - u0 % GROUPS);
        let rest = n - first;
        (first, rest / GROUPS, rest % GROUPS)
    }

    /// Issues of the worker with `n` row groups from `u0`, with `body` issues in
    /// a row group ([`rows_body`]).
    fn worker_issues(&self, u0: u32, n: u32, body: u64) -> u64 {
        if n == 0 {
            return 5;
        }
        let (first, whole, last) = Self::worker_range(u0, n);
        // Output jumps to the next column of blocks (two issues each): after every
        // block but a last partial one that ends a column.
        let v0 = u0 / GROUPS;
        let wraps = (v0 + whole + 1) / self.tb - v0 / self.tb;
        // Setup (nine loads and the test); the first block's repeat, its
        // bookkeeping and the test for whole blocks; per whole block the count,
        // the repeat, four row groups, the bookkeeping and the branch back; the
        // test for a last block, its repeat; the exit.
        let last_block = if last > 0 {
            1 + u64::from(last) * body
        } else {
            0
        };
        10 + 1
            + u64::from(first) * body
            + 4
            + u64::from(whole) * (6 + 4 * body)
            + 2 * u64::from(wraps)
            + 1
            + last_block
            + 1
    }
}

/// One group of four input rows of a block (`$m2`) to four output columns
/// (`$m3`): four 4x4 sub-blocks, then both pointers on (128 bytes of input, 8 of
/// output). Input rows `A..D` load into `$a0:1 .. $a6:7`; output row `4q + i`
/// gathers the same lane of all four, shuffled into `$a8:9`, `$a10:11`, `$a12:13`
/// and, once `B`'s pair is read, `$a2:3`.
fn rows_body() -> Vec<Issue> {
    let sort = |hi, d: u8, x: u8, y: u8| Inst::Sort4x16 {
        hi,
        d: a(d),
        a: a(x),
        b: a(y),
    };
    let st = |s: u8, imm: u16| Inst::St64 {
        s: a(s),
        base: m(3),
        imm,
    };
    let mut v = Vec::new();
    for q in 0..4u16 {
        // The first load of sub-block q > 0 went beside the previous one's last
        // shuffle.
        if q == 0 {
            v.push(mi(ld64(0, m(2), 0)));
        }
        for (r, reg) in [(1u16, 2u8), (2, 4), (3, 6)] {
            v.push(mi(ld64(reg, m(2), 4 * r + q)));
        }
        let row = |i: u16| (4 * q + i) * 4;
        v.extend([
            ai(sort(false, 8, 0, 2)),
            ai(sort(false, 9, 4, 6)),
            bi(st(8, row(0)), sort(true, 10, 0, 2)),
            ai(sort(true, 11, 4, 6)),
            bi(st(10, row(1)), sort(false, 12, 1, 3)),
            ai(sort(false, 13, 5, 7)),
            bi(st(12, row(2)), sort(true, 2, 1, 3)),
        ]);
        // `$a0:1` is free once `hi(1, 3)` has read it.
        v.push(if q < 3 {
            bi(ld64(0, m(2), q + 1), sort(true, 3, 5, 7))
        } else {
            ai(sort(true, 3, 5, 7))
        });
        v.push(mi(st(2, row(3))));
    }
    // The input pointer moves beside a shuffle after the group's last load.
    let n = v.len();
    v[n - 6] = v[n - 6].with(inti(IntOp::Add, m(2), m(2), 128));
    v.push(mi(inti(IntOp::Add, m(3), m(3), 8)));
    v
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
        let blk = s.label();
        let last = s.label();
        s.i(ld32m(m(2), m(0), 0)); // input row group, linear
        s.i(ld32m(m(3), m(0), 1)); // its output columns
        s.i(ld32m(m(4), m(0), 2)); // row groups of the first block
        s.brz(m(4), done);
        block(
            &mut s,
            &[
                mi(ld32m(m(5), m(0), 3)),  // blocks left in this column of blocks
                mi(ld32m(m(6), m(0), 4)),  // tb
                mi(ld32m(m(7), m(0), 5)),  // output step to the next row of blocks
                mi(ld32m(m(8), m(0), 6)),  // output jump to the next column of blocks
                mi(ld32m(m(9), m(0), 7)),  // whole blocks after the first
                mi(ld32m(m(10), m(0), 8)), // row groups of a last, partial block
            ],
            End::BeforeRpt,
        );
        let body = rows_body();
        // Every block but the worker's last ends at its fourth row group, whatever
        // group it started at, so the step to the next block is the same for all.
        let next_block = |s: &mut Asm| {
            let same_column = s.label();
            s.i(int(IntOp::Add, m(3), m(3), m(7)));
            s.i(inti(IntOp::Sub, m(5), m(5), 1));
            s.brnz(m(5), same_column);
            s.i(int(IntOp::Add, m(3), m(3), m(8)));
            s.i(mov(m(5), m(6)));
            s.bind(same_column);
        };
        s.rpt(m(4), |b| block(b, &body, End::Aligned));
        next_block(&mut s);
        s.brz(m(9), last);
        // Word parity below: the count's decrement puts each `rpt` at 4 mod 8.
        s.bind(blk);
        s.i(inti(IntOp::Sub, m(9), m(9), 1));
        s.rpti(GROUPS as u16, |b| block(b, &body, End::Aligned));
        next_block(&mut s);
        s.brnz(m(9), blk);
        s.bind(last);
        s.brz(m(10), done);
        s.rpt(m(10), |b| block(b, &body, End::Aligned));
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
        for (i, (u0, n)) in split(GROUPS * self.kc * self.tb).into_iter().enumerate() {
            let (v0, r0) = (u0 / GROUPS, u0 % GROUPS);
            let (c0, b0) = (v0 / self.tb, v0 % self.tb);
            let (first, whole, last) = Self::worker_range(u0, n);
            // A row group is 128 input bytes and 8 bytes of every output row.
            buf.u32(inp + v0 * BLOCK + r0 * 128)
                .u32(out + (b0 * self.kc + c0) * BLOCK + r0 * 8)
                .u32(first)
                .u32(self.tb - b0)
                .u32(self.tb)
                .u32(self.kc * BLOCK - 32)
                // From past the last row of blocks back to the next column of blocks
                // (wrapping: the jump is negative).
                .u32(BLOCK.wrapping_sub(self.bytes()))
                .u32(whole)
                .u32(last)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let body = rows_body().len() as u64;
        crate::single_shot_cycles(
            t,
            split(GROUPS * self.kc * self.tb)
                .into_iter()
                .map(|(u0, n)| self.worker_issues(u0, n, body)),
        )
    }
}

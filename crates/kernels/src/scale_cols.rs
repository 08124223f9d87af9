//! `scale_cols_f16`: every column of an f16 matrix in the AMP's block layout
//! `[nb][rows][16]` multiplied by its own factor, out of place, in f16: the factor
//! (given in f32) rounded to f16 once, each product rounded once (`f16v4mul`).
//!
//! It finishes the encoder attention's softmax on `(e V)^T = V^T e^T`, whose columns
//! are queries: each query's `1/sum` scales a column, so within a block the four
//! factor vectors are the same for every row, and a row's four groups stream
//! through `{ ldst64pace ; f16v4mul }`, one issue a group. Scaling the context's
//! rows after its transposition (`scale_rows`, f32) takes eight issues a group.
//!
//! Workers own contiguous row ranges of every block. Per block a worker converts
//! the block's 16 factors to four f16v4 pairs, then runs its rows software-
//! pipelined by two groups: each issue loads group `t`, stores group `t - 2` (the
//! same register: the store reads it before the load writes it) and multiplies
//! group `t - 1`. `in` and `out` are different memory elements (`ldst64pace`).

use tessera_isa::{FBinOp, FVec, Inst, IntOp, MReg, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m, mov};
use crate::contract::{Contract, Operand, Role, separate_all};
use crate::layernorm::{fbin, simple_contract, to_f16};
use crate::softmax::{End, Issue, ai, bi, block, mi};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// A worker record: its first row of `in`, of `out`, its rows, blocks, bytes between
/// blocks of `in`, the factors, bytes between blocks of `out`.
const STRIDE: u16 = 32;

/// Factor pairs of the four column groups, `$a6:7` .. `$a12:13`.
const F: [u8; 4] = [6, 8, 10, 12];
/// The two data pairs the rows rotate through.
const R: [u8; 2] = [0, 2];

/// `out[b][r][j] = in[b][r][j] * f[16 b + j]` for every block `b < nb`, row
/// `r < rows`, column `j < 16`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleCols {
    pub rows: u32,
    /// 16-wide column blocks.
    pub nb: u32,
    /// Stored rows of an `out` block (`>= rows`): rows `rows..out_rows` are left
    /// as they are (the attention's context keeps its padding dimensions there).
    pub out_rows: u32,
}

/// Issues of a worker's code outside its blocks (record loads, the count, `exit`)
/// and of one block besides its rows (the factors, cursors, pipeline fill and
/// drain, `rpt`, the block loop).
const SETUP_ISSUES: u64 = 10;
const BLOCK_ISSUES: u64 = 22;

impl ScaleCols {
    pub const NAME: &'static str = "scale_cols_f16";

    pub fn new(rows: u32, nb: u32) -> ScaleCols {
        ScaleCols {
            rows,
            nb,
            out_rows: rows,
        }
    }

    /// The same with `out` blocks of `out_rows` stored rows.
    pub fn with_out_rows(mut self, out_rows: u32) -> ScaleCols {
        self.out_rows = out_rows;
        self
    }

    /// Issues of a worker with `r` rows (load the count, branch, exit without).
    fn worker_issues(&self, r: u32) -> u64 {
        if r == 0 {
            return 3;
        }
        SETUP_ISSUES + u64::from(self.nb) * (BLOCK_ISSUES + 4 * (u64::from(r) - 1))
    }

    fn code(&self, code_base: u32) -> Vec<Word> {
        let mut s = Asm::new(code_base);
        let done = s.label();
        let blk = s.label();
        let (ld, st, fp) = (m(7), m(9), m(8));
        s.i(ld32m(m(4), m(0), 2)); // rows
        s.brz(m(4), done);
        block(
            &mut s,
            &[
                mi(ld32m(m(2), m(0), 0)),  // in at the worker's first row
                mi(ld32m(m(3), m(0), 1)),  // out at the worker's first row
                mi(ld32m(m(5), m(0), 3)),  // blocks
                mi(ld32m(m(6), m(0), 4)),  // bytes between blocks of in
                mi(ld32m(fp, m(0), 5)),    // factors
                mi(ld32m(m(10), m(0), 6)), // bytes between blocks of out
                mi(inti(IntOp::Sub, m(4), m(4), 1)),
            ],
            End::Any,
        );
        s.bind(blk);
        let step_ld = |d: u8, base: MReg| Inst::Ld64Step {
            d: a(d),
            base,
            inc: 1,
        };
        let step_st = |r: u8| Inst::St64Step {
            s: a(r),
            base: st,
            inc: 1,
        };
        let mul = |r: u8, g: usize| fbin(FBinOp::Mul, FVec::F16V4, r, r, F[g]);
        let ldst = |r: u8| Inst::Ldst64Pace {
            d: a(r),
            s: a(r),
            pl: ld,
            ps: st,
        };
        // The block's factors, two f32 a load, into f16 lanes (alternating staging
        // pairs, so that nothing past the block's factors is read).
        let mut pre = vec![mi(step_ld(4, fp))];
        for i in 0..8u8 {
            let (stage, next) = if i % 2 == 0 { (4, 0) } else { (0, 4) };
            let conv = to_f16(6 + i, stage);
            pre.push(if i < 7 {
                bi(step_ld(next, fp), conv)
            } else {
                ai(conv)
            });
        }
        // The store cursor last: a single word before the `rpt` keeps its body
        // aligned without a padding `nop`.
        pre.extend([
            mi(mov(ld, m(2))),
            mi(step_ld(R[0], ld)),
            bi(step_ld(R[1], ld), mul(R[0], 0)),
            mi(mov(st, m(3))),
        ]);
        block(&mut s, &pre, End::BeforeRpt);
        // Group t (from 2) of the rows: its load, the store of group t - 2 and the
        // product of group t - 1; a row is four of them.
        let body: Vec<Issue> = (2..6usize)
            .map(|t| bi(ldst(R[t % 2]), mul(R[(t - 1) % 2], (t - 1) % 4)))
            .collect();
        s.rpt(m(4), |b| block(b, &body, End::Aligned));
        block(
            &mut s,
            &[
                body[0],
                body[1],
                bi(step_st(R[0]), mul(R[1], 3)),
                mi(step_st(R[1])),
                mi(int(IntOp::Add, m(2), m(2), m(6))),
                mi(int(IntOp::Add, m(3), m(3), m(10))),
                mi(inti(IntOp::Sub, m(5), m(5), 1)),
            ],
            End::Any,
        );
        s.brnz(m(5), blk);
        s.bind(done);
        s.i(Inst::Exit);
        s.finish()
    }
}

impl Kernel for ScaleCols {
    fn symbol(&self) -> String {
        let out = if self.out_rows != self.rows {
            format!("_o{}", self.out_rows)
        } else {
            String::new()
        };
        format!("{}_r{}_nb{}{out}", Self::NAME, self.rows, self.nb)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.rows > RPT_MAX {
            return Err(invalid(&name, "more than 4095 rows"));
        }
        if self.out_rows < self.rows {
            return Err(invalid(&name, "out blocks must hold every row"));
        }
        crate::scale_rows::check_blocks(&name, self.out_rows, self.nb)?;
        crate::scale_rows::check_blocks(&name, self.rows, self.nb)
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || self.code(code_base))
    }

    fn contract(&self) -> Contract {
        let bytes = self.rows * self.nb * 32;
        let mut ops = vec![
            Operand::new("in", Role::Input, bytes, 8),
            // Rows past `rows` keep what they hold.
            Operand::new(
                "out",
                if self.out_rows > self.rows {
                    Role::InOut
                } else {
                    Role::Output
                },
                self.out_rows * self.nb * 32,
                8,
            ),
            Operand::new("f", Role::Input, self.nb * 64, 8),
        ];
        separate_all(&mut ops, &["in", "out"]);
        simple_contract(self, ops, u32::from(STRIDE) * WORKERS)
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let x = operand(addrs, &name, "in")?;
        let y = operand(addrs, &name, "out")?;
        let f = operand(addrs, &name, "f")?;
        let mut buf = StateBuf::default();
        for (i, (r0, r)) in split(self.rows).into_iter().enumerate() {
            buf.u32(x + r0 * 32)
                .u32(y + r0 * 32)
                .u32(r)
                .u32(self.nb)
                .u32(self.rows * 32)
                .u32(f)
                .u32(self.out_rows * 32)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked() {
        assert!(ScaleCols::new(80, 1).validate().is_ok());
        assert!(ScaleCols::new(0, 1).validate().is_err());
        assert!(ScaleCols::new(5, 0).validate().is_err());
        assert!(ScaleCols::new(4096, 1).validate().is_err());
        assert!(ScaleCols::new(72, 1).with_out_rows(80).validate().is_ok());
        assert!(ScaleCols::new(72, 1).with_out_rows(71).validate().is_err());
    }

    #[test]
    fn layout_needs_no_padding_nop() {
        for k in [
            ScaleCols::new(80, 1),
            ScaleCols::new(80, 2),
            ScaleCols::new(7, 3),
            ScaleCols::new(72, 2).with_out_rows(80),
        ] {
            crate::tests::assert_no_padding_nop(&k);
        }
    }
}

//! `softmax_cols_f16`: the softmax down every column of f16 scores in the AMP's
//! output layout `[blocks][rows][16]` (`out` may be `in`), with the normalisation left to
//! the caller: the exponentials `e = exp((x - M) * scale)` (in f16, see below) and
//! each column's `1/sum` (f32). It serves the transposed attention scores
//! `S^T = K Q^T`, whose columns are queries and whose rows are keys: rows `n..rows`
//! (the key dimension's padding) are never read and are written as `+0`, so `e`
//! is the AMP weight layout of `e^T` for `V^T e^T` as it stands.
//!
//! A column's scores lie 32 bytes apart, so the work is cut by rows, evenly over
//! the six workers whatever the number of columns, and the column maxima and sums
//! are combined across workers in three launches:
//! 1. each worker's maximum of every 4-column group over its rows (f16 lanes; max
//!    is exact), into the state;
//! 2. each worker takes the six maxima `M` of a group, then for each of its rows
//!    five issues: `f16v4sub` (`x - M`), `f16v4mul` (by `scale` rounded to f16;
//!    left out, for four issues, when that is one: the attention folds its scale
//!    into the query projection), two `f16v2exp`, and `f16v4acc`, which adds the
//!    four `e` to f32 lane sums in the worker's accumulators (the load of the
//!    next row and the store of `e` ride in two of them); the sums go to the state
//!    by `f32v2gina`. The
//!    argument is an f16, so `e` is within `2^-11 + 1.25 * 2^-10 |a|` (relative)
//!    of `exp(a)`: the f32 argument and `f32exp` of the row softmax cost 16 issue
//!    slots a row instead of 5. The worker with the last rows zeroes the padding
//!    rows;
//! 3. the groups split over the workers: the six partial sums added in worker
//!    order, `1/sum` per column.
//!
//! A group's rows are walked with `ld64step`/`st64step` by 32 bytes; every worker
//! has at least two rows (`n >= 12`), so the walks need no special cases.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, IntOp, MReg, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32, ld32m, m, setzi};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{
    SPLIT_SNIPPET_BYTES, bcast2, bcast4, fbin, fun, simple_contract, split_snippet,
};
use crate::softmax::{AZ, D0, D1, End, Issue, S1, S2, SC, W, X, add2, ai, bi, block, ld64, mi};
use crate::{
    Call, Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// Parameters of one column softmax.
#[derive(Debug, Clone, PartialEq)]
pub struct SoftmaxCols {
    /// 16-column blocks.
    pub blocks: u32,
    /// Stored rows of a block (the padded key dimension).
    pub rows: u32,
    /// Valid rows (`12 <= n <= rows`): scores `n..rows` are padding.
    pub n: u32,
    /// Multiplies every score before the exponential; `0 < scale <= 16` (see
    /// [`crate::Softmax::SCALE_MAX`]).
    pub scale: f32,
}

/// A worker record (words): its first row of block 0 in `in`, its rows, the
/// group-offset table, its maxima, everyone's maxima, its sums, its padding rows,
/// `scale` as f16 (low half); launch 3: its first group's partial sums, its first `1/sum`,
/// its groups; then its first row in `out`. Pointers into the state are offsets
/// from the record.
const STRIDE: u16 = 56;

// `$m` registers (launches 1 and 2).
const BASE: MReg = MReg(2);
const TAB: MReg = MReg(3);
const MX: MReg = MReg(4);
const SW: MReg = MReg(5);
const PADN: MReg = MReg(6);
const CNT: MReg = MReg(7);
const GI: MReg = MReg(8);
const RD: MReg = MReg(9);
const WR: MReg = MReg(10);
const OFF: MReg = MReg(11);
const BASE_OUT: MReg = MReg(0);

// `$a` registers of launch 2 (pairs), besides `X` (the scores) and the sums.
/// The arguments `(x - M) * scale` (f16).
const ARG: u8 = D0;
/// Their exponentials (f16).
const E: u8 = W;
/// `scale` rounded to f16, in all four lanes.
const SCV: u8 = D1;
/// The group's column maxima (f16).
const MV: u8 = SC;

/// `ld64step`/`st64step` increment down a column: one 32-byte row.
const ROW_STEP: i8 = 4;

/// Issues of the emitted code, counted while emitting: the estimate reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    /// Launch 1: before the group loop, one group without its repeat, the end.
    max_setup: u64,
    max_group: u64,
    /// Launch 2, the same, and the issues of its row repeat body.
    exp_setup: u64,
    exp_group: u64,
    exp_row: u64,
    /// Launch 3: with groups, before the loop and one group; without, all.
    sum_setup: u64,
    sum_group: u64,
    sum_idle: u64,
    entries: [u32; 3],
}

const EXIT_ISSUES: u64 = 1;

fn max4(d: u8, x: u8, y: u8) -> Inst {
    fbin(FBinOp::Max, FVec::F16V4, d, x, y)
}

fn exp16(d: u8, x: u8) -> Inst {
    Inst::F16v2Exp { d: a(d), a: a(x) }
}

impl SoftmaxCols {
    pub const NAME: &'static str = "softmax_cols_f16";

    pub fn new(blocks: u32, rows: u32, n: u32, scale: f32) -> SoftmaxCols {
        SoftmaxCols {
            blocks,
            rows,
            n,
            scale,
        }
    }

    /// 4-column groups.
    fn groups(&self) -> u32 {
        4 * self.blocks
    }

    /// Byte offset of group `gi` (row 0) from the start of `in` (and `out`).
    fn group_offset(&self, gi: u32) -> u32 {
        (gi / 4) * self.rows * 32 + (gi % 4) * 8
    }

    fn program(&self, code_base: u32) -> Result<(Vec<Word>, Tally), KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let g4 = self.groups();
        let mut s = Asm::new(code_base);
        let mut t = Tally::default();
        let repeat = |s: &mut Asm, count: MReg, body: &[Issue]| {
            s.rpt(count, |b| block(b, body, End::Aligned));
        };
        let step_ld = |d: u8| Inst::Ld64Step {
            d: a(d),
            base: RD,
            inc: ROW_STEP,
        };
        let step_st = |r: u8| Inst::St64Step {
            s: a(r),
            base: WR,
            inc: ROW_STEP,
        };
        let group_start = [
            mi(ld32m(OFF, TAB, 0)),
            mi(inti(IntOp::Add, TAB, TAB, 4)),
            mi(int(IntOp::Add, RD, BASE, OFF)),
        ];

        // Launch 1: the maxima.
        t.entries[0] = s.at() - code_base;
        let n0 = s.len();
        block(
            &mut s,
            &[
                mi(ld32m(BASE, m(0), 0)),
                mi(ld32m(CNT, m(0), 1)),
                mi(inti(IntOp::Sub, CNT, CNT, 2)),
                mi(ld32m(TAB, m(0), 2)),
                mi(int(IntOp::Add, TAB, TAB, m(0))),
                mi(ld32m(MX, m(0), 3)),
                mi(int(IntOp::Add, MX, MX, m(0))),
                mi(setzi(GI, g4)),
            ],
            End::Any,
        );
        let lp = s.label();
        s.bind(lp);
        let n1 = s.len();
        let mut head = group_start.to_vec();
        head.extend([mi(step_ld(S1)), mi(step_ld(X))]);
        block(&mut s, &head, End::BeforeRpt);
        repeat(
            &mut s,
            CNT,
            &[bi(step_ld(X), fbin(FBinOp::Max, FVec::F16V4, S1, S1, X))],
        );
        block(
            &mut s,
            &[
                ai(fbin(FBinOp::Max, FVec::F16V4, S1, S1, X)),
                mi(Inst::St64Step {
                    s: a(S1),
                    base: MX,
                    inc: 1,
                }),
                mi(inti(IntOp::Sub, GI, GI, 1)),
            ],
            End::Any,
        );
        s.brnz(GI, lp);
        t.max_group = (s.len() - n1) as u64;
        s.i(Inst::Exit);
        t.max_setup = (n1 - n0) as u64 + EXIT_ISSUES;

        // Launch 2: the exponentials and the partial sums.
        t.entries[1] = s.at() - code_base;
        let n0 = s.len();
        block(
            &mut s,
            &[
                mi(ld32m(BASE, m(0), 0)),
                mi(ld32m(CNT, m(0), 1)),
                mi(inti(IntOp::Sub, CNT, CNT, 1)),
                mi(ld32m(TAB, m(0), 2)),
                mi(int(IntOp::Add, TAB, TAB, m(0))),
                mi(ld32m(MX, m(0), 4)),
                mi(int(IntOp::Add, MX, MX, m(0))),
                mi(ld32m(SW, m(0), 5)),
                mi(int(IntOp::Add, SW, SW, m(0))),
                mi(ld32m(PADN, m(0), 6)),
                mi(ld32(a(SCV), m(0), 7)),
                bi(setzi(GI, g4), bcast4(SCV, SCV)),
                // Last: it overwrites the record pointer.
                mi(ld32m(BASE_OUT, m(0), 11)),
            ],
            End::Any,
        );
        let lp = s.label();
        s.bind(lp);
        let n1 = s.len();
        let mut head = group_start.to_vec();
        head.push(mi(int(IntOp::Add, WR, BASE_OUT, OFF)));
        // The column maxima over the six workers' (`g4` groups apart).
        head.push(mi(ld64(MV, MX, 0)));
        head.push(mi(ld64(X, MX, g4 as u16)));
        for k in 2..WORKERS as u16 {
            head.push(bi(ld64(X, MX, k * g4 as u16), max4(MV, MV, X)));
        }
        head.push(bi(inti(IntOp::Add, MX, MX, 8), max4(MV, MV, X)));
        head.push(mi(step_ld(X)));
        block(&mut s, &head, End::BeforeRpt);
        // A row: its arguments `(x - M) * scale` in f16, their exponentials, the
        // store and the f32 lane sums in the accumulators; the next row's load goes
        // once the scores are read.
        let sub = ai(fbin(FBinOp::Sub, FVec::F16V4, ARG, X, MV));
        let mul = fbin(FBinOp::Mul, FVec::F16V4, ARG, ARG, SCV);
        let acc = Inst::F16Acc {
            a: a(E),
            quad: false,
        };
        // Unscaled (the scale folded into the queries upstream), the first
        // exponential reads `x - M` directly and takes the multiply's slot.
        let unscaled = self.unscaled();
        let mut row = vec![sub];
        if unscaled {
            row.push(bi(step_ld(X), exp16(E, ARG)));
        } else {
            row.extend([bi(step_ld(X), mul), ai(exp16(E, ARG))]);
        }
        row.extend([ai(exp16(E + 1, ARG + 1)), bi(step_st(E), acc)]);
        t.exp_row = row.len() as u64;
        repeat(&mut s, CNT, &row);
        // The last row without a load; the sums out of the accumulators (which
        // leaves them zero for the next group); the padding rows zeroed (a repeat
        // of none on all but the last worker).
        let mut last = vec![sub];
        if !unscaled {
            last.push(ai(mul));
        }
        block(
            &mut s,
            &[
                &last[..],
                &[
                    ai(exp16(E, ARG)),
                    bi(inti(IntOp::Sub, GI, GI, 1), exp16(E + 1, ARG + 1)),
                    bi(step_st(E), acc),
                    ai(Inst::F32v2Gina { d: a(S1) }),
                    ai(Inst::F32v2Gina { d: a(S2) }),
                    bi(
                        Inst::St64 {
                            s: a(S1),
                            base: SW,
                            imm: 0,
                        },
                        bcast2(X, AZ),
                    ),
                    mi(Inst::St64 {
                        s: a(S2),
                        base: SW,
                        imm: 1,
                    }),
                    mi(inti(IntOp::Add, SW, SW, 16)),
                ],
            ]
            .concat(),
            End::BeforeRpt,
        );
        repeat(&mut s, PADN, &[mi(step_st(X))]);
        s.brnz(GI, lp);
        t.exp_group = (s.len() - n1) as u64;
        s.i(Inst::Exit);
        t.exp_setup = (n1 - n0) as u64 + EXIT_ISSUES;

        // Launch 3: partial sums added, reciprocals.
        t.entries[2] = s.at() - code_base;
        let n0 = s.len();
        let done = s.label();
        let (sp, rp) = (MReg(2), MReg(3));
        s.i(ld32m(CNT, m(0), 10));
        s.brz(CNT, done);
        t.sum_idle = (s.len() - n0) as u64 + EXIT_ISSUES;
        block(
            &mut s,
            &[
                mi(ld32m(sp, m(0), 8)),
                mi(int(IntOp::Add, sp, sp, m(0))),
                mi(ld32m(rp, m(0), 9)),
            ],
            End::BeforeRpt,
        );
        let n1 = s.len();
        let mut body = vec![mi(ld64(S1, sp, 0)), mi(ld64(S2, sp, 1))];
        for k in 1..WORKERS as u16 {
            let at = 2 * k * g4 as u16;
            body.push(mi(ld64(X, sp, at)));
            body.push(bi(ld64(W, sp, at + 1), add2(S1, X)));
            body.push(ai(add2(S2, W)));
        }
        body.extend([
            bi(inti(IntOp::Add, sp, sp, 16), fun(FUnOp::Recip, S1, S1)),
            ai(fun(FUnOp::Recip, S1 + 1, S1 + 1)),
            ai(fun(FUnOp::Recip, S2, S2)),
            ai(fun(FUnOp::Recip, S2 + 1, S2 + 1)),
            mi(Inst::St64 {
                s: a(S1),
                base: rp,
                imm: 0,
            }),
            mi(Inst::St64 {
                s: a(S2),
                base: rp,
                imm: 1,
            }),
            mi(inti(IntOp::Add, rp, rp, 16)),
        ]);
        repeat(&mut s, CNT, &body);
        t.sum_group = (s.len() - n1 - 1) as u64;
        t.sum_setup = (n1 - n0) as u64 + 1 + EXIT_ISSUES;
        s.bind(done);
        s.i(Inst::Exit);
        Ok((s.finish(), t))
    }

    /// The emitted code's counts; all zero for parameters the kernel refuses, whose
    /// estimate is then meaningless but does not fail (callers validate first).
    fn tally(&self) -> Tally {
        self.program(0).map(|(_, t)| t).unwrap_or_default()
    }

    /// Worker issue slots of each launch.
    fn launch_slots(&self, t: &Timing, tl: &Tally, launch: usize) -> Vec<u64> {
        let g4 = u64::from(self.groups());
        let pads = self.rows - self.n;
        let rows = split(self.n);
        let sums = split(self.groups());
        (0..WORKERS as usize)
            .map(|w| {
                let r = u64::from(rows[w].1);
                let pad = if w + 1 == WORKERS as usize {
                    u64::from(pads)
                } else {
                    0
                };
                match launch {
                    0 => tl.max_setup + g4 * (tl.max_group + r).saturating_sub(3),
                    // The emitted group holds the row body once and the padding
                    // store once; the body runs r - 1 times, the store `pad`.
                    // Two `f16v2exp` a row, each holding its slot `f16_exp_issues`.
                    1 => {
                        tl.exp_setup
                            + g4 * (tl.exp_group + tl.exp_row * r + pad)
                                .saturating_sub(2 * tl.exp_row + 1)
                            + g4 * 2 * r * u64::from(t.f16_exp_issues.saturating_sub(1))
                    }
                    _ => match u64::from(sums[w].1) {
                        0 => tl.sum_idle,
                        c => crate::issue_slots(t, tl.sum_setup + c * tl.sum_group, 4 * c),
                    },
                }
            })
            .collect()
    }
}

impl Kernel for SoftmaxCols {
    fn symbol(&self) -> String {
        let unscaled = if self.unscaled() { "_u" } else { "" };
        format!(
            "{}_b{}_r{}_n{}{unscaled}",
            Self::NAME,
            self.blocks,
            self.rows,
            self.n
        )
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.blocks == 0 {
            return Err(invalid(&name, "blocks must be positive"));
        }
        if self.n < 2 * WORKERS || self.n > self.rows {
            return Err(invalid(
                &name,
                "n must be at least 12 (two rows a worker) and at most rows",
            ));
        }
        // Repeat counts (rows a worker, padding rows) and the `ld64` offsets of the
        // maxima and sums of the last worker.
        if self.rows > RPT_MAX || 2 * WORKERS * self.groups() >= 1 << 12 {
            return Err(invalid(&name, "rows above 4095 or more than 340 blocks"));
        }
        if u64::from(self.blocks) * u64::from(self.rows) * 32 >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        crate::softmax::check_scale(&name, self.scale)?;
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        // `program` validates and checks the code base.
        crate::single_entry(self, code_base, || {
            self.program(code_base).map(|(w, _)| w).unwrap_or_default()
        })
    }

    fn contract(&self) -> Contract {
        let mut c = simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, self.blocks * self.rows * 32, 8),
                Operand::new("out", Role::Output, self.blocks * self.rows * 32, 8),
                Operand::new("recip", Role::Output, self.groups() * 16, 8),
            ],
            self.state_bytes(),
        );
        c.supervisor_bytes = SPLIT_SNIPPET_BYTES;
        c
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let x = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let recip = operand(addrs, &name, "recip")?;
        let g4 = self.groups();
        // State pointers are offsets from the worker's record (`$m0`): the state's
        // own address is the caller's.
        let records = u32::from(STRIDE) * WORKERS;
        let tab = records;
        let maxes = tab + (4 * g4).next_multiple_of(8);
        let sums = maxes + 8 * WORKERS * g4;
        let rows = split(self.n);
        let groups = split(g4);
        let mut buf = StateBuf::default();
        for (w, &(r0, r)) in rows.iter().enumerate() {
            let last = w + 1 == WORKERS as usize;
            let (gi0, gn) = groups[w];
            let record = w as u32 * u32::from(STRIDE);
            buf.u32(x + r0 * 32)
                .u32(r)
                .u32(tab - record)
                .u32(maxes + w as u32 * g4 * 8 - record)
                .u32(maxes - record)
                .u32(sums + w as u32 * g4 * 16 - record)
                .u32(if last { self.rows - self.n } else { 0 })
                .u32(u32::from(self.scale16().to_bits()))
                .u32(sums + gi0 * 16 - record)
                .u32(recip + gi0 * 16)
                .u32(gn)
                .u32(out + r0 * 32)
                .pad_to((w + 1) * usize::from(STRIDE));
        }
        for gi in 0..g4 {
            buf.u32(self.group_offset(gi));
        }
        // The maxima and sums need no initial value: each is written before it is
        // read.
        buf.pad_to(self.state_bytes() as usize);
        Ok(buf.finish(STRIDE))
    }

    fn supervisor(&self, call: &Call<'_>, code_base: u32) -> Result<Vec<Word>, KernelError> {
        let _ = code_base;
        let st = self.state(call.addrs)?;
        // The checks of the single-shot snippet cover the first launch; the other
        // entries lie inside the same code.
        crate::runall_snippet(&self.symbol(), call, &st)?;
        Ok(split_snippet(
            call.entry,
            call.state + st.runall_offset,
            self.tally().entries,
            st.stride,
        ))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let tl = self.tally();
        let words = split_snippet(0, 0, tl.entries, STRIDE);
        crate::supervisor_cycles(t, &words, |launch| self.launch_slots(t, &tl, launch))
    }
}

impl SoftmaxCols {
    /// `scale` as the kernel multiplies by it: rounded to f16 (a relative change of
    /// at most 2^-12, a temperature the softmax cannot tell from its arguments'
    /// own f16 rounding).
    fn scale16(&self) -> half::f16 {
        half::f16::from_f32(self.scale * crate::mutation::factor("softmax"))
    }

    /// Whether the multiply by `scale` is left out: only where it would multiply
    /// by exactly one.
    fn unscaled(&self) -> bool {
        self.scale16() == half::f16::ONE
    }

    fn state_bytes(&self) -> u32 {
        let g4 = self.groups();
        u32::from(STRIDE) * WORKERS + (4 * g4).next_multiple_of(8) + 24 * WORKERS * g4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked() {
        assert!(SoftmaxCols::new(1, 736, 729, 0.125).validate().is_ok());
        assert!(SoftmaxCols::new(1, 16, 12, 1.0).validate().is_ok());
        assert!(SoftmaxCols::new(1, 16, 11, 1.0).validate().is_err());
        assert!(SoftmaxCols::new(0, 736, 729, 1.0).validate().is_err());
        assert!(SoftmaxCols::new(1, 728, 729, 1.0).validate().is_err());
        for bad in [0.0, -1.0, 16.5, f32::NAN] {
            assert!(SoftmaxCols::new(1, 32, 32, bad).validate().is_err());
        }
        // Refused parameters still estimate without failing.
        for k in [
            SoftmaxCols::new(0, 0, 0, 1.0),
            SoftmaxCols::new(1, 16, 3, 1.0),
        ] {
            let _ = k.estimate_cycles();
        }
    }

    #[test]
    fn layout_needs_no_padding_nop() {
        for k in [
            SoftmaxCols::new(1, 736, 729, 0.125),
            SoftmaxCols::new(2, 736, 729, 0.125),
            SoftmaxCols::new(3, 40, 13, 0.5),
        ] {
            crate::tests::assert_no_padding_nop(&k);
        }
    }
}

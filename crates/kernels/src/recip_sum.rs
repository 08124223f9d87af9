//! `recip_sum_f32`: `out[i] = 1 / (a[i] + b[i])` over `n` f32, the sum rounded to
//! f32 and then the machine's f32 reciprocal (`f32recip`, the one `softmax_cols`
//! takes its `1/sum` with). It merges the per-query softmax denominators of two
//! tiles that each hold half of an attention's keys, straight into the factors
//! `scale_cols` multiplies by.
//!
//! The six workers take contiguous runs of element pairs (`split`). A pair costs
//! one `f32v2add` and two `f32recip`, five issue slots of the aux pipe, and the
//! loop is software-pipelined so that its loads and store ride in those bundles:
//! five slots a pair. Nothing is read or written past `n`: an odd `n`'s last
//! element is a scalar tail on the last worker, emitted only then.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, ld32, ld32m, m};
use crate::contract::Contract;
use crate::layernorm::{fbin, fun, ld64s, st64s};
use crate::softmax::{End, ai, bi, block, mi};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// Worker records: the worker's first pair of `a` (0 when it has none), of `b` and
/// of `out`, its pairs minus one (the loop count: the first pair is the
/// prologue's); for an odd `n` also the last element's address in `a`, `b` and
/// `out` (0 except on the worker that takes it).
const PAIR_FIELDS: u16 = 4;
const TAIL_FIELDS: u16 = 3;
/// The worker that takes an odd `n`'s last element: its pairs (if any) end just
/// before it, and `split` gives the last workers the fewest.
const TAIL_WORKER: u32 = WORKERS - 1;

/// Issues of a worker with pairs, besides the first record load (every worker
/// makes it), the idle check, the loop body, the tail and `exit`: three record
/// loads, the prologue's two loads (its add rides with the `out` load), `rpt`, the
/// epilogue's two reciprocals and store.
const PAIR_FIXED_ISSUES: u64 = 9;
/// Issues of the tail: its check (load, branch), two address loads and the
/// operands' loads, the add (bundled with the last address load), the reciprocal,
/// the store.
const TAIL_ISSUES: u64 = 8;

/// `out[i] = 1 / (a[i] + b[i])` for `i < n` (f32 in, f32 out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecipSum {
    pub n: u32,
}

impl RecipSum {
    pub const NAME: &'static str = "recip_sum_f32";

    pub fn new(n: u32) -> RecipSum {
        RecipSum { n }
    }

    fn pairs(&self) -> u32 {
        self.n / 2
    }

    fn odd(&self) -> bool {
        self.n % 2 == 1
    }

    /// With fewer pairs than workers some have none and must branch past the loop;
    /// otherwise the check is left out (an issue on every worker).
    fn has_idle(&self) -> bool {
        self.pairs() < WORKERS
    }

    fn stride(&self) -> u16 {
        4 * (PAIR_FIELDS + if self.odd() { TAIL_FIELDS } else { 0 })
    }

    /// (issues, f32 reciprocals) of worker `w`, which has `p` pairs.
    fn worker_work(&self, w: u32, p: u32) -> (u64, u64) {
        let p = u64::from(p);
        // The first record load, and the branch when emitted.
        let mut issues = 1 + u64::from(self.has_idle());
        let mut recips = 0;
        if p > 0 {
            issues += PAIR_FIXED_ISSUES + 3 * (p - 1);
            recips += 2 * p;
        }
        if self.odd() {
            if w == TAIL_WORKER {
                issues += TAIL_ISSUES;
                recips += 1;
            } else {
                issues += 2;
            }
        }
        // exit
        (issues + 1, recips)
    }

    /// The worker code (parameters validated by the caller).
    fn code(&self, code_base: u32) -> Vec<Word> {
        let mut s = Asm::new(code_base);
        let done = s.label();
        let tail = s.label();
        let (pa, pb, po, cnt) = (2, 3, 4, 5);
        // Pairs: `$a0:1` from `a`, `$a2:3` from `b`, `$a4:5` their sum and then its
        // reciprocals.
        let (xa, xb, y) = (0, 2, 4);
        let add2 = fbin(FBinOp::Add, FVec::F32V2, y, xa, xb);
        let recip = |r: u8| fun(FUnOp::Recip, r, r);
        let after_pairs = if self.odd() { tail } else { done };
        s.i(ld32m(m(pa), m(0), 0));
        if self.has_idle() {
            s.brz(m(pa), after_pairs);
        }
        if self.pairs() > 0 {
            block(
                &mut s,
                &[
                    mi(ld32m(m(pb), m(0), 1)),
                    mi(ld64s(xa, pa)),
                    mi(ld64s(xb, pb)),
                    bi(ld32m(m(po), m(0), 2), add2),
                    mi(ld32m(m(cnt), m(0), 3)),
                ],
                End::BeforeRpt,
            );
            // Pair i's loads ride with pair i-1's reciprocals, and pair i-1's
            // store with pair i's add: the store reads `$a4:5` before the add
            // writes it, and the add reads the loads of the two issues before.
            let body = [
                bi(ld64s(xa, pa), recip(y)),
                bi(ld64s(xb, pb), recip(y + 1)),
                bi(st64s(y, po), add2),
            ];
            s.rpt(m(cnt), |b| block(b, &body, End::Aligned));
            block(
                &mut s,
                &[ai(recip(y)), ai(recip(y + 1)), mi(st64s(y, po))],
                End::Any,
            );
        }
        if self.odd() {
            let f = PAIR_FIELDS;
            s.bind(tail);
            s.i(ld32m(m(pa), m(0), f));
            s.brz(m(pa), done);
            block(
                &mut s,
                &[
                    mi(ld32m(m(pb), m(0), f + 1)),
                    mi(ld32(a(0), m(pa), 0)),
                    mi(ld32(a(1), m(pb), 0)),
                    bi(
                        ld32m(m(po), m(0), f + 2),
                        fbin(FBinOp::Add, FVec::F32, 0, 0, 1),
                    ),
                    ai(recip(0)),
                    mi(Inst::St32 {
                        s: a(0),
                        base: m(po),
                        imm: 0,
                    }),
                ],
                End::Any,
            );
        }
        s.bind(done);
        s.i(Inst::Exit);
        s.finish()
    }
}

impl Kernel for RecipSum {
    fn symbol(&self) -> String {
        format!("{}_n{}", Self::NAME, self.n)
    }

    fn validate(&self) -> Result<(), KernelError> {
        // A worker's loop runs its pairs but one: at most `RPT_MAX + 1` pairs each.
        let most = 2 * WORKERS * (RPT_MAX + 1);
        if self.n == 0 || self.n > most {
            return Err(invalid(&self.symbol(), format!("n must be 1..={most}")));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || self.code(code_base))
    }

    fn contract(&self) -> Contract {
        crate::elementwise::binary_contract(self, 4 * self.n, self.stride())
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let xa = operand(addrs, &name, "a")?;
        let xb = operand(addrs, &name, "b")?;
        let out = operand(addrs, &name, "out")?;
        let last = 4 * (self.n - 1);
        let mut buf = StateBuf::default();
        for (w, (p0, p)) in split(self.pairs()).into_iter().enumerate() {
            let at = 8 * p0;
            if p > 0 {
                buf.u32(xa + at).u32(xb + at).u32(out + at).u32(p - 1);
            } else {
                buf.u32(0).u32(0).u32(0).u32(0);
            }
            if self.odd() {
                if w as u32 == TAIL_WORKER {
                    buf.u32(xa + last).u32(xb + last).u32(out + last);
                } else {
                    buf.u32(0).u32(0).u32(0);
                }
            }
            buf.pad_to((w + 1) * usize::from(self.stride()));
        }
        Ok(buf.finish(self.stride()))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(
            t,
            split(self.pairs())
                .into_iter()
                .enumerate()
                .map(|(w, (_, p))| {
                    let (issues, recips) = self.worker_work(w as u32, p);
                    crate::issue_slots(t, issues, recips)
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_checked() {
        assert!(RecipSum::new(0).validate().is_err());
        assert!(RecipSum::new(1).validate().is_ok());
        assert!(RecipSum::new(49_152).validate().is_ok());
        assert!(RecipSum::new(49_153).validate().is_err());
    }

    #[test]
    fn layout_needs_no_padding_nop() {
        for n in [1, 2, 3, 11, 12, 13, 64, 80, 97] {
            crate::tests::assert_no_padding_nop(&RecipSum::new(n));
        }
    }
}

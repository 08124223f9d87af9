//! `gelu` (tanh form) over `n` f16 elements, computed in f32.
//!
//! `0.5 x (1 + tanh(u))` with `tanh(u) = 1 - 2/(exp(2u) + 1)` simplifies to
//! `x / (1 + exp(-2u))`, `-2u = x (c1 + c2 x^2)` with `c1 = -2 sqrt(2/pi)` and
//! `c2 = 0.044715 c1`. The exponent is clamped to at most 80 so `exp` stays finite
//! in f32 (the quotient is then below f16's smallest subnormal anyway); very
//! negative exponents underflow to `exp = 0`, giving `y = x` as they should.
//!
//! The flat element range is split into six contiguous runs of 4-element groups.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst};
use tessera_machine::Timing;

use crate::asm::{Asm, a, ld32, ld32m, m};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{bcast2, fbin, fun, ld64s, simple_contract, st64s, to_f16, to_f32};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// Parameters of one GELU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gelu {
    /// Elements; a multiple of 4.
    pub n: u32,
}

const STRIDE: u16 = 32;
/// Upper clamp of the exponent `-2u`.
pub const GELU_EXP_CLAMP: f32 = 80.0;
/// Issues per four elements (the repeat body), and the exp/recip among them.
const ISSUES_PER_GROUP: u64 = 28;
const TRANSCENDENTALS_PER_GROUP: u64 = 8;

impl Gelu {
    pub const NAME: &'static str = "gelu";

    pub fn new(n: u32) -> Gelu {
        Gelu { n }
    }

    /// The f32 constants `(c1, c2)` of `-2u = x (c1 + c2 x^2)`.
    pub fn constants() -> (f32, f32) {
        let c1 = -2.0 * (2.0 / std::f64::consts::PI).sqrt();
        (c1 as f32, (c1 * 0.044715) as f32)
    }
}

impl Kernel for Gelu {
    fn symbol(&self) -> String {
        format!("{}_n{}", Self::NAME, self.n)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.n == 0 || !self.n.is_multiple_of(4) {
            return Err(invalid(&name, "n must be a positive multiple of 4"));
        }
        if (self.n / 4).div_ceil(WORKERS) > RPT_MAX {
            return Err(invalid(&name, "more than 4095 groups of 4 per worker"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        use FBinOp::*;
        const V: FVec = FVec::F32V2;
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        s.i(ld32m(m(2), m(0), 0)); // x
        s.i(ld32m(m(3), m(0), 1)); // y
        s.i(ld32m(m(4), m(0), 2)); // groups
        s.brz(m(4), done);
        // Constant pairs: c1 in $a6:7, c2 in $a8:9, clamp in $a10:11, 1.0 in $a12:13.
        for (word, pair) in [(3u16, 6u8), (4, 8), (5, 10), (6, 12)] {
            s.i(ld32(a(14), m(0), word));
            s.i(bcast2(pair, 14));
        }
        s.rpt(m(4), |b| {
            b.i(ld64s(0, 2));
            b.i(to_f32(2, 0));
            b.i(to_f32(4, 1));
            // $a0:1 is free once both halves are converted: it is the temporary.
            for p in [2u8, 4] {
                b.i(fbin(Mul, V, 0, p, p));
                b.i(fbin(Mul, V, 0, 0, 8));
                b.i(fbin(Add, V, 0, 0, 6));
                b.i(fbin(Mul, V, 0, 0, p));
                b.i(fbin(Min, V, 0, 0, 10));
                b.i(fun(FUnOp::Exp, 0, 0));
                b.i(fun(FUnOp::Exp, 1, 1));
                b.i(fbin(Add, V, 0, 0, 12));
                b.i(fun(FUnOp::Recip, 0, 0));
                b.i(fun(FUnOp::Recip, 1, 1));
                b.i(fbin(Mul, V, p, p, 0));
            }
            b.i(to_f16(0, 2));
            b.i(to_f16(1, 4));
            b.i(st64s(0, 3));
        });
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
        let bytes = self.n * 2;
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, bytes, 8),
                Operand::new("out", Role::Output, bytes, 8),
            ],
            u32::from(STRIDE) * WORKERS,
        )
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let (c1, c2) = Self::constants();
        let mut buf = StateBuf::default();
        for (i, (g0, g)) in split(self.n / 4).into_iter().enumerate() {
            buf.u32(inp + g0 * 8)
                .u32(out + g0 * 8)
                .u32(g)
                .f32(c1)
                .f32(c2)
                .f32(GELU_EXP_CLAMP)
                .f32(1.0)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(
            t,
            split(self.n / 4)
                .into_iter()
                .map(|(_, g)| match u64::from(g) {
                    0 => 5,
                    g => crate::issue_slots(
                        t,
                        14 + ISSUES_PER_GROUP * g,
                        TRANSCENDENTALS_PER_GROUP * g,
                    ),
                }),
        )
    }
}

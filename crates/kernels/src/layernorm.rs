//! `layernorm`: `y = (x - mean) / sqrt(var + eps) * gamma + beta` over rows of
//! `width` f16, statistics in f32.
//!
//! Workers own contiguous row ranges. Per row, three passes over the row:
//! 1. sum: `fsum` of four f16 lanes into f32, accumulated in f32;
//! 2. sum of squared deviations from the mean, in f32 (two-pass: no cancellation
//!    when the mean is large relative to the spread);
//! 3. normalise in f32, round to f16, then `beta + y * gamma` with one f16 `fmac`
//!    (computed in f32, rounded once).
//!
//! Each group of four elements is one 64-bit load; the loops are rotated so the
//! last operation of one group shares an issue with the first load of the next,
//! with the first group peeled instead of over-reading past the row.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, MZ, a, inti, ld32, ld32m, m, mov};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, invalid,
    operand, split,
};

/// Parameters of one layer normalisation.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNorm {
    pub rows: u32,
    /// Row length in elements; a multiple of 4.
    pub width: u32,
    pub eps: f32,
}

const STRIDE: u16 = 32;

pub(crate) fn fbin(op: FBinOp, vec: FVec, d: u8, x: u8, y: u8) -> Inst {
    Inst::FBin {
        op,
        vec,
        d: a(d),
        a: a(x),
        b: a(y),
    }
}
pub(crate) fn fmac(vec: FVec, d: u8, x: u8, y: u8) -> Inst {
    Inst::FMac {
        vec,
        d: a(d),
        a: a(x),
        b: a(y),
    }
}
pub(crate) fn to_f32(d: u8, x: u8) -> Inst {
    Inst::F16v2ToF32 { d: a(d), a: a(x) }
}
pub(crate) fn to_f16(d: u8, x: u8) -> Inst {
    Inst::F32v2ToF16 { d: a(d), a: a(x) }
}
pub(crate) fn fun(op: FUnOp, d: u8, x: u8) -> Inst {
    Inst::FUn {
        op,
        d: a(d),
        a: a(x),
    }
}
pub(crate) fn bcast2(d: u8, x: u8) -> Inst {
    Inst::FBcast {
        vec: FVec::F32V2,
        d: a(d),
        a: a(x),
    }
}
pub(crate) fn zero_a(d: u8) -> Inst {
    Inst::MovAm { d: a(d), a: MZ }
}
pub(crate) fn ld64s(d: u8, base: u8) -> Inst {
    Inst::Ld64Step {
        d: a(d),
        base: m(base),
        inc: 1,
    }
}
pub(crate) fn st64s(s: u8, base: u8) -> Inst {
    Inst::St64Step {
        s: a(s),
        base: m(base),
        inc: 1,
    }
}

/// The common contract shape of single-shot kernels.
pub(crate) fn simple_contract<K: Kernel + ?Sized>(
    k: &K,
    mut operands: Vec<Operand>,
    state_bytes: u32,
) -> Contract {
    operands.push(Operand::new("state", Role::State, state_bytes, 8));
    Contract {
        kernel: k.symbol(),
        code: CodeRequirement {
            bytes: k.code_bytes().unwrap_or(0),
            align: 8,
            mem_class: MemClass::Executable,
        },
        supervisor_bytes: crate::RUNALL_SNIPPET_BYTES,
        operands,
    }
}

impl LayerNorm {
    pub const NAME: &'static str = "layernorm";

    pub fn new(rows: u32, width: u32, eps: f32) -> LayerNorm {
        LayerNorm { rows, width, eps }
    }

    fn groups(&self) -> u32 {
        self.width / 4
    }

    /// One group of pass 3; `store` is false for the peeled first group, whose
    /// rotated-in store belongs to a group that does not exist.
    fn normalise_group(s: &mut Asm, store: bool) {
        use FBinOp::*;
        s.b(ld64s(0, 4), fmac(FVec::F16V4, 8, 0, 10));
        s.b(if store { st64s(8, 3) } else { Inst::Nop }, to_f32(2, 0));
        s.b(ld64s(8, 9), to_f32(4, 1));
        s.b(ld64s(10, 8), fbin(Sub, FVec::F32V2, 2, 2, 12));
        s.i(fbin(Sub, FVec::F32V2, 4, 4, 12));
        s.i(fbin(Mul, FVec::F32V2, 2, 2, 6));
        s.i(fbin(Mul, FVec::F32V2, 4, 4, 6));
        s.i(to_f16(0, 2));
        s.i(to_f16(1, 4));
    }
}

impl Kernel for LayerNorm {
    fn symbol(&self) -> String {
        format!("{}_r{}_w{}", Self::NAME, self.rows, self.width)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.rows == 0 || self.width == 0 || !self.width.is_multiple_of(4) {
            return Err(invalid(
                &name,
                "rows must be positive and width a positive multiple of 4",
            ));
        }
        if self.groups() > RPT_MAX {
            return Err(invalid(&name, "width above 16380"));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return Err(invalid(&name, "eps must be finite and non-negative"));
        }
        if u64::from(self.rows) * u64::from(self.width) * 2 >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        use FBinOp::*;
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        let row = s.label();
        s.i(ld32m(m(2), m(0), 0)); // current row of x
        s.i(ld32m(m(3), m(0), 1)); // y, linear
        s.i(ld32m(m(6), m(0), 4)); // rows left
        s.brz(m(6), done);
        s.i(ld32m(m(7), m(0), 5)); // groups per row
        s.i(inti(IntOp::Sub, m(10), m(7), 1));
        s.bind(row);
        // Pass 1: sum into $a6.
        s.i(mov(m(4), m(2)));
        s.i(zero_a(6));
        s.i(zero_a(14));
        s.rpt(m(7), |b| {
            b.b(ld64s(0, 4), fbin(Add, FVec::F32, 6, 6, 14));
            b.i(Inst::FSum {
                vec: FVec::F16V4,
                d: a(14),
                a: a(0),
            });
        });
        s.i(fbin(Add, FVec::F32, 6, 6, 14));
        s.i(ld32(a(14), m(0), 6)); // 1 / width
        s.i(fbin(Mul, FVec::F32, 6, 6, 14));
        s.i(bcast2(12, 6)); // mean pair
        // Pass 2: squared deviations into the pair $a8:9.
        s.i(mov(m(4), m(2)));
        for r in [2, 3, 4, 5, 8, 9] {
            s.i(zero_a(r));
        }
        s.rpt(m(7), |b| {
            b.b(ld64s(0, 4), fmac(FVec::F32V2, 8, 2, 2));
            b.i(fmac(FVec::F32V2, 8, 4, 4));
            b.i(to_f32(2, 0));
            b.i(to_f32(4, 1));
            b.i(fbin(Sub, FVec::F32V2, 2, 2, 12));
            b.i(fbin(Sub, FVec::F32V2, 4, 4, 12));
        });
        s.i(fmac(FVec::F32V2, 8, 2, 2));
        s.i(fmac(FVec::F32V2, 8, 4, 4));
        s.i(Inst::FSum {
            vec: FVec::F32V2,
            d: a(14),
            a: a(8),
        });
        s.i(ld32(a(6), m(0), 6));
        s.i(fbin(Mul, FVec::F32, 14, 14, 6));
        s.i(ld32(a(6), m(0), 7)); // eps
        s.i(fbin(Add, FVec::F32, 14, 14, 6));
        s.i(fun(FUnOp::Rsqrt, 14, 14));
        s.i(bcast2(6, 14)); // rstd pair
        // Pass 3.
        s.i(mov(m(4), m(2)));
        s.i(ld32m(m(8), m(0), 2)); // gamma
        s.i(ld32m(m(9), m(0), 3)); // beta
        Self::normalise_group(&mut s, false);
        s.rpt(m(10), |b| Self::normalise_group(b, true));
        s.i(fmac(FVec::F16V4, 8, 0, 10));
        s.i(st64s(8, 3));
        s.i(mov(m(2), m(4)));
        s.i(inti(IntOp::Sub, m(6), m(6), 1));
        s.brnz(m(6), row);
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
        let bytes = self.rows * self.width * 2;
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, bytes, 8),
                Operand::new("gamma", Role::Weights, self.width * 2, 8),
                Operand::new("beta", Role::Weights, self.width * 2, 8),
                Operand::new("out", Role::Output, bytes, 8),
            ],
            u32::from(STRIDE) * crate::WORKERS,
        )
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let gamma = operand(addrs, &name, "gamma")?;
        let beta = operand(addrs, &name, "beta")?;
        let row_bytes = self.width * 2;
        let mut buf = StateBuf::default();
        for (i, (r0, r)) in split(self.rows).into_iter().enumerate() {
            buf.u32(inp + r0 * row_bytes)
                .u32(out + r0 * row_bytes)
                .u32(gamma)
                .u32(beta)
                .u32(r)
                .u32(self.groups())
                .f32(crate::mutation::factor("layernorm") / self.width as f32)
                .f32(self.eps)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let g = u64::from(self.groups());
        crate::single_shot_cycles(
            t,
            split(self.rows)
                .into_iter()
                .map(|(_, r)| match u64::from(r) {
                    0 => 5,
                    r => crate::issue_slots(t, 7 + r * (17 * g + 36), r),
                }),
        )
    }
}

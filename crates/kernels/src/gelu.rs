//! `gelu` (tanh form) over `n` f16 elements, in f16 arithmetic around the hardware
//! `f16v2tanh`.
//!
//! `y = h + h tanh(u)` with `h = x/2` and `u = x (c1 + c2 x^2)`, `c1 = sqrt(2/pi)`,
//! `c2 = 0.044715 c1` (f16 constants). Per group of four: `x^2`, `c1 + c2 x^2` (one
//! fused `f16v4mac`), `u`, two `f16v2tanh`, `h`, and `h + h t` (one `f16v4mac`):
//! eight issues, where `f32tanh` (five issues each) would need twenty for the tanh
//! alone. Every step rounds to f16 once and the tanh's rounding dominates: for
//! negative x, `1 + t` keeps few bits, so the error there is absolute, at most about
//! `|x| 2^-12`, not relative to the small `y` (an f32 path would be accurate
//! relative to `y`; the absolute error is what a following matmul sees).
//! Large `|x|` make `x^2` overflow to infinity, so `u = ±inf`, `t = ±1` and `y` is
//! exactly `x` or `0`.
//!
//! The flat element range is split into six contiguous runs of 4-element groups.
//! The repeat is rotated: one iteration finishes group j-1 (tanh, `y`, store) and
//! starts group j (load, `u`, `h`), loading group j only after group j-1's last use
//! of its input, so nothing is read past the run and the first group's head and the
//! last group's tail are peeled.

use tessera_isa::{FBinOp, FVec, Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, a, inti, ld32, ld32m, m};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{bcast4, fbin, fmac, ld64s, simple_contract, st64s};
use crate::softmax::{End, ai, bi, block, mi};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// Parameters of one GELU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gelu {
    /// Elements; a multiple of 4.
    pub n: u32,
    /// The input holds `h = x / 2` (a producer with the factor folded into its
    /// weights) and the result is still `gelu(x)`: see [`Gelu::with_half_input`].
    pub half_input: bool,
}

/// A worker record: `in`, `out`, groups, then `c1` as f16 in both halves of a word
/// (moved into the accumulator pair as it stands), `c2` as f16 in the low half of
/// a word (broadcast to four lanes by the worker), then 0.5 likewise, or with
/// `half_input` the repeat's pairs of groups and whether one is left over.
const STRIDE: u16 = 32;
/// Issues of a worker with at least one group, beyond the repeat body: 13 before it
/// (the record, the loads with group 0's head beside them, and the `rpt`), 4 after
/// it (the last group's tail and store) and the `exit`.
const FIXED_ISSUES: u64 = 18;
/// Issues per group of four elements (the repeat body): its seven aux
/// instructions, the load, the store and the two moves that re-arm `c1` beside them.
const ISSUES_PER_GROUP: u64 = 7;
/// [`Gelu::with_half_input`] with one group: 5 before the first group, its 6, the
/// `rpt`, the leftover test, the last tail (4) and the `exit`.
const HALF_FIXED_ISSUES: u64 = 18;

impl Gelu {
    pub const NAME: &'static str = "gelu";

    pub fn new(n: u32) -> Gelu {
        Gelu {
            n,
            half_input: false,
        }
    }

    /// The same GELU of `x` from an input of `h = x / 2`: `u = h (2 c1 + 8 c2 h^2)`
    /// is the same `u` (both constants scaled by powers of two, so every rounding
    /// is the same), and `y = h + h t` needs no `h = x / 2`: six issues a group
    /// instead of seven. The loop alternates two input registers so that `y` can
    /// be formed in the one it was loaded into.
    pub fn with_half_input(mut self) -> Gelu {
        self.half_input = true;
        self
    }

    /// The f16 constants `(c1, c2)` of `u = x (c1 + c2 x^2)`.
    pub fn constants() -> (half::f16, half::f16) {
        let c1 = (2.0 / std::f64::consts::PI).sqrt();
        (half::f16::from_f64(c1), half::f16::from_f64(c1 * 0.044715))
    }

    /// First half of the group in the pair `$a{x}`, with `d = c1` already in
    /// `$a4:5` (two main-pipe moves from `$m5`): `a = x^2`, `d += a c2`, `u = d x`
    /// (in `$a4:5`), and `h = x/2` (into `$a6:7`; the half-input form leaves it
    /// out).
    fn head(x: u8) -> [Inst; 4] {
        const V: FVec = FVec::F16V4;
        [
            fbin(FBinOp::Mul, V, 2, x, x),
            fmac(V, 4, 2, 10),
            fbin(FBinOp::Mul, V, 4, 4, x),
            fbin(FBinOp::Mul, V, 6, x, 12),
        ]
    }

    /// Second half: `t = tanh(u)` one lane pair at a time, then `y = h + h t` in
    /// the pair `$a{h}`.
    fn tail(h: u8) -> [Inst; 3] {
        let tanh = |r: u8| Inst::F16v2Tanh { d: a(r), a: a(r) };
        [tanh(4), tanh(5), fmac(FVec::F16V4, h, h, 4)]
    }

    /// `$a{r}` = `c1`'s pair pattern (`$m5`), a main-pipe move that re-arms `d`.
    fn mov_c1(r: u8) -> Inst {
        Inst::MovAm { d: a(r), a: m(5) }
    }

    /// The record's groups (`$m4`), `x` (`$m2`), `c1`'s pattern (`$m5`) and `c2`
    /// (`$a14`), and the exit of a worker with no groups.
    fn record(s: &mut Asm, done: crate::asm::Label) {
        s.i(ld32m(m(4), m(0), 2));
        s.i(ld32m(m(2), m(0), 0));
        s.i(ld32m(m(5), m(0), 3));
        s.i(ld32(a(14), m(0), 4));
        s.brz(m(4), done);
    }

    /// Worker code of [`Gelu::with_half_input`]. Groups alternate between `$a0:1`
    /// and `$a6:7`; a group's `y = h + h t` is formed in place and stored from
    /// there, and the next load into the same pair comes two issues after that
    /// store. The repeat runs pairs of groups; a leftover group follows it.
    fn half_input_code(code_base: u32) -> Vec<tessera_isa::Word> {
        // The tail of the group in `x`, beside the head of the next group, loaded
        // into `z` (the same shape as the seven-issue loop without `h = x / 2`).
        let step = |x: u8, z: u8| {
            let [sq, mac, mul_u, _] = Self::head(z);
            let [tanh_lo, tanh_hi, y] = Self::tail(x);
            [
                bi(ld64s(z, 2), tanh_lo),
                ai(tanh_hi),
                bi(Self::mov_c1(5), y),
                bi(Self::mov_c1(4), sq),
                bi(st64s(x, 3), mac),
                ai(mul_u),
            ]
        };
        let tail = |x: u8| {
            let [tanh_lo, tanh_hi, y] = Self::tail(x);
            [ai(tanh_lo), ai(tanh_hi), ai(y), mi(st64s(x, 3))]
        };
        let mut s = Asm::new(code_base);
        let done = s.label();
        let even = s.label();
        Self::record(&mut s, done);
        let [sq, mac, mul_u, _] = Self::head(0);
        let bcast = bcast4(10, 14);
        block(
            &mut s,
            &[
                mi(ld64s(0, 2)),
                bi(Self::mov_c1(4), bcast),
                bi(Self::mov_c1(5), sq),
                bi(ld32m(m(3), m(0), 1), mac),   // y
                bi(ld32m(m(6), m(0), 5), mul_u), // pairs
                mi(ld32m(m(7), m(0), 6)),        // leftover
            ],
            End::BeforeRpt,
        );
        let body: Vec<_> = step(0, 6).into_iter().chain(step(6, 0)).collect();
        s.rpt(m(6), |b| block(b, &body, End::Aligned));
        s.brz(m(7), even);
        // After the 4-byte branch: the load beside the second tanh instead, so
        // the bundles fall aligned without a padding `nop`.
        let mut leftover = step(0, 6);
        let [tanh_lo, tanh_hi, _] = Self::tail(0);
        leftover[0] = ai(tanh_lo);
        leftover[1] = bi(ld64s(6, 2), tanh_hi);
        block(&mut s, &leftover, End::Any);
        block(&mut s, &tail(6), End::Any);
        s.i(Inst::Exit);
        s.bind(even);
        block(&mut s, &tail(0), End::Any);
        s.bind(done);
        s.i(Inst::Exit);
        s.finish()
    }
}

impl Kernel for Gelu {
    fn symbol(&self) -> String {
        let h = if self.half_input { "_h" } else { "" };
        format!("{}_n{}{h}", Self::NAME, self.n)
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
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        if self.half_input {
            return Ok(KernelCode {
                symbol: self.symbol(),
                code_base,
                entry: code_base,
                words: Self::half_input_code(code_base),
            });
        }
        let bcast = |pair: u8| bcast4(pair, 14);
        let mut s = Asm::new(code_base);
        let done = s.label();
        // Each loaded value is read no earlier than the next issue; in a bundle
        // the aux instruction reads its registers before the main one writes.
        // Constants: c2 in $a10:11 and 0.5 in $a12:13 (each through $a14), c1's
        // pair pattern in $m5.
        Self::record(&mut s, done);
        let [sq, mac, mul_u, mul_h] = Self::head(0);
        let [tanh_lo, tanh_hi, mac_y] = Self::tail(6);
        block(
            &mut s,
            &[
                mi(ld64s(0, 2)),
                bi(ld32(a(14), m(0), 5), bcast(10)),
                bi(Self::mov_c1(4), sq),
                bi(Self::mov_c1(5), bcast(12)),
                bi(ld32m(m(3), m(0), 1), mac), // y
                bi(inti(IntOp::Sub, m(4), m(4), 1), mul_u),
                ai(mul_h),
            ],
            End::BeforeRpt,
        );
        // Group j's load lands after group j-1's last read of `$a0:1`; `c1` goes
        // back into `$a4:5` once the tail has read `t` from it (the `mac` beside
        // the second move reads the old `$a5`); the store of y(j-1) precedes the
        // `h` of group j that overwrites `$a6:7`.
        let body = [
            bi(ld64s(0, 2), tanh_lo),
            ai(tanh_hi),
            bi(Self::mov_c1(5), mac_y),
            bi(Self::mov_c1(4), sq),
            bi(st64s(6, 3), mac),
            ai(mul_u),
            ai(mul_h),
        ];
        s.rpt(m(4), |b| block(b, &body, End::Aligned));
        block(
            &mut s,
            &[ai(tanh_lo), ai(tanh_hi), ai(mac_y), mi(st64s(6, 3))],
            End::Any,
        );
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
        let c1 = half::f16::from_f32(c1.to_f32() * crate::mutation::factor("gelu"));
        // From `h = x / 2`: `2 c1` and `8 c2` (exact: powers of two).
        let (c1, c2) = if self.half_input {
            (
                half::f16::from_f32(c1.to_f32() * 2.0),
                half::f16::from_f32(c2.to_f32() * 8.0),
            )
        } else {
            (c1, c2)
        };
        let half = half::f16::from_f32(0.5);
        let mut buf = StateBuf::default();
        for (i, (g0, g)) in split(self.n / 4).into_iter().enumerate() {
            let c1 = u32::from(c1.to_bits());
            buf.u32(inp + g0 * 8)
                .u32(out + g0 * 8)
                .u32(g)
                .u32(c1 | c1 << 16);
            if self.half_input {
                // c2; the repeat's pairs of groups after the first; whether one
                // group is left over.
                let rest = g.saturating_sub(1);
                buf.u32(c2.to_bits().into()).u32(rest / 2).u32(rest % 2);
            } else {
                for c in [c2, half] {
                    buf.u32(c.to_bits().into());
                }
            }
            buf.pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(
            t,
            split(self.n / 4)
                .into_iter()
                .map(|(_, g)| match (u64::from(g), self.half_input) {
                    (0, _) => 5,
                    (g, false) => FIXED_ISSUES + ISSUES_PER_GROUP * (g - 1),
                    // Six issues a group after the first: pairs in the repeat, a
                    // leftover one after it (the test's taken branch, when there
                    // is none, refills within the worker's barrel round).
                    (g, true) => HALF_FIXED_ISSUES + 6 * (g - 1),
                }),
        )
    }
}

//! The two halves of a softmax whose row is cut over tiles, each tile holding a run
//! of the keys (the pooling head's single query: a whole row on one tile leaves the
//! rest of its tile group idle):
//! - `row_max`: the maximum of a tile's `n` scores, as f32, for the tiles of the row
//!   to exchange;
//! - `exp_shift`: with every tile's maximum at hand, `e = exp(scale * (s - M))` for
//!   the row's maximum `M`, as f16 with zeros past `n`, and the f32 sum of the `e`.
//!
//! Every tile shifts by the same `M`, so the tiles' `e V` products and sums add up
//! as they are: `reduce_norm` (elementwise.rs) sums the products and divides by the
//! sum of the sums. A tile's run is a few dozen scores, so both kernels run on
//! worker 0 alone (the others exit at once) and loop counts are fixed at emission.
//! Scores are read as 4-element groups; a partial last group's lanes past `n` are
//! never used (any bits, NaN included).

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, ld32, ld32m, m};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{bcast2, fbin, fun, ld64s, simple_contract, st64s, to_f16, to_f32, zero_a};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand,
};

/// Every worker reads the same record; only worker 0 uses it.
const STRIDE: u16 = 0;

/// The maximum of `n` f16 scores, written as one f32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMax {
    pub n: u32,
}

/// `out[j] = exp(scale * (in[j] - M))` for `j < n` (f16), `0` for `n <= j < ld`, with
/// `M` the largest of the `g` f32 in `maxes`; `sum` gets the f32 sum of the
/// exponentials.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpShift {
    pub n: u32,
    /// Elements of `out`: a multiple of 4, `>= n`.
    pub ld: u32,
    /// Maxima to reduce: one per tile of the row.
    pub g: u32,
    /// `0 < scale <= 16`.
    pub scale: f32,
}

impl RowMax {
    pub const NAME: &'static str = "row_max_f16";
    pub fn new(n: u32) -> RowMax {
        RowMax { n }
    }
    fn worker0_issues(&self) -> u64 {
        let (g, r) = (u64::from(self.n / 4), u64::from(self.n % 4));
        let groups = match g {
            0 => 0,
            1 => 5,
            g => 6 + 2 * (g - 1),
        };
        let rest = if r == 0 { 0 } else { 2 + u64::from(r == 3) + r };
        // brnz, two loads, groups, remainder, store, exit
        3 + groups + rest + 2
    }
}

impl ExpShift {
    pub const NAME: &'static str = "exp_shift_f16";
    pub fn new(n: u32, ld: u32, g: u32, scale: f32) -> ExpShift {
        ExpShift { n, ld, g, scale }
    }
    /// (issues, f32 transcendentals) of worker 0.
    fn worker0_work(&self) -> (u64, u64) {
        let full = u64::from(self.n / 4);
        let rest = u64::from(self.n % 4);
        let zero_groups = u64::from(self.ld / 4 - self.n.div_ceil(4));
        let g = u64::from(self.g);
        // brnz, four pointers, scale and its broadcast
        let mut issues = 7;
        issues += if g == 1 {
            1
        } else {
            // first pair, repeat (body of two), odd last, pair reduction
            1 + if g >= 4 { 1 + (g - 2) / 2 * 2 } else { 0 } + 2 * (g % 2) + 1
        };
        // -M*scale, its broadcast
        issues += 3;
        if full > 0 {
            issues += 1 + 16 * full;
        }
        if rest > 0 {
            issues += 16 + (4 - rest);
        }
        if zero_groups > 0 {
            issues += 1 + zero_groups;
        }
        // the sum, its store, exit
        issues += 4;
        (issues, 4 * (full + u64::from(rest > 0)))
    }
}

fn st32(s: u8, base: u8) -> Inst {
    Inst::St32 {
        s: a(s),
        base: m(base),
        imm: 0,
    }
}

fn fmov(d: u8, x: u8) -> Inst {
    Inst::FMov {
        d: a(d),
        a: a(x),
        pair: false,
    }
}

/// Cycles of a call whose worker 0 takes `slots` issue slots and the others two.
fn worker0_cycles(t: &Timing, slots: u64) -> u64 {
    crate::single_shot_cycles(t, (0..WORKERS).map(|w| if w == 0 { slots } else { 2 }))
}

impl Kernel for RowMax {
    fn symbol(&self) -> String {
        format!("{}_n{}", Self::NAME, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        if self.n == 0 || self.n / 4 > RPT_MAX {
            return Err(invalid(&self.symbol(), "n must be 1..=16383"));
        }
        Ok(())
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        let (g, r) = (self.n / 4, self.n % 4);
        s.brnz(m(1), done);
        s.i(ld32m(m(2), m(0), 0)); // scores
        s.i(ld32m(m(3), m(0), 1)); // out
        // The maximum is exact in f16: four lanes at a time, then to f32 in `$a6`.
        if g >= 1 {
            s.i(ld64s(4, 2));
            if g >= 2 {
                s.rpti((g - 1) as u16, |b| {
                    b.i(ld64s(0, 2));
                    b.i(fbin(FBinOp::Max, FVec::F16V4, 4, 4, 0));
                });
            }
            s.i(to_f32(6, 4));
            s.i(to_f32(8, 5));
            s.i(fbin(FBinOp::Max, FVec::F32V2, 6, 6, 8));
            s.i(fbin(FBinOp::Max, FVec::F32, 6, 6, 7));
        }
        if r > 0 {
            s.i(ld64s(0, 2));
            s.i(to_f32(2, 0));
            if r == 3 {
                s.i(to_f32(10, 1));
            }
            for (i, lane) in [2u8, 3, 10].into_iter().take(r as usize).enumerate() {
                if g == 0 && i == 0 {
                    s.i(fmov(6, lane));
                } else {
                    s.i(fbin(FBinOp::Max, FVec::F32, 6, 6, lane));
                }
            }
        }
        s.i(st32(6, 3));
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
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, 8 * self.n.div_ceil(4), 8),
                Operand::new("out", Role::Output, 4, 4),
            ],
            8,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let mut buf = StateBuf::default();
        buf.u32(operand(addrs, &name, "in")?)
            .u32(operand(addrs, &name, "out")?);
        Ok(buf.finish(STRIDE))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        worker0_cycles(t, self.worker0_issues())
    }
}

// `exp_shift` registers: `$a0:1` a group as loaded and as stored, `$a2:3` and
// `$a4:5` its lanes in f32 (arguments, then exponentials), `$a6:7` the scale,
// `$a8:9` `-M*scale`, `$a10:11` and `$a12:13` the sums, `$a14:15` zeros (`$a14` is
// never written; workers start with it zeroed).
const ZERO_PAIR: u8 = 14;

impl Kernel for ExpShift {
    fn symbol(&self) -> String {
        format!(
            "{}_n{}_ld{}_g{}_s{:08x}",
            Self::NAME,
            self.n,
            self.ld,
            self.g,
            self.scale.to_bits()
        )
    }
    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.n == 0 || !self.ld.is_multiple_of(4) || self.ld < self.n || self.ld / 4 > RPT_MAX {
            return Err(invalid(
                &name,
                "n must be positive, ld a multiple of 4 with n <= ld <= 16380",
            ));
        }
        if self.g == 0 || self.g > 2 * RPT_MAX {
            return Err(invalid(&name, "g must be 1..=8190"));
        }
        crate::softmax::check_scale(&name, self.scale)?;
        Ok(())
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        let (full, rest) = (self.n / 4, self.n % 4);
        let zero_groups = self.ld / 4 - self.n.div_ceil(4);
        s.brnz(m(1), done);
        s.i(ld32m(m(2), m(0), 0)); // scores
        s.i(ld32m(m(3), m(0), 1)); // out
        s.i(ld32m(m(4), m(0), 2)); // maxes
        s.i(ld32m(m(5), m(0), 3)); // sum
        s.i(ld32(a(6), m(0), 4)); // scale
        s.i(bcast2(6, 6));
        // M in `$a8`, pairs at a time; `$a2:3` are free until the groups.
        if self.g == 1 {
            s.i(ld32(a(8), m(4), 0));
        } else {
            s.i(ld64s(8, 4));
            let pairs = (self.g - 2) / 2;
            if pairs > 0 {
                s.rpti(pairs as u16, |b| {
                    b.i(ld64s(2, 4));
                    b.i(fbin(FBinOp::Max, FVec::F32V2, 8, 8, 2));
                });
            }
            if self.g % 2 == 1 {
                s.i(ld32(a(2), m(4), 0));
                s.i(fbin(FBinOp::Max, FVec::F32, 8, 8, 2));
            }
            s.i(fbin(FBinOp::Max, FVec::F32, 8, 8, 9));
        }
        s.i(fbin(FBinOp::Mul, FVec::F32, 8, 8, 6));
        s.i(fun(FUnOp::Neg, 8, 8));
        s.i(bcast2(8, 8));
        let group = |b: &mut Asm, masked: Option<u32>| {
            b.i(ld64s(0, 2));
            b.i(to_f32(2, 0));
            b.i(to_f32(4, 1));
            for x in [2, 4] {
                b.i(fbin(FBinOp::Mul, FVec::F32V2, x, x, 6));
                b.i(fbin(FBinOp::Add, FVec::F32V2, x, x, 8));
            }
            if let Some(r) = masked {
                // exp(-inf) = 0: the lanes past `n` add nothing and store +0.
                for lane in r..4 {
                    b.i(ld32(a(2 + lane as u8), m(0), 5));
                }
            }
            for x in 2..6 {
                b.i(fun(FUnOp::Exp, x, x));
            }
            b.i(fbin(FBinOp::Add, FVec::F32V2, 10, 10, 2));
            b.i(fbin(FBinOp::Add, FVec::F32V2, 12, 12, 4));
            b.i(to_f16(0, 2));
            b.i(to_f16(1, 4));
            b.i(st64s(0, 3));
        };
        if full > 0 {
            s.rpti(full as u16, |b| group(b, None));
        }
        if rest > 0 {
            group(&mut s, Some(rest));
        }
        if zero_groups > 0 {
            s.rpti(zero_groups as u16, |b| b.i(st64s(ZERO_PAIR, 3)));
        }
        s.i(fbin(FBinOp::Add, FVec::F32V2, 10, 10, 12));
        s.i(fbin(FBinOp::Add, FVec::F32, 10, 10, 11));
        s.i(st32(10, 5));
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
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, 8 * self.n.div_ceil(4), 8),
                Operand::new("maxes", Role::Input, 4 * self.g, 8),
                Operand::new("out", Role::Output, 2 * self.ld, 8),
                Operand::new("sum", Role::Output, 4, 4),
            ],
            24,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let mut buf = StateBuf::default();
        buf.u32(operand(addrs, &name, "in")?)
            .u32(operand(addrs, &name, "out")?)
            .u32(operand(addrs, &name, "maxes")?)
            .u32(operand(addrs, &name, "sum")?)
            .f32(self.scale * crate::mutation::factor("softmax"))
            .f32(f32::NEG_INFINITY);
        Ok(buf.finish(STRIDE))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let (issues, exps) = self.worker0_work();
        worker0_cycles(t, crate::issue_slots(t, issues, exps))
    }
}

/// The column maxima of an f16 block `[n][16]` (rows 32 bytes apart), as `[16]`
/// f16 (the maximum is exact in f16): the column form of [`RowMax`], for a softmax
/// down 16 columns whose rows are cut over tiles (the pooling head's absorbed
/// scores: tokens on the rows, heads on the columns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColMax {
    pub n: u32,
}

/// `out[r][c] = exp(scale * (in[r][c] - M[c]))` for rows `r < n` (f16), `+0` for rows
/// `n..rows`, with `M[c]` the largest of column `c` over the `g` rows of `maxes`
/// (`[g][16]` f16); `sum` gets each column's f32 sum of the exponentials. The
/// column form of [`ExpShift`].
#[derive(Debug, Clone, PartialEq)]
pub struct ColExpShift {
    pub n: u32,
    /// Rows of `out`, `>= n`.
    pub rows: u32,
    /// Rows of `maxes`: one per tile of the cut.
    pub g: u32,
    /// `0 < scale <= 16`.
    pub scale: f32,
}

/// Four workers take a 4-column group each (`ld64` lanes); the other two exit.
const COL_GROUPS: u32 = 4;
/// `ld64step`/`st64step` increment down a column: one 32-byte row.
const COL_STEP: i8 = 4;
/// Worker records of the column kernels: `in` (0 for an idle worker), `out`,
/// `maxes`, `sum`, `scale`, `-scale`.
const COL_STRIDE: u16 = 24;

fn col_step_ld(d: u8, base: u8) -> Inst {
    Inst::Ld64Step {
        d: a(d),
        base: m(base),
        inc: COL_STEP,
    }
}

fn col_step_st(s: u8, base: u8) -> Inst {
    Inst::St64Step {
        s: a(s),
        base: m(base),
        inc: COL_STEP,
    }
}

fn st64(s: u8, base: u8, imm: u16) -> Inst {
    Inst::St64 {
        s: a(s),
        base: m(base),
        imm,
    }
}

/// Cycles of a column kernel whose four active workers take `slots` issue slots
/// each and whose idle ones three (load, branch, exit).
fn col_cycles(t: &Timing, slots: u64) -> u64 {
    crate::single_shot_cycles(
        t,
        (0..WORKERS).map(|w| if w < COL_GROUPS { slots } else { 3 }),
    )
}

/// Worker records of a column kernel: group `w`'s 8-byte column offset into each
/// operand (16 bytes into the f32 sums) for the four active workers.
fn col_state(addrs: [u32; 4], scale: f32) -> VertexState {
    let mut buf = StateBuf::default();
    for w in 0..WORKERS {
        let (x, out, maxes, sum) = if w < COL_GROUPS {
            (
                addrs[0] + 8 * w,
                addrs[1] + 8 * w,
                addrs[2] + 8 * w,
                addrs[3] + 16 * w,
            )
        } else {
            (0, 0, 0, 0)
        };
        buf.u32(x)
            .u32(out)
            .u32(maxes)
            .u32(sum)
            .f32(scale)
            .f32(-scale)
            .pad_to(((w + 1) * u32::from(COL_STRIDE)) as usize);
    }
    buf.finish(COL_STRIDE)
}

impl ColMax {
    pub const NAME: &'static str = "col_max_f16";
    pub fn new(n: u32) -> ColMax {
        ColMax { n }
    }
    fn active_issues(&self) -> u64 {
        // load, branch, load, first row, the repeat and its body, store, exit
        let rest = if self.n >= 2 {
            1 + 2 * u64::from(self.n - 1)
        } else {
            0
        };
        4 + rest + 2
    }
}

impl Kernel for ColMax {
    fn symbol(&self) -> String {
        format!("{}_n{}", Self::NAME, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        if self.n == 0 || self.n > RPT_MAX {
            return Err(invalid(&self.symbol(), "n must be 1..=4095"));
        }
        Ok(())
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || {
            let mut s = Asm::new(code_base);
            let done = s.label();
            s.i(ld32m(m(2), m(0), 0)); // in, 0 on an idle worker
            s.brz(m(2), done);
            s.i(ld32m(m(3), m(0), 1)); // out
            s.i(col_step_ld(4, 2));
            if self.n >= 2 {
                s.rpti((self.n - 1) as u16, |b| {
                    b.i(col_step_ld(0, 2));
                    b.i(fbin(FBinOp::Max, FVec::F16V4, 4, 4, 0));
                });
            }
            s.i(st64(4, 3, 0));
            s.bind(done);
            s.i(Inst::Exit);
            s.finish()
        })
    }
    fn contract(&self) -> Contract {
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, 32 * self.n, 8),
                Operand::new("out", Role::Output, 32, 8),
            ],
            u32::from(COL_STRIDE) * WORKERS,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        Ok(col_state(
            [
                operand(addrs, &name, "in")?,
                operand(addrs, &name, "out")?,
                0,
                0,
            ],
            0.0,
        ))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        col_cycles(t, self.active_issues())
    }
}

// `col_exp_shift` registers: `$a0:1` a row's group as loaded and as stored, `$a2:3`
// two of its lanes in f32, `$a6:7` the scale, `$a8:9` and `$a10:11` each lane's
// `C = -M*scale`, `$a12:13` and `$a4:5` the sums of lanes 0-1 and 2-3 (`$a12:13`
// first holds `-scale`).

impl ColExpShift {
    pub const NAME: &'static str = "col_exp_shift_f16";
    pub fn new(n: u32, rows: u32, g: u32, scale: f32) -> ColExpShift {
        ColExpShift { n, rows, g, scale }
    }
    /// The worker code (parameters validated by the caller).
    fn program(&self, code_base: u32) -> Vec<Word> {
        let mut s = Asm::new(code_base);
        let done = s.label();
        s.i(ld32m(m(2), m(0), 0)); // in, 0 on an idle worker
        s.brz(m(2), done);
        s.i(ld32m(m(3), m(0), 1)); // out
        s.i(ld32m(m(4), m(0), 2)); // maxes
        s.i(ld32m(m(5), m(0), 3)); // sum
        s.i(ld32(a(6), m(0), 4));
        s.i(bcast2(6, 6));
        s.i(ld32(a(12), m(0), 5));
        s.i(bcast2(12, 12));
        // M, exact in f16, then `C = -(M*scale)` per lane in f32.
        s.i(col_step_ld(8, 4));
        if self.g >= 2 {
            s.rpti((self.g - 1) as u16, |b| {
                b.i(col_step_ld(0, 4));
                b.i(fbin(FBinOp::Max, FVec::F16V4, 8, 8, 0));
            });
        }
        s.i(to_f32(10, 9));
        s.i(to_f32(8, 8));
        s.i(fbin(FBinOp::Mul, FVec::F32V2, 8, 8, 12));
        s.i(fbin(FBinOp::Mul, FVec::F32V2, 10, 10, 12));
        for r in [4, 5, 12, 13] {
            s.i(zero_a(r));
        }
        // Two lanes at a time through `$a2:3` (`$a15` is the zero register): the
        // first pair is packed back into `$a0` before the second is widened.
        s.rpti(self.n as u16, |b| {
            b.i(col_step_ld(0, 2));
            for (src, c, sum) in [(0u8, 8u8, 12u8), (1, 10, 4)] {
                b.i(to_f32(2, src));
                b.i(fbin(FBinOp::Mul, FVec::F32V2, 2, 2, 6));
                b.i(fbin(FBinOp::Add, FVec::F32V2, 2, 2, c));
                b.i(fun(FUnOp::Exp, 2, 2));
                b.i(fun(FUnOp::Exp, 3, 3));
                b.i(fbin(FBinOp::Add, FVec::F32V2, sum, sum, 2));
                b.i(to_f16(src, 2));
            }
            b.i(col_step_st(0, 3));
        });
        let pad = self.rows - self.n;
        if pad > 0 {
            s.i(zero_a(0));
            s.i(zero_a(1));
            s.rpti(pad as u16, |b| b.i(col_step_st(0, 3)));
        }
        s.i(st64(12, 5, 0));
        s.i(st64(4, 5, 1));
        s.bind(done);
        s.i(Inst::Exit);
        s.finish()
    }

    /// (issues, f32 transcendentals) of an active worker.
    fn active_work(&self) -> (u64, u64) {
        let (n, g, pad) = (
            u64::from(self.n),
            u64::from(self.g),
            u64::from(self.rows - self.n),
        );
        // load, branch, three loads, scale and `-scale` with their broadcasts
        let mut issues = 9;
        // the maxima: first row, repeat and body
        issues += 1 + if g >= 2 { 1 + 2 * (g - 1) } else { 0 };
        // to f32, `C`, zeroed sums
        issues += 2 + 2 + 4;
        // the rows: repeat and body
        issues += 1 + 16 * n;
        if pad > 0 {
            issues += 2 + 1 + pad;
        }
        // the sums, exit
        issues += 3;
        (issues, 4 * n)
    }
}

impl Kernel for ColExpShift {
    fn symbol(&self) -> String {
        format!(
            "{}_n{}_r{}_g{}_s{:08x}",
            Self::NAME,
            self.n,
            self.rows,
            self.g,
            self.scale.to_bits()
        )
    }
    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.n == 0 || self.rows < self.n || self.rows > RPT_MAX {
            return Err(invalid(&name, "n must be positive, n <= rows <= 4095"));
        }
        if self.g == 0 || self.g > RPT_MAX {
            return Err(invalid(&name, "g must be 1..=4095"));
        }
        crate::softmax::check_scale(&name, self.scale)?;
        Ok(())
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || self.program(code_base))
    }
    fn contract(&self) -> Contract {
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, 32 * self.n, 8),
                Operand::new("maxes", Role::Input, 32 * self.g, 8),
                Operand::new("out", Role::Output, 32 * self.rows, 8),
                Operand::new("sum", Role::Output, 64, 8),
            ],
            u32::from(COL_STRIDE) * WORKERS,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        Ok(col_state(
            [
                operand(addrs, &name, "in")?,
                operand(addrs, &name, "out")?,
                operand(addrs, &name, "maxes")?,
                operand(addrs, &name, "sum")?,
            ],
            self.scale * crate::mutation::factor("softmax"),
        ))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let (issues, exps) = self.active_work();
        col_cycles(t, crate::issue_slots(t, issues, exps))
    }
}

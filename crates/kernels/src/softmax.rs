//! `softmax`: `P = softmax(S * scale)` over each row of `n` f16 scores, in f32 with
//! the row maximum subtracted, probabilities rounded to f16.
//!
//! Rows are stored with a stride of `ld` elements (a multiple of 4, `ld >= n`), so
//! every row starts 8-byte aligned and is read as 4-element groups with 64-bit loads.
//! Columns `n..ld` of the input are never used (any bits, NaN included); those of the
//! output are written as `+0`, so a caller that pads the key dimension (SigLIP's 729
//! tokens to 736 for a 16-wide matmul) gets probabilities that feed the next product
//! directly.
//!
//! Workers own contiguous row ranges. Per row, with `G = ceil(n/4)` groups:
//! 1. the maximum `M`, in f16 lanes (max is exact), reduced to one f32;
//! 2. `e = exp(x*scale + C)` with `C = -(M*scale)` rounded once to f32: a fused
//!    multiply-add, so each argument is rounded once; the rounding of `C` scales every
//!    `e` of the row by the same factor, which the normalisation cancels. The `e` are
//!    summed in f32 (two pairs of lane accumulators) and stored as f16 in `out`;
//! 3. `out = e * (1/sum)` in f32, rounded to f16.
//!
//! Storing `e` in f16 between passes 2 and 3 costs one extra f16 rounding (hence the
//! error bound of about 1.5 f16 ulp, docs/kernels.md); recomputing the exponentials in
//! pass 3 instead would double the dominant cost, `f32exp` (a scalar instruction that
//! holds two issue slots).
//!
//! Two variants serve the encoder attention: with `recip` pass 3 is left out (`out`
//! holds `e`, and each row's `1/sum` goes to its own operand for the caller to scale
//! the few rows of `e V` instead), and `blocked` reads and writes the AMP's block
//! layout in place of row-major, its loops unrolled by the four groups of a 32-byte
//! piece so that each `ld64step`/`st64step` knows whether it steps to the next group
//! or the next piece.
//!
//! A partial last group (`n % 4 != 0`) is passed through `f16v4min` with a mask of
//! `+inf` (valid lanes) and `-inf` (padding): whatever the padding holds becomes `-inf`,
//! which the maximum ignores and whose exponential is 0. Loops are rotated with their
//! first and last groups peeled, so nothing is read outside the row's `4G` elements.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, IntOp, MReg, Word};
use tessera_machine::Timing;

use crate::asm::{AUX_NOP, Asm, MZ, a, int, inti, ld32, ld32m, m, mov, setzi};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{bcast2, fbin, fmac, fun, ld64s, simple_contract, st64s, to_f16, to_f32};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// Parameters of one row-wise softmax.
#[derive(Debug, Clone, PartialEq)]
pub struct Softmax {
    pub rows: u32,
    /// Scores per row (`>= 1`).
    pub n: u32,
    /// Row stride in elements, of `in` and `out` alike: a multiple of 4, `>= n`.
    pub ld: u32,
    /// Multiplies every score before the exponential; `0 < scale <= 16`.
    pub scale: f32,
    /// Leave the normalisation to the caller: `out` gets the exponentials `e` (pass 3
    /// is not run) and the operand `recip` each row's `1/sum` as f32. A caller whose
    /// next step is `P V` scales its few output rows instead of every probability
    /// (`ScaleRows`).
    pub recip: bool,
    /// `in` and `out` in the AMP's block layout `[ld/16][rows][16]` (what
    /// `amp_matmul` writes and reads) instead of row-major: a row is `ld/16` pieces
    /// of 32 bytes, `32 rows` bytes apart, so the caller needs no layout copies.
    /// Only with `recip`, `ld` a multiple of 16 and at most 32 rows (a piece's step
    /// must fit `ld64step`'s increment).
    pub blocked: bool,
}

/// A worker record: `in` row, `out` row, rows, `scale`, `-scale`, the `recip` row
/// (with `recip`; otherwise unused), then the last group's mask (four f16 lanes) at
/// byte 24 for one `ld64`.
const STRIDE: u16 = 32;
/// `ld64` offset (in 8-byte units) of the mask in a record.
const MASK_AT: u16 = 3;

// `$a` registers (pairs named by their first register).
/// Group loaded from memory (four f16): scores in passes 1-2, `e` in pass 3.
pub(crate) const X: u8 = 0;
/// f32 lanes of half a group; packed `e` of the previous group; the mask, from the
/// end of the previous row until pass 2 (loaded again for a masked last group).
pub(crate) const W: u8 = 2;
/// Pass 2: arguments, then exponentials, of lanes 0-1; pass 3: f32 lanes 2-3.
pub(crate) const D0: u8 = 4;
/// Pass 2: lanes 2-3; pass 3: the packed probabilities.
pub(crate) const D1: u8 = 6;
/// `scale` in both lanes, for the whole run.
pub(crate) const SC: u8 = 8;
/// Pass 1: the running maximum (four f16); pass 2: the sums of lanes 0-1.
pub(crate) const S1: u8 = 10;
/// Pass 2: the sums of lanes 2-3; pass 3: `1/sum` in both lanes.
pub(crate) const S2: u8 = 12;
/// `-scale`, for the whole run.
pub(crate) const NEG_SCALE: u8 = 14;
/// `$azero`.
pub(crate) const AZ: u8 = 15;

// `$m` registers.
const IN: MReg = MReg(2); // current `in` row; pass 2's read pointer
const OUT: MReg = MReg(3); // current `out` row; pass 3's write pointer
const RD: MReg = MReg(4); // pass 1's and pass 3's read pointer
const WR: MReg = MReg(5); // pass 2's write pointer
const ROWS: MReg = MReg(6);
const GROUPS_M1: MReg = MReg(7); // G - 1: repeats of passes 1 and 3
const PAD_BYTES: MReg = MReg(8); // 8Z: `in` bytes skipped after a row
const PAD_GROUPS: MReg = MReg(9); // Z: zero groups stored after a row
const C_BITS: MReg = MReg(10); // C, re-broadcast into the argument pairs
const PASS2_REPEATS: MReg = MReg(11);
const ROW_BYTES: MReg = MReg(12); // 2 ld
const RECIP: MReg = MReg(13); // with `recip`: where the row's 1/sum goes
// Blocked: the row's start in `in` (rows are 32 bytes apart), the last group's
// offset from it and its address (the padding registers are free: no repeats store
// the padding).
const ROWP: MReg = MReg(14);
const LAST: MReg = MReg(9);
const LAST_AT: MReg = MReg(8);

/// One issue: a main-pipe instruction, an aux-pipe instruction, or both (a bundle).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Issue {
    main: Option<Inst>,
    aux: Option<Inst>,
}

pub(crate) fn mi(main: Inst) -> Issue {
    Issue {
        main: Some(main),
        aux: None,
    }
}
pub(crate) fn ai(aux: Inst) -> Issue {
    Issue {
        main: None,
        aux: Some(aux),
    }
}
pub(crate) fn bi(main: Inst, aux: Inst) -> Issue {
    Issue {
        main: Some(main),
        aux: Some(aux),
    }
}
impl Issue {
    fn dual(&self) -> bool {
        self.main.is_some() && self.aux.is_some()
    }
    /// The same issue with `main` added (it must have none).
    pub(crate) fn with(self, main: Inst) -> Issue {
        assert!(self.main.is_none(), "issue already has a main instruction");
        Issue {
            main: Some(main),
            ..self
        }
    }
}

/// How a block must end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Any,
    /// A bundle follows.
    Aligned,
    /// A `rpt` whose body holds bundles follows: it must sit at 4 mod 8 for the body
    /// to start aligned.
    BeforeRpt,
}

/// Emits `issues`, one word each. An issue with one instruction may be a 4-byte word
/// or an 8-byte bundle with a no-op partner (still one issue): the choice is made so
/// that every bundle is 8-byte aligned and the block ends as `end` asks, with no
/// padding `nop` (which would cost an issue) and as few wide words as possible.
pub(crate) fn block(s: &mut Asm, issues: &[Issue], end: End) {
    // reach[i][p]: how the state "after i issues, at 4*p mod 8" was first reached at
    // least cost: (previous p, whether issue i-1 was wide, wide words so far).
    let n = issues.len();
    let mut reach: Vec<[Option<(usize, bool, u32)>; 2]> = vec![[None; 2]; n + 1];
    let start = (s.at() % 8 / 4) as usize;
    reach[0][start] = Some((start, false, 0));
    for (i, is) in issues.iter().enumerate() {
        for p in 0..2 {
            let Some((_, _, cost)) = reach[i][p] else {
                continue;
            };
            let mut offer = |q: usize, wide: bool, cost: u32| {
                if reach[i + 1][q].is_none_or(|(_, _, c)| cost < c) {
                    reach[i + 1][q] = Some((p, wide, cost));
                }
            };
            if !is.dual() {
                offer(p ^ 1, false, cost);
            }
            if p == 0 {
                offer(0, true, cost + u32::from(!is.dual()));
            }
        }
    }
    let finals: &[usize] = match end {
        End::Any => &[0, 1],
        End::Aligned => &[0],
        End::BeforeRpt => &[1],
    };
    let best = finals
        .iter()
        .filter_map(|&p| reach[n][p].map(|(_, _, c)| (c, p)))
        .min();
    let Some((_, mut p)) = best else {
        // No padding-free layout: let the assembler pad (the no-nop test catches it).
        for is in issues {
            emit(s, is, is.dual());
        }
        return;
    };
    let mut wide = vec![false; n];
    for i in (0..n).rev() {
        let (prev, w, _) = reach[i + 1][p].expect("reached");
        wide[i] = w;
        p = prev;
    }
    for (is, w) in issues.iter().zip(wide) {
        emit(s, is, w);
    }
}

fn emit(s: &mut Asm, is: &Issue, wide: bool) {
    match (is.main, is.aux, wide) {
        (Some(main), Some(aux), _) => s.b(main, aux),
        (Some(main), None, true) => s.b(main, AUX_NOP),
        (None, Some(aux), true) => s.b(Inst::Nop, aux),
        (Some(i), None, false) | (None, Some(i), false) => s.i(i),
        (None, None, _) => unreachable!("empty issue"),
    }
}

/// Executed issues of the emitted code, counted while emitting: the check on the
/// closed form the estimate uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tally {
    /// A worker with rows: issues before the row loop.
    pub setup: u64,
    /// Issues of one row.
    pub per_row: u64,
    /// A worker without rows: all its issues.
    pub idle: u64,
}

pub(crate) fn ld64(d: u8, base: MReg, imm: u16) -> Inst {
    Inst::Ld64 { d: a(d), base, imm }
}
pub(crate) fn mov_am(d: u8, s: MReg) -> Inst {
    Inst::MovAm { d: a(d), a: s }
}
pub(crate) fn exp(r: u8) -> Inst {
    fun(FUnOp::Exp, r, r)
}
fn min4(d: u8, x: u8, y: u8) -> Inst {
    fbin(FBinOp::Min, FVec::F16V4, d, x, y)
}
pub(crate) fn add2(d: u8, x: u8) -> Inst {
    fbin(FBinOp::Add, FVec::F32V2, d, d, x)
}
pub(crate) fn mul2(d: u8, x: u8) -> Inst {
    fbin(FBinOp::Mul, FVec::F32V2, d, d, x)
}

/// Pass 2 of one group rotated with the end of the previous one (12 issues, 13 with
/// `masked`): `ld` loads the group's four scores into `X`; the previous group's
/// arguments (in `D0`, `D1`) are exponentiated, added to the lane sums (`S1` lanes
/// 0-1, `S2` lanes 2-3), packed into `W` and stored by `st`; the argument pairs are
/// re-armed with `C` from `c` (one `$m` register per lane; the row softmax passes its
/// one `C` four times) and the new group is
/// converted and multiplied in (`D = C + x * scale`). With `masked`, the mask is
/// loaded into `W` (free between the last conversion and the packing) and applied
/// before the conversion.
/// A softmax's score scale must be in `(0, Softmax::SCALE_MAX]`
/// ([`Softmax::SCALE_MAX`] says why).
pub(crate) fn check_scale(name: &str, scale: f32) -> Result<(), KernelError> {
    if scale > 0.0 && scale <= Softmax::SCALE_MAX {
        Ok(())
    } else {
        Err(invalid(name, "scale must be in (0, 16]"))
    }
}

pub(crate) fn pass2_group(ld: Inst, st: Inst, c: [MReg; 4], masked: bool) -> Vec<Issue> {
    let mut v = vec![bi(ld, exp(D0))];
    if masked {
        v.push(bi(ld64(W, MReg(0), MASK_AT), exp(D0 + 1)));
        v.push(ai(exp(D1)));
        v.push(ai(min4(X, X, W)));
    } else {
        v.push(ai(exp(D0 + 1)));
        v.push(ai(exp(D1)));
    }
    v.extend([
        ai(exp(D1 + 1)),
        ai(add2(S1, D0)),
        bi(mov_am(D0, c[0]), to_f16(W, D0)),
        bi(mov_am(D0 + 1, c[1]), add2(S2, D1)),
        bi(mov_am(D1, c[2]), to_f16(W + 1, D1)),
        bi(st, to_f32(W, X)),
        bi(mov_am(D1 + 1, c[3]), fmac(FVec::F32V2, D0, W, SC)),
        ai(to_f32(W, X + 1)),
        ai(fmac(FVec::F32V2, D1, W, SC)),
    ]);
    v
}

impl Softmax {
    pub const NAME: &'static str = "softmax";

    /// Largest accepted `scale`: `C` is `M*scale` rounded to f32, and its rounding
    /// error (at most `2^-25 |M*scale|`, `|M| <= 65504`) becomes a common factor
    /// `exp(r)` on every `e` of the row. Up to 16 that factor is within 3.2% of 1, so
    /// `e` stays far from the top of the f16 range and the error bound's absolute
    /// (subnormal) term holds.
    pub const SCALE_MAX: f32 = 16.0;

    /// Rows stored densely, the stride `n` rounded up to a multiple of 4.
    pub fn new(rows: u32, n: u32, scale: f32) -> Softmax {
        Softmax {
            rows,
            n,
            ld: n.next_multiple_of(4),
            scale,
            recip: false,
            blocked: false,
        }
    }

    /// Rows `ld` elements apart (a multiple of 4, at least `n`).
    pub fn with_ld(rows: u32, n: u32, ld: u32, scale: f32) -> Softmax {
        Softmax {
            rows,
            n,
            ld,
            scale,
            recip: false,
            blocked: false,
        }
    }

    /// The same softmax with the normalisation left to the caller (`recip`).
    pub fn with_recip(self) -> Softmax {
        Softmax {
            recip: true,
            ..self
        }
    }

    /// The same softmax on the AMP's block layout (`blocked`; implies `recip`).
    pub fn with_blocked(self) -> Softmax {
        Softmax {
            recip: true,
            blocked: true,
            ..self
        }
    }

    /// Largest `rows` of a blocked softmax: the step from a piece's last group to
    /// the next piece, `4 rows - 3` words, must fit `ld64step`'s `i8` increment.
    const BLOCKED_ROWS_MAX: u32 = 32;

    /// `ld64step`/`st64step` increment after group `g` (8-byte words): the next
    /// group, or in block layout after a piece's fourth group the next piece.
    fn step(&self, g: u32) -> i8 {
        if self.blocked && g % 4 == 3 {
            (4 * self.rows - 3) as i8
        } else {
            1
        }
    }

    /// Byte offset of group `g` from its row's start in block layout.
    fn block_offset(&self, g: u32) -> u32 {
        (g / 4) * self.rows * 32 + (g % 4) * 8
    }

    fn ld64g(&self, d: u8, base: MReg, g: u32) -> Inst {
        Inst::Ld64Step {
            d: a(d),
            base,
            inc: self.step(g),
        }
    }

    fn st64g(&self, s: u8, base: MReg, g: u32) -> Inst {
        Inst::St64Step {
            s: a(s),
            base,
            inc: self.step(g),
        }
    }

    /// 4-element groups per row, the last one possibly partial.
    fn groups(&self) -> u32 {
        self.n.div_ceil(4)
    }

    /// Whole groups of padding after the last group (stored as zeros).
    fn pad_groups(&self) -> u32 {
        (self.ld - 4 * self.groups()) / 4
    }

    fn masked(&self) -> bool {
        !self.n.is_multiple_of(4)
    }

    /// The last group's mask: `+inf` for valid lanes, `-inf` for padding.
    fn mask(&self) -> u64 {
        let valid = self.n - 4 * (self.groups() - 1);
        (0..4).fold(0, |acc, l| {
            let lane: u64 = if l < valid { 0x7c00 } else { 0xfc00 };
            acc | lane << (16 * l)
        })
    }

    /// Repeats of pass 2's steady-state body: every group after the first, except a
    /// masked last group, which has its own copy of the body.
    fn pass2_repeats(&self) -> u32 {
        let g = self.groups();
        if self.masked() && g >= 2 {
            g - 2
        } else {
            g - 1
        }
    }

    /// Worker issues of one row (closed form of the emitted code; `Tally` checks it).
    pub(crate) fn row_issues(&self) -> u64 {
        let (g, z) = (u64::from(self.groups()), u64::from(self.pad_groups()));
        let m = u64::from(self.masked());
        if self.blocked {
            // As below, with the last group's address formed, the padding stored
            // beside the bookkeeping and three more pointer moves.
            13 * g + 19 + 3 * m + z
        } else if self.recip {
            // Passes 1 and 2, the last group's end, the sum and its reciprocal stored,
            // the row bookkeeping beside them, the padding.
            13 * g + 14 + 3 * m + if z > 0 { z + 2 } else { 0 }
        } else {
            19 * g + 15 + 2 * m + if z > 0 { z + 1 } else { 0 }
        }
    }

    /// Worker issues before the row loop.
    pub(crate) fn setup_issues(&self) -> u64 {
        if self.blocked {
            return 13 + u64::from(self.masked());
        }
        11 + if self.pad_groups() > 0 { 2 } else { 0 }
            + u64::from(self.masked())
            + u64::from(self.recip)
    }

    /// Issues of a worker without rows (load the count, branch, `exit`).
    pub(crate) const IDLE_ISSUES: u64 = 3;

    /// Pass 2, one group `j` rotated with the end of group `j-1` ([`pass2_group`]).
    fn pass2_body(&self, masked: bool, j: u32) -> Vec<Issue> {
        pass2_group(
            self.ld64g(X, IN, j),
            self.st64g(W, WR, j - 1),
            [C_BITS; 4],
            masked,
        )
    }

    /// Pass 3, group `j` rotated with the end of `j-1` (6 issues): load `e(j)`, scale
    /// and pack `j-1`, store it, convert `e(j)`.
    fn pass3_body() -> Vec<Issue> {
        vec![
            bi(ld64s(X, RD.0), mul2(W, S2)),
            ai(mul2(D0, S2)),
            ai(to_f16(D1, W)),
            ai(to_f16(D1 + 1, D0)),
            bi(st64s(D1, OUT.0), to_f32(W, X)),
            ai(to_f32(D0, X + 1)),
        ]
    }

    /// The worker code and its executed-issue tally.
    fn program(&self, code_base: u32) -> Result<(Vec<Word>, Tally), KernelError> {
        use FBinOp::*;
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let g = self.groups();
        let z = self.pad_groups();
        let masked = self.masked();
        let mut s = Asm::new(code_base);
        let done = s.label();
        let row = s.label();

        s.i(ld32m(ROWS, m(0), 2));
        s.brz(ROWS, done);
        let idle = s.len() as u64 + 1;
        // Blocked, the loops are unrolled by the four groups of a piece (the
        // increments repeat every four groups): `q` repeats of four, `r` peeled.
        let blocked = self.blocked;
        let unroll = if blocked { 4 } else { 1 };
        let (q1, r1) = ((g - 1) / unroll, (g - 1) % unroll);
        let n2 = self.pass2_repeats();
        let (q2, r2) = (n2 / unroll, n2 % unroll);
        let mut setup = vec![
            mi(ld32m(IN, m(0), 0)),
            mi(ld32m(OUT, m(0), 1)),
            mi(ld32(a(SC), m(0), 3)),
            bi(ld32(a(NEG_SCALE), m(0), 4), bcast2(SC, SC)),
            mi(setzi(GROUPS_M1, q1)),
            mi(setzi(PASS2_REPEATS, q2)),
        ];
        if blocked {
            setup.push(mi(mov(ROWP, IN)));
            setup.push(mi(setzi(LAST, self.block_offset(g - 1))));
        } else {
            setup.push(mi(setzi(ROW_BYTES, 2 * self.ld)));
            if z > 0 {
                setup.push(mi(setzi(PAD_GROUPS, z)));
                setup.push(mi(setzi(PAD_BYTES, 8 * z)));
            }
        }
        // Pointers and the mask for the first row; each row's end sets them for the
        // next, in main-pipe slots its floating point leaves free.
        setup.push(mi(mov(RD, IN)));
        setup.push(mi(mov(WR, OUT)));
        if masked {
            setup.push(mi(ld64(W, m(0), MASK_AT)));
        }
        if self.recip {
            setup.push(mi(ld32m(RECIP, m(0), 5)));
        }
        block(&mut s, &setup, End::Any);
        let setup = s.len() as u64;

        // Per row: executed issues = words of the loop + each repeat body's words
        // times (count - 1).
        s.bind(row);
        let row_start = s.len() as i64;
        let mut repeated: i64 = 0;
        // `end`: how the code after the repeat starts (the body is laid out from an
        // aligned start, and the code after it continues from the body's end).
        let mut repeat = |s: &mut Asm, count: MReg, times: u32, body: &[Issue], end: End| {
            let mut len = 0;
            s.rpt(count, |b| {
                block(b, body, end);
                len = b.len();
            });
            repeated += len as i64 * (i64::from(times) - 1);
        };

        // Pass 1: the maximum starts as the (masked) last group, so the repeat
        // maxes groups 0..G-2 while loading 1..G-1, all inside the row. (A block
        // before a repeat must end with a single-pipe issue: a bundle ends 8-byte
        // aligned, where the `rpt` cannot sit.)
        let mut p1 = if blocked {
            vec![
                mi(int(IntOp::Add, LAST_AT, IN, LAST)),
                mi(ld64(S1, LAST_AT, 0)),
            ]
        } else {
            vec![mi(ld64(S1, IN, (g - 1) as u16))]
        };
        p1.push(mi(self.ld64g(X, RD, 0)));
        if masked {
            p1.push(ai(min4(S1, S1, W)));
        }
        block(&mut s, &p1, End::BeforeRpt);
        let max_group = |j: u32| bi(self.ld64g(X, RD, j), fbin(Max, FVec::F16V4, S1, S1, X));
        repeat(
            &mut s,
            GROUPS_M1,
            q1,
            &(1..=unroll).map(max_group).collect::<Vec<_>>(),
            End::Aligned,
        );

        // Reduce the maximum to f32, C = M * -scale; group 0 of pass 2. The sums are
        // zeroed and the argument pairs armed from the main pipe, beside the chain.
        let mut head: Vec<Issue> = (unroll * q1 + 1..=unroll * q1 + r1)
            .map(max_group)
            .collect();
        head.extend([
            bi(self.ld64g(X, IN, 0), fbin(Max, FVec::F16V2, D0, S1, S1 + 1)),
            bi(mov_am(S1, MZ), to_f32(D0, D0)),
            bi(mov_am(S1 + 1, MZ), fbin(Max, FVec::F32, D0, D0, D0 + 1)),
            bi(mov_am(S2, MZ), fbin(Mul, FVec::F32, D0, D0, NEG_SCALE)),
            bi(
                Inst::MovMa {
                    d: C_BITS,
                    a: a(D0),
                },
                bcast2(D0, D0),
            ),
        ]);
        if masked && g == 1 {
            // The only group is the partial one; the mask is still in `W`.
            head.push(ai(min4(X, X, W)));
        }
        head.extend([
            ai(to_f32(W, X)),
            ai(fmac(FVec::F32V2, D0, W, SC)),
            ai(to_f32(W, X + 1)),
            ai(fmac(FVec::F32V2, D1, W, SC)),
        ]);
        // `D1` must hold C before the last issue.
        let n = head.len();
        head[n - 4] = head[n - 4].with(mov_am(S2 + 1, MZ));
        head[n - 3] = head[n - 3].with(mov_am(D1, C_BITS));
        head[n - 2] = head[n - 2].with(mov_am(D1 + 1, C_BITS));
        block(&mut s, &head, End::BeforeRpt);
        repeat(
            &mut s,
            PASS2_REPEATS,
            q2,
            &(1..=unroll)
                .flat_map(|j| self.pass2_body(false, j))
                .collect::<Vec<_>>(),
            End::Aligned,
        );

        // [Peeled groups, the masked last group;] the row's end follows.
        let mut tail: Vec<Issue> = (unroll * q2 + 1..=unroll * q2 + r2)
            .flat_map(|j| self.pass2_body(false, j))
            .collect();
        if masked && g >= 2 {
            tail.extend(self.pass2_body(true, g - 1));
        }
        // The pointer the padding's zeros are stored through, when a repeat stores
        // them (blocked, the row's end stores them itself).
        let pad_ptr = if self.recip {
            self.recip_row_end(&mut s, tail);
            WR
        } else {
            self.pass3(&mut s, tail, &mut repeat);
            OUT
        };
        if z > 0 && !blocked {
            repeat(&mut s, PAD_GROUPS, z, &[mi(st64s(X, pad_ptr.0))], End::Any);
        }
        s.brnz(ROWS, row);
        let per_row = (s.len() as i64 - row_start + repeated) as u64;
        s.bind(done);
        s.i(Inst::Exit);
        Ok((
            s.finish(),
            Tally {
                setup,
                per_row,
                idle,
            },
        ))
    }

    /// Without `recip`, the end of a row after pass 2's repeat: `tail` (a masked
    /// last group), the last group's end, the sum and its reciprocal, and pass 3
    /// (reading back `e` from `out`) beside the row bookkeeping. The padding's
    /// zeros follow, stored through pass 3's write pointer.
    fn pass3(
        &self,
        s: &mut Asm,
        mut tail: Vec<Issue>,
        repeat: &mut impl FnMut(&mut Asm, MReg, u32, &[Issue], End),
    ) {
        let (g, z, masked) = (self.groups(), self.pad_groups(), self.masked());
        tail.extend(self.last_group_end());
        tail.extend([
            bi(
                mov(RD, OUT),
                Inst::FSum {
                    vec: FVec::F32V2,
                    d: a(S2),
                    a: a(S1),
                },
            ),
            bi(ld64s(X, RD.0), fun(FUnOp::Recip, S2, S2)),
            // The next row's pass-2 stores start a row after this one's.
            bi(int(IntOp::Add, WR, OUT, ROW_BYTES), bcast2(S2, S2)),
            ai(to_f32(W, X)),
            ai(to_f32(D0, X + 1)),
        ]);
        block(s, &tail, End::BeforeRpt);
        repeat(s, GROUPS_M1, g - 1, &Self::pass3_body(), End::Aligned);

        // The last group of pass 3, beside the row bookkeeping (`IN` is already past
        // the row's groups), then the zero padding.
        let mut end = vec![
            bi(inti(IntOp::Sub, ROWS, ROWS, 1), mul2(W, S2)),
            ai(mul2(D0, S2)),
            ai(to_f16(D1, W)),
            ai(to_f16(D1 + 1, D0)),
        ];
        if z > 0 {
            end[1] = end[1].with(int(IntOp::Add, IN, IN, PAD_BYTES));
        }
        end[2] = end[2].with(mov(RD, IN));
        if masked {
            // `W` is free once its probabilities are packed.
            end[3] = end[3].with(ld64(W, m(0), MASK_AT));
        }
        end.push(if z > 0 {
            bi(st64s(D1, OUT.0), bcast2(X, AZ))
        } else {
            mi(st64s(D1, OUT.0))
        });
        block(s, &end, End::Any);
    }

    /// Pass 2's last group after the repeat: its exponentials, sums, packing and
    /// store, and the first add of the two pairs of sums.
    fn last_group_end(&self) -> [Issue; 9] {
        [
            ai(exp(D0)),
            ai(exp(D0 + 1)),
            ai(exp(D1)),
            ai(exp(D1 + 1)),
            ai(add2(S1, D0)),
            ai(to_f16(W, D0)),
            ai(add2(S2, D1)),
            ai(to_f16(W + 1, D1)),
            bi(self.st64g(W, WR, self.groups() - 1), add2(S1, S2)),
        ]
    }

    /// With `recip`, the end of a row after pass 2's repeat: `tail` (a masked last
    /// group), the last group's exponentials, sums and store, then `1/sum` stored
    /// beside the row bookkeeping. The padding groups follow, zeroed through pass 2's
    /// write pointer, which thereby ends at the next row.
    fn recip_row_end(&self, s: &mut Asm, mut tail: Vec<Issue>) {
        let z = self.pad_groups();
        tail.extend(self.last_group_end());
        // Main-pipe work in order; the store of `1/sum` comes third or later, after
        // the reciprocal's issue (the second aux-pipe instruction), and blocked, the
        // padding's stores after the zeros' broadcast (the third).
        let store_recip = [
            Inst::St32 {
                s: a(S2),
                base: RECIP,
                imm: 0,
            },
            inti(IntOp::Add, RECIP, RECIP, 4),
        ];
        let mut main = vec![inti(IntOp::Sub, ROWS, ROWS, 1)];
        if self.blocked {
            // The next row starts 32 bytes on, in `in` and in `out`.
            main.push(inti(IntOp::Add, ROWP, ROWP, 32));
            main.extend(store_recip);
            let g = self.groups();
            main.extend((g..g + z).map(|p| self.st64g(X, WR, p)));
            main.push(inti(IntOp::Add, OUT, OUT, 32));
            main.push(mov(IN, ROWP));
            main.push(mov(RD, ROWP));
            main.push(mov(WR, OUT));
        } else {
            if z > 0 {
                main.push(int(IntOp::Add, IN, IN, PAD_BYTES));
            }
            main.push(mov(RD, IN));
            main.extend(store_recip);
        }
        if self.masked() {
            // `W` is free once the last group is stored.
            main.push(ld64(W, m(0), MASK_AT));
        }
        let mut aux = vec![
            Inst::FSum {
                vec: FVec::F32V2,
                d: a(S2),
                a: a(S1),
            },
            fun(FUnOp::Recip, S2, S2),
        ];
        if z > 0 {
            aux.push(bcast2(X, AZ));
        }
        for i in 0..main.len().max(aux.len()) {
            tail.push(match (main.get(i), aux.get(i)) {
                (Some(&mi_), Some(&ax)) => bi(mi_, ax),
                (Some(&mi_), None) => mi(mi_),
                (None, Some(&ax)) => ai(ax),
                (None, None) => unreachable!(),
            });
        }
        block(s, &tail, End::Any);
    }

    /// The tally of the emitted code (tests compare it with the closed form).
    #[cfg(test)]
    pub(crate) fn tally(&self) -> Result<Tally, KernelError> {
        Ok(self.program(0)?.1)
    }
}

impl Kernel for Softmax {
    fn symbol(&self) -> String {
        let mode = match (self.recip, self.blocked) {
            (_, true) => "_exp_blk",
            (true, false) => "_exp",
            (false, false) => "",
        };
        format!(
            "{}{mode}_r{}_n{}_ld{}",
            Self::NAME,
            self.rows,
            self.n,
            self.ld
        )
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.rows == 0 || self.n == 0 {
            return Err(invalid(&name, "rows and n must be positive"));
        }
        if self.ld < self.n || !self.ld.is_multiple_of(4) {
            return Err(invalid(&name, "ld must be a multiple of 4 and at least n"));
        }
        // Repeat counts G - 1 and Z, and the 12-bit `ld64` offset of the last group.
        if self.groups() - 1 > RPT_MAX {
            return Err(invalid(&name, "n above 16384"));
        }
        if self.pad_groups() > RPT_MAX {
            return Err(invalid(&name, "more than 4095 padding groups per row"));
        }
        if u64::from(self.rows) * u64::from(self.ld) * 2 >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        check_scale(&name, self.scale)?;
        if self.blocked
            && (!self.recip || !self.ld.is_multiple_of(16) || self.rows > Self::BLOCKED_ROWS_MAX)
        {
            return Err(invalid(
                &name,
                "block layout needs recip, ld a multiple of 16 and at most 32 rows",
            ));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        let (words, _) = self.program(code_base)?;
        Ok(KernelCode {
            symbol: self.symbol(),
            code_base,
            entry: code_base,
            words,
        })
    }

    fn contract(&self) -> Contract {
        let bytes = self.rows * self.ld * 2;
        simple_contract(
            self,
            [
                Operand::new("in", Role::Input, bytes, 8),
                Operand::new("out", Role::Output, bytes, 8),
            ]
            .into_iter()
            .chain(
                self.recip
                    .then(|| Operand::new("recip", Role::Output, self.rows * 4, 8)),
            )
            .collect(),
            u32::from(STRIDE) * WORKERS,
        )
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let recip = if self.recip {
            Some(operand(addrs, &name, "recip")?)
        } else {
            None
        };
        // Where row `r0` starts: rows are 32-byte pieces apart in block layout.
        let row_bytes = if self.blocked { 32 } else { self.ld * 2 };
        let mask = self.mask();
        let mut buf = StateBuf::default();
        for (i, (r0, r)) in split(self.rows).into_iter().enumerate() {
            buf.u32(inp + r0 * row_bytes)
                .u32(out + r0 * row_bytes)
                .u32(r)
                .f32(self.scale * crate::mutation::factor("softmax"))
                .f32(-self.scale * crate::mutation::factor("softmax"))
                .u32(recip.map_or(0, |at| at + 4 * r0))
                .u32(mask as u32)
                .u32((mask >> 32) as u32)
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
                    0 => Self::IDLE_ISSUES,
                    r => crate::issue_slots(
                        t,
                        self.setup_issues() + r * self.row_issues() + 1,
                        r * (4 * g + 1),
                    ),
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes() -> Vec<Softmax> {
        let mut v = Vec::new();
        for n in [1u32, 2, 3, 4, 5, 7, 8, 9, 12, 13, 196, 729] {
            for extra in [0, 4, 12, 28] {
                let ld = n.next_multiple_of(4) + extra;
                v.push(Softmax::with_ld(7, n, ld, 0.125));
                v.push(Softmax::with_ld(7, n, ld, 0.125).with_recip());
                if ld.is_multiple_of(16) {
                    v.push(Softmax::with_ld(7, n, ld, 0.125).with_blocked());
                }
            }
            let ld = n.next_multiple_of(16);
            for rows in [1, 6, 16, 32] {
                v.push(Softmax::with_ld(rows, n, ld, 0.125).with_blocked());
            }
        }
        v
    }

    #[test]
    fn issue_formula_matches_the_emitted_code() {
        for k in shapes() {
            let t = k.tally().unwrap();
            assert_eq!(t.per_row, k.row_issues(), "{}", k.symbol());
            assert_eq!(t.setup, k.setup_issues(), "{}", k.symbol());
            assert_eq!(t.idle, Softmax::IDLE_ISSUES, "{}", k.symbol());
        }
    }

    #[test]
    fn layout_needs_no_padding_nop() {
        for k in shapes() {
            crate::tests::assert_no_padding_nop(&k);
        }
    }

    #[test]
    fn parameters_are_checked() {
        assert!(Softmax::new(1, 1, 1.0).validate().is_ok());
        assert!(Softmax::new(0, 4, 1.0).validate().is_err());
        assert!(Softmax::new(2, 0, 1.0).validate().is_err());
        assert!(Softmax::with_ld(2, 5, 6, 1.0).validate().is_err());
        assert!(Softmax::with_ld(2, 9, 8, 1.0).validate().is_err());
        assert!(Softmax::new(2, 4 * 4096, 1.0).validate().is_ok());
        assert!(Softmax::new(1, 4 * 4096 + 1, 1.0).validate().is_err());
        for bad in [0.0, -1.0, 16.5, f32::NAN, f32::INFINITY] {
            assert!(Softmax::new(2, 8, bad).validate().is_err(), "{bad}");
        }
        assert!(Softmax::new(2, 8, Softmax::SCALE_MAX).validate().is_ok());
    }

    #[test]
    fn mask_marks_the_padding_lanes() {
        assert_eq!(Softmax::new(1, 5, 1.0).mask(), 0xfc00_fc00_fc00_7c00);
        assert_eq!(Softmax::new(1, 7, 1.0).mask(), 0xfc00_7c00_7c00_7c00);
        assert_eq!(Softmax::new(1, 8, 1.0).mask(), 0x7c00_7c00_7c00_7c00);
    }
}

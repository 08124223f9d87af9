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
//!    is exact), two groups at a time, into the state;
//! 2. each worker takes the six maxima `M` of a group, then for each of its rows
//!    five issues: `f16v4sub` (`x - M`), `f16v4mul` (by `scale` rounded to f16;
//!    left out, for four issues, when that is one: the attention folds its scale
//!    into the query projection), two `f16v2exp`, and `f16v4acc`, which adds the
//!    four `e` to f32 lane sums in the worker's accumulators (the load of the
//!    next row and the store of `e` ride in two of them); the sums go to the state
//!    by `f32v2gina`. Unscaled, two groups go together (eight columns, 16 bytes of
//!    a row): seven issues a row where two groups alone take eight, one
//!    `f16v8acc` summing both (see `exp_pairs`). The
//!    argument is an f16, so `e` is within `2^-11 + 1.25 * 2^-10 |a|` (relative)
//!    of `exp(a)`: the f32 argument and `f32exp` of the row softmax cost 16 issue
//!    slots a row instead of 5. The worker with the last rows zeroes the padding
//!    rows;
//! 3. the groups split over the workers: the six partial sums added in worker
//!    order, `1/sum` per column.
//!
//! A group's rows are walked with `ld64step`/`st64step` by 32 bytes; every worker
//! has at least two rows (`n >= 12`), so the walks need no special cases.
//!
//! Where the keys are cut over tiles (each tile a run of the rows of the same
//! query columns), the tiles must shift by the same column maxima, so the launches
//! come apart into two calls with an exchange between them
//! ([`SoftmaxColsMode`]):
//! - `Maxima`: launch 1, then the groups split over the workers as in launch 3,
//!   the six maxima of a group combined and stored (`max`, `[blocks][16]` f16);
//! - `Shifted { g }`: launch 2 with `M` the maximum of the `g` tiles' rows of
//!   `maxes` instead of the six workers', and launch 3 storing the sums
//!   themselves (`sum`): a tile's column can then lie far below `M`, and only the
//!   tiles' sums added give the denominator.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, IntOp, MReg, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, code_bytes, int, inti, ld32, ld32m, m, setzi};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{bcast2, bcast4, fbin, fun, simple_contract, split_snippet};
use crate::softmax::{AZ, D0, D1, End, Issue, S1, S2, SC, W, X, add2, ai, bi, block, ld64, mi};
use crate::{
    Call, Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

/// What a call computes (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoftmaxColsMode {
    /// The softmax of one tile's keys: `e` (`out`) and `1/sum` (`recip`).
    Full,
    /// Each column's maximum over the valid rows (`max`), nothing else.
    Maxima,
    /// `e` (`out`) shifted by the maxima of the `g` rows of `maxes` (`[g][blocks][16]`
    /// f16, each row a tile's `max`), and each column's sum of them (`sum`,
    /// `[blocks][16]` f32).
    Shifted { g: u32 },
}

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
    /// [`crate::Softmax::SCALE_MAX`]). Unused by `Maxima`.
    pub scale: f32,
    pub mode: SoftmaxColsMode,
}

/// Largest `g` of `Shifted`: the last row of `maxes` is then at most `11 * groups`
/// words from the first, inside the `ld64` offset range `validate` keeps for the
/// state (`12 * groups` words).
const SHIFTED_G_MAX: u32 = 12;

/// The launches, in the order a mode runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// Launch 1: each worker's maxima of its rows.
    Max,
    /// Launch 2: the exponentials and each worker's sums.
    Exp,
    /// Launch 3: the groups split over the workers, the six workers' results
    /// combined.
    Groups,
}

/// A worker record (words): its first row of block 0 in `in`, its rows, the
/// group-offset table, its maxima, everyone's maxima, its sums, its padding rows,
/// `scale` as f16 (low half); launch 3: its first group's partial sums, its first `1/sum`,
/// its groups; then its first row in `out`. Pointers into the state are offsets
/// from the record. The other modes keep the positions, words they do not use zero:
/// `Maxima`'s launch 3 reads its first group's six maxima and `max` where `Full`'s
/// reads the sums and `recip`; `Shifted` has the address of `maxes` for everyone's
/// maxima (not an offset: it is an operand) and `sum` for `recip`.
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
/// Zeros for the padding rows of [`SoftmaxCols::exp_pairs`], set once a launch.
const PAIRS_ZERO: u8 = 12;

/// `ld64step`/`st64step` increment down a column: one 32-byte row.
const ROW_STEP: i8 = 4;

/// Issues of the emitted code, counted while emitting: the estimate reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Tally {
    /// Launch 1: before the group loop, one pair of groups without its repeat,
    /// the end.
    max_setup: u64,
    max_group: u64,
    /// Launch 2, the same (a group, or a pair where it takes pairs), and the
    /// issues of its row repeat body.
    exp_setup: u64,
    exp_group: u64,
    exp_row: u64,
    /// Launch 3: with groups, before the loop and one group; without, all.
    sum_setup: u64,
    sum_group: u64,
    sum_idle: u64,
    /// Entry offsets, in launch order (the two-launch modes leave the last zero).
    entries: [u32; 3],
}

const EXIT_ISSUES: u64 = 1;

fn max4(d: u8, x: u8, y: u8) -> Inst {
    fbin(FBinOp::Max, FVec::F16V4, d, x, y)
}

fn exp16(d: u8, x: u8) -> Inst {
    Inst::F16v2Exp { d: a(d), a: a(x) }
}

fn repeat(s: &mut Asm, count: MReg, body: &[Issue]) {
    s.rpt(count, |b| block(b, body, End::Aligned));
}

/// A row's f16 quad loaded from `base`, which steps down the column.
fn row_ld(d: u8, base: MReg) -> Inst {
    Inst::Ld64Step {
        d: a(d),
        base,
        inc: ROW_STEP,
    }
}

/// A row's f16 quad stored at `base`, which steps down the column.
fn row_st(r: u8, base: MReg) -> Inst {
    Inst::St64Step {
        s: a(r),
        base,
        inc: ROW_STEP,
    }
}

fn step_ld(d: u8) -> Inst {
    row_ld(d, RD)
}

fn step_st(r: u8) -> Inst {
    row_st(r, WR)
}

/// A group's offset from the table, the table advanced, the group's first row.
fn group_start() -> [Issue; 3] {
    [
        mi(ld32m(OFF, TAB, 0)),
        mi(inti(IntOp::Add, TAB, TAB, 4)),
        mi(int(IntOp::Add, RD, BASE, OFF)),
    ]
}

/// The second group of a pair's row pointer (launches 1 and 2 take groups in
/// pairs, 16 bytes of a row).
const RD1: MReg = MReg(12);

/// A pair's first group's offset (the table lists every group), the table
/// advanced past the pair, both groups' first rows (`RD`, `RD1`).
fn pair_start() -> [Issue; 4] {
    [
        mi(ld32m(OFF, TAB, 0)),
        mi(inti(IntOp::Add, TAB, TAB, 8)),
        mi(int(IntOp::Add, RD, BASE, OFF)),
        mi(inti(IntOp::Add, RD1, RD, 8)),
    ]
}

/// `MV` = the lane maxima of `rows` f16 quads `stride` words (of 8 bytes) apart
/// from `ptr` (`X` clobbered), and `ptr` advanced to the next group's.
fn column_max(ptr: MReg, rows: u32, stride: u32) -> Vec<Issue> {
    column_max_into(MV, X, ptr, rows, stride)
}

/// [`column_max`] into `dst`, with `tmp` clobbered.
fn column_max_into(dst: u8, tmp: u8, ptr: MReg, rows: u32, stride: u32) -> Vec<Issue> {
    if rows == 1 {
        return vec![mi(Inst::Ld64Step {
            d: a(dst),
            base: ptr,
            inc: 1,
        })];
    }
    let at = |k: u32| ld64(tmp, ptr, (k * stride) as u16);
    let mut v = vec![mi(ld64(dst, ptr, 0)), mi(at(1))];
    for k in 2..rows {
        v.push(bi(at(k), max4(dst, dst, tmp)));
    }
    v.push(bi(inti(IntOp::Add, ptr, ptr, 8), max4(dst, dst, tmp)));
    v
}

impl SoftmaxCols {
    pub const NAME: &'static str = "softmax_cols_f16";

    pub fn new(blocks: u32, rows: u32, n: u32, scale: f32) -> SoftmaxCols {
        SoftmaxCols {
            blocks,
            rows,
            n,
            scale,
            mode: SoftmaxColsMode::Full,
        }
    }

    /// The column maxima of a tile's run of keys: operands `in` and `max`.
    pub fn maxima(blocks: u32, rows: u32, n: u32) -> SoftmaxCols {
        SoftmaxCols {
            mode: SoftmaxColsMode::Maxima,
            ..SoftmaxCols::new(blocks, rows, n, 1.0)
        }
    }

    /// The exponentials and sums of a tile's run of keys, shifted by the maxima of
    /// `g` tiles' runs: operands `in`, `out`, `maxes` and `sum`.
    pub fn shifted(blocks: u32, rows: u32, n: u32, scale: f32, g: u32) -> SoftmaxCols {
        SoftmaxCols {
            mode: SoftmaxColsMode::Shifted { g },
            ..SoftmaxCols::new(blocks, rows, n, scale)
        }
    }

    fn launches(&self) -> &'static [Launch] {
        match self.mode {
            SoftmaxColsMode::Full => &[Launch::Max, Launch::Exp, Launch::Groups],
            SoftmaxColsMode::Maxima => &[Launch::Max, Launch::Groups],
            SoftmaxColsMode::Shifted { .. } => &[Launch::Exp, Launch::Groups],
        }
    }

    /// Rows of maxima launch 2 reduces, and whether they are the workers' own
    /// (in the state, at offsets from the record) rather than `maxes`.
    fn exp_maxima(&self) -> (u32, bool) {
        match self.mode {
            SoftmaxColsMode::Shifted { g } => (g, false),
            _ => (WORKERS, true),
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
        let mut s = Asm::new(code_base);
        let mut t = Tally::default();
        for (i, launch) in self.launches().iter().enumerate() {
            t.entries[i] = s.at() - code_base;
            match launch {
                Launch::Max => self.max_launch(&mut s, &mut t),
                Launch::Exp => self.exp_launch(&mut s, &mut t),
                Launch::Groups => self.groups_launch(&mut s, &mut t),
            }
        }
        Ok((s.finish(), t))
    }

    /// Launch 1: the maxima.
    fn max_launch(&self, s: &mut Asm, t: &mut Tally) {
        let n0 = s.len();
        block(
            s,
            &[
                mi(ld32m(BASE, m(0), 0)),
                mi(ld32m(CNT, m(0), 1)),
                mi(inti(IntOp::Sub, CNT, CNT, 2)),
                mi(ld32m(TAB, m(0), 2)),
                mi(int(IntOp::Add, TAB, TAB, m(0))),
                mi(ld32m(MX, m(0), 3)),
                mi(int(IntOp::Add, MX, MX, m(0))),
                mi(setzi(GI, self.groups() / 2)),
            ],
            End::Any,
        );
        // Two groups at a time (16 bytes of a row): a row is two issues, a load
        // and a `f16v4max` each, as for one group alone, but the pair shares one
        // head and one tail.
        const X1: u8 = D0;
        let max = |d: u8, x: u8| max4(d, d, x);
        let st = |r: u8| Inst::St64Step {
            s: a(r),
            base: MX,
            inc: 1,
        };
        let lp = s.label();
        s.bind(lp);
        let n1 = s.len();
        // The pair's pointers, both groups' first two rows.
        let mut head = pair_start().to_vec();
        head.extend([
            mi(row_ld(S1, RD)),
            mi(row_ld(S2, RD1)),
            mi(row_ld(X, RD)),
            mi(row_ld(X1, RD1)),
        ]);
        block(s, &head, End::BeforeRpt);
        repeat(
            s,
            CNT,
            &[
                bi(row_ld(X, RD), max(S1, X)),
                bi(row_ld(X1, RD1), max(S2, X1)),
            ],
        );
        block(
            s,
            &[
                ai(max(S1, X)),
                bi(st(S1), max(S2, X1)),
                mi(st(S2)),
                mi(inti(IntOp::Sub, GI, GI, 1)),
            ],
            End::Any,
        );
        s.brnz(GI, lp);
        t.max_group = (s.len() - n1) as u64;
        s.i(Inst::Exit);
        t.max_setup = (n1 - n0) as u64 + EXIT_ISSUES;
    }

    /// Launch 2: the exponentials and the partial sums.
    fn exp_launch(&self, s: &mut Asm, t: &mut Tally) {
        let g4 = self.groups();
        let (maxima, own) = self.exp_maxima();
        let wide = self.wide();
        let n0 = s.len();
        let mut setup = vec![
            mi(ld32m(BASE, m(0), 0)),
            mi(ld32m(CNT, m(0), 1)),
            mi(inti(IntOp::Sub, CNT, CNT, 1)),
            mi(ld32m(TAB, m(0), 2)),
            mi(int(IntOp::Add, TAB, TAB, m(0))),
            mi(ld32m(MX, m(0), 4)),
        ];
        if own {
            setup.push(mi(int(IntOp::Add, MX, MX, m(0))));
        }
        setup.extend([
            mi(ld32m(SW, m(0), 5)),
            mi(int(IntOp::Add, SW, SW, m(0))),
            mi(ld32m(PADN, m(0), 6)),
            mi(ld32(a(SCV), m(0), 7)),
            if wide {
                // The padding rows' zeros (see `exp_pairs`).
                bi(setzi(GI, g4 / 2), bcast2(PAIRS_ZERO, AZ))
            } else {
                bi(setzi(GI, g4), bcast4(SCV, SCV))
            },
            // Last: it overwrites the record pointer.
            mi(ld32m(BASE_OUT, m(0), 11)),
        ]);
        block(s, &setup, End::Any);
        if wide {
            return Self::exp_pairs(s, t, (maxima, g4), n0);
        }
        let lp = s.label();
        s.bind(lp);
        let n1 = s.len();
        let mut head = group_start().to_vec();
        head.push(mi(int(IntOp::Add, WR, BASE_OUT, OFF)));
        // The group's column maxima: the six workers' or the tiles' rows (`g4`
        // groups apart either way).
        head.extend(column_max(MX, maxima, g4));
        head.push(mi(step_ld(X)));
        block(s, &head, End::BeforeRpt);
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
        repeat(s, CNT, &row);
        // The last row without a load; the sums out of the accumulators (which
        // leaves them zero for the next group); the padding rows zeroed (a repeat
        // of none on all but the last worker).
        let mut last = vec![sub];
        if !unscaled {
            last.push(ai(mul));
        }
        block(
            s,
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
        repeat(s, PADN, &[mi(step_st(X))]);
        s.brnz(GI, lp);
        t.exp_group = (s.len() - n1) as u64;
        s.i(Inst::Exit);
        t.exp_setup = (n1 - n0) as u64 + EXIT_ISSUES;
    }

    /// Launch 2 of an unscaled softmax, two groups (eight columns, 16 bytes of a
    /// row) at a time: a row is seven issues where two groups take eight, since
    /// one `f16v8acc` sums both groups' exponentials (the arithmetic is otherwise
    /// the same, so are the results). Besides the four exponentials and the two
    /// subtractions, the main pipe loads and stores each group through its own
    /// stepping pointer; the loop is rotated by one issue so that a row's second
    /// store goes beside the next row's first subtraction.
    fn exp_pairs(s: &mut Asm, t: &mut Tally, (maxima, g4): (u32, u32), n0: usize) {
        // `$a` quads and pairs: the scores, the pairs' maxima, the exponentials
        // (`E8` a quad, as `f16v8acc` reads it); the sums leave through the first
        // four pairs.
        const X0: u8 = 0;
        const MV0: u8 = 2;
        const X1: u8 = 4;
        const MV1: u8 = 6;
        const E8: u8 = 8;
        const WR1: MReg = MReg(13);
        let (ld, st) = (row_ld, row_st);
        let sub = |x: u8, mv: u8| fbin(FBinOp::Sub, FVec::F16V4, x, x, mv);
        let acc8 = Inst::F16Acc {
            a: a(E8),
            quad: true,
        };
        let lp = s.label();
        s.bind(lp);
        let n1 = s.len();
        // The pair's pointers, both groups' column maxima, the first row's loads
        // and its first subtraction. (A single word last: the `rpt` must follow
        // at 4 mod 8.)
        let mut head = pair_start().to_vec();
        head.push(mi(int(IntOp::Add, WR, BASE_OUT, OFF)));
        head.extend(column_max_into(MV0, E8, MX, maxima, g4));
        head.push(mi(ld(X0, RD)));
        head.extend(column_max_into(MV1, E8, MX, maxima, g4));
        head.extend([
            bi(ld(X1, RD1), sub(X0, MV0)),
            mi(inti(IntOp::Add, WR1, WR, 8)),
        ]);
        block(s, &head, End::BeforeRpt);
        // A row from its first exponential to the next row's first subtraction.
        let row = [
            ai(exp16(E8, X0)),
            ai(exp16(E8 + 1, X0 + 1)),
            bi(ld(X0, RD), sub(X1, MV1)),
            bi(st(E8, WR), exp16(E8 + 2, X1)),
            ai(exp16(E8 + 3, X1 + 1)),
            bi(ld(X1, RD1), acc8),
            bi(st(E8 + 2, WR1), sub(X0, MV0)),
        ];
        t.exp_row = row.len() as u64;
        repeat(s, CNT, &row);
        // The last row, without loads; the sums out of the accumulators (which
        // leaves them zero for the next pair) and stored; a zero pair for the
        // padding rows, which the last worker stores (a repeat of none on the
        // others).
        let gina = |d: u8| Inst::F32v2Gina { d: a(d) };
        let sums = |r: u8| Inst::St64Step {
            s: a(r),
            base: SW,
            inc: 1,
        };
        let last = [
            bi(inti(IntOp::Sub, GI, GI, 1), exp16(E8, X0)),
            ai(exp16(E8 + 1, X0 + 1)),
            ai(sub(X1, MV1)),
            bi(st(E8, WR), exp16(E8 + 2, X1)),
            ai(exp16(E8 + 3, X1 + 1)),
            ai(acc8),
            bi(st(E8 + 2, WR1), gina(X0)),
            bi(sums(X0), gina(MV0)),
            bi(sums(MV0), gina(X1)),
            bi(sums(X1), gina(MV1)),
            mi(sums(MV1)),
        ];
        block(s, &last, End::BeforeRpt);
        repeat(s, PADN, &[mi(st(PAIRS_ZERO, WR)), mi(st(PAIRS_ZERO, WR1))]);
        s.brnz(GI, lp);
        t.exp_group = (s.len() - n1) as u64;
        s.i(Inst::Exit);
        t.exp_setup = (n1 - n0) as u64 + EXIT_ISSUES;
    }

    /// Launch 3: the groups split over the workers, each group's six workers'
    /// results combined: the partial sums added and their reciprocals (`Full`) or
    /// the sums themselves (`Shifted`); the maxima (`Maxima`).
    fn groups_launch(&self, s: &mut Asm, t: &mut Tally) {
        let g4 = self.groups() as u16;
        let n0 = s.len();
        let done = s.label();
        let (sp, rp) = (MReg(2), MReg(3));
        s.i(ld32m(CNT, m(0), 10));
        s.brz(CNT, done);
        t.sum_idle = (s.len() - n0) as u64 + EXIT_ISSUES;
        block(
            s,
            &[
                mi(ld32m(sp, m(0), 8)),
                mi(int(IntOp::Add, sp, sp, m(0))),
                mi(ld32m(rp, m(0), 9)),
            ],
            End::BeforeRpt,
        );
        let n1 = s.len();
        let store_step = |r: u8| {
            mi(Inst::St64Step {
                s: a(r),
                base: rp,
                inc: 1,
            })
        };
        let body = match self.mode {
            SoftmaxColsMode::Full => {
                let mut body = vec![mi(ld64(S1, sp, 0)), mi(ld64(S2, sp, 1))];
                for k in 1..WORKERS as u16 {
                    let at = 2 * k * g4;
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
                body
            }
            SoftmaxColsMode::Shifted { .. } => {
                // Each worker's lanes 2-3 are added as the next worker's 0-1 load.
                let mut body = vec![mi(ld64(S1, sp, 0)), mi(ld64(S2, sp, 1))];
                for k in 1..WORKERS as u16 {
                    let at = 2 * k * g4;
                    body.push(if k == 1 {
                        mi(ld64(X, sp, at))
                    } else {
                        bi(ld64(X, sp, at), add2(S2, W))
                    });
                    body.push(bi(ld64(W, sp, at + 1), add2(S1, X)));
                }
                body.extend([
                    bi(inti(IntOp::Add, sp, sp, 16), add2(S2, W)),
                    store_step(S1),
                    store_step(S2),
                ]);
                body
            }
            SoftmaxColsMode::Maxima => {
                let mut body = column_max(sp, WORKERS, u32::from(g4));
                body.push(store_step(MV));
                body
            }
        };
        repeat(s, CNT, &body);
        t.sum_group = (s.len() - n1 - 1) as u64;
        t.sum_setup = (n1 - n0) as u64 + 1 + EXIT_ISSUES;
        s.bind(done);
        s.i(Inst::Exit);
    }

    /// The emitted code's counts; all zero for parameters the kernel refuses, whose
    /// estimate is then meaningless but does not fail (callers validate first).
    fn tally(&self) -> Tally {
        self.program(0).map(|(_, t)| t).unwrap_or_default()
    }

    /// Worker issue slots of a launch.
    fn launch_slots(&self, t: &Timing, tl: &Tally, launch: Launch) -> Vec<u64> {
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
                    // Two groups at a time; the emitted pair holds the row body
                    // (two issues) once, and it runs r - 2 times.
                    Launch::Max => tl.max_setup + g4 / 2 * (tl.max_group + 2 * r).saturating_sub(6),
                    // The emitted group (a pair, wide) holds the row body once and
                    // the padding store once; the body runs r - 1 times, the store
                    // `pad` (two issues wide). Two `f16v2exp` a row of a group,
                    // each holding its slot `f16_exp_issues`.
                    Launch::Exp if self.wide() => {
                        tl.exp_setup
                            + g4 / 2
                                * (tl.exp_group + tl.exp_row * r + 2 * pad)
                                    .saturating_sub(2 * tl.exp_row + 2)
                            + g4 * 2 * r * u64::from(t.f16_exp_issues.saturating_sub(1))
                    }
                    Launch::Exp => {
                        tl.exp_setup
                            + g4 * (tl.exp_group + tl.exp_row * r + pad)
                                .saturating_sub(2 * tl.exp_row + 1)
                            + g4 * 2 * r * u64::from(t.f16_exp_issues.saturating_sub(1))
                    }
                    Launch::Groups => match u64::from(sums[w].1) {
                        0 => tl.sum_idle,
                        c => crate::issue_slots(
                            t,
                            tl.sum_setup + c * tl.sum_group,
                            c * self.recips_a_group(),
                        ),
                    },
                }
            })
            .collect()
    }
}

impl Kernel for SoftmaxCols {
    fn symbol(&self) -> String {
        let unscaled = if self.unscaled() { "_u" } else { "" };
        let (scaling, mode) = match self.mode {
            SoftmaxColsMode::Full => (unscaled, String::new()),
            SoftmaxColsMode::Maxima => ("", "_max".to_string()),
            SoftmaxColsMode::Shifted { g } => (unscaled, format!("_sh{g}")),
        };
        format!(
            "{}_b{}_r{}_n{}{scaling}{mode}",
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
            return Err(invalid(&name, "rows above 4095 or more than 85 blocks"));
        }
        if u64::from(self.blocks) * u64::from(self.rows) * 32 >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        if let SoftmaxColsMode::Shifted { g } = self.mode
            && !(1..=SHIFTED_G_MAX).contains(&g)
        {
            return Err(invalid(&name, "g must be 1..=12"));
        }
        if self.mode != SoftmaxColsMode::Maxima {
            crate::softmax::check_scale(&name, self.scale)?;
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        // `program` validates and checks the code base.
        crate::single_entry(self, code_base, || {
            self.program(code_base).map(|(w, _)| w).unwrap_or_default()
        })
    }

    fn contract(&self) -> Contract {
        let scores = self.blocks * self.rows * 32;
        let operands = match self.mode {
            SoftmaxColsMode::Full => vec![
                Operand::new("in", Role::Input, scores, 8),
                Operand::new("out", Role::Output, scores, 8),
                Operand::new("recip", Role::Output, self.groups() * 16, 8),
            ],
            SoftmaxColsMode::Maxima => vec![
                Operand::new("in", Role::Input, scores, 8),
                Operand::new("max", Role::Output, self.groups() * 8, 8),
            ],
            SoftmaxColsMode::Shifted { g } => vec![
                Operand::new("in", Role::Input, scores, 8),
                Operand::new("out", Role::Output, scores, 8),
                Operand::new("maxes", Role::Input, g * self.groups() * 8, 8),
                Operand::new("sum", Role::Output, self.groups() * 16, 8),
            ],
        };
        let mut c = simple_contract(self, operands, self.state_bytes());
        c.supervisor_bytes = code_bytes(&split_snippet(
            0,
            0,
            &[0; 3][..self.launches().len()],
            STRIDE,
        ));
        c
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let x = operand(addrs, &name, "in")?;
        let mode = self.mode;
        let full = mode == SoftmaxColsMode::Full;
        let maxima = mode == SoftmaxColsMode::Maxima;
        let shifted = matches!(mode, SoftmaxColsMode::Shifted { .. });
        // Words a mode does not use are zero (`Maxima` has no `out`).
        let out = if maxima {
            0
        } else {
            operand(addrs, &name, "out")?
        };
        let result = operand(
            addrs,
            &name,
            match mode {
                SoftmaxColsMode::Full => "recip",
                SoftmaxColsMode::Maxima => "max",
                SoftmaxColsMode::Shifted { .. } => "sum",
            },
        )?;
        let tiles_maxes = match mode {
            SoftmaxColsMode::Shifted { .. } => operand(addrs, &name, "maxes")?,
            _ => 0,
        };
        let g4 = self.groups();
        // State pointers are offsets from the worker's record (`$m0`): the state's
        // own address is the caller's.
        let records = u32::from(STRIDE) * WORKERS;
        let tab = records;
        let (maxes_bytes, _) = self.scratch_bytes();
        let maxes = tab + (4 * g4).next_multiple_of(8);
        let sums = maxes + maxes_bytes;
        let rows = split(self.n);
        let groups = split(g4);
        let mut buf = StateBuf::default();
        for (w, &(r0, r)) in rows.iter().enumerate() {
            let last = w + 1 == WORKERS as usize;
            let (gi0, gn) = groups[w];
            let w = w as u32;
            let record = w * u32::from(STRIDE);
            let only = |used: bool, v: u32| if used { v } else { 0 };
            buf.u32(x + r0 * 32)
                .u32(r)
                .u32(tab - record)
                .u32(only(!shifted, maxes + w * g4 * 8 - record))
                .u32(if full { maxes - record } else { tiles_maxes })
                .u32(only(!maxima, sums + w * g4 * 16 - record))
                .u32(only(last && !maxima, self.rows - self.n))
                .u32(only(!maxima, u32::from(self.scale16().to_bits())))
                .u32(if maxima {
                    maxes + gi0 * 8 - record
                } else {
                    sums + gi0 * 16 - record
                })
                .u32(result + gi0 * if maxima { 8 } else { 16 })
                .u32(gn)
                .u32(only(!maxima, out + r0 * 32))
                .pad_to((record + u32::from(STRIDE)) as usize);
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
        let launches = self.launches().len();
        Ok(split_snippet(
            call.entry,
            call.state + st.runall_offset,
            &self.tally().entries[..launches],
            st.stride,
        ))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let tl = self.tally();
        let launches = self.launches();
        let words = split_snippet(0, 0, &tl.entries[..launches.len()], STRIDE);
        crate::supervisor_cycles(t, &words, |i| self.launch_slots(t, &tl, launches[i]))
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

    /// Whether launch 2 takes two groups at a time ([`SoftmaxCols::exp_pairs`]):
    /// unscaled, where a row of two groups fits seven issues.
    fn wide(&self) -> bool {
        self.mode != SoftmaxColsMode::Maxima && self.unscaled()
    }

    /// Bytes of the state's workers' maxima and of their sums: each only in the
    /// modes whose launches use it.
    fn scratch_bytes(&self) -> (u32, u32) {
        let g4 = self.groups();
        let launches = self.launches();
        let has = |l: Launch| u32::from(launches.contains(&l));
        (
            has(Launch::Max) * 8 * WORKERS * g4,
            has(Launch::Exp) * 16 * WORKERS * g4,
        )
    }

    fn state_bytes(&self) -> u32 {
        let (maxes, sums) = self.scratch_bytes();
        u32::from(STRIDE) * WORKERS + (4 * self.groups()).next_multiple_of(8) + maxes + sums
    }

    /// f32 reciprocals a group of launch 3 takes: `Full`'s four `1/sum`.
    fn recips_a_group(&self) -> u64 {
        if self.mode == SoftmaxColsMode::Full {
            4
        } else {
            0
        }
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
        // The maxima take no scale; the shifted exponentials check theirs and `g`.
        assert!(SoftmaxCols::maxima(2, 40, 13).validate().is_ok());
        assert!(
            SoftmaxCols {
                scale: f32::NAN,
                ..SoftmaxCols::maxima(2, 40, 13)
            }
            .validate()
            .is_ok()
        );
        assert!(SoftmaxCols::maxima(1, 16, 11).validate().is_err());
        assert!(SoftmaxCols::maxima(0, 16, 12).validate().is_err());
        let shifted_g = |g| SoftmaxCols::shifted(1, 736, 729, 0.125, g).validate();
        for g in [1, 2, 6, 12] {
            assert!(shifted_g(g).is_ok());
        }
        assert!(shifted_g(0).is_err());
        assert!(shifted_g(13).is_err());
        assert!(SoftmaxCols::shifted(1, 16, 11, 1.0, 2).validate().is_err());
        assert!(SoftmaxCols::shifted(1, 32, 32, 16.5, 2).validate().is_err());
        assert!(SoftmaxCols::new(86, 12, 12, 1.0).validate().is_err());
        // The largest `g` at the most blocks: its last row's offset encodes.
        let code = SoftmaxCols::shifted(85, 12, 12, 1.0, 12).emit(0).unwrap();
        assert!(tessera_isa::encode(&code.words).is_ok());
        // Refused parameters still estimate without failing.
        for k in [
            SoftmaxCols::new(0, 0, 0, 1.0),
            SoftmaxCols::new(1, 16, 3, 1.0),
            SoftmaxCols::maxima(1, 16, 3),
            SoftmaxCols::shifted(1, 16, 3, 1.0, 2),
            SoftmaxCols::shifted(1, 16, 16, 1.0, 0),
        ] {
            let _ = k.estimate_cycles();
        }
    }

    #[test]
    fn modes_have_their_own_symbols_operands_and_snippets() {
        let full = SoftmaxCols::new(2, 40, 13, 1.0);
        let max = SoftmaxCols::maxima(2, 40, 13);
        let sh = SoftmaxCols::shifted(2, 40, 13, 1.0, 3);
        assert_eq!(full.symbol(), "softmax_cols_f16_b2_r40_n13_u");
        assert_eq!(max.symbol(), "softmax_cols_f16_b2_r40_n13_max");
        assert_eq!(sh.symbol(), "softmax_cols_f16_b2_r40_n13_u_sh3");
        assert_eq!(
            SoftmaxCols::shifted(2, 40, 13, 0.5, 3).symbol(),
            "softmax_cols_f16_b2_r40_n13_sh3"
        );
        let ops = |k: &SoftmaxCols| {
            k.contract()
                .operands
                .iter()
                .map(|o| (o.name.clone(), o.role, o.bytes))
                .collect::<Vec<_>>()
        };
        let state = |k: &SoftmaxCols| k.state_bytes();
        assert_eq!(
            ops(&max),
            [
                ("in".to_string(), Role::Input, 2 * 40 * 32),
                ("max".to_string(), Role::Output, 64),
                ("state".to_string(), Role::State, state(&max)),
            ]
        );
        assert_eq!(
            ops(&sh),
            [
                ("in".to_string(), Role::Input, 2 * 40 * 32),
                ("out".to_string(), Role::Output, 2 * 40 * 32),
                ("maxes".to_string(), Role::Input, 3 * 64),
                ("sum".to_string(), Role::Output, 128),
                ("state".to_string(), Role::State, state(&sh)),
            ]
        );
        // Records, the group table, then only the scratch a mode's launches use.
        assert_eq!(state(&full), 336 + 32 + 6 * 24 * 8);
        assert_eq!(state(&max), 336 + 32 + 6 * 8 * 8);
        assert_eq!(state(&sh), 336 + 32 + 6 * 16 * 8);
        assert_eq!(full.contract().supervisor_bytes, 40);
        assert_eq!(max.contract().supervisor_bytes, 28);
        assert_eq!(sh.contract().supervisor_bytes, 28);
    }

    #[test]
    fn layout_needs_no_padding_nop() {
        for k in [
            SoftmaxCols::new(1, 736, 729, 0.125),
            SoftmaxCols::new(2, 736, 729, 0.125),
            SoftmaxCols::new(3, 40, 13, 0.5),
            SoftmaxCols::maxima(1, 736, 729),
            SoftmaxCols::maxima(3, 40, 13),
            SoftmaxCols::shifted(1, 736, 729, 0.125, 2),
            SoftmaxCols::shifted(2, 736, 729, 1.0, 1),
            SoftmaxCols::shifted(3, 40, 13, 0.5, 6),
            SoftmaxCols::shifted(1, 40, 13, 1.0, 5),
        ] {
            crate::tests::assert_no_padding_nop(&k);
        }
    }
}

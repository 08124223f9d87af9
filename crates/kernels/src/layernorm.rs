//! `layernorm`: `y = (x - mean) / sqrt(var + eps) * gamma + beta` over rows of
//! `width` f16, statistics in f32.
//!
//! Workers own contiguous row ranges. Per row, three passes over the row:
//! 1. sum: `f16v4acc` into the worker's four f32 lane accumulators, then added;
//! 2. sum of squared deviations from the mean, squared and summed in f32 (two-pass:
//!    no cancellation when the mean is large relative to the spread); the
//!    deviations themselves are taken in f16 from the mean rounded to f16;
//! 3. normalise: `y = x rstd - mean rstd` summed in the worker's f32
//!    accumulators from exact f16 products and f16 parts of the constants (rstd
//!    and `mean rstd` each as a rounded part and the rest), rounded to f16 once on
//!    the way out (`f16v2gina`), then `beta + y * gamma` with one f16 `fmac`
//!    (computed in f32, rounded once): seven issues a group, where converting to
//!    f32 and back takes nine.
//!
//! Each group of four elements is one 64-bit load; the loops are rotated so the
//! last operation of one group shares an issue with the first load of the next,
//! with the first group peeled instead of over-reading past the row.
//!
//! With fewer rows than workers (a tile of a row-split LayerNorm holds one or two
//! rows), whole rows per worker leave most workers idle, so a second variant splits
//! every row's groups across the workers in three launches, one per pass. Each
//! worker writes its f32 partial of a pass into a scratch area after the worker
//! records; the next launch's workers all add the six partials in the same order,
//! so they agree on the mean and variance without a supervisor that has no float
//! registers. The variant is chosen per call by the estimate.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, IntOp, Word};
use tessera_machine::{Machine, Timing};

use crate::asm::{Asm, Label, MZ, a, int, inti, ld32, ld32m, m, mov, setzi};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::softmax::{End, Issue, ai, bi, block, mi};
use crate::{
    Call, Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
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
/// Record stride of the column-split variant (eleven words, 8-byte aligned).
const SPLIT_STRIDE: u16 = 48;
/// Scratch bytes per row of the column-split variant: six f32 sums, six f32 sums of
/// squared deviations.
const SPLIT_ROW_BYTES: u32 = 2 * 4 * WORKERS;
/// Most rows the column split is considered for: its scratch grows with the rows,
/// and from a few rows per worker whole rows keep every worker busy anyway.
const SPLIT_MAX_ROWS: u32 = 16;
/// Supervisor bytes of the column split: `setzi` x2, then per launch `runall`,
/// `sync local`, and a `setzi` of the next entry.
pub(crate) const SPLIT_SNIPPET_BYTES: u32 = 40;

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
/// Lane 0 of the f16 pair `$a{x}` into all four lanes of the pair `$a{d}:d+1`.
pub(crate) fn bcast4(d: u8, x: u8) -> Inst {
    Inst::FBcast {
        vec: FVec::F16V4,
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

    /// Whether this call splits rows' columns across the workers: only where every
    /// worker gets a group, and only where the estimate (on the c600 tile, so the
    /// choice never depends on the timing a caller estimates with) says it is faster.
    pub fn column_split(&self) -> bool {
        let t = &Machine::c600().timing;
        self.groups() >= WORKERS
            && self.rows <= SPLIT_MAX_ROWS
            && self.split_cycles(t) < self.rows_cycles(t)
    }

    /// One group of pass 3; `store` is false for the peeled first group, whose
    /// rotated-in store belongs to a group that does not exist. Seven issues, four
    /// of them beside a load or the store: the group before's `beta + y * gamma`
    /// (its `y` read from `$a0:1` as this group's `x` is loaded there), then `y =
    /// x rstd + c` summed in the worker's f32 accumulators from exact products
    /// (`x rstd_hi`, `x rstd_lo`) and the two f16 parts of `c`, taken out rounded
    /// to f16 once.
    fn normalise_group(s: &mut Asm, store: bool) {
        let acc = |x: u8| Inst::F16Acc {
            a: a(x),
            quad: false,
        };
        s.b(ld64s(0, 4), fmac(FVec::F16V4, 8, 0, 10));
        s.b(
            if store { st64s(8, 3) } else { Inst::Nop },
            Inst::F16v4Cmac { a: a(0), b: a(6) },
        );
        s.b(ld64s(10, 8), Inst::F16v4Cmac { a: a(0), b: a(4) });
        s.b(ld64s(8, 9), acc(2));
        s.i(acc(12));
        s.i(Inst::F16v2Gina { d: a(0) });
        s.i(Inst::F16v2Gina { d: a(1) });
    }

    /// Pass 3's constants, each in all four f16 lanes, from the mean pair
    /// `$a12:13` and the rstd pair `$a6:7`: `c = -mean rstd` as `c_hi` (rounded)
    /// in `$a2:3` and `c_lo` (the rest, rounded) in `$a12:13`, rstd as `rstd_hi`
    /// in `$a6:7` and `rstd_lo` in `$a4:5`. Two f16 parts carry a constant to 21
    /// bits, or to 2^-25 where the low part is subnormal (a constant under about
    /// 1/8, as rstd is for a standard deviation over 8): for a
    /// standard deviation under 2048 either is far finer than `y`'s one rounding,
    /// whatever the mean's size, since the cancellation of `x rstd` against `c`
    /// happens in the f32 accumulators.
    fn normalise_constants(s: &mut Asm) {
        use FBinOp::*;
        // The f32 pair at `$a{x}` as f16 parts: the rounded value in all four
        // lanes of `$a{hi}` and the rest in all four of `$a{lo}` (through `$a0`
        // and `$a4:5`).
        let split = |s: &mut Asm, x: u8, hi: u8, lo: u8| {
            s.i(to_f16(0, x));
            s.i(to_f32(4, 0));
            s.i(fbin(Sub, FVec::F32V2, 4, x, 4));
            s.i(to_f16(lo, 4));
            s.i(bcast4(lo, lo));
            s.i(bcast4(hi, 0));
        };
        s.i(fbin(Mul, FVec::F32, 2, 12, 6));
        s.i(fun(FUnOp::Neg, 2, 2));
        s.i(bcast2(2, 2));
        split(s, 2, 2, 12);
        split(s, 6, 6, 4);
    }

    /// Pass 1 over `$m7` groups at `$m4`: the f32 sum into `$a6`. Each group is
    /// one `{ ld64 ; f16v4acc }` issue into the worker's accumulators (lane sums in
    /// f32, one per lane), loads leading by one issue; then the four lane sums
    /// are taken out and added. The accumulators are left zero.
    fn sum_pass(s: &mut Asm) {
        let acc = Inst::F16Acc {
            a: a(0),
            quad: false,
        };
        s.single_or_bundle(ld64s(0, 4));
        s.i(inti(IntOp::Sub, m(10), m(7), 1));
        s.rpt(m(10), |b| b.b(ld64s(0, 4), acc));
        s.i(acc);
        Self::lane_sums(s, 6, 6);
    }

    /// The four lane sums out of the accumulators (leaving them zero) into the
    /// pair `$a{pair}` and `$a2:3`, added into `$a{d}`.
    fn lane_sums(s: &mut Asm, pair: u8, d: u8) {
        s.i(Inst::F32v2Gina { d: a(pair) });
        s.i(Inst::F32v2Gina { d: a(2) });
        s.i(fbin(FBinOp::Add, FVec::F32V2, pair, pair, 2));
        s.i(Inst::FSum {
            vec: FVec::F32V2,
            d: a(d),
            a: a(pair),
        });
    }

    /// Pass 2 over `$m7` groups at `$m4`, mean pair in `$a12:13`: the f32 sum of
    /// squared deviations into `$a14`. The deviations are taken from the mean
    /// rounded to f16 (`m16`), in f16: each is then rounded relative to itself,
    /// not to the mean, and the sum of their squares exceeds the true one by `n
    /// (mean - m16)^2`, at most `2^-22 (mean / std)^2` of it. Each group's four
    /// squares go into the worker's accumulators by one `f16v4cmac` (an f16
    /// product is exact in f32), beside the next group's load: two issues a
    /// group, against five squaring in f32 registers.
    fn deviation_pass(s: &mut Asm) {
        use FBinOp::*;
        let sub = fbin(Sub, FVec::F16V4, 2, 0, 6);
        let cmac = Inst::F16v4Cmac { a: a(2), b: a(2) };
        // `m16` in all four lanes of `$a6:7`; group j's deviations in `$a2:3` are
        // squared beside group j+1's load; the first group is peeled, the last
        // one's squares follow the repeat.
        block(
            s,
            &[
                ai(to_f16(6, 12)),
                ai(bcast4(6, 6)),
                mi(ld64s(0, 4)),
                mi(inti(IntOp::Sub, m(10), m(7), 1)),
                ai(sub),
            ],
            End::BeforeRpt,
        );
        s.rpt(m(10), |b| {
            b.b(ld64s(0, 4), cmac);
            b.i(sub);
        });
        s.i(cmac);
        Self::lane_sums(s, 8, 14);
    }

    /// `$a14` = variance sum times `1 / width` plus eps, then the rstd pair `$a6:7`.
    fn rstd(s: &mut Asm) {
        use FBinOp::*;
        s.i(ld32(a(6), m(0), 6));
        s.i(fbin(Mul, FVec::F32, 14, 14, 6));
        s.i(ld32(a(6), m(0), 7)); // eps
        s.i(fbin(Add, FVec::F32, 14, 14, 6));
        s.i(fun(FUnOp::Rsqrt, 14, 14));
        s.i(bcast2(6, 14));
    }

    /// Pass 3 over `$m10 + 1` groups: x at `$m4`, y at `$m3`, gamma at `$m8`, beta
    /// at `$m9`, mean pair `$a12:13`, rstd pair `$a6:7`.
    fn normalise_pass(s: &mut Asm) {
        Self::normalise_constants(s);
        Self::normalise_group(s, false);
        s.rpt(m(10), |b| Self::normalise_group(b, true));
        s.i(fmac(FVec::F16V4, 8, 0, 10));
        s.i(st64s(8, 3));
    }

    /// The whole-row variant: each worker owns a contiguous range of rows.
    fn emit_rows(&self, s: &mut Asm) {
        use FBinOp::*;
        let done = s.label();
        let row = s.label();
        s.i(ld32m(m(2), m(0), 0)); // current row of x
        s.i(ld32m(m(3), m(0), 1)); // y, linear
        s.i(ld32m(m(6), m(0), 4)); // rows left
        s.brz(m(6), done);
        s.i(ld32m(m(7), m(0), 5)); // groups per row
        s.i(inti(IntOp::Sub, m(10), m(7), 1));
        s.bind(row);
        s.i(mov(m(4), m(2)));
        Self::sum_pass(s);
        s.i(ld32(a(14), m(0), 6)); // 1 / width
        s.i(fbin(Mul, FVec::F32, 6, 6, 14));
        s.i(bcast2(12, 6)); // mean pair
        s.i(mov(m(4), m(2)));
        Self::deviation_pass(s);
        Self::rstd(s);
        s.i(mov(m(4), m(2)));
        s.i(ld32m(m(8), m(0), 2)); // gamma
        s.i(ld32m(m(9), m(0), 3)); // beta
        Self::normalise_pass(s);
        s.i(mov(m(2), m(4)));
        s.i(inti(IntOp::Sub, m(6), m(6), 1));
        s.brnz(m(6), row);
        s.bind(done);
        s.i(Inst::Exit);
    }

    /// The six f32 partials of a row at `$m{base}` (8-byte aligned) summed into
    /// `$a{d}` in worker order, `((p0 + p1) + p2) + ...` as every worker adds them:
    /// three `ld64` pairs into `$a8:9` and `$a10:11`, each beside an add, so six
    /// issues where a load and an add a partial take eleven. `with` goes beside
    /// the fourth add.
    fn sum_partials(base: u8, d: u8, with: Option<Inst>) -> Vec<Issue> {
        use FBinOp::Add;
        let ld = |r: u8, imm: u16| Inst::Ld64 {
            d: a(r),
            base: m(base),
            imm,
        };
        let add = |x: u8, y: u8| fbin(Add, FVec::F32, d, x, y);
        let fourth = match with {
            Some(main) => bi(main, add(d, 11)),
            None => ai(add(d, 11)),
        };
        vec![
            mi(ld(8, 0)),
            bi(ld(10, 1), add(8, 9)),
            bi(ld(8, 2), add(d, 10)),
            fourth,
            ai(add(d, 8)),
            ai(add(d, 9)),
        ]
    }

    /// The mean pair `$a12:13` from the six sum partials of a row at `$m13`, added
    /// in worker order by every worker alike.
    fn combine_mean(s: &mut Asm) {
        use FBinOp::*;
        let mut v = Self::sum_partials(13, 6, Some(ld32(a(14), m(0), 6))); // 1 / width
        v.push(ai(fbin(Mul, FVec::F32, 6, 6, 14)));
        v.push(ai(bcast2(12, 6)));
        block(s, &v, End::Any);
    }

    /// Common prologue of a column-split launch: x chunk of row 0 in `$m2`, rows in
    /// `$m6`, groups in `$m7`, row bytes in `$m11`, the sum partials of row 0 in
    /// `$m13` and the squared-deviation partials in `$m14`.
    fn split_prologue(s: &mut Asm) {
        s.i(ld32m(m(2), m(0), 0));
        s.i(ld32m(m(6), m(0), 4));
        s.i(ld32m(m(7), m(0), 5));
        s.i(ld32m(m(11), m(0), 8));
        s.i(ld32m(m(13), m(0), 9));
        s.i(int(IntOp::Add, m(13), m(13), m(0)));
        s.i(ld32m(m(14), m(0), 10));
        s.i(int(IntOp::Add, m(14), m(14), m(0)));
        // This worker's partial slot: `$m1` is its index.
        s.i(inti(IntOp::Shl, m(1), m(1), 2));
    }

    /// Row loop tail of a column-split launch: the next row's chunk and partials.
    fn split_next_row(s: &mut Asm, row: Label, y: bool) {
        s.i(int(IntOp::Add, m(2), m(2), m(11)));
        if y {
            s.i(int(IntOp::Add, m(5), m(5), m(11)));
        }
        s.i(inti(IntOp::Add, m(13), m(13), SPLIT_ROW_BYTES as u16 / 2));
        s.i(inti(IntOp::Add, m(14), m(14), SPLIT_ROW_BYTES as u16 / 2));
        s.i(inti(IntOp::Sub, m(6), m(6), 1));
        s.brnz(m(6), row);
        s.i(Inst::Exit);
    }

    /// A launch that leaves one f32 partial per row in the table at `m(table)`
    /// (this worker's slot): per row, `before` (what the pass needs first), the
    /// pass over the worker's chunk, then the partial in `a(result)` stored.
    fn partial_launch(
        s: &mut Asm,
        table: u8,
        before: impl Fn(&mut Asm),
        pass: impl Fn(&mut Asm),
        result: u8,
    ) {
        let row = s.label();
        Self::split_prologue(s);
        s.i(int(IntOp::Add, m(12), m(table), m(1)));
        s.bind(row);
        before(s);
        s.i(mov(m(4), m(2)));
        pass(s);
        s.i(Inst::St32 {
            s: a(result),
            base: m(12),
            imm: 0,
        });
        s.i(inti(IntOp::Add, m(12), m(12), SPLIT_ROW_BYTES as u16 / 2));
        Self::split_next_row(s, row, false);
    }

    /// The column-split variant's three launches; returns their entry offsets.
    fn emit_split(&self, s: &mut Asm) -> [u32; 3] {
        let base = s.at();
        let mut entries = [0; 3];
        // Launch 1: partial sums.
        Self::partial_launch(s, 13, |_| {}, Self::sum_pass, 6);
        // Launch 2: partial sums of squared deviations from the combined mean.
        entries[1] = s.at() - base;
        Self::partial_launch(s, 14, Self::combine_mean, Self::deviation_pass, 14);
        // Launch 3: normalise the chunk with the combined statistics.
        entries[2] = s.at() - base;
        let row = s.label();
        Self::split_prologue(s);
        s.i(ld32m(m(5), m(0), 1)); // y chunk of the current row
        s.i(inti(IntOp::Sub, m(10), m(7), 1));
        s.bind(row);
        Self::combine_mean(s);
        block(s, &Self::sum_partials(14, 14, None), End::Any);
        Self::rstd(s);
        s.i(mov(m(4), m(2)));
        s.i(mov(m(3), m(5)));
        s.i(ld32m(m(8), m(0), 2)); // gamma chunk
        s.i(ld32m(m(9), m(0), 3)); // beta chunk
        Self::normalise_pass(s);
        Self::split_next_row(s, row, true);
        entries
    }

    /// Entry offsets of the column split's launches from the code base.
    fn split_entries(&self) -> [u32; 3] {
        self.emit_split(&mut Asm::new(0))
    }

    /// Worker issues of the whole-row variant with `r` rows.
    fn rows_issues(&self, t: &Timing, r: u32) -> u64 {
        let g = u64::from(self.groups());
        match u64::from(r) {
            0 => 5,
            r => crate::issue_slots(t, 7 + r * (10 * g + 51), r),
        }
    }

    fn rows_cycles(&self, t: &Timing) -> u64 {
        crate::single_shot_cycles(
            t,
            split(self.rows)
                .into_iter()
                .map(|(_, r)| self.rows_issues(t, r)),
        )
    }

    /// Worker issues of each column-split launch for a chunk of `g` groups.
    fn split_issues(&self, t: &Timing, launch: usize, g: u32) -> u64 {
        let (r, g) = (u64::from(self.rows), u64::from(g));
        match launch {
            0 => 11 + r * (g + 16),
            1 => 11 + r * (2 * g + 24),
            _ => crate::issue_slots(t, 12 + r * (7 * g + 48), r),
        }
    }

    fn split_cycles(&self, t: &Timing) -> u64 {
        let words = split_snippet(0, 0, &[0, 4, 8], SPLIT_STRIDE);
        crate::supervisor_cycles(t, &words, |launch| {
            split(self.groups())
                .into_iter()
                .map(|(_, g)| self.split_issues(t, launch, g))
                .collect()
        })
    }
}

/// The column split's supervisor snippet: one launch an entry (the column split
/// has three, `softmax_cols` two or three), each waited for, the workers of one
/// reading what the previous one's wrote.
pub(crate) fn split_snippet(entry: u32, state: u32, entries: &[u32], stride: u16) -> Vec<Word> {
    let run = [
        Word::Single(Inst::RunAll {
            entry: m(0),
            state: m(1),
            stride,
        }),
        Word::Single(Inst::SyncLocal),
    ];
    let mut w = vec![
        Word::Single(setzi(m(0), entry + entries[0])),
        Word::Single(setzi(m(1), state)),
    ];
    w.extend(run);
    for e in &entries[1..] {
        w.push(Word::Single(setzi(m(0), entry + e)));
        w.extend(run);
    }
    w
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
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        if self.column_split() {
            self.emit_split(&mut s);
        } else {
            self.emit_rows(&mut s);
        }
        Ok(KernelCode {
            symbol: self.symbol(),
            code_base,
            entry: code_base,
            words: s.finish(),
        })
    }

    fn contract(&self) -> Contract {
        let bytes = self.rows * self.width * 2;
        let operands = vec![
            Operand::new("in", Role::Input, bytes, 8),
            Operand::new("gamma", Role::Weights, self.width * 2, 8),
            Operand::new("beta", Role::Weights, self.width * 2, 8),
            Operand::new("out", Role::Output, bytes, 8),
        ];
        if self.column_split() {
            let state = u32::from(SPLIT_STRIDE) * WORKERS + self.rows * SPLIT_ROW_BYTES;
            let mut c = simple_contract(self, operands, state);
            c.supervisor_bytes = SPLIT_SNIPPET_BYTES;
            c
        } else {
            simple_contract(self, operands, u32::from(STRIDE) * WORKERS)
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let gamma = operand(addrs, &name, "gamma")?;
        let beta = operand(addrs, &name, "beta")?;
        let row_bytes = self.width * 2;
        let inv_width = crate::mutation::factor("layernorm") / self.width as f32;
        let mut buf = StateBuf::default();
        if self.column_split() {
            let stride = u32::from(SPLIT_STRIDE);
            let sums = stride * WORKERS;
            let squares = sums + self.rows * SPLIT_ROW_BYTES / 2;
            for (i, (g0, g)) in split(self.groups()).into_iter().enumerate() {
                let record = i as u32 * stride;
                buf.u32(inp + g0 * 8)
                    .u32(out + g0 * 8)
                    .u32(gamma + g0 * 8)
                    .u32(beta + g0 * 8)
                    .u32(self.rows)
                    .u32(g)
                    .f32(inv_width)
                    .f32(self.eps)
                    .u32(row_bytes)
                    .u32(sums - record)
                    .u32(squares - record)
                    .pad_to((i + 1) * usize::from(SPLIT_STRIDE));
            }
            // The partials need no initial value: each is written before it is read.
            buf.pad_to((stride * WORKERS + self.rows * SPLIT_ROW_BYTES) as usize);
            return Ok(buf.finish(SPLIT_STRIDE));
        }
        for (i, (r0, r)) in split(self.rows).into_iter().enumerate() {
            buf.u32(inp + r0 * row_bytes)
                .u32(out + r0 * row_bytes)
                .u32(gamma)
                .u32(beta)
                .u32(r)
                .u32(self.groups())
                .f32(inv_width)
                .f32(self.eps)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn supervisor(&self, call: &Call<'_>, code_base: u32) -> Result<Vec<Word>, KernelError> {
        let _ = code_base;
        let st = self.state(call.addrs)?;
        if !self.column_split() {
            return crate::runall_snippet(&self.symbol(), call, &st);
        }
        // The checks of the single-shot snippet cover the first launch; the other
        // entries lie inside the same code.
        crate::runall_snippet(&self.symbol(), call, &st)?;
        Ok(split_snippet(
            call.entry,
            call.state + st.runall_offset,
            &self.split_entries(),
            st.stride,
        ))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        if self.column_split() {
            self.split_cycles(t)
        } else {
            self.rows_cycles(t)
        }
    }
}

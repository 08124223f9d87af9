//! The addition family: `add` (two `[n]` f16 operands), `add_bias` (a `[n]` vector
//! broadcast over `[rows, n]`) and `reduce_add` (`k` stacked `[n]` inputs summed in
//! f32).
//!
//! All three split the columns into six contiguous runs of 4-element groups (so a
//! broadcast bias pointer only rewinds per row) and stream 64-bit words. `add` and
//! `add_bias` load one group ahead, with the first group peeled; `out` may be the same
//! buffer as `a` (each group is stored after it is loaded), never a partial overlap.

use tessera_isa::{FBinOp, FUnOp, FVec, Inst, IntOp, MReg, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m, mov, setzi};
use crate::contract::{Contract, MemClass, Operand, Role, separate_all};
use crate::layernorm::{fbin, ld64s, simple_contract, st64s, to_f16};
use crate::softmax::{End, Issue, ai, bi, block, mi};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

const STRIDE: u16 = 32;

/// `out = a + b`, `n` f16 each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Add {
    pub n: u32,
    /// `a`, `b` and `out` in three different memory elements (the contract asks
    /// for it): see [`Add::apart`].
    pub apart: bool,
}

/// `out[r] = a[r] + bias` for `rows` rows of `n` f16.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddBias {
    pub rows: u32,
    pub n: u32,
}

/// `out = sum over i < k of in[i]`, `in` is `[k][n]` f16, accumulated in f32; with
/// addends, `+ b` (`n` f16, a linear's bias slab) and then `+ c` (a residual) in the
/// same f32 sum, so the separate `add`s and their roundings go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceAdd {
    pub k: u32,
    pub n: u32,
    /// 0, 1 (`b`) or 2 (`b` and `c`).
    pub addends: u8,
}

/// `out = (sum over i < k of in[i]) / (sum over i < k of sums[i])`: `in` is
/// `[k][n]` f16 summed in f32, `sums` `k` f32 (the denominators of a softmax cut over
/// tiles, whose numerators `in` are already multiplied out).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceNorm {
    pub k: u32,
    pub n: u32,
}

impl Add {
    pub const NAME: &'static str = "add_f16";
    pub fn new(n: u32) -> Add {
        Add { n, apart: false }
    }

    /// The same sum where `out` is neither `a` nor shares an element with `a` or
    /// `b`: one issue a group of four (`{ ld2xst64pace ; f16v4add }`, the store two
    /// groups behind the loads) instead of three. The attention's merge adds two
    /// tiles' products this way.
    pub fn apart(n: u32) -> Add {
        Add { n, apart: true }
    }
}
impl AddBias {
    pub const NAME: &'static str = "add_bias_f16";
    pub fn new(rows: u32, n: u32) -> AddBias {
        AddBias { rows, n }
    }

    /// Whether the bias stays in the workers' registers (`$a0..$a7`) and each
    /// worker takes whole rows: rows of 8 or 16 columns (a linear's bias added
    /// block by block), which a split of the columns over six workers would leave
    /// two workers idle and the others one group a row, each row paying its
    /// pointer moves and loop. The groups go in pairs (see [`narrow_bias_code`]).
    fn narrow(&self) -> bool {
        matches!(self.n, 8 | 16)
    }
}
impl ReduceAdd {
    pub const NAME: &'static str = "reduce_add_f16";
    pub fn new(k: u32, n: u32) -> ReduceAdd {
        ReduceAdd { k, n, addends: 0 }
    }

    /// The same reduction with the operand `b` added in.
    pub fn with_addend(self) -> ReduceAdd {
        ReduceAdd { addends: 1, ..self }
    }

    /// The same reduction with the operands `b` and `c` added in, in that order.
    pub fn with_addends(self) -> ReduceAdd {
        ReduceAdd { addends: 2, ..self }
    }
}

impl ReduceNorm {
    pub const NAME: &'static str = "reduce_norm_f16";
    pub fn new(k: u32, n: u32) -> ReduceNorm {
        ReduceNorm { k, n }
    }
}

fn check_columns(name: &str, rows: u32, n: u32) -> Result<(), KernelError> {
    if rows == 0 || n == 0 || !n.is_multiple_of(4) {
        return Err(invalid(
            name,
            "rows must be positive and n a positive multiple of 4",
        ));
    }
    if (n / 4).div_ceil(WORKERS) > RPT_MAX + 1 {
        return Err(invalid(name, "more than 4096 groups of 4 per worker"));
    }
    if u64::from(rows) * u64::from(n) * 2 >= 1 << 20 {
        return Err(invalid(name, "operand larger than tile memory"));
    }
    Ok(())
}

/// The contract of `out = a op b` over `bytes` each, 8-byte aligned, with worker
/// records of `stride` bytes.
pub(crate) fn binary_contract<K: Kernel + ?Sized>(k: &K, bytes: u32, stride: u16) -> Contract {
    simple_contract(
        k,
        vec![
            Operand::new("a", Role::Input, bytes, 8),
            Operand::new("b", Role::Input, bytes, 8),
            Operand::new("out", Role::Output, bytes, 8),
        ],
        u32::from(stride) * WORKERS,
    )
}

/// Worker code shared by `add` and `add_bias`: the broadcast is only a different row
/// step for `b` in the state.
fn binary_code(code_base: u32) -> Vec<Word> {
    let mut s = Asm::new(code_base);
    let done = s.label();
    let row = s.label();
    s.i(ld32m(m(2), m(0), 0)); // a row
    s.i(ld32m(m(3), m(0), 1)); // b row
    s.i(ld32m(m(4), m(0), 2)); // out row
    s.i(ld32m(m(5), m(0), 3)); // groups
    s.brz(m(5), done);
    s.i(ld32m(m(6), m(0), 4)); // rows
    s.i(ld32m(m(7), m(0), 5)); // row bytes of a and out
    s.i(ld32m(m(8), m(0), 6)); // row bytes of b (0: broadcast)
    s.i(inti(IntOp::Sub, m(9), m(5), 1));
    s.bind(row);
    s.i(mov(m(10), m(2)));
    s.i(mov(m(11), m(3)));
    s.i(mov(m(12), m(4)));
    s.i(ld64s(0, 10));
    s.i(ld64s(2, 11));
    s.rpt(m(9), |b| {
        b.b(ld64s(0, 10), fbin(FBinOp::Add, FVec::F16V4, 4, 0, 2));
        b.i(ld64s(2, 11));
        b.i(st64s(4, 12));
    });
    s.i(fbin(FBinOp::Add, FVec::F16V4, 4, 0, 2));
    s.i(st64s(4, 12));
    s.i(int(IntOp::Add, m(2), m(2), m(7)));
    s.i(int(IntOp::Add, m(3), m(3), m(8)));
    s.i(int(IntOp::Add, m(4), m(4), m(7)));
    s.i(inti(IntOp::Sub, m(6), m(6), 1));
    s.brnz(m(6), row);
    s.bind(done);
    s.i(Inst::Exit);
    s.finish()
}

/// Worker code of [`Add::apart`]: one issue a group once the pipeline is full.
/// Issue t loads group t, adds group t-1 and stores group t-2; in a bundle both
/// pipes read before either writes, so the load and the add each see the previous
/// issue's registers. Three streams in one issue need three elements: the contract
/// keeps `a`, `b` and `out` apart.
fn apart_code(code_base: u32) -> Vec<Word> {
    let mut s = Asm::new(code_base);
    let done = s.label();
    let one = s.label();
    let add = fbin(FBinOp::Add, FVec::F16V4, 4, 0, 2);
    let load = Inst::Ld2x64Pace {
        d0: a(0),
        d1: a(2),
        p0: m(10),
        p1: m(11),
    };
    let load_store = Inst::Ld2xSt64Pace {
        d0: a(0),
        d1: a(2),
        s: a(4),
        p0: m(10),
        p1: m(11),
        ps: m(12),
    };
    s.i(ld32m(m(5), m(0), 3)); // groups
    s.brz(m(5), done);
    s.i(ld32m(m(10), m(0), 0)); // a
    s.i(ld32m(m(11), m(0), 1)); // b
    s.i(ld32m(m(12), m(0), 2)); // out
    s.i(inti(IntOp::Sub, m(9), m(5), 1));
    s.brz(m(9), one);
    block(
        &mut s,
        &[mi(load), bi(load, add), mi(inti(IntOp::Sub, m(9), m(9), 1))],
        End::BeforeRpt,
    );
    s.rpt(m(9), |b| block(b, &[bi(load_store, add)], End::Aligned));
    block(&mut s, &[bi(st64s(4, 12), add), mi(st64s(4, 12))], End::Any);
    s.i(Inst::Exit);
    s.bind(one);
    s.i(load);
    s.i(add);
    s.i(st64s(4, 12));
    s.bind(done);
    s.i(Inst::Exit);
    s.finish()
}

/// Worker issues of [`apart_code`] with `g` groups.
fn apart_issues(g: u64) -> u64 {
    match g {
        0 => 3,
        1 => 11,
        g => g + 12,
    }
}

fn binary_state(rows: u32, n: u32, a: u32, b: u32, out: u32, broadcast: bool) -> VertexState {
    let mut buf = StateBuf::default();
    for (i, (g0, g)) in split(n / 4).into_iter().enumerate() {
        buf.u32(a + g0 * 8)
            .u32(b + g0 * 8)
            .u32(out + g0 * 8)
            .u32(g)
            .u32(rows)
            .u32(n * 2)
            .u32(if broadcast { 0 } else { n * 2 })
            .pad_to((i + 1) * usize::from(STRIDE));
    }
    buf.finish(STRIDE)
}

/// Worker code of a narrow [`AddBias`] (`groups`, 2 or 4, groups a row): the bias
/// in `$a0..`, a worker's rows in one contiguous run, two issues a group. Groups go
/// in pairs, two loads each beside an add and then the two stores, so that the
/// bundles stay 8-byte aligned without padding. The last row's last load reads the
/// worker's own record instead of the word past its rows, so no worker reads past
/// its rows.
fn narrow_bias_code(code_base: u32, groups: u32) -> Vec<Word> {
    let g = groups as u8;
    let mut s = Asm::new(code_base);
    let done = s.label();
    s.i(ld32m(m(2), m(0), 0)); // a
    s.i(ld32m(m(3), m(0), 1)); // bias
    s.i(ld32m(m(4), m(0), 2)); // out
    s.i(ld32m(m(5), m(0), 3)); // rows
    s.brz(m(5), done);
    for q in 0..g {
        s.i(ld64s(2 * q, 3));
    }
    s.i(inti(IntOp::Sub, m(6), m(5), 1));
    s.i(ld64s(8, 2));
    // A row: pairs of { load the next group ; add this one } and their stores.
    let row = |b: &mut Asm, last: bool| {
        for pair in 0..g / 2 {
            for k in 0..2 {
                let q = 2 * pair + k;
                let from = if last && q == g - 1 { 0 } else { 2 };
                b.b(
                    ld64s(8, from),
                    fbin(FBinOp::Add, FVec::F16V4, 10 + 2 * k, 8, 2 * q),
                );
            }
            b.i(st64s(10, 4));
            b.i(st64s(12, 4));
        }
    };
    s.rpt(m(6), |b| row(b, false));
    row(&mut s, true);
    s.bind(done);
    s.i(Inst::Exit);
    s.finish()
}

/// Issues of a narrow [`AddBias`]'s worker with `rows` rows of `groups` groups.
fn narrow_bias_issues(rows: u32, groups: u32) -> u64 {
    let (r, g) = (u64::from(rows), u64::from(groups));
    match r {
        // The header loads, the branch and `exit`.
        0 => 6,
        // And the bias loads, the count, the first load, `rpt`, two issues a group.
        r => 9 + g + 2 * g * r,
    }
}

fn binary_cycles(t: &Timing, rows: u32, n: u32) -> u64 {
    crate::single_shot_cycles(
        t,
        split(n / 4).into_iter().map(|(_, g)| match u64::from(g) {
            0 => 6,
            g => 10 + u64::from(rows) * (11 + 3 * g),
        }),
    )
}

impl Kernel for Add {
    fn symbol(&self) -> String {
        let apart = if self.apart { "_apart" } else { "" };
        format!("{}_n{}{apart}", Self::NAME, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        check_columns(&self.symbol(), 1, self.n)
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        if self.apart {
            crate::single_entry(self, code_base, || apart_code(code_base))
        } else {
            crate::single_entry(self, code_base, || binary_code(code_base))
        }
    }
    fn contract(&self) -> Contract {
        let mut c = binary_contract(self, self.n * 2, STRIDE);
        if self.apart {
            separate_all(&mut c.operands, &["a", "b", "out"]);
        }
        c
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        Ok(binary_state(
            1,
            self.n,
            operand(addrs, &name, "a")?,
            operand(addrs, &name, "b")?,
            operand(addrs, &name, "out")?,
            false,
        ))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        if self.apart {
            crate::single_shot_cycles(
                t,
                split(self.n / 4)
                    .into_iter()
                    .map(|(_, g)| apart_issues(u64::from(g))),
            )
        } else {
            binary_cycles(t, 1, self.n)
        }
    }
}

impl Kernel for AddBias {
    fn symbol(&self) -> String {
        format!("{}_r{}_n{}", Self::NAME, self.rows, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        check_columns(&self.symbol(), self.rows, self.n)?;
        if self.narrow() && self.rows.div_ceil(WORKERS) > RPT_MAX + 1 {
            return Err(invalid(&self.symbol(), "more than 4096 rows per worker"));
        }
        Ok(())
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        if self.narrow() {
            return crate::single_entry(self, code_base, || {
                narrow_bias_code(code_base, self.n / 4)
            });
        }
        crate::single_entry(self, code_base, || binary_code(code_base))
    }
    fn contract(&self) -> Contract {
        let bytes = self.rows * self.n * 2;
        simple_contract(
            self,
            vec![
                Operand::new("a", Role::Input, bytes, 8),
                Operand::new("bias", Role::Weights, self.n * 2, 8),
                Operand::new("out", Role::Output, bytes, 8),
            ],
            u32::from(STRIDE) * WORKERS,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let (a, bias, out) = (
            operand(addrs, &name, "a")?,
            operand(addrs, &name, "bias")?,
            operand(addrs, &name, "out")?,
        );
        if self.narrow() {
            // Each worker's rows, contiguous.
            let row = self.n * 2;
            let mut buf = StateBuf::default();
            for (i, (r0, r)) in split(self.rows).into_iter().enumerate() {
                buf.u32(a + r0 * row)
                    .u32(bias)
                    .u32(out + r0 * row)
                    .u32(r)
                    .pad_to((i + 1) * usize::from(STRIDE));
            }
            return Ok(buf.finish(STRIDE));
        }
        Ok(binary_state(self.rows, self.n, a, bias, out, true))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        if self.narrow() {
            let g = self.n / 4;
            return crate::single_shot_cycles(
                t,
                split(self.rows)
                    .into_iter()
                    .map(|(_, r)| narrow_bias_issues(r, g)),
            );
        }
        binary_cycles(t, self.rows, self.n)
    }
}

impl Kernel for ReduceAdd {
    fn symbol(&self) -> String {
        let b = ["", "_b", "_bc"][usize::from(self.addends.min(2))];
        format!("{}_k{}_n{}{b}", Self::NAME, self.k, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.k < 2 || self.k - 1 > RPT_MAX {
            return Err(invalid(&name, "k must be 2..=4096 (k = 1 is a copy)"));
        }
        if self.addends > 2 {
            return Err(invalid(&name, "at most two addends"));
        }
        check_columns(&name, self.k, self.n)
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || {
            reduce_code(code_base, None, (self.k, self.n), self.addends)
        })
    }
    fn contract(&self) -> Contract {
        let mut ops = vec![
            reduce_input(self.k, self.n),
            Operand::new("out", Role::Output, self.n * 2, 8),
        ];
        // Read like more partials: 128 bits at a time on the wide path.
        for name in ["b", "c"].into_iter().take(usize::from(self.addends)) {
            let mut b = reduce_input(1, self.n);
            b.name = name.into();
            ops.push(b);
        }
        simple_contract(self, ops, u32::from(STRIDE) * WORKERS)
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        reduce_state(
            &self.symbol(),
            self.k,
            self.n,
            addrs,
            Extra::Addends(self.addends),
        )
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        reduce_cycles(t, self.k, self.n, false, self.addends)
    }
}

impl Kernel for ReduceNorm {
    fn symbol(&self) -> String {
        format!("{}_k{}_n{}", Self::NAME, self.k, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.k < 2 || self.k / 2 > RPT_MAX || self.k - 1 > RPT_MAX {
            return Err(invalid(&name, "k must be 2..=4096"));
        }
        check_columns(&name, self.k, self.n)
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || {
            reduce_code(code_base, Some(self.k), (self.k, self.n), 0)
        })
    }
    fn contract(&self) -> Contract {
        simple_contract(
            self,
            vec![
                reduce_input(self.k, self.n),
                Operand::new("sums", Role::Input, self.k * 4, 8),
                Operand::new("out", Role::Output, self.n * 2, 8),
            ],
            u32::from(STRIDE) * WORKERS,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        reduce_state(&self.symbol(), self.k, self.n, addrs, Extra::Sums)
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        reduce_cycles(t, self.k, self.n, true, 0)
    }
}

/// Whether a reduction over rows of `n` columns reads its octets with `ld128`.
fn wide(n: u32) -> bool {
    n.is_multiple_of(8)
}

/// Most partials a wide reduction unrolls (8 bytes of code each).
const UNROLL_MAX: u32 = 64;

/// Whether a wide reduction of `k` partials unrolls its partial loop: every
/// partial's octet at an immediate `ld128` offset (12 bits of 16 bytes) from the
/// first one's, so a partial costs one issue (`{ ld128; f16v8acc }`) instead of two.
fn unrolled(k: u32, n: u32) -> bool {
    wide(n) && k <= UNROLL_MAX && k <= per_base(n)
}

/// Partials one base register reaches at `ld128` immediates (12 bits of 16-byte
/// atoms) when partial `j`'s octet is `j * n * 2 / 16` atoms on. Only for `wide(n)`.
fn per_base(n: u32) -> u32 {
    4095 / (n * 2 / 16) + 1
}

/// Whether the software-pipelined loop ([`pipelined_octets`]) serves `k` partials of
/// `n` columns: those one base register reaches, and up to as many again from a
/// second (`FAR`), re-formed beside every octet's drain. Without it, a wide
/// reduction whose partials are spread too far for the immediates (the So400m
/// `fc2`'s 18 partials of 2,448 columns: 83 KB) falls back to the rolled loop at
/// twice the issues an octet.
fn pipelined(k: u32, n: u32) -> bool {
    wide(n) && k <= UNROLL_MAX && k <= 2 * per_base(n)
}

/// The second base of [`pipelined_octets`], and the distance it keeps from `$m4`.
const FAR: MReg = MReg(5);
const FAR_DISTANCE: MReg = MReg(14);

fn reduce_input(k: u32, n: u32) -> Operand {
    let op = Operand::new("in", Role::Input, k * n * 2, 8);
    if wide(n) {
        Operand::new("in", Role::Input, k * n * 2, 16).class(MemClass::Interleaved)
    } else {
        op
    }
}

/// What a reduction's records carry besides the partials: `reduce_norm`'s
/// denominators (word 6), or the addends (`b` in word 7, `c` in word 6, each as its
/// distance from `in`, the same for every worker since all advance by the worker's
/// first column).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    Sums,
    Addends(u8),
}

fn reduce_state(
    name: &str,
    k: u32,
    n: u32,
    addrs: &OperandAddrs,
    extra: Extra,
) -> Result<VertexState, KernelError> {
    let inp = operand(addrs, name, "in")?;
    let out = operand(addrs, name, "out")?;
    let distance = |op: &str| Ok::<u32, KernelError>(operand(addrs, name, op)?.wrapping_sub(inp));
    let (word6, word7) = match extra {
        Extra::Sums => (operand(addrs, name, "sums")?, 0),
        Extra::Addends(0) => (0, 0),
        Extra::Addends(1) => (0, distance("b")?),
        Extra::Addends(_) => (distance("c")?, distance("b")?),
    };
    let mut buf = StateBuf::default();
    for (i, (o0, o, tail)) in reduce_split(n).into_iter().enumerate() {
        buf.u32(inp + o0 * 16)
            .u32(out + o0 * 16)
            .u32(o)
            .u32(n * 2)
            .u32(k - 1)
            .u32(u32::from(tail))
            .u32(word6)
            .u32(word7)
            .pad_to((i + 1) * usize::from(STRIDE));
    }
    Ok(buf.finish(STRIDE))
}

/// Worker issues as [`reduce_code`] emits them; `norm` adds the denominator's sum
/// (pairs, an odd last one, the pair reduction and `1/x` with its broadcast, the
/// reciprocal holding extra slots) and two products per half octet.
/// Addends add their pointers' loads and an alignment `nop` once, and per octet
/// each addend's address, load and accumulate (two issues wide, three otherwise;
/// three in the tail).
fn reduce_cycles(t: &Timing, k: u32, n: u32, norm: bool, addends: u8) -> u64 {
    let k64 = u64::from(k);
    let scaled = u64::from(norm);
    let prologue = if norm {
        let pairs = (k64 - 2) / 2;
        let repeat = if pairs > 0 { 1 + 2 * pairs } else { 0 };
        let pad = u64::from(pairs == 0);
        2 + repeat + 2 * (k64 % 2) + 2 + crate::issue_slots(t, 1, 1) + pad
    } else {
        0
    };
    let b = u64::from(addends);
    // One load per addend, and the alignment `nop` after a single one.
    let setup = if addends > 0 { 2 } else { 0 };
    // An addend is read like one more partial.
    let per_input = if wide(n) { 2 } else { 3 };
    let pipelined = pipelined(k, n) && !norm;
    let far = pipelined && k > per_base(n);
    // Unscaled, the drain reads the accumulators as f16 (`f16v2gina`): four
    // conversions an octet fewer, two in the tail.
    let converts = if norm { 4 } else { 0 };
    let per_octet = if pipelined {
        pipelined_octet_issues(k, addends)
    } else if unrolled(k, n) {
        // The partials one issue each, without the rolled loop's pointer copy,
        // pointer step and `rpt`.
        k64 + 2 * b + 8 + converts
    } else {
        per_input * (k64 + b) + 10 + converts
    };
    crate::single_shot_cycles(
        t,
        reduce_split(n).into_iter().map(|(_, o, tail)| {
            let tail = if tail {
                2 * k64 + 7 + converts / 2 + 2 * scaled + 3 * b
            } else {
                1
            };
            // The pipelined loop's setup: the addends' addresses, the first load,
            // the count, the `rpt`; with the second base, its distance and first
            // address.
            let pre = if pipelined && o > 0 {
                b + 3 + 2 * u64::from(far)
            } else {
                0
            };
            // Beside the octets, the drains' leftovers and the last octet's
            // second store.
            let drains = if pipelined && o > 0 {
                u64::from(o - 1) * pipelined_drain_extra(addends, far) + 1
            } else {
                0
            };
            8 + prologue + setup + pre + u64::from(o) * (per_octet + 4 * scaled) + drains + tail
        }),
    )
}

/// Each worker's octets (8 columns) of a `reduce_add` as (first, count), and whether
/// it also sums the trailing group of 4 columns: the last worker, whose octets (the
/// fewest) end where that group starts.
fn reduce_split(n: u32) -> Vec<(u32, u32, bool)> {
    let tail = n % 8 == 4;
    split(n / 8)
        .into_iter()
        .enumerate()
        .map(|(w, (o0, o))| (o0, o, tail && w as u32 == WORKERS - 1))
        .collect()
}

/// The octet loop of an unrolled `reduce_add` (no `norm`), software-pipelined:
/// each input's `{ ld128 ; f16v8acc }` loads the next one beside the previous
/// one's accumulation; the step of `$m4`, the addends' addresses and the next
/// octet's first load go beside the drain (four `f16v2gina`), whose second store
/// goes beside the next octet's last accumulation. An octet costs `k + b + 4`
/// issues (`b` addends), the aux pipe's floor, when at most one addend's address
/// is formed in the drain, and one issue more for each further main instruction
/// there; `k + 2b + 8` rolled the plain way. Partials past the immediates' reach
/// come from a second base (`FAR`), formed in the drain too, against `2 (k + b) +
/// 10` for the rolled loop they would otherwise need. The repeat body is rotated (a
/// drain, then the next octet's accumulations): the first octet's accumulations
/// lead it and the last drain, which loads nothing past its own octet, follows.
/// Expects `$m8` = octets (at least one), `$m4` at partial 0 of the first octet,
/// `$m3` at the output; leaves both past the last octet, as the rolled loop does.
fn pipelined_octets(s: &mut Asm, k: u32, n: u32, distances: &[MReg]) {
    let reach = per_base(n);
    let far = k > reach;
    // Partials past the first base's reach go from `FAR`, `reach` partials on.
    let at = |j: u32| {
        let (base, j) = if j < reach {
            (m(4), j)
        } else {
            (FAR, j - reach)
        };
        Inst::Ld128 {
            d: a(0),
            base,
            imm: (j * n * 2 / 16) as u16,
        }
    };
    let far_form = int(IntOp::Add, FAR, m(4), FAR_DISTANCE);
    let acc8 = Inst::F16Acc {
        a: a(0),
        quad: true,
    };
    let gina16 = |d| Inst::F16v2Gina { d: a(d) };
    // An addend's address, then its octet, from its own register: `$m11`, `$m10`.
    let addr = [m(11), m(10)];
    let addr = &addr[..distances.len()];
    let form = |i: usize| int(IntOp::Add, addr[i], m(4), distances[i]);
    let mut pre: Vec<Issue> = (0..distances.len()).map(|i| mi(form(i))).collect();
    if far {
        pre.push(mi(setzi(FAR_DISTANCE, reach * n * 2)));
        pre.push(mi(far_form));
    }
    pre.push(mi(at(0)));
    pre.push(mi(inti(IntOp::Sub, m(8), m(8), 1)));
    // An octet's accumulations, each beside the next input's load; the last one
    // beside the previous octet's second store (none for the first octet).
    let accumulate = |prev_store: bool| -> Vec<Issue> {
        let mut loads: Vec<Inst> = (1..k).map(at).collect();
        loads.extend(addr.iter().map(|&r| Inst::Ld128 {
            d: a(0),
            base: r,
            imm: 0,
        }));
        let mut v: Vec<Issue> = loads.into_iter().map(|l| bi(l, acc8)).collect();
        v.push(if prev_store {
            bi(st64s(12, 3), acc8)
        } else {
            ai(acc8)
        });
        v
    };
    // The drain and the first store; beside it the step of `$m4` and, when an
    // octet follows, its addends' addresses, second base and first load.
    let drain = |next: bool| -> Vec<Issue> {
        let mut beside = vec![inti(IntOp::Add, m(4), m(4), 16)];
        if next {
            beside.extend((0..addr.len()).map(form));
            if far {
                beside.push(far_form);
            }
            beside.push(at(0));
        }
        let mut beside = beside.into_iter();
        let mut v = Vec::new();
        let mut with = |aux: Inst, v: &mut Vec<Issue>| {
            v.push(match beside.next() {
                Some(main) => bi(main, aux),
                None => ai(aux),
            });
        };
        with(gina16(10), &mut v);
        with(gina16(11), &mut v);
        v.push(bi(st64s(10, 3), gina16(12)));
        with(gina16(13), &mut v);
        // What found no aux slot in the drain goes alone.
        v.extend(beside.map(mi));
        if !next {
            v.push(mi(st64s(12, 3)));
        }
        v
    };
    pre.extend(accumulate(false));
    block(s, &pre, End::BeforeRpt);
    let mut body = drain(true);
    body.extend(accumulate(true));
    s.rpt(m(8), |b| block(b, &body, End::Aligned));
    block(s, &drain(false), End::Any);
}

/// Issues of one octet of [`pipelined_octets`]: its accumulations and drain, the
/// aux pipe's floor.
fn pipelined_octet_issues(k: u32, addends: u8) -> u64 {
    u64::from(k) + u64::from(addends) + 4
}

/// Issues a drain followed by another octet adds: its step of `$m4`, the next
/// octet's addend addresses, second base and first load take the drain's three aux
/// slots without a partner, and what is left over goes alone.
fn pipelined_drain_extra(addends: u8, far: bool) -> u64 {
    (1 + u64::from(addends) + u64::from(far) + 1).saturating_sub(3)
}

/// `reduce_add` worker code. The accumulators (`f16v8acc`, `f32v2gina`) widen and
/// sum eight f16 per issue, so a partial costs three issues per eight columns (two
/// loads and a pointer step), against eight with `f16v2tof32` and `f32v2add`; the
/// sum is the same f32 sum in the same order.
///
/// With `norm` (`reduce_norm`, its `k`), every worker first sums the `k` f32
/// denominators into `$a8` (pairs at a time), takes `1/x` and broadcasts it to
/// `$a8:9`, and scales each f32 pair by it before rounding to f16.
///
/// When every octet start is 16-byte aligned (`wide`: `n % 8 == 0`, and the contract
/// asks for a 16-byte aligned `in` in interleaved memory), a partial's octet is one
/// `ld128`, so a partial costs two issues per eight columns instead of three; one
/// when the partials are few enough to be unrolled at immediate offsets
/// ([`unrolled`]).
fn reduce_code(code_base: u32, norm: Option<u32>, (k, n): (u32, u32), addends: u8) -> Vec<Word> {
    let unroll = unrolled(k, n);
    let pipelined = pipelined(k, n) && norm.is_none();
    let wide = wide(n);
    // `$m12` and `$m13` hold the addends' distances from `in` (`b`, `c`).
    let distances = [m(12), m(13)];
    let distances = &distances[..usize::from(addends)];
    let ld128 = || Inst::Ld128 {
        d: a(0),
        base: m(5),
        imm: 0,
    };
    let acc8 = Inst::F16Acc {
        a: a(0),
        quad: true,
    };
    let acc4 = Inst::F16Acc {
        a: a(0),
        quad: false,
    };
    let gina = |d| Inst::F32v2Gina { d: a(d) };
    let gina16 = |d| Inst::F16v2Gina { d: a(d) };
    let ld = |d, imm| Inst::Ld64 {
        d: a(d),
        base: m(5),
        imm,
    };
    let mut s = Asm::new(code_base);
    let tail = s.label();
    let done = s.label();
    let octet = s.label();
    s.i(ld32m(m(4), m(0), 0)); // partial 0 at the worker's first column
    s.i(ld32m(m(3), m(0), 1)); // output
    s.i(ld32m(m(8), m(0), 2)); // octets
    s.i(ld32m(m(6), m(0), 3)); // partial stride (bytes)
    s.i(ld32m(m(7), m(0), 4)); // k - 1
    s.i(ld32m(m(9), m(0), 5)); // trailing group of 4
    for (&d, word) in distances.iter().zip([7, 6]) {
        s.i(ld32m(d, m(0), word));
    }
    // The octet loop's bundles stay aligned: one issue here, not one per octet.
    if addends > 0 && !s.at().is_multiple_of(8) {
        s.i(Inst::Nop);
    }
    if let Some(k) = norm {
        s.i(ld32m(m(10), m(0), 6)); // denominators
        s.i(ld64s(8, 10));
        let pairs = (k - 2) / 2;
        if pairs > 0 {
            s.rpti(pairs as u16, |b| {
                b.i(ld64s(10, 10));
                b.i(fbin(FBinOp::Add, FVec::F32V2, 8, 8, 10));
            });
        }
        if k % 2 == 1 {
            s.i(Inst::Ld32 {
                d: a(10),
                base: m(10),
                imm: 0,
            });
            s.i(fbin(FBinOp::Add, FVec::F32, 8, 8, 10));
        }
        s.i(fbin(FBinOp::Add, FVec::F32, 8, 8, 9));
        s.i(Inst::FUn {
            op: FUnOp::Recip,
            d: a(8),
            a: a(8),
        });
        s.i(Inst::FBcast {
            vec: FVec::F32V2,
            d: a(8),
            a: a(8),
        });
        // Keep the bundles below where they were: one padding issue here, rather
        // than padding inside the loops.
        if !s.at().is_multiple_of(8) {
            s.i(Inst::Nop);
        }
    }
    let scale = |s: &mut Asm| {
        if norm.is_some() {
            s.i(fbin(FBinOp::Mul, FVec::F32V2, 4, 4, 8));
            s.i(fbin(FBinOp::Mul, FVec::F32V2, 6, 6, 8));
        }
    };
    s.brz(m(8), tail);
    if pipelined {
        pipelined_octets(&mut s, k, n, distances);
    } else {
        s.bind(octet);
        if unroll {
            // Partial j's octet is `j` strides on: each load beside the previous
            // partial's accumulation. (One word, then bundles: the loop starts where
            // the rolled one does, so what follows stays aligned.)
            let at = |j: u32| Inst::Ld128 {
                d: a(0),
                base: m(4),
                imm: (j * n * 2 / 16) as u16,
            };
            s.i(at(0));
            for j in 1..k {
                s.b(at(j), acc8);
            }
        } else {
            s.i(mov(m(5), m(4)));
            if wide {
                // Eight bytes like the two loads it replaces, so the bundles below stay
                // aligned without padding issues.
                s.b(ld128(), crate::asm::AUX_NOP);
            } else {
                s.i(ld(0, 0));
                s.i(ld(2, 1));
            }
            s.i(int(IntOp::Add, m(5), m(5), m(6)));
            // Each pass accumulates the previous partial while loading the next.
            s.rpt(m(7), |b| {
                if wide {
                    b.b(ld128(), acc8);
                    b.b(int(IntOp::Add, m(5), m(5), m(6)), crate::asm::AUX_NOP);
                } else {
                    b.b(ld(0, 0), acc8);
                    b.i(ld(2, 1));
                    b.i(int(IntOp::Add, m(5), m(5), m(6)));
                }
            });
        }
        for &d in distances {
            // The last partial (or addend) is accumulated while the next addend's
            // address is formed; the addend then goes in as one more partial.
            s.b(int(IntOp::Add, m(11), m(4), d), acc8);
            if wide {
                s.b(
                    Inst::Ld128 {
                        d: a(0),
                        base: m(11),
                        imm: 0,
                    },
                    crate::asm::AUX_NOP,
                );
            } else {
                s.i(Inst::Ld64 {
                    d: a(0),
                    base: m(11),
                    imm: 0,
                });
                s.i(Inst::Ld64 {
                    d: a(2),
                    base: m(11),
                    imm: 1,
                });
            }
        }
        s.b(inti(IntOp::Add, m(4), m(4), 16), acc8);
        if norm.is_some() {
            s.b(inti(IntOp::Sub, m(8), m(8), 1), gina(4));
            s.i(gina(6));
            scale(&mut s);
            s.i(to_f16(0, 4));
            s.i(to_f16(1, 6));
            s.b(st64s(0, 3), gina(4));
            s.i(gina(6));
            scale(&mut s);
            s.i(to_f16(2, 4));
            s.i(to_f16(3, 6));
        } else {
            // Unscaled, the accumulators come out already rounded to f16.
            s.b(inti(IntOp::Sub, m(8), m(8), 1), gina16(0));
            s.i(gina16(1));
            s.b(st64s(0, 3), gina16(2));
            s.i(gina16(3));
        }
        s.i(st64s(2, 3));
        s.brnz(m(8), octet);
    }
    s.bind(tail);
    s.brz(m(9), done);
    s.i(mov(m(5), m(4)));
    s.i(ld(0, 0));
    s.i(int(IntOp::Add, m(5), m(5), m(6)));
    s.rpt(m(7), |b| {
        b.b(ld(0, 0), acc4);
        b.i(int(IntOp::Add, m(5), m(5), m(6)));
    });
    for &d in distances {
        s.i(int(IntOp::Add, m(11), m(4), d));
        s.i(acc4);
        s.i(Inst::Ld64 {
            d: a(0),
            base: m(11),
            imm: 0,
        });
    }
    s.i(acc4);
    if norm.is_some() {
        s.i(gina(4));
        s.i(gina(6));
        scale(&mut s);
        s.i(to_f16(0, 4));
        s.i(to_f16(1, 6));
    } else {
        s.i(gina16(0));
        s.i(gina16(1));
    }
    s.i(st64s(0, 3));
    s.bind(done);
    s.i(Inst::Exit);
    s.finish()
}

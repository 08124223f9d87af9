//! The addition family: `add` (two `[n]` f16 operands), `add_bias` (a `[n]` vector
//! broadcast over `[rows, n]`) and `reduce_add` (`k` stacked `[n]` inputs summed in
//! f32).
//!
//! All three split the columns into six contiguous runs of 4-element groups (so a
//! broadcast bias pointer only rewinds per row) and stream 64-bit words. `add` and
//! `add_bias` load one group ahead, with the first group peeled; `out` may be the same
//! buffer as `a` (each group is stored after it is loaded), never a partial overlap.

use tessera_isa::{FBinOp, FVec, Inst, IntOp, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m, mov};
use crate::contract::{Contract, Operand, Role};
use crate::layernorm::{fbin, ld64s, simple_contract, st64s, to_f16, to_f32};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, WORKERS,
    invalid, operand, split,
};

const STRIDE: u16 = 32;

/// `out = a + b`, `n` f16 each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Add {
    pub n: u32,
}

/// `out[r] = a[r] + bias` for `rows` rows of `n` f16.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddBias {
    pub rows: u32,
    pub n: u32,
}

/// `out = sum over i < k of in[i]`, `in` is `[k][n]` f16, accumulated in f32.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReduceAdd {
    pub k: u32,
    pub n: u32,
}

impl Add {
    pub const NAME: &'static str = "add_f16";
    pub fn new(n: u32) -> Add {
        Add { n }
    }
}
impl AddBias {
    pub const NAME: &'static str = "add_bias_f16";
    pub fn new(rows: u32, n: u32) -> AddBias {
        AddBias { rows, n }
    }
}
impl ReduceAdd {
    pub const NAME: &'static str = "reduce_add_f16";
    pub fn new(k: u32, n: u32) -> ReduceAdd {
        ReduceAdd { k, n }
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

fn binary_cycles(t: &Timing, rows: u32, n: u32) -> u64 {
    crate::single_shot_cycles(
        t,
        split(n / 4).into_iter().map(|(_, g)| match u64::from(g) {
            0 => 6,
            g => 10 + u64::from(rows) * (11 + 3 * g),
        }),
    )
}

fn code(
    kernel: &impl Kernel,
    code_base: u32,
    words: impl FnOnce() -> Vec<Word>,
) -> Result<KernelCode, KernelError> {
    kernel.validate()?;
    crate::check_code_base(&kernel.symbol(), code_base, 8)?;
    Ok(KernelCode {
        symbol: kernel.symbol(),
        code_base,
        entry: code_base,
        words: words(),
    })
}

impl Kernel for Add {
    fn symbol(&self) -> String {
        format!("{}_n{}", Self::NAME, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        check_columns(&self.symbol(), 1, self.n)
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        code(self, code_base, || binary_code(code_base))
    }
    fn contract(&self) -> Contract {
        let bytes = self.n * 2;
        simple_contract(
            self,
            vec![
                Operand::new("a", Role::Input, bytes, 8),
                Operand::new("b", Role::Input, bytes, 8),
                Operand::new("out", Role::Output, bytes, 8),
            ],
            u32::from(STRIDE) * WORKERS,
        )
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
        binary_cycles(t, 1, self.n)
    }
}

impl Kernel for AddBias {
    fn symbol(&self) -> String {
        format!("{}_r{}_n{}", Self::NAME, self.rows, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        check_columns(&self.symbol(), self.rows, self.n)
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        code(self, code_base, || binary_code(code_base))
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
        Ok(binary_state(
            self.rows,
            self.n,
            operand(addrs, &name, "a")?,
            operand(addrs, &name, "bias")?,
            operand(addrs, &name, "out")?,
            true,
        ))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        binary_cycles(t, self.rows, self.n)
    }
}

impl Kernel for ReduceAdd {
    fn symbol(&self) -> String {
        format!("{}_k{}_n{}", Self::NAME, self.k, self.n)
    }
    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.k < 2 || self.k - 2 > RPT_MAX {
            return Err(invalid(&name, "k must be 2..=4097 (k = 1 is a copy)"));
        }
        check_columns(&name, self.k, self.n)
    }
    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        code(self, code_base, || {
            use FBinOp::Add;
            const V: FVec = FVec::F32V2;
            let mut s = Asm::new(code_base);
            let done = s.label();
            let group = s.label();
            s.i(ld32m(m(4), m(0), 0)); // input 0 at the current group
            s.i(ld32m(m(3), m(0), 1)); // output
            s.i(ld32m(m(8), m(0), 2)); // groups left
            s.brz(m(8), done);
            s.i(ld32m(m(6), m(0), 3)); // input stride (bytes)
            s.i(ld32m(m(7), m(0), 4)); // k - 2
            s.bind(group);
            s.i(mov(m(5), m(4)));
            // Inputs 0 and 1 are peeled: input 0 initialises the accumulators
            // ($a6:7, $a8:9) and input 1 fills the pipeline ($a2:3, $a4:5).
            s.i(Inst::Ld64 {
                d: a(0),
                base: m(5),
                imm: 0,
            });
            s.b(int(IntOp::Add, m(5), m(5), m(6)), to_f32(6, 0));
            s.b(
                Inst::Ld64 {
                    d: a(0),
                    base: m(5),
                    imm: 0,
                },
                to_f32(8, 1),
            );
            s.b(int(IntOp::Add, m(5), m(5), m(6)), to_f32(2, 0));
            s.i(to_f32(4, 1));
            s.rpt(m(7), |b| {
                b.b(
                    Inst::Ld64 {
                        d: a(0),
                        base: m(5),
                        imm: 0,
                    },
                    fbin(Add, V, 6, 6, 2),
                );
                b.b(int(IntOp::Add, m(5), m(5), m(6)), fbin(Add, V, 8, 8, 4));
                b.i(to_f32(2, 0));
                b.i(to_f32(4, 1));
            });
            s.i(fbin(Add, V, 6, 6, 2));
            s.i(fbin(Add, V, 8, 8, 4));
            s.i(to_f16(0, 6));
            s.i(to_f16(1, 8));
            s.i(st64s(0, 3));
            s.i(inti(IntOp::Add, m(4), m(4), 8));
            s.i(inti(IntOp::Sub, m(8), m(8), 1));
            s.brnz(m(8), group);
            s.bind(done);
            s.i(Inst::Exit);
            s.finish()
        })
    }
    fn contract(&self) -> Contract {
        simple_contract(
            self,
            vec![
                Operand::new("in", Role::Input, self.k * self.n * 2, 8),
                Operand::new("out", Role::Output, self.n * 2, 8),
            ],
            u32::from(STRIDE) * WORKERS,
        )
    }
    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let mut buf = StateBuf::default();
        for (i, (g0, g)) in split(self.n / 4).into_iter().enumerate() {
            buf.u32(inp + g0 * 8)
                .u32(out + g0 * 8)
                .u32(g)
                .u32(self.n * 2)
                .u32(self.k - 2)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }
    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let k = u64::from(self.k);
        crate::single_shot_cycles(
            t,
            split(self.n / 4)
                .into_iter()
                .map(|(_, g)| match u64::from(g) {
                    0 => 5,
                    g => 7 + g * (4 * k + 7),
                }),
        )
    }
}

//! `rearrange_row_major_to_amp_f16`: row-major `[rows, k]` f16 to the AMP's
//! chunk-major `[k/16][rows][16]` f16.
//!
//! Worker `w` owns a contiguous range of rows and, for every 16-wide chunk, copies
//! its rows' 32-byte pieces, one `ldst64pace` per 8-byte word ([`piece_copy`]). The
//! output pointer runs linearly through the worker's part of a chunk; the input
//! pointer is bumped by one row minus 32 bytes after each piece.

use tessera_isa::{Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m, mov};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, RPT_MAX, StateBuf, VertexState, invalid,
    operand, split,
};

/// Parameters of one rearrangement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rearrange {
    pub rows: u32,
    /// Row length in elements; a multiple of 16.
    pub k: u32,
    /// Alignment the contract declares for both operands. The code's 64-bit accesses
    /// need 8; anything less is an understated contract, kept as a knob so tests can
    /// reproduce the seed's 2-byte declaration and watch the simulator catch it.
    pub declared_align: u32,
}

const STRIDE: u16 = 32;

impl Rearrange {
    pub const NAME: &'static str = "rearrange_row_major_to_amp_f16";

    pub fn new(rows: u32, k: u32) -> Rearrange {
        Rearrange {
            rows,
            k,
            declared_align: 8,
        }
    }

    pub fn bytes(&self) -> u32 {
        self.rows * self.k * 2
    }
}

impl Kernel for Rearrange {
    fn symbol(&self) -> String {
        format!("{}_r{}_k{}", Self::NAME, self.rows, self.k)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.rows == 0 || self.k == 0 || !self.k.is_multiple_of(16) {
            return Err(invalid(
                &name,
                "rows must be positive and k a positive multiple of 16",
            ));
        }
        if self.rows.div_ceil(crate::WORKERS) > RPT_MAX {
            return Err(invalid(&name, "more than 4095 rows per worker"));
        }
        if !self.declared_align.is_power_of_two() {
            return Err(invalid(&name, "declared alignment must be a power of two"));
        }
        if u64::from(self.rows) * u64::from(self.k) * 2 >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        crate::single_entry(self, code_base, || piece_copy(code_base, Strided::Source))
    }

    fn contract(&self) -> Contract {
        let al = self.declared_align;
        Contract {
            kernel: self.symbol(),
            code: CodeRequirement {
                bytes: self.code_bytes().unwrap_or(0),
                align: 8,
                mem_class: MemClass::Executable,
            },
            supervisor_bytes: crate::RUNALL_SNIPPET_BYTES,
            operands: piece_copy_operands(
                Operand::new("in", Role::Input, self.bytes(), al),
                Operand::new("out", Role::Output, self.bytes(), al),
            ),
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        Ok(piece_copy_state(inp, out, self.rows, self.k / 16))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        piece_copy_cycles(t, self.rows, self.k / 16)
    }
}

/// The operands of a piece copy: `in` and `out` in different memory elements (every
/// issue loads from one and stores to the other), and the state.
pub(crate) fn piece_copy_operands(inp: Operand, out: Operand) -> Vec<Operand> {
    let mut ops = vec![inp, out];
    crate::contract::separate_all(&mut ops, &["in", "out"]);
    ops.push(Operand::new(
        "state",
        Role::State,
        u32::from(STRIDE) * crate::WORKERS,
        8,
    ));
    ops
}

/// Which side of a piece copy walks rows (a row's 32-byte piece, then the next
/// row's): the other side runs linearly through one 16-wide chunk after another.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strided {
    /// Row-major to chunk-major (the rearrangement).
    Source,
    /// Chunk-major to row-major (`blocks_to_rows`).
    Destination,
}

/// The worker code both layout conversions share. Record: the strided side's start
/// for the current chunk, the linear side's pointer, rows, chunks, row bytes minus
/// 32, and the linear side's skip to the next chunk.
///
/// Each 8-byte word is copied by one `ldst64pace`, which stores the word loaded by
/// the previous issue while it loads the next, so a row's 32-byte piece costs four
/// issues and one pointer add on the strided side (a register add, since a row can
/// be longer than `ld64step`'s ±1016-byte step): the add goes before the piece's
/// last load on the source side, after its last store on the destination side. A
/// chunk's first word is loaded by an `ld64step` and its last piece ends with an
/// `st64step`, so nothing is read past a worker's rows. `ldst64pace` needs its load
/// and store in different memory elements: the contract separates `in` and `out`.
pub(crate) fn piece_copy(code_base: u32, strided: Strided) -> Vec<tessera_isa::Word> {
    let mut s = Asm::new(code_base);
    let done = s.label();
    let chunk = s.label();
    let (src, dst) = match strided {
        Strided::Source => (m(8), m(3)),
        Strided::Destination => (m(3), m(8)),
    };
    // `a0:1` and `a2:3` take turns: each issue stores one and loads the other.
    let copy = |d: u8| Inst::Ldst64Pace {
        d: a(d),
        s: a(2 - d),
        pl: src,
        ps: dst,
    };
    s.i(ld32m(m(2), m(0), 0)); // strided side of the current chunk
    s.i(ld32m(m(3), m(0), 1)); // linear side
    s.i(ld32m(m(4), m(0), 2)); // rows of this worker
    s.brz(m(4), done);
    s.i(ld32m(m(5), m(0), 3)); // chunks left
    s.i(ld32m(m(6), m(0), 4)); // row bytes - 32
    s.i(ld32m(m(7), m(0), 5)); // linear skip to the next chunk
    s.i(inti(IntOp::Sub, m(9), m(4), 1)); // pieces before the last
    s.bind(chunk);
    s.i(mov(m(8), m(2)));
    s.i(Inst::Ld64Step {
        d: a(0),
        base: src,
        inc: 1,
    });
    s.rpt(m(9), |b| {
        b.i(copy(2));
        b.i(copy(0));
        b.i(copy(2));
        if strided == Strided::Source {
            b.i(int(IntOp::Add, m(8), m(8), m(6)));
        }
        b.i(copy(0));
        if strided == Strided::Destination {
            b.i(int(IntOp::Add, m(8), m(8), m(6)));
        }
    });
    s.i(copy(2));
    s.i(copy(0));
    s.i(copy(2));
    s.i(Inst::St64Step {
        s: a(2),
        base: dst,
        inc: 1,
    });
    s.i(inti(IntOp::Add, m(2), m(2), 32));
    s.i(int(IntOp::Add, m(3), m(3), m(7)));
    s.i(inti(IntOp::Sub, m(5), m(5), 1));
    s.brnz(m(5), chunk);
    s.bind(done);
    s.i(Inst::Exit);
    s.finish()
}

/// The vertex state of a piece copy over `rows` rows of `chunks` 16-wide chunks:
/// worker records with its strided side's start (`strided`, rows `chunks * 32`
/// bytes apart), its linear side's start (`linear`, chunk-major), rows, chunks,
/// row bytes minus 32 and the linear side's skip to the next chunk.
pub(crate) fn piece_copy_state(strided: u32, linear: u32, rows: u32, chunks: u32) -> VertexState {
    let row_bytes = chunks * 32;
    let mut buf = StateBuf::default();
    for (i, (r0, r)) in split(rows).into_iter().enumerate() {
        buf.u32(strided + r0 * row_bytes)
            .u32(linear + r0 * 32)
            .u32(r)
            .u32(chunks)
            .u32(row_bytes - 32)
            .u32((rows - r) * 32)
            .pad_to((i + 1) * usize::from(STRIDE));
    }
    buf.finish(STRIDE)
}

/// Cycles of a piece copy: each worker's issues are 5 without rows, otherwise 9
/// plus, per chunk, 5 per row and 6.
pub(crate) fn piece_copy_cycles(t: &Timing, rows: u32, chunks: u32) -> u64 {
    let issues = |r: u32| {
        if r == 0 {
            5
        } else {
            9 + u64::from(chunks) * (5 * u64::from(r) + 6)
        }
    };
    crate::single_shot_cycles(t, split(rows).into_iter().map(|(_, r)| issues(r)))
}

//! `transpose_blocks_f16`: a `[16·tb, 16·kc]` matrix X in block layout
//! `[kc][16·tb][16]` f16 to the AMP weight layout `[tb][kc][16][16]` of Xᵀ:
//! `out[b][c][kk][j] = in[c][16b + j][kk] = X[16b + j][16c + kk]`. With it,
//! `amp_matmul` with `a` = K (block layout, `[rows, 16·kc]`) and `w` = `out` for
//! X = Q computes K·Qᵀ (the attention's transposed scores).
//!
//! Every 16×16 input block (512 contiguous bytes) becomes one transposed output
//! block. Workers own contiguous ranges of row groups (four input rows of a
//! block), taken in input order so the input pointer is linear: a range may start
//! and end inside a block, so `kc · tb` blocks spread over the six workers to
//! within one row group (twenty blocks: 14 row groups on the busiest worker, where
//! whole blocks give 16). The output block steps by `kc` blocks and jumps back to
//! the next column of blocks after the `tb`-th. A 4×4 sub-block is four `ld64` (a
//! row's four elements each), eight `sort4x16lo/hi` (each pairs the same half of two
//! rows' words: the 2×2 transposes) and four `st64` (an output row's four elements).
//! A repeat handles a group of four input rows (the four sub-blocks across them,
//! every address an immediate offset from the two block pointers), four times a
//! block; inside it the sub-blocks are software-pipelined so that every shuffle has
//! a load or a store beside it: eight issues a sub-block, 36 a row group with the
//! pipeline's fill and drain (49 one sub-block after another). The copy is bit-exact
//! (NaN payloads included).

use tessera_isa::{Inst, IntOp};
use tessera_machine::Timing;

use crate::asm::{Asm, a, int, inti, ld32m, m, mov};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role};
use crate::softmax::{End, Issue, ai, bi, block, ld64, mi};
use crate::{
    Kernel, KernelCode, KernelError, OperandAddrs, StateBuf, VertexState, invalid, operand, split,
};

/// Parameters of one block transpose.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransposeBlocks {
    /// 16-wide column blocks of X (input chunks of the matmul that reads `out`).
    pub kc: u32,
    /// 16-row blocks of X (output blocks of that matmul).
    pub tb: u32,
}

/// A worker record: nine words (see [`Kernel::state`]), 8-byte aligned.
const STRIDE: u16 = 40;
/// Row groups in a block.
const GROUPS: u32 = 4;
const BLOCK: u32 = 512;

impl TransposeBlocks {
    pub const NAME: &'static str = "transpose_blocks_f16";

    pub fn new(kc: u32, tb: u32) -> TransposeBlocks {
        TransposeBlocks { kc, tb }
    }

    /// Bytes of each operand.
    pub fn bytes(&self) -> u32 {
        self.kc * self.tb * BLOCK
    }

    /// A worker's range of row groups from `u0`, `n` of them, as its first
    /// block's groups (to the end of that block, or of the range), then whole
    /// blocks, then the groups of a last, partial block.
    fn worker_range(u0: u32, n: u32) -> (u32, u32, u32) {
        let first = n.min(GROUPS - u0 % GROUPS);
        let rest = n - first;
        (first, rest / GROUPS, rest % GROUPS)
    }

    /// Issues of the worker with `n` row groups from `u0`, with `body` issues in
    /// a row group ([`rows_body`]).
    fn worker_issues(&self, u0: u32, n: u32, body: u64) -> u64 {
        if n == 0 {
            return 5;
        }
        let (first, whole, last) = Self::worker_range(u0, n);
        // Output jumps to the next column of blocks (two issues each): after every
        // block but a last partial one that ends a column.
        let v0 = u0 / GROUPS;
        let wraps = (v0 + whole + 1) / self.tb - v0 / self.tb;
        // Setup (nine loads and the test); the first block's repeat, its
        // bookkeeping and the test for whole blocks; per whole block the count,
        // the repeat, four row groups, the bookkeeping and the branch back; the
        // test for a last block, its repeat; the exit.
        let last_block = if last > 0 {
            1 + u64::from(last) * body
        } else {
            0
        };
        10 + 1
            + u64::from(first) * body
            + 4
            + u64::from(whole) * (6 + 4 * body)
            + 2 * u64::from(wraps)
            + 1
            + last_block
            + 1
    }
}

/// One group of four input rows of a block (`$m2`) to four output columns
/// (`$m3`): four 4x4 sub-blocks, then both pointers on (128 bytes of input, 8 of
/// output).
///
/// The sub-blocks are software-pipelined at eight issues each, every issue a
/// shuffle beside a load or a store: sub-block `q`'s rows `A`, `B` are loaded
/// during sub-block `q - 1`, its `C`, `D` beside its own first shuffles, and its
/// last two output rows stored beside sub-block `q + 1`'s first shuffles. `A` and
/// `B` are shuffled first (the first halves of all four output rows), so their
/// pairs free early: output rows 2 and 3 are gathered in `B`'s and `A`'s pairs.
/// That keeps seven register pairs enough (`$a14` and the zero `$a15` are left);
/// [`pairs`] assigns them. Two loads lead the first sub-block and two stores
/// trail the last: 36 issues a row group, where one sub-block after another takes
/// 49.
fn rows_body() -> Vec<Issue> {
    let sort = |hi, d: u8, x: u8, y: u8| Inst::Sort4x16 {
        hi,
        d: a(d),
        a: a(x),
        b: a(y),
    };
    // The output pointer moves beside sub-block 3, before its last two stores.
    let st = |s: u8, q: u16, i: u16, moved: bool| Inst::St64 {
        s: a(s),
        base: m(3),
        imm: (4 * q + i) * 4 - u16::from(moved),
    };
    let ld = |d: u8, row: u16, q: u16| ld64(d, m(2), 4 * row + q);
    let p = pairs();
    let r = |role: Part, q: usize| 2 * p[q][role as usize];
    let mut v = vec![mi(ld(r(Part::A, 0), 0, 0)), mi(ld(r(Part::B, 0), 1, 0))];
    for q in 0..4usize {
        let (a0, b0, c0, d0) = (r(Part::A, q), r(Part::B, q), r(Part::C, q), r(Part::D, q));
        let (o0, o1) = (r(Part::O0, q), r(Part::O1, q));
        let qq = q as u16;
        // The previous sub-block's rows 2 and 3 (in its `B` and `A` pairs).
        let prev = |i: u16| {
            (q > 0).then(|| {
                let pb = r(if i == 2 { Part::B } else { Part::A }, q - 1);
                st(pb, qq - 1, i, false)
            })
        };
        let next = |role: Part, row: u16| (q < 3).then(|| ld(r(role, q + 1), row, qq + 1));
        let shuffles = [
            sort(false, o0, a0, b0),
            sort(true, o1, a0, b0),
            sort(false, b0, a0 + 1, b0 + 1),
            sort(true, a0, a0 + 1, b0 + 1),
            sort(false, o0 + 1, c0, d0),
            sort(true, o1 + 1, c0, d0),
            sort(false, b0 + 1, c0 + 1, d0 + 1),
            sort(true, a0 + 1, c0 + 1, d0 + 1),
        ];
        let mut mains: [Option<Inst>; 8] = Default::default();
        let mut put = |slot: u32, i: Option<Inst>| mains[slot as usize] = i;
        put(ST_O2 - 8, prev(2));
        put(ST_O3 - 8, prev(3));
        put(LD_C, Some(ld(c0, 2, qq)));
        put(LD_D, Some(ld(d0, 3, qq)));
        put(
            LD_NEXT_A,
            next(Part::A, 0).or(Some(inti(IntOp::Add, m(2), m(2), 128))),
        );
        put(ST_O0, Some(st(o0, qq, 0, false)));
        put(ST_O1, Some(st(o1, qq, 1, false)));
        put(
            LD_NEXT_B,
            next(Part::B, 1).or(Some(inti(IntOp::Add, m(3), m(3), 8))),
        );
        for (main, aux) in mains.into_iter().zip(shuffles) {
            v.push(match main {
                Some(main) => bi(main, aux),
                None => ai(aux),
            });
        }
    }
    v.push(mi(st(r(Part::B, 3), 3, 2, true)));
    v.push(mi(st(r(Part::A, 3), 3, 3, true)));
    v
}

/// The main-pipe slots of a sub-block's loads and stores among its eight issues,
/// whose aux slots hold the shuffles in order (A and B's four, writing output rows
/// 0 and 1 first, then C and D's four). Output rows 2 and 3 are stored in the next
/// sub-block's first two slots (8 and 9 counted from this one's start). Both
/// [`rows_body`], which places the instructions, and [`pairs`], which reads the
/// registers' lifetimes, take the schedule from here.
const LD_C: u32 = 2;
const LD_D: u32 = 3;
const LD_NEXT_A: u32 = 4;
const ST_O0: u32 = 5;
const ST_O1: u32 = 6;
const LD_NEXT_B: u32 = 7;
const ST_O2: u32 = 8;
const ST_O3: u32 = 9;
/// The last shuffle, C and D's last read.
const LAST_SHUFFLE: u32 = 7;

/// A sub-block's registers by role: its input rows `A..D` (`A` and `B` then
/// hold output rows 3 and 2) and output rows 0 and 1.
#[derive(Clone, Copy)]
enum Part {
    A,
    B,
    C,
    D,
    O0,
    O1,
}

/// The register pair (`$a{2p}:{2p+1}`) of every role of the four sub-blocks of
/// [`rows_body`]: each pair taken, lowest first, when its first write issues and
/// given back after its last read, as the body's issues order them.
fn pairs() -> [[u8; 6]; 4] {
    // (issue of the first write, issue of the last read) of role `r` of
    // sub-block `q`, which starts at issue 2 + 8q.
    let span = |q: u32, r: Part| -> (u32, u32) {
        // Rows A and B of sub-block 0 are the two leading loads; later ones load
        // during the sub-block before. Shuffles 0 and 1 write output rows 0 and 1.
        let b = 2 + 8 * q;
        match r {
            Part::A => (if q == 0 { 0 } else { b - 8 + LD_NEXT_A }, b + ST_O3),
            Part::B => (if q == 0 { 1 } else { b - 8 + LD_NEXT_B }, b + ST_O2),
            Part::C => (b + LD_C, b + LAST_SHUFFLE),
            Part::D => (b + LD_D, b + LAST_SHUFFLE),
            Part::O0 => (b, b + ST_O0),
            Part::O1 => (b + 1, b + ST_O1),
        }
    };
    let roles = [Part::A, Part::B, Part::C, Part::D, Part::O0, Part::O1];
    let mut spans: Vec<(u32, u32, usize, usize)> = (0..4u32)
        .flat_map(|q| {
            roles.iter().map(move |&r| {
                let (w, last) = span(q, r);
                (w, last, q as usize, r as usize)
            })
        })
        .collect();
    spans.sort_unstable();
    let mut out = [[0u8; 6]; 4];
    // The issue after which each pair is free again.
    let mut busy_until: [Option<u32>; 7] = [None; 7];
    for (w, last, q, r) in spans {
        let p = (0..7)
            .find(|&p| busy_until[p].is_none_or(|u| u < w))
            .expect("seven pairs hold every sub-block's rows");
        busy_until[p] = Some(last);
        out[q][r] = p as u8;
    }
    out
}

impl Kernel for TransposeBlocks {
    fn symbol(&self) -> String {
        format!("{}_kc{}_tb{}", Self::NAME, self.kc, self.tb)
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.kc == 0 || self.tb == 0 {
            return Err(invalid(&name, "kc and tb must be positive"));
        }
        if u64::from(self.kc) * u64::from(self.tb) * u64::from(BLOCK) >= 1 << 20 {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        let done = s.label();
        let blk = s.label();
        let last = s.label();
        s.i(ld32m(m(2), m(0), 0)); // input row group, linear
        s.i(ld32m(m(3), m(0), 1)); // its output columns
        s.i(ld32m(m(4), m(0), 2)); // row groups of the first block
        s.brz(m(4), done);
        block(
            &mut s,
            &[
                mi(ld32m(m(5), m(0), 3)),  // blocks left in this column of blocks
                mi(ld32m(m(6), m(0), 4)),  // tb
                mi(ld32m(m(7), m(0), 5)),  // output step to the next row of blocks
                mi(ld32m(m(8), m(0), 6)),  // output jump to the next column of blocks
                mi(ld32m(m(9), m(0), 7)),  // whole blocks after the first
                mi(ld32m(m(10), m(0), 8)), // row groups of a last, partial block
            ],
            End::BeforeRpt,
        );
        let body = rows_body();
        // Every block but the worker's last ends at its fourth row group, whatever
        // group it started at, so the step to the next block is the same for all.
        let next_block = |s: &mut Asm| {
            let same_column = s.label();
            s.i(int(IntOp::Add, m(3), m(3), m(7)));
            s.i(inti(IntOp::Sub, m(5), m(5), 1));
            s.brnz(m(5), same_column);
            s.i(int(IntOp::Add, m(3), m(3), m(8)));
            s.i(mov(m(5), m(6)));
            s.bind(same_column);
        };
        s.rpt(m(4), |b| block(b, &body, End::Aligned));
        next_block(&mut s);
        s.brz(m(9), last);
        // Word parity below: the count's decrement puts each `rpt` at 4 mod 8.
        s.bind(blk);
        s.i(inti(IntOp::Sub, m(9), m(9), 1));
        s.rpti(GROUPS as u16, |b| block(b, &body, End::Aligned));
        next_block(&mut s);
        s.brnz(m(9), blk);
        s.bind(last);
        s.brz(m(10), done);
        s.rpt(m(10), |b| block(b, &body, End::Aligned));
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
        Contract {
            kernel: self.symbol(),
            code: CodeRequirement {
                bytes: self.code_bytes().unwrap_or(0),
                align: 8,
                mem_class: MemClass::Executable,
            },
            supervisor_bytes: crate::RUNALL_SNIPPET_BYTES,
            operands: vec![
                Operand::new("in", Role::Input, self.bytes(), 8),
                Operand::new("out", Role::Output, self.bytes(), 8),
                Operand::new("state", Role::State, u32::from(STRIDE) * crate::WORKERS, 8),
            ],
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let name = self.symbol();
        let inp = operand(addrs, &name, "in")?;
        let out = operand(addrs, &name, "out")?;
        let mut buf = StateBuf::default();
        for (i, (u0, n)) in split(GROUPS * self.kc * self.tb).into_iter().enumerate() {
            let (v0, r0) = (u0 / GROUPS, u0 % GROUPS);
            let (c0, b0) = (v0 / self.tb, v0 % self.tb);
            let (first, whole, last) = Self::worker_range(u0, n);
            // A row group is 128 input bytes and 8 bytes of every output row.
            buf.u32(inp + v0 * BLOCK + r0 * 128)
                .u32(out + (b0 * self.kc + c0) * BLOCK + r0 * 8)
                .u32(first)
                .u32(self.tb - b0)
                .u32(self.tb)
                .u32(self.kc * BLOCK - 32)
                // From past the last row of blocks back to the next column of blocks
                // (wrapping: the jump is negative).
                .u32(BLOCK.wrapping_sub(self.bytes()))
                .u32(whole)
                .u32(last)
                .pad_to((i + 1) * usize::from(STRIDE));
        }
        Ok(buf.finish(STRIDE))
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        let body = rows_body().len() as u64;
        crate::single_shot_cycles(
            t,
            split(GROUPS * self.kc * self.tb)
                .into_iter()
                .map(|(u0, n)| self.worker_issues(u0, n, body)),
        )
    }
}

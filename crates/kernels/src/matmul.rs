//! `amp_matmul`: `out[rows, 16*nb] = A[rows, 16*kc] x W[16*kc, 16*nb]` in f16 on the
//! AMP, with f16 partial sums between 16-wide K chunks.
//!
//! Layouts: A is chunk-major `[kc][rows][16]` (what `rearrange` produces) or, with
//! [`AmpMatmul::row_major`], row-major `[rows][16*kc]` as it arrives from an
//! exchange: then the A stream reads a row's four quarters and jumps to the next
//! row with the strided form of its load (`$m9` = `4*kc - 3` atoms). W is
//! `[nb][kc][16][16]`, each 16x16 block row-major with `W[kk][j]` = weight from input
//! `c*16+kk` to output `b*16+j` (see [`pack_weights`]); the output is `[nb][rows][16]`.
//!
//! The supervisor snippet loops over blocks `b` and chunks `c`: per call it waits for
//! the previous run, loads the block's 32 weight quads and runs the workers on the
//! call header (A chunk, partial-in, output) at the start of the state. Everything
//! else (the next call's header and pointers, the loop counters) is done while the
//! workers run: the supervisor issues there only in the slots of workers that have
//! exited, which is after every worker has read the header, and otherwise those slots
//! would go unused. Partials ping-pong between `p0` and `p1`; the first chunk has no
//! partial-in buffer: its workers start at a second entry point, the zero-partial
//! path, which feeds a zeroed register pair to the AMP instead of a third stream. The
//! last chunk of a block, which writes the output, is the chunk loop peeled once.
//! With an even row split every worker exits at once, so nothing the supervisor
//! does between runs is hidden: there the headers of a block's calls are
//! precomputed in the state, one per worker with its rows' offset already added,
//! and the supervisor only walks them (`table_loop`); a worker then loads its
//! pointers and starts streaming.
//!
//! Each worker streams its rows through the engine, four `amp` issues per row,
//! software-pipelined by one row (the engine hands out the previous row's results)
//! and by one issue on both sides (loads lead, stores lag), so no stream reads or
//! writes past its rows. The row split is known when the kernel is emitted, so the
//! worker code is specialised to it (see [`Rows`]): every worker issue costs a full
//! barrel round, every supervisor issue one cycle.

use half::f16;
use tessera_isa::{AReg, Inst, IntOp, MReg, Word};
use tessera_machine::Timing;

use crate::asm::{Asm, MZ, a, code_bytes, int, inti, ld32m, m, mov, setzi, st32m};
use crate::contract::{CodeRequirement, Contract, MemClass, Operand, Role, separate_all};
use crate::{
    Call, Kernel, KernelCode, KernelError, OperandAddrs, StateBuf, VertexState, WORKERS, invalid,
    operand, split,
};

/// Parameters of one AMP matrix multiplication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmpMatmul {
    pub rows: u32,
    /// 16-wide chunks of the contraction dimension.
    pub kc: u32,
    /// 16-wide blocks of output columns.
    pub nb: u32,
    /// A is row-major `[rows][16*kc]` rather than chunk-major (no rearrangement
    /// needed); it costs each worker the stride register a call, and on uneven
    /// splits also A's row offset. Irrelevant, and kept false, for one chunk.
    pub a_row_major: bool,
    /// Rows of the result that go to operand `own` instead of `out`: see
    /// [`AmpMatmul::with_own_rows`].
    pub own: Option<OwnRows>,
    /// What chunk 0 of every block starts from.
    pub start: AmpStart,
}

/// What chunk 0 of a block adds its products to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AmpStart {
    /// Zero partial sums.
    Zeros,
    /// The partial sums in operand `init` (`[nb][rows][16]`, what an earlier call
    /// over other chunks of K wrote as its `out`): see [`AmpMatmul::continuing`].
    Init,
    /// The block's 16 values of operand `bias` (`[nb][16]` f16) in every row: see
    /// [`AmpMatmul::with_bias`].
    Bias,
}

impl AmpStart {
    /// How its chunk 0's workers feed the engine.
    fn feed(self) -> Feed {
        match self {
            AmpStart::Zeros => Feed::Zeros,
            AmpStart::Init => Feed::Partials,
            AmpStart::Bias => Feed::Bias,
        }
    }
}

/// The register pairs a biased chunk 0 holds its block's bias in, one a phase:
/// the AMP adds phase `p`'s pair to accumulators `4p..4p+4` of every row. None
/// is A's (`$a0:1`) or the output's (`$a4:5`).
const BIAS_PAIRS: [u8; 4] = [2, 6, 8, 10];

/// Output rows `first..first + rows` of every block written to operand `own`
/// (`[nb][rows][16]` with `block_stride` bytes from one block's rows to the
/// next's) instead of `out`: a reduction's own piece of rows, put where the
/// reduction reads it rather than sent to itself. Whole workers' rows of an even
/// split only (each worker's header names its output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnRows {
    pub first: u32,
    pub rows: u32,
    pub block_stride: u32,
}

/// Byte offsets of the worker code's entries after the partials entry (its
/// start): the zero-partial entry and, with a bias, the bias entry.
#[derive(Debug, Clone, Copy, Default)]
struct Entries {
    zero: u32,
    bias: u32,
}

/// Bytes of the call header at the start of the state buffer.
const HEADER: u32 = 12;
/// Word index of a worker's record (row offset, count) relative to its `$m0`.
const RECORD: u16 = HEADER as u16 / 4;
const STATE_BYTES: u32 = 64;

/// How the worker code finds its rows, fixed by `split(rows)` at emit time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rows {
    /// Every worker has the same `q >= 2` rows: each worker's `$m0` is its own
    /// header of the call (stride 12), its row offset already in the pointers, and
    /// the repeat count is an immediate. No records.
    Even { q: u32 },
    /// Every worker has at least three rows: records of (row offset, rows - 3).
    Records,
    /// Some worker has fewer than three rows (none more than three): records of
    /// (row offset, rows), and the worker branches on its row count and on the
    /// partial-in being zero.
    Few,
}

impl AmpMatmul {
    pub const NAME: &'static str = "amp_matmul";

    /// The type of the partial sums this kernel hands from one K chunk to the next
    /// and writes out for a reduction over inner groups. It names the AMP mode the
    /// machine's `amp_f16_macs_per_cycle` is the rate of, so that a report can say
    /// which peak its FLOP are held to (inside a chunk the engine adds in f32).
    pub const PARTIALS: &'static str = "f16";

    pub fn new(rows: u32, kc: u32, nb: u32) -> AmpMatmul {
        AmpMatmul {
            rows,
            kc,
            nb,
            a_row_major: false,
            own: None,
            start: AmpStart::Zeros,
        }
    }

    /// Whether a call on `rows` rows splits them evenly over the workers, at
    /// least two each: what [`AmpMatmul::continuing`] and
    /// [`AmpMatmul::with_bias`] need (the header table names each block's
    /// partial-in).
    pub fn splits_evenly(rows: u32) -> bool {
        AmpMatmul::new(rows, 1, 1).table()
    }

    /// The same product with the bias added in the engine: chunk 0 of each
    /// block feeds the block's 16 bias values (held in registers) where it
    /// would feed zero partial sums, so a linear's bias costs four loads a
    /// block instead of an `add_bias` over its rows or a whole bias slab beside
    /// its reduction. Even row splits only (the header table names each block's
    /// bias), and not with `init`, whose partial sums already carry it; otherwise
    /// `None`.
    pub fn with_bias(&self) -> Option<AmpMatmul> {
        (self.table() && self.start != AmpStart::Init).then(|| AmpMatmul {
            start: AmpStart::Bias,
            ..self.clone()
        })
    }

    /// The same product added to the partial sums in operand `init`, so that a
    /// matmul's K can be taken in parts, one call a part, each weight block
    /// running once over all the rows (where row passes run every block once a
    /// pass). Even row splits only, whose header table is then per block for
    /// chunk 0 too; otherwise `None`.
    pub fn continuing(&self) -> Option<AmpMatmul> {
        (self.table() && self.start != AmpStart::Bias).then(|| AmpMatmul {
            start: AmpStart::Init,
            ..self.clone()
        })
    }

    /// The same product with output rows `first..first + rows` of every block
    /// written to operand `own` (see [`OwnRows`]), when the split is even and
    /// those rows are whole workers'; otherwise unchanged (`None`).
    pub fn with_own_rows(&self, first: u32, rows: u32, block_stride: u32) -> Option<AmpMatmul> {
        let own = OwnRows {
            first,
            rows,
            block_stride,
        };
        self.own_fits(own).then(|| AmpMatmul {
            own: Some(own),
            ..self.clone()
        })
    }

    /// Whether `o` names whole workers' rows of an even split, blocks apart.
    fn own_fits(&self, o: OwnRows) -> bool {
        let Rows::Even { q } = self.layout() else {
            return false;
        };
        o.rows > 0
            && o.first.is_multiple_of(q)
            && o.rows.is_multiple_of(q)
            && o.first + o.rows <= self.rows
            && o.block_stride >= o.rows * 32
    }

    /// The same product reading A row-major (`[rows][16*kc]`). One chunk is the same
    /// layout either way, and keeps the chunk-major code.
    pub fn row_major(mut self) -> AmpMatmul {
        self.a_row_major = self.kc > 1;
        self
    }

    fn block_bytes(&self) -> u32 {
        self.rows * 32
    }

    /// Partial-sum buffers the chunk loop needs: none, `p0`, or `p0` and `p1`.
    pub fn partials(&self) -> u32 {
        (self.kc - 1).min(2)
    }

    fn layout(&self) -> Rows {
        let (q, extra) = (self.rows / WORKERS, self.rows % WORKERS);
        if q >= 2 && extra == 0 && 32 * q < 1 << 12 {
            Rows::Even { q }
        } else if q >= 3 {
            Rows::Records
        } else {
            Rows::Few
        }
    }

    fn stride(&self) -> u16 {
        match self.layout() {
            Rows::Even { .. } => HEADER as u16,
            Rows::Records | Rows::Few => 8,
        }
    }

    /// Emits the worker code; returns the byte offsets of the zero-partial entry
    /// and of the bias entry (0 without a bias; the code's start is the partials
    /// entry). The supervisor overwrites the header once any worker has exited,
    /// so every path reads it before it can exit.
    fn worker_code(&self, s: &mut Asm) -> Entries {
        let start = s.at();
        let mut entries = Entries::default();
        match self.layout() {
            Rows::Few => few_rows(s, self.row_major_kc()),
            Rows::Even { q } => {
                let feeds: &[Feed] = if self.start == AmpStart::Bias {
                    &[Feed::Partials, Feed::Zeros, Feed::Bias]
                } else {
                    &[Feed::Partials, Feed::Zeros]
                };
                for &f in feeds {
                    match f {
                        Feed::Zeros => entries.zero = s.at() - start,
                        Feed::Bias => entries.bias = s.at() - start,
                        Feed::Partials => {}
                    }
                    // Every worker's `$m0` is its own header; the output pointer
                    // is loaded in `rows_stream`.
                    s.i(ld32m(m(3), m(0), 0));
                    if f != Feed::Zeros {
                        s.i(ld32m(m(4), m(0), 1));
                    }
                    if let Some(kc) = self.row_major_kc() {
                        s.i(setzi(m(9), 4 * kc - 3));
                    }
                    rows_stream(s, f, Count::Table(q), self.a_row_major);
                }
            }
            Rows::Records => {
                for f in [Feed::Partials, Feed::Zeros] {
                    if f == Feed::Zeros {
                        entries.zero = s.at() - start;
                    }
                    s.i(inti(IntOp::Shl, m(2), m(1), 3));
                    s.i(int(IntOp::Sub, m(2), m(0), m(2))); // call header
                    s.i(ld32m(m(3), m(2), 0));
                    if f == Feed::Partials {
                        s.i(ld32m(m(4), m(2), 1));
                    }
                    s.i(ld32m(m(5), m(2), 2));
                    s.i(ld32m(m(6), m(0), RECORD));
                    offset_pointers(s, f, self.row_major_kc());
                    rows_stream(s, f, Count::Record, self.a_row_major);
                }
            }
        }
        entries
    }

    /// With a row-major A, its chunks a row: what the workers offset A's rows by
    /// and derive the stride from (see [`offset_a`]).
    fn row_major_kc(&self) -> Option<u32> {
        self.a_row_major.then_some(self.kc)
    }

    /// Bytes from one chunk of A to the next: a block chunk-major, 32 row-major.
    fn chunk_step(&self) -> u32 {
        if self.a_row_major {
            32
        } else {
            self.block_bytes()
        }
    }

    /// Whether the calls' headers are precomputed in the state (a table of one
    /// block's calls, in chunk order, which the supervisor walks once a block and
    /// whose last output it rewrites for each block), rather than stored by the
    /// supervisor before every call: with an even row split, where every worker
    /// reads one header. The workers then all exit together and the supervisor's stores would fall
    /// in the gap between calls; with uneven rows the short workers' early exits
    /// hide them, and the records per worker keep the single header.
    fn table(&self) -> bool {
        matches!(self.layout(), Rows::Even { .. })
    }

    /// Bytes of one call's headers in the table: one per worker.
    const CALL_HEADERS: u32 = HEADER * WORKERS;

    /// Calls of the table's per-block first calls: a continuing or biased
    /// product's chunk 0 when it is not also the last chunk.
    fn firsts(&self) -> u32 {
        if self.start != AmpStart::Zeros && self.kc > 1 {
            self.nb
        } else {
            0
        }
    }

    /// Calls of the table shared by every block: the chunks before the last,
    /// less a continuing product's chunk 0, which is per block.
    fn shared_calls(&self) -> u32 {
        self.kc - 1 - u32::from(self.firsts() > 0)
    }

    fn state_bytes(&self) -> u32 {
        if self.table() {
            // The calls before a block's last, shared by every block, then each
            // block's last call (which names that block's output); continuing,
            // each block's first call (which names its partial-in) as well.
            Self::CALL_HEADERS * (self.firsts() + self.shared_calls() + self.nb)
        } else {
            STATE_BYTES
        }
    }

    /// The first block's call headers (A chunk, partial-in, output) in chunk
    /// order. Chunk c < kc-1 writes `p0` or `p1` (alternating from `p0`), the last
    /// chunk the block's output; chunk c > 0 reads what chunk c-1 wrote, chunk 0
    /// nothing (0: it starts at the zero-partial entry). Every block's headers are
    /// the same but for the last output.
    fn headers(&self, addrs: &OperandAddrs) -> Result<Vec<(u32, u32, u32)>, KernelError> {
        let name = self.symbol();
        let addr = |n: &str| operand(addrs, &name, n);
        let (a0, out) = (addr("a")?, addr("out")?);
        let p = [
            if self.partials() >= 1 { addr("p0")? } else { 0 },
            if self.partials() >= 2 { addr("p1")? } else { 0 },
        ];
        let step = self.chunk_step();
        Ok((0..self.kc)
            .map(|c| {
                let pin = if c == 0 { 0 } else { p[((c - 1) % 2) as usize] };
                let o = if c + 1 == self.kc {
                    out
                } else {
                    p[(c % 2) as usize]
                };
                (a0 + c * step, pin, o)
            })
            .collect())
    }

    /// Issues of one worker run with `r` rows, as emitted: setup, then the
    /// stream (see [`rows_stream`]).
    fn worker_issues(&self, r: u32, feed: Feed) -> u64 {
        // The partial-in (or bias) pointer's load, and with records its offset.
        let p = u64::from(feed != Feed::Zeros);
        // A row-major A: its row offset and the stride register (only the stride
        // with the header table, whose pointers hold the offset).
        let rm = match (self.a_row_major && r > 0, self.layout()) {
            (false, _) => 0,
            (true, Rows::Even { .. }) => 1,
            (true, _) => 2,
        };
        rm + match self.layout() {
            // The A header load.
            Rows::Even { q } => 1 + p + stream_issues(feed, r, Count::Table(q)),
            // Header address, header loads, record load, adds.
            Rows::Records => 7 + 2 * p + stream_issues(feed, r, Count::Record),
            Rows::Few => match r {
                0 => 9,
                // Header address and loads, the row branch, offsets, the
                // partial-in branch and the first row-count branch; beyond one
                // row the count's step and the second branch.
                r => {
                    let more = if r == 1 { 0 } else { 2 };
                    13 + p + more + stream_issues(feed, r, Count::Fixed(r))
                }
            },
        }
    }

    fn supervisor_words(&self, call: &Call<'_>, code_base: u32) -> Result<Vec<Word>, KernelError> {
        let name = self.symbol();
        let addr = |n: &str| operand(call.addrs, &name, n);
        let a_addr = addr("a")?;
        let w_addr = addr("w")?;
        let out_addr = addr("out")?;
        let p0 = if self.partials() >= 1 { addr("p0")? } else { 0 };
        let p1 = if self.partials() >= 2 {
            addr("p1")?
        } else {
            p0
        };
        let entries = self.entries();
        let zero_entry = call.entry + entries.zero;
        let bias_entry = call.entry + entries.bias;
        for (what, v) in [
            ("entry", call.entry),
            ("zero-partial entry", zero_entry),
            ("bias entry", bias_entry),
            ("state", call.state),
            ("a", a_addr),
            ("w", w_addr),
            ("out", out_addr),
            ("p0", p0),
            ("p1", p1),
        ] {
            if v >= 1 << 20 || v % 4 != 0 {
                return Err(KernelError::BadAddress {
                    kernel: name.clone(),
                    what: what.into(),
                    addr: v,
                    message: "must be 4-byte aligned and below 2^20".into(),
                });
            }
        }
        crate::check_code_base(&name, code_base, 4)?;
        // The walked estimates reach here without `validate`, for shapes no tile
        // holds; their counts and block size must still fit `setzi`, or the
        // instance is refused as too large rather than emitted wrong.
        if u64::from(self.rows) * 32 >= 1 << 20 || self.kc >= 1 << 20 || self.nb >= 1 << 20 {
            return Err(invalid(&name, "a block or count above setzi's 20 bits"));
        }
        let sup = Sup {
            entry: call.entry,
            zero_entry,
            bias_entry,
            state: call.state,
            stride: self.stride(),
            a: a_addr,
            w: w_addr,
            out: out_addr,
            p0,
            p1,
            rb: self.block_bytes(),
            a_row_major: self.a_row_major,
        };
        let mut s = Asm::new(code_base);
        if self.table() {
            self.table_loop(&mut s, &sup);
        } else if self.kc == 1 {
            self.single_chunk_loop(&mut s, &sup);
        } else {
            self.chunk_loop(&mut s, &sup);
        }
        Ok(s.finish())
    }

    fn entries(&self) -> Entries {
        self.worker_code(&mut Asm::new(0))
    }

    /// The header table's walk: per block, chunk 0 at the zero-partial entry, then
    /// chunks 1..kc-2 at the partials entry, two calls a loop pass (an odd one
    /// first) so that the loop's branch and its pipeline refill come once in two
    /// gaps, then the last chunk on the block's own headers (`$m8`, which walks
    /// the blocks' last calls). Every instruction between a `runall` and the next
    /// `sync local` waits for the workers to exit; counters are decremented after
    /// a `sync local`, far ahead of the branch that reads them. With several
    /// blocks, each block's first gap rewinds the shared headers. A continuing
    /// product's chunk 0 takes the partials entry on the block's own first call
    /// (`$m7`, which walks them ahead of the shared calls); a biased one's takes
    /// the bias entry there, its header naming the block's bias.
    fn table_loop(&self, s: &mut Asm, c: &Sup) {
        let blocks = self.nb > 1;
        // Calls between a block's first and its last.
        let middle = self.kc.saturating_sub(2);
        let pairs = middle / 2;
        let calls = Self::CALL_HEADERS as u16;
        let firsts = self.firsts();
        let shared = c.state + Self::CALL_HEADERS * firsts;
        s.i(setzi(m(1), shared));
        s.i(setzi(m(2), c.w)); // advanced 16 bytes by every weight load
        let chunk0 = match self.start {
            AmpStart::Init => m(3),
            AmpStart::Zeros => {
                s.i(setzi(m(0), c.zero_entry));
                m(0)
            }
            AmpStart::Bias => {
                s.i(setzi(m(0), c.bias_entry));
                m(0)
            }
        };
        if self.kc > 1 || self.start == AmpStart::Init {
            s.i(setzi(m(3), c.entry));
        }
        if firsts > 0 {
            s.i(setzi(m(7), c.state));
        }
        // Block 0's last call's headers; each block's follow.
        s.i(setzi(
            m(8),
            shared + Self::CALL_HEADERS * self.shared_calls(),
        ));
        if blocks {
            s.i(setzi(m(4), self.nb));
        }
        let call = |s: &mut Asm, entry: MReg, state: MReg, before: &[Inst]| {
            s.i(Inst::SyncLocal);
            for &i in before {
                s.i(i);
            }
            load_weights(s);
            s.i(Inst::RunAll {
                entry,
                state,
                stride: HEADER as u16,
            });
            s.i(inti(IntOp::Add, state, state, calls));
        };
        let block = s.label();
        s.bind(block);
        let mut first = Vec::new();
        if blocks {
            first.push(inti(IntOp::Sub, m(4), m(4), 1));
            first.push(setzi(m(1), shared));
        }
        if pairs > 1 {
            first.push(setzi(m(6), pairs));
        }
        if self.kc == 1 {
            call(s, chunk0, m(8), &first);
        } else {
            call(s, chunk0, if firsts > 0 { m(7) } else { m(1) }, &first);
            if middle % 2 == 1 {
                call(s, m(3), m(1), &[]);
            }
            if pairs == 1 {
                call(s, m(3), m(1), &[]);
                call(s, m(3), m(1), &[]);
            } else if pairs > 1 {
                let pair = s.label();
                s.bind(pair);
                call(s, m(3), m(1), &[inti(IntOp::Sub, m(6), m(6), 1)]);
                call(s, m(3), m(1), &[]);
                s.brnz(m(6), pair);
            }
            call(s, m(3), m(8), &[]);
        }
        if blocks {
            s.brnz(m(4), block);
        }
        s.i(Inst::SyncLocal);
    }

    /// `kc == 1`: every call takes the zero-partial path on the same A, so only the
    /// output block advances between calls.
    fn single_chunk_loop(&self, s: &mut Asm, c: &Sup) {
        let loops = self.nb > 1;
        s.i(setzi(m(1), c.state));
        s.i(setzi(m(5), c.a));
        s.i(setzi(m(3), c.out));
        s.i(setzi(m(2), c.w)); // advanced 16 bytes by every weight load
        s.i(setzi(m(0), c.zero_entry));
        if loops {
            s.i(setzi(m(9), c.rb));
            s.i(setzi(m(4), self.nb));
        }
        s.i(st32m(m(5), m(1), 0));
        s.i(st32m(MZ, m(1), 1));
        s.i(st32m(m(3), m(1), 2));
        let block = s.label();
        if loops {
            s.i(int(IntOp::Add, m(3), m(3), m(9)));
            s.bind(block);
            // Waits for the previous block's run; at entry it has none.
            s.i(Inst::SyncLocal);
        }
        load_weights(s);
        c.run(s);
        if loops {
            // The workers run: the next block's header, then the loop test.
            s.i(inti(IntOp::Sub, m(4), m(4), 1));
            s.i(st32m(m(3), m(1), 2));
            s.i(int(IntOp::Add, m(3), m(3), m(9)));
            s.brnz(m(4), block);
        }
        s.i(Inst::SyncLocal);
    }

    /// `kc >= 2`: per block, chunk 0 reads no partials and writes `p0`; chunk c
    /// reads the buffer chunk c-1 wrote and writes the other one, except that the
    /// last chunk writes the block's output. Registers hold the header of the call
    /// after the one running: `$m5` A chunk, `$m7` partial-in, `$m8` output.
    fn chunk_loop(&self, s: &mut Asm, c: &Sup) {
        let blocks = self.nb > 1;
        // Chunks 0..kc-1 run in the loop, the last one after it.
        let looped = self.kc - 1;
        s.i(setzi(m(1), c.state));
        s.i(setzi(m(5), c.a));
        s.i(setzi(m(8), c.p0));
        s.i(setzi(m(2), c.w)); // advanced 16 bytes by every weight load
        s.i(setzi(m(0), c.zero_entry));
        s.i(setzi(m(3), c.out)); // output of the current block
        s.i(setzi(m(9), c.rb));
        s.i(setzi(m(10), c.p0 ^ c.p1));
        if blocks {
            s.i(setzi(m(4), self.nb));
            s.i(setzi(m(11), c.p0));
            s.i(setzi(m(12), c.a));
        }
        s.i(st32m(m(5), m(1), 0));
        s.i(st32m(MZ, m(1), 1));
        s.i(st32m(m(8), m(1), 2));
        next_chunk(s, c, m(5), m(8));
        if looped > 1 {
            s.i(setzi(m(6), looped));
        }
        let block = s.label();
        let chunk = s.label();
        s.bind(block);
        s.bind(chunk);
        // Waits for the previous run; at entry there is none.
        s.i(Inst::SyncLocal);
        load_weights(s);
        c.run(s);
        // The workers run: the next call's header, then the loop test.
        if looped > 1 {
            s.i(inti(IntOp::Sub, m(6), m(6), 1));
        }
        s.i(st32m(m(5), m(1), 0));
        s.i(st32m(m(7), m(1), 1));
        s.i(st32m(m(8), m(1), 2));
        next_chunk(s, c, m(5), m(8));
        s.i(setzi(m(0), c.entry));
        if looped > 1 {
            s.brnz(m(6), chunk);
        }
        // The last chunk: the header the loop stored names a partial buffer as
        // the output.
        s.i(Inst::SyncLocal);
        load_weights(s);
        s.i(st32m(m(3), m(1), 2));
        c.run(s);
        if blocks {
            // The workers run: the next block's chunk 0 header, the registers for
            // its chunk 1, then the loop test.
            s.i(inti(IntOp::Sub, m(4), m(4), 1));
            s.i(st32m(m(12), m(1), 0));
            s.i(st32m(MZ, m(1), 1));
            s.i(st32m(m(11), m(1), 2));
            s.i(int(IntOp::Add, m(3), m(3), m(9)));
            s.i(setzi(m(0), c.zero_entry));
            s.i(c.next_a(m(5), m(12)));
            s.i(mov(m(7), m(11)));
            s.i(int(IntOp::Xor, m(8), m(11), m(10)));
            if looped > 1 {
                s.i(setzi(m(6), looped));
            }
            s.brnz(m(4), block);
        }
        s.i(Inst::SyncLocal);
    }
}

/// Addresses the supervisor snippet is built from.
struct Sup {
    entry: u32,
    zero_entry: u32,
    bias_entry: u32,
    state: u32,
    stride: u16,
    a: u32,
    w: u32,
    out: u32,
    p0: u32,
    p1: u32,
    /// Bytes of one `[rows][16]` block.
    rb: u32,
    /// A is row-major: the next chunk starts 32 bytes on, not a block on.
    a_row_major: bool,
}

impl Sup {
    /// `d` = the A chunk after `a`'s.
    fn next_a(&self, d: MReg, a: MReg) -> Inst {
        if self.a_row_major {
            inti(IntOp::Add, d, a, 32)
        } else {
            int(IntOp::Add, d, a, m(9))
        }
    }

    fn run(&self, s: &mut Asm) {
        s.i(Inst::RunAll {
            entry: m(0),
            state: m(1),
            stride: self.stride,
        });
    }
}

/// Registers of the call after next from those of the next call (`a`, `out`;
/// `$m7` becomes the partial-in): the A chunk advances one block, the partials
/// swap buffers.
fn next_chunk(s: &mut Asm, c: &Sup, a: MReg, out: MReg) {
    s.i(c.next_a(a, a));
    s.i(mov(m(7), out));
    s.i(int(IntOp::Xor, out, out, m(10)));
}

fn load_weights(s: &mut Asm) {
    for quad in 0..32 {
        s.i(Inst::AmpLoadW { base: m(2), quad });
    }
}

/// Adds a worker's row offset (`$m6`, from its record) to the stream pointers;
/// A's as [`offset_a`] says.
fn offset_pointers(s: &mut Asm, f: Feed, row_major_kc: Option<u32>) {
    offset_a(s, row_major_kc);
    if f == Feed::Partials {
        s.i(int(IntOp::Add, m(4), m(4), m(6)));
    }
    s.i(int(IntOp::Add, m(5), m(5), m(6)));
}

/// Adds A's row offset to its pointer `$m3`: the row offset `$m6` itself for a
/// chunk-major A; for a row-major one of `kc` chunks a row, `kc` times it, and
/// the stride from a row's last quarter to the next row's first (`4*kc - 3`
/// atoms) goes into `$m9`.
fn offset_a(s: &mut Asm, row_major_kc: Option<u32>) {
    match row_major_kc {
        Some(kc) => {
            s.i(inti(IntOp::Mul, m(10), m(6), kc as u16));
            s.i(int(IntOp::Add, m(3), m(3), m(10)));
            s.i(setzi(m(9), 4 * kc - 3));
        }
        None => s.i(int(IntOp::Add, m(3), m(3), m(6))),
    }
}

/// The worker for splits with fewer than three rows for some worker: one entry,
/// branching on the row count (`$m7`, up to three) and on a zero partial-in; each
/// count's rows are emitted straight.
fn few_rows(s: &mut Asm, row_major_kc: Option<u32>) {
    let done = s.label();
    let zero = s.label();
    s.i(inti(IntOp::Shl, m(2), m(1), 3));
    s.i(int(IntOp::Sub, m(2), m(0), m(2))); // call header
    s.i(ld32m(m(3), m(2), 0)); // A chunk
    s.i(ld32m(m(4), m(2), 1)); // partial-in, 0 = zeros
    s.i(ld32m(m(5), m(2), 2)); // output
    s.i(ld32m(m(6), m(0), RECORD)); // row offset (bytes)
    s.i(ld32m(m(7), m(0), RECORD + 1)); // rows
    // Workers without rows exit here, after reading the header like the others.
    s.brz(m(7), done);
    offset_a(s, row_major_kc);
    s.i(int(IntOp::Add, m(5), m(5), m(6)));
    s.i(inti(IntOp::Sub, m(8), m(7), 1));
    s.brz(m(4), zero);
    s.i(int(IntOp::Add, m(4), m(4), m(6)));
    by_rows(s, Feed::Partials, row_major_kc.is_some());
    s.bind(zero);
    by_rows(s, Feed::Zeros, row_major_kc.is_some());
    s.bind(done);
    s.i(Inst::Exit);
}

/// Branches on `$m8` = rows - 1 (0..=2) to each count's straight code.
fn by_rows(s: &mut Asm, f: Feed, strided: bool) {
    let (one, two) = (s.label(), s.label());
    s.brz(m(8), one);
    s.i(inti(IntOp::Sub, m(8), m(8), 1));
    s.brz(m(8), two);
    rows_stream(s, f, Count::Fixed(3), strided);
    s.bind(two);
    rows_stream(s, f, Count::Fixed(2), strided);
    s.bind(one);
    rows_stream(s, f, Count::Fixed(1), strided);
}

/// How partial sums enter the engine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// A third stream from the partial-in buffer (`$m4`) into `$a2:3`, one row
    /// ahead of A.
    Partials,
    /// The zeroed pair `$a6:7`; only A and the output are streamed. Workers start
    /// with every register but `$m0`/`$m1` zeroed (ISA, `run`) and nothing here
    /// writes it.
    Zeros,
    /// Streamed like `Zeros`, with the block's bias in [`BIAS_PAIRS`] instead of
    /// the zeroed pair, one pair a phase.
    Bias,
}

impl Feed {
    fn pin(self, phase: u8) -> AReg {
        match self {
            Feed::Partials => a(2),
            Feed::Zeros => a(6),
            Feed::Bias => a(BIAS_PAIRS[usize::from(phase % 4)]),
        }
    }
    fn amp(self, phase: u8) -> Inst {
        Inst::Amp {
            out: a(4),
            inp: a(0),
            pin: self.pin(phase),
            phase,
        }
    }
}

fn store() -> Inst {
    Inst::St64Step {
        s: a(4),
        base: m(5),
        inc: 1,
    }
}

/// Where a worker's row count comes from.
#[derive(Clone, Copy)]
enum Count {
    /// The same `q >= 2` for every worker, whose output pointer is in its header
    /// of the table (`$m0` word 2): the code is specialised to `q`.
    Table(u32),
    /// One to three rows, known when the code is emitted, the output pointer in
    /// `$m5` already.
    Fixed(u32),
    /// At least three rows; the second word of the worker's record holds rows - 3.
    Record,
}

/// What one issue of a worker's row stream does besides its `amp`, as a function
/// of the issue's index `t` among the `amp` issues (`4 * rows + 4`: the rows, then
/// one row of draining) and the row count `q`. Issue t feeds input word t, loaded
/// by issue t-1, and yields output word t-4, stored by issue t+1; with partials
/// from a buffer, it also loads partial word t+5, which issue t+1 feeds to the
/// engine one row ahead of its inputs (docs/isa.md, "AMP").
#[derive(Clone, Copy, PartialEq, Eq)]
struct Slot {
    load: bool,
    pin: bool,
    store: bool,
    stride: bool,
}

impl Slot {
    fn at(f: Feed, t: u32, q: u32) -> Slot {
        let words = 4 * q;
        Slot {
            load: t + 1 < words,
            pin: f == Feed::Partials && t + 5 < words,
            store: (5..=words + 4).contains(&t),
            // A row-major A's last quarter of a row strides to the next row,
            // except the last row's: nothing is loaded after it.
            stride: (t + 1) % 4 == 3 && t + 2 < words,
        }
    }

    /// The main-pipe instruction (`nop` if the issue only runs the engine).
    fn inst(self, strided: bool) -> Inst {
        let (d, pa, ps, pp) = (a(0), m(3), m(5), m(4));
        let stride = self.stride && strided;
        match (self.load, self.pin, self.store, stride) {
            (false, _, false, _) => Inst::Nop,
            (false, _, true, _) => store(),
            (true, false, false, false) => Inst::Ld64Step {
                d,
                base: pa,
                inc: 1,
            },
            (true, false, false, true) => Inst::Ld64Stride {
                d,
                base: pa,
                stride: m(9),
            },
            (true, false, true, false) => Inst::Ldst64Pace {
                d,
                s: a(4),
                pl: pa,
                ps,
            },
            (true, false, true, true) => Inst::Ldst64PaceStride {
                d,
                s: a(4),
                pl: pa,
                ps,
                stride: m(9),
            },
            (true, true, false, false) => Inst::Ld2x64Pace {
                d0: d,
                d1: a(2),
                p0: pa,
                p1: pp,
            },
            (true, true, false, true) => Inst::Ld2x64PaceStride {
                d0: d,
                d1: a(2),
                p0: pa,
                p1: pp,
                stride: m(9),
            },
            (true, true, true, false) => Inst::Ld2xSt64Pace {
                d0: d,
                d1: a(2),
                s: a(4),
                p0: pa,
                p1: pp,
                ps,
            },
            (true, true, true, true) => Inst::Ld2xSt64PaceStride {
                d0: d,
                d1: a(2),
                s: a(4),
                p0: pa,
                p1: pp,
                ps,
                stride: m(9),
            },
        }
    }
}

/// Issues of [`rows_stream`] for `q` rows, from its first word to `exit`.
fn stream_issues(f: Feed, q: u32, count: Count) -> u64 {
    let q = u64::from(q);
    // The lead-in: the first input load, and with partials or a bias one row of
    // issues that puts the first row's partials in (the bias entry's four loads
    // of its bias ride in them).
    let lead = if f == Feed::Zeros { 1 } else { 5 };
    // The output pointer's load and the `rpt`, or the count's load and the `rpt`.
    let setup = match count {
        Count::Fixed(_) => 0,
        Count::Table(q) if !repeats(q) => 1,
        Count::Table(_) | Count::Record => 2,
    };
    lead + (4 * q + 4) + setup + 2
}

/// Whether [`rows_stream`] repeats a body for a table's `q` rows, rather than
/// emitting them straight.
fn repeats(q: u32) -> bool {
    q > 3
}

/// A worker's rows: the lead-in, four `amp` issues a row plus one row draining,
/// then the last store and `exit`. Up to three rows known at emit time are
/// emitted straight; otherwise the issues whose loads (partials included) and
/// stores all run are a repeated body of one row, and everything before and
/// after it is the same for every `q >= 3`, so the count is q - 3. No stream
/// reads or writes past its rows.
///
/// The words are placed so that the bundles need no padding: the lead-in starts
/// with a single word, and the `rpt` has one single word before it, which
/// computes what it can: the output pointer (a table's, which also precedes
/// straight code) or the count. The bias entry (`Feed::Bias`) loads its four
/// bias pairs from `$m4` in the lead-in.
fn rows_stream(s: &mut Asm, f: Feed, count: Count, strided: bool) {
    let straight = match count {
        Count::Table(q) if !repeats(q) => Some(q),
        Count::Fixed(q) => Some(q),
        Count::Table(_) | Count::Record => None,
    };
    if let Count::Table(q) = count
        && !repeats(q)
    {
        s.i(ld32m(m(5), m(0), 2));
    }
    match f {
        Feed::Zeros => {}
        Feed::Partials | Feed::Bias => {
            // Issue -5 loads the first partial word (or bias pair), -4..-2 feed
            // them one a phase while loading the next; -1 feeds the last and
            // loads the first input.
            let next = |i: usize| match f {
                Feed::Bias => Inst::Ld64Step {
                    d: a(BIAS_PAIRS[i]),
                    base: m(4),
                    inc: 1,
                },
                _ => Inst::Ld64Step {
                    d: a(2),
                    base: m(4),
                    inc: 1,
                },
            };
            s.single_or_bundle(next(0));
            for p in 0..3u8 {
                s.b(next(usize::from(p) + 1), f.amp(p));
            }
        }
    }
    // Issue -1: the first input word (and, with partials, row 1's first partial
    // word).
    let first = Slot {
        load: true,
        pin: f == Feed::Partials && straight.is_none_or(|q| q > 1),
        store: false,
        stride: false,
    }
    .inst(strided);
    if f == Feed::Zeros {
        s.single_or_bundle(first);
    } else {
        s.b(first, f.amp(3));
    }
    let emit = |s: &mut Asm, t: u32, q: u32| {
        s.b(Slot::at(f, t, q).inst(strided), f.amp((t % 4) as u8));
    };
    match straight {
        Some(q) => {
            for t in 0..4 * q + 4 {
                emit(s, t, q);
            }
        }
        None => {
            // Any q >= 3 gives the head and the tail; a large one the body.
            for t in 0..5 {
                emit(s, t, 3);
            }
            let body = |b: &mut Asm| (5..9).for_each(|t| emit(b, t, 64));
            match count {
                Count::Table(q) => {
                    s.i(ld32m(m(5), m(0), 2));
                    s.rpti(q as u16 - 3, body);
                }
                _ => {
                    s.i(ld32m(m(8), m(0), RECORD + 1));
                    s.rpt(m(8), body);
                }
            }
            for t in 5..16 {
                emit(s, t, 3);
            }
        }
    }
    s.i(store());
    s.i(Inst::Exit);
}

impl Kernel for AmpMatmul {
    fn symbol(&self) -> String {
        let rm = if self.a_row_major { "_rm" } else { "" };
        let own = match self.own {
            Some(o) => format!("_own{}x{}", o.first, o.rows),
            None => String::new(),
        };
        let start = match self.start {
            AmpStart::Zeros => "",
            AmpStart::Init => "_init",
            AmpStart::Bias => "_bias",
        };
        format!(
            "{}_r{}_kc{}_nb{}{rm}{own}{start}",
            Self::NAME,
            self.rows,
            self.kc,
            self.nb
        )
    }

    fn validate(&self) -> Result<(), KernelError> {
        let name = self.symbol();
        if self.rows == 0 || self.kc == 0 || self.nb == 0 {
            return Err(invalid(&name, "rows, kc and nb must be positive"));
        }
        if self.rows.div_ceil(WORKERS) > crate::RPT_MAX + 2 {
            return Err(invalid(&name, "more than 4097 rows per worker"));
        }
        if u64::from(self.rows) * 32 * u64::from(self.kc.max(self.nb)) >= 1 << 20
            || u64::from(self.kc) * u64::from(self.nb) * 512 >= 1 << 20
        {
            return Err(invalid(&name, "operand larger than tile memory"));
        }
        if self.start != AmpStart::Zeros && !self.table() {
            return Err(invalid(
                &name,
                "partial sums or a bias to start from need an even split of at least two rows a worker",
            ));
        }
        if self.own.is_some_and(|o| !self.own_fits(o)) {
            return Err(invalid(
                &name,
                "own rows must be whole workers' rows of an even split, blocks apart",
            ));
        }
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        // The zero-partial entry's offset is recomputed by the supervisor snippet.
        let _ = self.worker_code(&mut s);
        Ok(KernelCode {
            symbol: self.symbol(),
            code_base,
            entry: code_base,
            words: s.finish(),
        })
    }

    fn contract(&self) -> Contract {
        let rb = self.block_bytes();
        let mut ops = vec![
            Operand::new("a", Role::Input, rb * self.kc, 8),
            Operand::new("w", Role::Weights, 512 * self.kc * self.nb, 16)
                .class(MemClass::Interleaved),
            Operand::new("out", Role::Output, rb * self.nb, 8),
        ];
        let mut streamed = vec!["a", "out"];
        for (i, name) in ["p0", "p1"].into_iter().enumerate() {
            if self.partials() > i as u32 {
                ops.push(Operand::new(name, Role::InOut, rb, 8));
                streamed.push(name);
            }
        }
        // Only what one issue streams together must be apart: A with each of the
        // others; the two partial buffers (chunk c reads one and writes the
        // other); and the output with the partial-in of the last chunk (chunk
        // kc-1 reads what chunk kc-2 wrote), not with the other partial buffer.
        for &other in &streamed[1..] {
            separate_all(&mut ops, &["a", other]);
        }
        if self.kc >= 3 {
            separate_all(&mut ops, &["p0", "p1"]);
        }
        // Rows to `own` go by the output stream: apart from what it streams with.
        let mut outputs = vec!["out"];
        if let Some(o) = self.own {
            ops.push(Operand::new(
                "own",
                Role::Output,
                (self.nb - 1) * o.block_stride + o.rows * 32,
                8,
            ));
            separate_all(&mut ops, &["a", "own"]);
            outputs.push("own");
        }
        if self.start == AmpStart::Init {
            // Chunk 0 streams `init` with A and writes `p0`, or the output when
            // it is also the last chunk.
            ops.push(Operand::new("init", Role::Input, rb * self.nb, 8));
            separate_all(&mut ops, &["a", "init"]);
            if self.kc >= 2 {
                separate_all(&mut ops, &["init", "p0"]);
            } else {
                for &out in &outputs {
                    separate_all(&mut ops, &[out, "init"]);
                }
            }
        }
        if self.start == AmpStart::Bias {
            // Loaded alone, before the rows stream: no element rule.
            ops.push(Operand::new("bias", Role::Weights, 32 * self.nb, 8));
        }
        if self.kc >= 2 {
            let last_in = ["p0", "p1"][((self.kc - 2) % 2) as usize];
            for out in outputs {
                separate_all(&mut ops, &[out, last_in]);
            }
        }
        ops.push(Operand::new("state", Role::State, self.state_bytes(), 8));
        let supervisor_bytes = self
            .supervisor_words(
                &Call {
                    entry: 0,
                    state: 0,
                    addrs: &OperandAddrs::new()
                        .with("a", 0)
                        .with("w", 0)
                        .with("out", 0)
                        .with("p0", 0)
                        .with("p1", 0),
                },
                0,
            )
            .map(|w| code_bytes(&w))
            .unwrap_or(0);
        Contract {
            kernel: self.symbol(),
            code: CodeRequirement {
                bytes: self.code_bytes().unwrap_or(0),
                align: 8,
                mem_class: MemClass::Executable,
            },
            supervisor_bytes,
            operands: ops,
        }
    }

    fn state(&self, addrs: &OperandAddrs) -> Result<VertexState, KernelError> {
        self.validate()?;
        let mut buf = StateBuf::default();
        if let Rows::Even { q } = self.layout() {
            // The header table: worker w's rows start `w q` rows on, in A's chunk
            // (a row of every chunk, row-major), the partials and the output.
            let row = 32 * q;
            let a_row = row * if self.a_row_major { self.kc } else { 1 };
            let own = match self.own {
                Some(o) => Some((o, operand(addrs, &self.symbol(), "own")?)),
                None => None,
            };
            // The partial-in of a call: rows of a buffer (each worker at its own)
            // or a block's bias (every worker at the same).
            #[derive(Clone, Copy)]
            enum Pin {
                Rows(u32),
                Bias(u32),
            }
            // Chunk 0's partial-in for block b: block b of `init`, or block b's
            // bias.
            let start = match self.start {
                AmpStart::Zeros => None,
                AmpStart::Init => Some((
                    Pin::Rows(operand(addrs, &self.symbol(), "init")?),
                    self.block_bytes(),
                )),
                AmpStart::Bias => Some((Pin::Bias(operand(addrs, &self.symbol(), "bias")?), 32)),
            };
            // In table order: a call a block where the call names a block (the
            // last chunk's output, a continuing or biased chunk 0's partial-in),
            // one call shared by every block otherwise. The last chunk's workers
            // write that block of `out` or of `own`.
            let mut calls = Vec::new();
            for (c, &(a, pin, out)) in self.headers(addrs)?.iter().enumerate() {
                let last = c as u32 + 1 == self.kc;
                let pin_of = |b: u32| match start {
                    Some((Pin::Rows(base), step)) if c == 0 => Some(Pin::Rows(base + b * step)),
                    Some((Pin::Bias(base), step)) if c == 0 => Some(Pin::Bias(base + b * step)),
                    _ => (pin != 0).then_some(Pin::Rows(pin)),
                };
                if last || (c == 0 && start.is_some()) {
                    calls.extend((0..self.nb).map(|b| (a, pin_of(b), out, last.then_some(b))));
                } else {
                    calls.push((a, pin_of(0), out, None));
                }
            }
            for (a, pin, out, block) in calls {
                for w in 0..WORKERS {
                    let r0 = w * q;
                    let dst = match (block, own) {
                        (None, _) => out + w * row,
                        (Some(b), Some((o, base))) if (o.first..o.first + o.rows).contains(&r0) => {
                            base + b * o.block_stride + (r0 - o.first) * 32
                        }
                        (Some(b), _) => out + b * self.block_bytes() + w * row,
                    };
                    let pin = match pin {
                        None => 0,
                        Some(Pin::Rows(p)) => p + w * row,
                        Some(Pin::Bias(p)) => p,
                    };
                    buf.u32(a + w * a_row).u32(pin).u32(dst);
                }
            }
            return Ok(buf.finish(self.stride()));
        }
        // The header is rewritten by the supervisor before every run; only the row
        // split is built here. Operand addresses go into the supervisor snippet.
        buf.pad_to(HEADER as usize);
        let layout = self.layout();
        for (r0, r) in split(self.rows) {
            match layout {
                Rows::Even { .. } => {}
                Rows::Records => {
                    buf.u32(r0 * 32).u32(r - 3);
                }
                Rows::Few => {
                    buf.u32(r0 * 32).u32(r);
                }
            }
        }
        buf.pad_to(self.state_bytes() as usize);
        Ok(buf.finish(self.stride()))
    }

    fn supervisor(&self, call: &Call<'_>, code_base: u32) -> Result<Vec<Word>, KernelError> {
        self.validate()?;
        self.supervisor_words(call, code_base)
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        // The supervisor's work between runs depends on which slots the workers
        // leave free, so the snippet is walked with the real workers. Every pass of
        // a loop costs the same once the pipeline is in its steady state, so small
        // instances (one to four chunks, one to three blocks) are walked once per
        // timing and row count and extended linearly: the planner asks for
        // thousands of estimates.
        let walk = |kc: u32, nb: u32| walked(t, self.rows, kc, nb, self.a_row_major, self.start);
        let per_chunk = |nb: u32| -> u64 {
            if self.table() {
                // Chunks after the first run in pairs from five on (an odd one
                // peeled), so each two more chunks add one loop pass.
                return match self.kc {
                    0..=8 => walk(self.kc.max(1), nb),
                    kc => {
                        let base = 8 - (kc % 2);
                        let (x, y) = (walk(base, nb), walk(base + 2, nb));
                        x + u64::from((kc - base) / 2) * y.saturating_sub(x)
                    }
                };
            }
            match self.kc {
                0..=3 => walk(self.kc.max(1), nb),
                // Two chunks run straight through; from three on the chunk loop
                // loops, and each further chunk adds one pass.
                kc => {
                    let (three, four) = (walk(3, nb), walk(4, nb));
                    three + u64::from(kc - 3) * four.saturating_sub(three)
                }
            }
        };
        // One block emits no block loop at all; from two blocks on it is a loop.
        match self.nb {
            0 | 1 => per_chunk(1),
            2 => per_chunk(2),
            nb => {
                let (two, three) = (per_chunk(2), per_chunk(3));
                two + u64::from(nb - 2) * three.saturating_sub(two)
            }
        }
    }
}

/// Cycles of the snippet of `AmpMatmul::new(rows, kc, nb)` walked with its workers
/// (cached: see `estimate_cycles_with`).
fn walked(t: &Timing, rows: u32, kc: u32, nb: u32, row_major: bool, start: AmpStart) -> u64 {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Key = (u32, u32, u32, u32, u32, bool, AmpStart);
    use foldhash::fast::FixedState;
    // A hash map: the planner looks up thousands of row counts many times over.
    static WALKS: Mutex<HashMap<Key, u64, FixedState>> =
        Mutex::new(HashMap::with_hasher(FixedState::with_seed(0)));
    let key = (
        t.worker_issue_interval,
        t.supervisor_result_latency,
        rows,
        kc,
        nb,
        row_major,
        start,
    );
    if let Some(&c) = WALKS.lock().ok().as_ref().and_then(|w| w.get(&key)) {
        return c;
    }
    let mut k = AmpMatmul::new(rows, kc, nb);
    if row_major {
        k = k.row_major();
    }
    k = match start {
        AmpStart::Zeros => k,
        AmpStart::Init => k.continuing().unwrap_or(k),
        AmpStart::Bias => k.with_bias().unwrap_or(k),
    };
    // Placeholder addresses: the snippet's timing does not depend on them, and
    // `supervisor_words` does not insist on a shape that fits a tile (the walked
    // instance may be larger than the one estimated).
    let addrs = OperandAddrs::new()
        .with("a", 0x1000)
        .with("w", 0x2000)
        .with("out", 0x3000)
        .with("p0", 0x4000)
        .with("p1", 0x5000)
        .with("bias", 0x7000);
    let call = Call {
        entry: crate::ESTIMATE_CODE_BASE,
        state: 0x6000,
        addrs: &addrs,
    };
    let issues = |feed: Feed| -> Vec<u64> {
        split(rows)
            .into_iter()
            .map(|(_, r)| k.worker_issues(r, feed))
            .collect()
    };
    let chunk0 = issues(k.start.feed());
    let partials = issues(Feed::Partials);
    let c = k
        .supervisor_words(&call, crate::ESTIMATE_CODE_BASE)
        .map_or(u64::MAX / 4, |words| {
            // Run `k` is chunk `k % kc`; chunk 0 has no partial-in unless the
            // product continues from one.
            crate::supervisor_cycles(t, &words, |run| {
                if (run as u32).is_multiple_of(kc.max(1)) {
                    chunk0.clone()
                } else {
                    partials.clone()
                }
            })
        });
    if let Ok(mut w) = WALKS.lock() {
        w.insert(key, c);
    }
    c
}

/// Packs a row-major `[16*kc, 16*nb]` weight matrix into the `[nb][kc][16][16]` order
/// the kernel's `w` operand expects: quad `q` of block `(b, c)` is the 16 bytes of
/// `W[c*16 + q/2][b*16 + 8*(q%2) .. +8]`, i.e. weight quad `q` as `AmpLoadW` loads it.
pub fn pack_weights(kc: usize, nb: usize, w: &[f16]) -> Vec<f16> {
    let n = nb * 16;
    assert_eq!(w.len(), kc * 16 * n, "weights are not [16*kc, 16*nb]");
    let mut out = Vec::with_capacity(w.len());
    for b in 0..nb {
        for c in 0..kc {
            for kk in 0..16 {
                let row = (c * 16 + kk) * n + b * 16;
                out.extend_from_slice(&w[row..row + 16]);
            }
        }
    }
    let f = crate::mutation::factor("amp_matmul");
    if f != 1.0 {
        for v in &mut out {
            *v = f16::from_f32(v.to_f32() * f);
        }
    }
    out
}

/// Packs a row-major `[rows, 16*kc]` matrix into chunk-major `[kc][rows][16]` (what
/// the `rearrange` kernel computes on the tile).
pub fn pack_chunk_major(rows: usize, kc: usize, x: &[f16]) -> Vec<f16> {
    assert_eq!(x.len(), rows * kc * 16);
    let mut out = Vec::with_capacity(x.len());
    for c in 0..kc {
        for r in 0..rows {
            let at = r * kc * 16 + c * 16;
            out.extend_from_slice(&x[at..at + 16]);
        }
    }
    out
}

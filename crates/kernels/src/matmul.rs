//! `amp_matmul`: `out[rows, 16*nb] = A[rows, 16*kc] x W[16*kc, 16*nb]` in f16 on the
//! AMP, with f16 partial sums between 16-wide K chunks.
//!
//! Layouts: A is chunk-major `[kc][rows][16]` (what `rearrange` produces); W is
//! `[nb][kc][16][16]`, each 16x16 block row-major with `W[kk][j]` = weight from input
//! `c*16+kk` to output `b*16+j` (see [`pack_weights`]); the output is `[nb][rows][16]`.
//!
//! The supervisor snippet loops over blocks `b` and chunks `c`: it loads the block's
//! 32 weight quads, writes the call header (A chunk, partial-in, output) into the
//! state, runs the workers and waits. Partials ping-pong between `p0` and `p1`; the
//! first chunk has no partial-in buffer: its workers take the zero-partial path, which
//! feeds a zeroed register pair to the AMP instead of a third stream.
//!
//! Each worker streams its rows through the engine, four `amp` issues per row,
//! software-pipelined by one row (the engine hands out the previous row's results)
//! and by one issue on both sides (loads lead, stores lag), so no stream reads or
//! writes past its rows.

use half::f16;
use tessera_isa::{AReg, Inst, IntOp, Word};
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
}

/// Bytes of the call header at the start of the state buffer.
const HEADER: u32 = 12;
const STRIDE: u16 = 8;
const STATE_BYTES: u32 = 64;

impl AmpMatmul {
    pub const NAME: &'static str = "amp_matmul";

    pub fn new(rows: u32, kc: u32, nb: u32) -> AmpMatmul {
        AmpMatmul { rows, kc, nb }
    }

    fn block_bytes(&self) -> u32 {
        self.rows * 32
    }

    /// Partial-sum buffers the chunk loop needs: none, `p0`, or `p0` and `p1`.
    pub fn partials(&self) -> u32 {
        (self.kc - 1).min(2)
    }

    fn worker_code(&self, s: &mut Asm) {
        let done = s.label();
        let zero = s.label();
        let one_pin = s.label();
        let one_zero = s.label();
        s.i(inti(IntOp::Shl, m(2), m(1), 3));
        s.i(int(IntOp::Sub, m(2), m(0), m(2))); // call header
        s.i(ld32m(m(3), m(2), 0)); // A chunk
        s.i(ld32m(m(4), m(2), 1)); // partial-in, 0 = zeros
        s.i(ld32m(m(5), m(2), 2)); // output
        s.i(ld32m(m(6), m(0), HEADER as u16 / 4)); // row offset (bytes)
        s.i(ld32m(m(7), m(0), HEADER as u16 / 4 + 1)); // rows
        s.brz(m(7), done);
        s.i(int(IntOp::Add, m(3), m(3), m(6)));
        s.i(int(IntOp::Add, m(5), m(5), m(6)));
        s.i(inti(IntOp::Sub, m(8), m(7), 1));
        s.brz(m(4), zero);
        s.i(int(IntOp::Add, m(4), m(4), m(6)));
        s.brz(m(8), one_pin);
        rows_loop(s, Feed::Partials);
        s.bind(one_pin);
        one_row(s, Feed::Partials);
        s.bind(zero);
        // `$a6:7` is the zero partial: workers start with every register but
        // `$m0`/`$m1` zeroed (ISA, `run`) and nothing here writes it.
        s.brz(m(8), one_zero);
        rows_loop(s, Feed::Zeros);
        s.bind(one_zero);
        one_row(s, Feed::Zeros);
        s.bind(done);
        s.i(Inst::Exit);
    }

    /// Issues of one worker run with `r` rows, as emitted: setup, then four per row
    /// plus pipeline fill and drain; the partials path has one more pointer add.
    fn worker_issues(r: u32, partials: bool) -> u64 {
        let extra = u64::from(partials);
        match u64::from(r) {
            0 => 9,
            1 => 24 + extra,
            r => 4 * r + 22 + extra,
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
        for (what, v) in [
            ("entry", call.entry),
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
        let mut s = Asm::new(code_base);
        s.i(setzi(m(0), call.entry));
        s.i(setzi(m(1), call.state));
        s.i(setzi(m(2), w_addr)); // advanced 16 bytes by every weight load
        if self.kc == 1 {
            self.single_chunk_loop(&mut s, a_addr, out_addr);
        } else {
            self.chunk_loop(&mut s, a_addr, out_addr, p0, p1);
        }
        Ok(s.finish())
    }

    /// `kc == 1`: no partials, and A and the partial-in stay put, so only the output
    /// block advances between calls.
    fn single_chunk_loop(&self, s: &mut Asm, a_addr: u32, out_addr: u32) {
        let block = s.label();
        s.i(setzi(m(5), a_addr));
        s.i(setzi(m(3), out_addr));
        s.i(st32m(m(5), m(1), 0));
        s.i(st32m(MZ, m(1), 1));
        s.i(st32m(m(3), m(1), 2));
        if self.nb > 1 {
            s.i(setzi(m(4), self.nb));
            s.i(setzi(m(9), self.block_bytes()));
        }
        s.bind(block);
        load_weights(s);
        s.i(Inst::RunAll {
            entry: m(0),
            state: m(1),
            stride: STRIDE,
        });
        s.i(Inst::SyncLocal);
        if self.nb > 1 {
            s.i(int(IntOp::Add, m(3), m(3), m(9)));
            s.i(st32m(m(3), m(1), 2));
            s.i(inti(IntOp::Sub, m(4), m(4), 1));
            s.brnz(m(4), block);
        }
    }

    /// `kc >= 2`: per block, chunk 0 reads no partials and writes `p0`; chunk c
    /// reads the buffer chunk c-1 wrote and writes the other one, except that the
    /// last chunk writes the block's output.
    fn chunk_loop(&self, s: &mut Asm, a_addr: u32, out_addr: u32, p0: u32, p1: u32) {
        let block = s.label();
        let chunk = s.label();
        let not_last = s.label();
        s.i(setzi(m(3), out_addr)); // output of the current block
        if self.nb > 1 {
            s.i(setzi(m(4), self.nb));
        }
        s.i(setzi(m(9), self.block_bytes()));
        s.i(setzi(m(10), p0 ^ p1));
        s.bind(block);
        s.i(setzi(m(5), a_addr));
        s.i(setzi(m(6), self.kc));
        s.i(mov(m(7), MZ)); // partial-in of chunk 0: none
        s.i(setzi(m(8), p0));
        s.bind(chunk);
        load_weights(s);
        s.i(mov(m(12), m(8)));
        s.i(inti(IntOp::Sub, m(11), m(6), 1));
        s.brnz(m(11), not_last);
        s.i(mov(m(12), m(3)));
        s.bind(not_last);
        s.i(st32m(m(5), m(1), 0));
        s.i(st32m(m(7), m(1), 1));
        s.i(st32m(m(12), m(1), 2));
        s.i(Inst::RunAll {
            entry: m(0),
            state: m(1),
            stride: STRIDE,
        });
        s.i(Inst::SyncLocal);
        s.i(mov(m(7), m(12)));
        s.i(int(IntOp::Xor, m(8), m(8), m(10)));
        s.i(int(IntOp::Add, m(5), m(5), m(9)));
        s.i(inti(IntOp::Sub, m(6), m(6), 1));
        s.brnz(m(6), chunk);
        if self.nb > 1 {
            s.i(int(IntOp::Add, m(3), m(3), m(9)));
            s.i(inti(IntOp::Sub, m(4), m(4), 1));
            s.brnz(m(4), block);
        }
    }
}

fn load_weights(s: &mut Asm) {
    for quad in 0..32 {
        s.i(Inst::AmpLoadW { base: m(2), quad });
    }
}

/// How partial sums enter the engine.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// A third stream from the partial-in buffer (`$m4`) into `$a2:3`.
    Partials,
    /// The zeroed pair `$a6:7`; only A and the output are streamed.
    Zeros,
}

impl Feed {
    fn pin(self) -> AReg {
        match self {
            Feed::Partials => a(2),
            Feed::Zeros => a(6),
        }
    }
    fn load(self) -> Inst {
        match self {
            Feed::Partials => Inst::Ld2x64Pace {
                d0: a(0),
                d1: a(2),
                p0: m(3),
                p1: m(4),
            },
            Feed::Zeros => Inst::Ld64Step {
                d: a(0),
                base: m(3),
                inc: 1,
            },
        }
    }
    fn load_store(self) -> Inst {
        match self {
            Feed::Partials => Inst::Ld2xSt64Pace {
                d0: a(0),
                d1: a(2),
                s: a(4),
                p0: m(3),
                p1: m(4),
                ps: m(5),
            },
            Feed::Zeros => Inst::Ldst64Pace {
                d: a(0),
                s: a(4),
                pl: m(3),
                ps: m(5),
            },
        }
    }
    fn amp(self, phase: u8) -> Inst {
        Inst::Amp {
            out: a(4),
            inp: a(0),
            pin: self.pin(),
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

/// Rows (`$m7`) >= 2. Issue t (0-based over 4*rows amp issues plus four draining
/// ones) feeds input word t, loaded by issue t-1, and yields output word t-4, stored
/// by issue t+1. The first load and the repeat count are placed so that neither the
/// bundles nor the repeat body need padding.
fn rows_loop(s: &mut Asm, f: Feed) {
    s.single_or_bundle(f.load());
    for t in 0..5u8 {
        s.b(f.load(), f.amp(t % 4));
    }
    s.b(f.load_store(), f.amp(1));
    s.b(f.load_store(), f.amp(2));
    s.i(inti(IntOp::Sub, m(8), m(7), 2));
    s.rpt(m(8), |b| {
        for p in [3, 0, 1, 2] {
            b.b(f.load_store(), f.amp(p));
        }
    });
    s.b(store(), f.amp(3));
    for p in 0..4 {
        s.b(store(), f.amp(p));
    }
    s.i(store());
    s.i(Inst::Exit);
}

fn one_row(s: &mut Asm, f: Feed) {
    s.single_or_bundle(f.load());
    for t in 0..3u8 {
        s.b(f.load(), f.amp(t));
    }
    s.b(Inst::Nop, f.amp(3));
    s.b(Inst::Nop, f.amp(0));
    for p in 1..4 {
        s.b(store(), f.amp(p));
    }
    s.i(store());
    s.i(Inst::Exit);
}

impl Kernel for AmpMatmul {
    fn symbol(&self) -> String {
        format!("{}_r{}_kc{}_nb{}", Self::NAME, self.rows, self.kc, self.nb)
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
        Ok(())
    }

    fn emit(&self, code_base: u32) -> Result<KernelCode, KernelError> {
        self.validate()?;
        crate::check_code_base(&self.symbol(), code_base, 8)?;
        let mut s = Asm::new(code_base);
        self.worker_code(&mut s);
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
        separate_all(&mut ops, &streamed);
        ops.push(Operand::new("state", Role::State, STATE_BYTES, 8));
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
        // The header is rewritten by the supervisor before every run; only the row
        // split is built here. Operand addresses go into the supervisor snippet.
        let _ = addrs;
        let mut buf = StateBuf::default();
        buf.pad_to(HEADER as usize);
        for (r0, r) in split(self.rows) {
            buf.u32(r0 * 32).u32(r);
        }
        buf.pad_to(STATE_BYTES as usize);
        Ok(buf.finish(STRIDE))
    }

    fn supervisor(&self, call: &Call<'_>, code_base: u32) -> Result<Vec<Word>, KernelError> {
        self.validate()?;
        self.supervisor_words(call, code_base)
    }

    fn estimate_cycles_with(&self, t: &Timing) -> u64 {
        // Every `runall` is followed at once by `sync local`, after which the
        // supervisor resumes when the last worker exits, with every register long
        // ready. So a call costs its supervisor snippet walked with workers that
        // exit at once, plus, per run, what the real workers take beyond that.
        let zero = crate::run_cycles(t, [0; WORKERS as usize]);
        let run = |partials: bool| {
            crate::run_cycles(
                t,
                split(self.rows)
                    .into_iter()
                    .map(|(_, r)| Self::worker_issues(r, partials)),
            )
            .saturating_sub(zero)
        };
        let (kc, nb) = (u64::from(self.kc.max(1)), u64::from(self.nb.max(1)));
        let runs = if kc == 1 {
            nb * run(false)
        } else {
            nb * (run(false) + (kc - 1) * run(true))
        };
        supervisor_only_cycles(t, self.kc, self.nb) + runs
    }
}

/// Cycles of the matmul's supervisor snippet for `kc` chunks and `nb` blocks with
/// workers that exit at once. Every pass of a loop costs the same once the
/// pipeline is in its steady state, so small instances (one to three blocks and
/// chunks) are walked once per timing and extended linearly: the planner asks for
/// thousands of estimates.
fn supervisor_only_cycles(t: &Timing, kc: u32, nb: u32) -> u64 {
    use std::collections::BTreeMap;
    use std::sync::Mutex;
    static WALKS: Mutex<BTreeMap<(u32, u32, u32, u32), u64>> = Mutex::new(BTreeMap::new());
    let walk = |kc: u32, nb: u32| -> u64 {
        let key = (t.worker_issue_interval, t.supervisor_result_latency, kc, nb);
        if let Some(&c) = WALKS.lock().ok().as_ref().and_then(|w| w.get(&key)) {
            return c;
        }
        let c = crate::estimate_snippet(&AmpMatmul::new(1, kc, nb)).map_or(u64::MAX / 4, |words| {
            crate::supervisor_cycles(t, &words, |_| vec![0; WORKERS as usize])
        });
        if let Ok(mut w) = WALKS.lock() {
            w.insert(key, c);
        }
        c
    };
    let per_chunk = |nb: u32| -> u64 {
        match kc {
            0 | 1 => walk(1, nb),
            2 => walk(2, nb),
            kc => {
                let (two, three) = (walk(2, nb), walk(3, nb));
                two + u64::from(kc - 2) * three.saturating_sub(two)
            }
        }
    };
    // One block emits no block loop at all; from two blocks on it is a loop.
    match nb {
        0 | 1 => per_chunk(1),
        2 => per_chunk(2),
        nb => {
            let (two, three) = (per_chunk(2), per_chunk(3));
            two + u64::from(nb - 2) * three.saturating_sub(two)
        }
    }
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

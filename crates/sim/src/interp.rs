//! The instruction interpreter of one context. It runs until something the tile
//! must handle (exit, a fault, a supervisor instruction acting on other contexts or
//! on other tiles) and returns it as a [`Stop`]; everything else (registers, tile
//! memory, AMP state, repeat loops, the context's clock) it handles itself.

use crate::barrel::Barrel;
use crate::fault::FaultKind;
use crate::fp;
use crate::hazard::{Access, Hazards};
use crate::mem::{AddrError, Layout};
use crate::program::{FetchError, Program};
use std::sync::Arc;
use tessera_isa::{AReg, FBinOp, FUnOp, FVec, Inst, MReg, Word};

mod feed;

/// Register state, pc, repeat state and clock of one context.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ctx {
    pub m: [u32; 16],
    pub a: [u32; 16],
    pub pc: u32,
    /// Iterations of the active repeat still to run, counting the current one; 0
    /// when no repeat is active.
    pub rpt_left: u32,
    pub rpt_start: u32,
    pub rpt_end: u32,
    /// Earliest cycle of this context's next issue.
    pub clock: u64,
    /// Cycle of this context's latest issue.
    pub last_issue: u64,
    /// Supervisor only: the cycle from which each register's latest result may be
    /// read (bit layout of [`tessera_isa::RegUse`]).
    pub ready: [u64; 32],
    pub issues: u64,
    pub instructions: u64,
    /// Worker only: `$FP_SCL`, the exponent the FP8 conversions scale by (zero
    /// when the worker starts, like its other registers).
    pub fp_scl: i8,
}

/// One worker's AMP engine.
#[derive(Debug, Clone, Default)]
pub(crate) struct Amp {
    /// The row the inputs are multiplied into.
    pub acc: [f32; 16],
    /// The next row, whose partial sums enter one row ahead of its inputs.
    pub lead: [f32; 16],
    pub latch: [f32; 16],
}

impl Amp {
    /// What `f32v2gina` and `f16v2gina` read: accumulators 0 and 1, the rest
    /// moved down by two and zeros in at 14 and 15.
    fn take_pair(&mut self) -> (f32, f32) {
        let pair = (self.acc[0], self.acc[1]);
        self.acc.copy_within(2.., 0);
        self.acc[14..].fill(0.0);
        pair
    }
}

/// What a context shares with the rest of its tile.
#[derive(Clone)]
pub(crate) struct Shared {
    pub mem: Vec<u8>,
    pub prog: Arc<Program>,
    /// AMP weights `W[row][col]`, kept as f32 (exact images of the loaded f16).
    pub weights: [[f32; 16]; 16],
    /// Set when a store replaced `prog` (the interpreter refreshes its handle).
    pub code_dirty: bool,
    /// Which contexts hold the issue slots.
    pub barrel: Barrel,
    /// What the supervisor's exchange code has issued since the last global sync.
    pub xlog: crate::exchange::ExchangeLog,
    /// What worker runs accessed, for the supervisor's hazard checks.
    pub hz: Hazards,
}

/// Per-run constants.
#[derive(Clone)]
pub(crate) struct Env {
    pub layout: Layout,
    pub interval: u64,
    /// Cycles from a supervisor issue until its result may be read.
    pub latency: u64,
    /// Cycles an `amp` step holds its worker beyond its issue: none while six
    /// workers' steps fit the machine's AMP rate.
    pub amp_extra: u64,
    pub transcendental_issues: u64,
    /// Issue slots of an `f32tanh`.
    pub tanh_issues: u64,
    pub f16_exp_issues: u64,
    pub rpt_max: u32,
    pub budget: u64,
    /// Whether AMP feeder bundles take their fast paths (`feeder_bundle`,
    /// `feed`). Always on, except where the tests run the general path alone
    /// as the oracle the fast paths must agree with.
    pub feed_fast: bool,
}

/// A fault before it is placed (tile, context, symbol are added by the tile).
#[derive(Debug, Clone)]
pub(crate) struct Trap {
    pub kind: FaultKind,
    pub cause: String,
    pub address: Option<u32>,
    /// The other context of a hazard.
    pub races: Option<crate::fault::Context>,
}

#[cold]
pub(crate) fn trap(kind: FaultKind, cause: String, address: Option<u32>) -> Box<Trap> {
    Box::new(Trap {
        kind,
        cause,
        address,
        races: None,
    })
}

#[cold]
fn addr_trap(e: AddrError, addr: u64, size: u32, layout: &Layout) -> Box<Trap> {
    let cause = match e {
        AddrError::Outside => format!(
            "address {addr:#x} (+{size} bytes) is outside SRAM {:#x}..{:#x}",
            layout.start, layout.end
        ),
        AddrError::Misaligned => format!("address {addr:#x} is not {size}-byte aligned"),
        AddrError::NotInterleaved => format!(
            "address {addr:#x} is not in an interleaved region (required for 128-bit accesses)"
        ),
    };
    trap(
        FaultKind::InvalidMemoryAddress,
        cause,
        u32::try_from(addr).ok(),
    )
}

/// Why a context stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    /// `pc` and `word` name the faulting instruction (`word` is `None` when nothing
    /// could be fetched).
    Fault {
        trap: Box<Trap>,
        pc: u32,
        word: Option<Word>,
    },
    /// A supervisor instruction for the tile to carry out; `pc` is its address, the
    /// context's pc already points past it.
    Super { inst: Inst, pc: u32, word: Word },
    /// A `mark`; carry on after recording it.
    Mark { tag: u16, cycle: u64 },
}

/// A pending aux-pipe register write (up to a pair), applied after the main-pipe
/// instruction of the same bundle has read its operands: the value in bits
/// 0..64, the first register in 64..72, how many registers (0 to 2) in 72..80.
/// One integer rather than a struct of mixed widths: the loop keeps it on the
/// stack across the main instruction, and a struct's fields written one by one
/// were read back in a wider word, a load that waits for those stores to retire
/// (it was a twelfth of the interpreter's time).
#[derive(Clone, Copy)]
struct AuxOut(u128);

impl AuxOut {
    fn new(d: u8, n: u8, v: u64) -> AuxOut {
        AuxOut(u128::from(v) | (u128::from(d) << 64) | (u128::from(n) << 72))
    }
}

enum Flow {
    Next,
    Jump(u32),
    Rpt { count: u32, body: u8 },
    Stop(Inst),
}

type Res<T> = Result<T, Box<Trap>>;

#[inline(always)]
fn mr(ctx: &Ctx, r: MReg) -> u32 {
    ctx.m[(r.0 & 15) as usize]
}
#[inline(always)]
fn ar(ctx: &Ctx, r: AReg) -> u32 {
    ctx.a[(r.0 & 15) as usize]
}
#[inline(always)]
fn ar2(ctx: &Ctx, r: AReg) -> u64 {
    let i = (r.0 & 14) as usize;
    u64::from(ctx.a[i]) | (u64::from(ctx.a[i + 1]) << 32)
}
#[inline(always)]
fn set_m(ctx: &mut Ctx, r: MReg, v: u32) {
    ctx.m[(r.0 & 15) as usize] = v;
}
#[inline(always)]
fn set_a(ctx: &mut Ctx, r: AReg, v: u32) {
    ctx.a[(r.0 & 15) as usize] = v;
}
#[inline(always)]
fn set_a2(ctx: &mut Ctx, r: AReg, v: u64) {
    let i = (r.0 & 14) as usize;
    ctx.a[i] = v as u32;
    ctx.a[i + 1] = (v >> 32) as u32;
}

#[inline(always)]
fn rd32(mem: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([mem[off], mem[off + 1], mem[off + 2], mem[off + 3]])
}
#[inline(always)]
fn rd64(mem: &[u8], off: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&mem[off..off + 8]);
    u64::from_le_bytes(b)
}

impl Shared {
    #[inline(always)]
    fn wr(&mut self, env: &Env, addr: u32, off: usize, bytes: &[u8]) {
        self.mem[off..off + bytes.len()].copy_from_slice(bytes);
        if self.prog.overlaps(addr, bytes.len() as u32) {
            self.code_written(env, addr, bytes.len() as u32);
        }
    }

    #[cold]
    fn code_written(&mut self, env: &Env, addr: u32, len: u32) {
        let mem = &self.mem;
        Arc::make_mut(&mut self.prog).redecode(mem, env.layout.start, addr, len);
        self.code_dirty = true;
    }
}

/// Effective address `base + imm * size`, checked.
#[inline(always)]
fn ea(env: &Env, base: u32, imm: u16, size: u32) -> Res<(u32, usize)> {
    let addr = u64::from(base) + u64::from(imm) * u64::from(size);
    match env.layout.check(addr, size) {
        Ok(off) => Ok((addr as u32, off)),
        Err(e) => Err(addr_trap(e, addr, size, &env.layout)),
    }
}

#[inline(always)]
fn ea8(env: &Env, addr: u32) -> Res<usize> {
    env.layout
        .check(u64::from(addr), 8)
        .map_err(|e| addr_trap(e, addr.into(), 8, &env.layout))
}

/// `p + delta` for pointer post-increments: overflow is a fault, never a wrap.
#[inline(always)]
fn bump(p: u32, delta: i64) -> Res<u32> {
    u32::try_from(i64::from(p) + delta).map_err(|_| {
        trap(
            FaultKind::InvalidMemoryAddress,
            format!("pointer {p:#x} + {delta} overflows the address space"),
            Some(p),
        )
    })
}

/// Records a worker's access for the hazard checks, or checks a supervisor's
/// (its only memory instructions are `ld32`, `st32` and `ampw` on `$m`).
#[inline(always)]
fn access<const SUP: bool>(
    sh: &mut Shared,
    ctx: &Ctx,
    base: MReg,
    addr: u32,
    len: u32,
    how: Access,
) -> Res<()> {
    if SUP {
        sh.hz.supervisor(ctx.last_issue, addr, len, how)
    } else {
        sh.hz
            .note(base, addr, len, ctx.last_issue, how == Access::Store);
        Ok(())
    }
}

/// `p + 8` for paced pointers (checked like [`bump`]).
#[inline(always)]
fn step8(p: u32) -> Res<u32> {
    match p.checked_add(8) {
        Some(v) => Ok(v),
        None => bump(p, 8),
    }
}

#[cold]
fn conflict(addrs: &[u32], e: u32) -> Box<Trap> {
    let list: Vec<String> = addrs.iter().map(|a| format!("{a:#x}")).collect();
    trap(
        FaultKind::MemoryConflict,
        format!(
            "accesses {} in one issue are served by the same memory element {e}",
            list.join(", ")
        ),
        addrs.first().copied(),
    )
}

/// Whether a main-pipe instruction reads or writes `$a` registers (which the
/// supervisor does not have).
fn uses_areg(i: &Inst) -> bool {
    matches!(
        i,
        Inst::MovAm { .. }
            | Inst::MovMa { .. }
            | Inst::Ld32 { .. }
            | Inst::St32 { .. }
            | Inst::Ld64 { .. }
            | Inst::St64 { .. }
            | Inst::Ld64Step { .. }
            | Inst::St64Step { .. }
            | Inst::Ld128 { .. }
            | Inst::Ld2x64Pace { .. }
            | Inst::Ldst64Pace { .. }
            | Inst::Ld2xSt64Pace { .. }
            | Inst::Ld64Stride { .. }
            | Inst::Ld2x64PaceStride { .. }
            | Inst::Ldst64PaceStride { .. }
            | Inst::Ld2xSt64PaceStride { .. }
    )
}

/// Runs context `ctx` until it stops. `SUP` selects the supervisor's rules.
///
/// On an x86-64 host with AVX2 and F16C the same loop runs compiled for them
/// (the AMP step on 256-bit vectors, its f16 conversions by F16C); its results
/// are the same bit for bit: Rust contracts no multiply and add into a fused one,
/// and every f16 conversion is IEEE (exact, or rounded to nearest even) in either
/// form (`fp`). The features are checked here,
/// once a call, not on every conversion.
pub(crate) fn run<const SUP: bool>(
    sh: &mut Shared,
    ctx: &mut Ctx,
    amp: &mut Amp,
    env: &Env,
) -> Stop {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("f16c") {
        // SAFETY: the features the function is compiled for were detected.
        return unsafe { run_avx2::<SUP>(sh, ctx, amp, env) };
    }
    run_portable::<SUP, false>(sh, ctx, amp, env)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
fn run_avx2<const SUP: bool>(sh: &mut Shared, ctx: &mut Ctx, amp: &mut Amp, env: &Env) -> Stop {
    // The one instantiation with `F16C` true: the feature was detected.
    run_portable::<SUP, true>(sh, ctx, amp, env)
}

/// The loop itself, as [`run`] calls it on a host without AVX2 and F16C (and the
/// tests, to compare it with the other copy). `F16C` selects the conversions'
/// form (`fp::unpack4`): true only where the host has F16C.
#[inline(always)]
pub(crate) fn run_portable<const SUP: bool, const F16C: bool>(
    sh: &mut Shared,
    ctx: &mut Ctx,
    amp: &mut Amp,
    env: &Env,
) -> Stop {
    // A local handle on the code lets the loop borrow words in place (no copies on
    // the hot path) while `sh` is borrowed mutably; a store into code replaces
    // `sh.prog` and sets `code_dirty`, after which the handle is refreshed.
    let mut prog = Arc::clone(&sh.prog);
    loop {
        let pc = ctx.pc;
        if ctx.clock >= env.budget {
            return Stop::Fault {
                trap: trap(
                    FaultKind::Timeout,
                    format!("cycle budget of {} cycles exhausted", env.budget),
                    None,
                ),
                pc,
                word: prog.fetch(pc).ok().copied(),
            };
        }
        let word = match prog.fetch(pc) {
            Ok(w) => w,
            Err(e) => return fetch_fault(sh, env, pc, e),
        };
        let (len, n_inst) = match word {
            Word::Single(_) => (4u32, 1u64),
            Word::Bundle(..) => (8, 2),
        };
        ctx.issues += 1;
        ctx.instructions += n_inst;
        let before = ctx.clock;
        // The previous issue, which closes a feeder batch (`hazard::Feed`).
        let prev = ctx.last_issue;
        // Only the supervisor's timing depends on register use.
        let uses = if SUP {
            word_uses(word)
        } else {
            tessera_isa::RegUse::default()
        };
        if SUP {
            // The supervisor issues in a slot no worker holds, once the results it
            // reads have left the pipeline.
            let mut ready = ctx.clock;
            let mut reads = uses.reads;
            while reads != 0 {
                let r = reads.trailing_zeros() as usize;
                ready = ready.max(ctx.ready[r]);
                reads &= reads - 1;
            }
            let at = sh.barrel.first_free(ready, None);
            ctx.last_issue = at;
            ctx.clock = at + 1;
        } else {
            ctx.last_issue = ctx.clock;
            ctx.clock += env.interval;
        }
        if let Word::Bundle(m, a) = word
            && !SUP
            && env.feed_fast
            && pc.is_multiple_of(8)
            && feeder_bundle::<F16C>(sh, ctx, amp, env, m, a, ctx.last_issue, prev)
        {
            ctx.clock += env.amp_extra;
            ctx.m[15] = 0;
            ctx.a[15] = 0;
            advance(ctx, pc, 8);
            if !sh.code_dirty {
                feed::feeder_run::<F16C>(sh, ctx, amp, env, &prog);
            }
            if sh.code_dirty {
                sh.code_dirty = false;
                prog = Arc::clone(&sh.prog);
            }
            continue;
        }
        if !SUP && sh.hz.feeding() {
            sh.hz.close_feed(&ctx.m, prev);
        }
        let result = match word {
            Word::Single(i) => {
                if ctx.rpt_left > 0 && i.is_control() {
                    Err(in_repeat())
                } else if i.pipe() == tessera_isa::Pipe::Aux {
                    if SUP {
                        Err(sup_aux())
                    } else {
                        exec_aux::<F16C>(ctx, amp, sh, env, i).map(|out| {
                            apply(ctx, out);
                            Flow::Next
                        })
                    }
                } else {
                    exec_main::<SUP, F16C>(sh, ctx, env, i, pc, len)
                }
            }
            Word::Bundle(m, a) => {
                if !pc.is_multiple_of(8) {
                    Err(trap(
                        FaultKind::InvalidProgramCounter,
                        format!("bundle at {pc:#x} is not 8-byte aligned"),
                        Some(pc),
                    ))
                } else if SUP {
                    Err(sup_aux())
                } else if ctx.rpt_left > 0 && m.is_control() {
                    Err(in_repeat())
                } else {
                    // Both pipes read before either writes: the aux result waits
                    // until the main instruction has executed.
                    match exec_aux::<F16C>(ctx, amp, sh, env, a) {
                        Ok(out) => exec_main::<SUP, F16C>(sh, ctx, env, m, pc, len).inspect(|_| {
                            apply(ctx, out);
                        }),
                        Err(e) => Err(e),
                    }
                }
            }
        };
        ctx.m[15] = 0;
        ctx.a[15] = 0;
        if SUP && result.is_ok() {
            let (at, lat) = (ctx.last_issue, env.latency);
            for (set, delay) in [(uses.increments, 1), (uses.writes, lat)] {
                let mut bits = set;
                while bits != 0 {
                    let r = bits.trailing_zeros() as usize;
                    ctx.ready[r] = at + delay;
                    bits &= bits - 1;
                }
            }
            if let Ok(Flow::Jump(_)) = result {
                // A taken branch refills the pipeline.
                ctx.clock = ctx.clock.max(at + lat);
            }
        }
        match result {
            Ok(Flow::Next) => advance(ctx, pc, len),
            Ok(Flow::Jump(t)) => ctx.pc = t,
            Ok(Flow::Rpt { count, body }) => {
                if let Err(trap) = start_repeat(&prog, ctx, env, pc, len, count, body) {
                    return Stop::Fault {
                        trap,
                        pc,
                        word: Some(*word),
                    };
                }
            }
            Ok(Flow::Stop(inst)) => {
                advance(ctx, pc, len);
                if let Inst::Mark { tag } = inst {
                    return Stop::Mark {
                        tag,
                        cycle: ctx.last_issue,
                    };
                }
                return Stop::Super {
                    inst,
                    pc,
                    word: *word,
                };
            }
            Err(trap) => {
                // The faulting issue does not complete.
                ctx.clock = before;
                return Stop::Fault {
                    trap,
                    pc,
                    word: Some(*word),
                };
            }
        }
        if sh.code_dirty {
            sh.code_dirty = false;
            prog = Arc::clone(&sh.prog);
        }
    }
}

/// Register use of an issue (both halves of a bundle).
fn word_uses(word: &Word) -> tessera_isa::RegUse {
    match word {
        Word::Single(i) => i.reg_use(),
        Word::Bundle(m, a) => {
            let (x, y) = (m.reg_use(), a.reg_use());
            tessera_isa::RegUse {
                reads: x.reads | y.reads,
                writes: x.writes | y.writes,
                increments: x.increments | y.increments,
            }
        }
    }
}

#[inline(always)]
fn advance(ctx: &mut Ctx, pc: u32, len: u32) {
    let next = pc + len;
    if ctx.rpt_left > 0 && next == ctx.rpt_end {
        ctx.rpt_left -= 1;
        ctx.pc = if ctx.rpt_left > 0 {
            ctx.rpt_start
        } else {
            next
        };
    } else {
        ctx.pc = next;
    }
}

#[cold]
fn in_repeat() -> Box<Trap> {
    trap(
        FaultKind::InvalidInstruction,
        "control instruction inside a repeat body".into(),
        None,
    )
}

#[cold]
fn sup_aux() -> Box<Trap> {
    trap(
        FaultKind::InvalidInstruction,
        "the supervisor has no arithmetic registers: aux-pipe instruction in the supervisor".into(),
        None,
    )
}

#[cold]
fn fetch_fault(sh: &Shared, env: &Env, pc: u32, e: FetchError) -> Stop {
    let trap = match e {
        FetchError::NoCode => {
            let why = if !pc.is_multiple_of(4) {
                "is not 4-byte aligned"
            } else if !env.layout.is_executable(pc) {
                "is not in an executable region"
            } else {
                "is not in an executable segment"
            };
            trap(
                FaultKind::InvalidProgramCounter,
                format!("pc {pc:#x} {why}"),
                Some(pc),
            )
        }
        FetchError::Invalid => {
            let off = (pc - env.layout.start) as usize;
            let bytes = &sh.mem[off..(off + 8).min(sh.mem.len())];
            let msg = match tessera_isa::decode_word(bytes) {
                Err(e) => e.to_string(),
                Ok(_) => "undecodable word".into(),
            };
            trap(
                FaultKind::InvalidInstruction,
                format!("cannot decode the word at {pc:#x}: {msg}"),
                Some(pc),
            )
        }
    };
    Stop::Fault {
        trap,
        pc,
        word: None,
    }
}

fn start_repeat(
    prog: &Program,
    ctx: &mut Ctx,
    env: &Env,
    pc: u32,
    len: u32,
    count: u32,
    body: u8,
) -> Res<()> {
    if count > env.rpt_max {
        return Err(trap(
            FaultKind::InvalidOperand,
            format!("repeat count {count} exceeds the limit of {}", env.rpt_max),
            None,
        ));
    }
    let start = pc + len;
    let mut end = start;
    for _ in 0..body {
        end += match prog.fetch(end) {
            Ok(Word::Bundle(..)) => 8,
            Ok(Word::Single(_)) | Err(FetchError::Invalid) => 4,
            Err(FetchError::NoCode) => {
                return Err(trap(
                    FaultKind::InvalidProgramCounter,
                    format!("repeat body of {body} words runs past the end of code at {end:#x}"),
                    Some(end),
                ));
            }
        };
    }
    if count == 0 {
        ctx.pc = end;
    } else {
        ctx.rpt_left = count;
        ctx.rpt_start = start;
        ctx.rpt_end = end;
        ctx.pc = start;
    }
    Ok(())
}

#[inline(always)]
fn check_target(t: u32) -> Res<Flow> {
    if !t.is_multiple_of(4) {
        Err(trap(
            FaultKind::InvalidProgramCounter,
            format!("branch target {t:#x} is not 4-byte aligned"),
            Some(t),
        ))
    } else {
        Ok(Flow::Jump(t))
    }
}

#[inline(always)]
fn exec_main<const SUP: bool, const F16C: bool>(
    sh: &mut Shared,
    ctx: &mut Ctx,
    env: &Env,
    i: &Inst,
    pc: u32,
    len: u32,
) -> Res<Flow> {
    if SUP && uses_areg(i) {
        return Err(trap(
            FaultKind::InvalidInstruction,
            "the supervisor has no arithmetic registers".into(),
            None,
        ));
    }
    if !SUP && i.is_supervisor_only() {
        return Err(trap(
            FaultKind::InvalidInstruction,
            "supervisor-only instruction in a worker".into(),
            None,
        ));
    }
    match *i {
        Inst::Nop => {}
        Inst::Setzi { d, imm } => set_m(ctx, d, imm),
        Inst::Int { op, d, a, b } => {
            let v = op.apply(mr(ctx, a), mr(ctx, b));
            set_m(ctx, d, v)
        }
        Inst::IntImm { op, d, a, imm } => {
            let v = op.apply(mr(ctx, a), u32::from(imm));
            set_m(ctx, d, v)
        }
        Inst::MovAm { d, a } => set_a(ctx, d, mr(ctx, a)),
        Inst::MovMa { d, a } => set_m(ctx, d, ar(ctx, a)),
        Inst::Ld32M { d, base, imm } => {
            let (addr, off) = ea(env, mr(ctx, base), imm, 4)?;
            access::<SUP>(sh, ctx, base, addr, 4, Access::Load)?;
            set_m(ctx, d, rd32(&sh.mem, off))
        }
        Inst::Ld32 { d, base, imm } => {
            let (addr, off) = ea(env, mr(ctx, base), imm, 4)?;
            access::<SUP>(sh, ctx, base, addr, 4, Access::Load)?;
            set_a(ctx, d, rd32(&sh.mem, off))
        }
        Inst::St32M { s, base, imm } => {
            let (addr, off) = ea(env, mr(ctx, base), imm, 4)?;
            access::<SUP>(sh, ctx, base, addr, 4, Access::Store)?;
            sh.wr(env, addr, off, &mr(ctx, s).to_le_bytes())
        }
        Inst::St32 { s, base, imm } => {
            let (addr, off) = ea(env, mr(ctx, base), imm, 4)?;
            access::<SUP>(sh, ctx, base, addr, 4, Access::Store)?;
            sh.wr(env, addr, off, &ar(ctx, s).to_le_bytes())
        }
        Inst::Ld64 { d, base, imm } => {
            let (addr, off) = ea(env, mr(ctx, base), imm, 8)?;
            access::<SUP>(sh, ctx, base, addr, 8, Access::Load)?;
            set_a2(ctx, d, rd64(&sh.mem, off))
        }
        Inst::St64 { s, base, imm } => {
            let (addr, off) = ea(env, mr(ctx, base), imm, 8)?;
            access::<SUP>(sh, ctx, base, addr, 8, Access::Store)?;
            sh.wr(env, addr, off, &ar2(ctx, s).to_le_bytes())
        }
        Inst::Ld64Step { d, base, inc } => {
            let p = mr(ctx, base);
            let off = ea8(env, p)?;
            let next = bump(p, i64::from(inc) * 8)?;
            access::<SUP>(sh, ctx, base, p, 8, Access::Load)?;
            set_a2(ctx, d, rd64(&sh.mem, off));
            set_m(ctx, base, next)
        }
        Inst::St64Step { s, base, inc } => {
            let p = mr(ctx, base);
            let off = ea8(env, p)?;
            let next = bump(p, i64::from(inc) * 8)?;
            access::<SUP>(sh, ctx, base, p, 8, Access::Store)?;
            sh.wr(env, p, off, &ar2(ctx, s).to_le_bytes());
            set_m(ctx, base, next)
        }
        Inst::Ld128 { d, base, imm } => {
            let addr = u64::from(mr(ctx, base)) + u64::from(imm) * 16;
            let off = env
                .layout
                .check128(addr)
                .map_err(|e| addr_trap(e, addr, 16, &env.layout))?;
            // Inside SRAM, so below 2^32.
            access::<SUP>(sh, ctx, base, addr as u32, 16, Access::Load)?;
            let lo = rd64(&sh.mem, off);
            let hi = rd64(&sh.mem, off + 8);
            let q = (d.0 & 12) as usize;
            ctx.a[q] = lo as u32;
            ctx.a[q + 1] = (lo >> 32) as u32;
            ctx.a[q + 2] = hi as u32;
            ctx.a[q + 3] = (hi >> 32) as u32;
        }
        Inst::Ld64Stride { d, base, stride } => {
            let p = mr(ctx, base);
            let off = ea8(env, p)?;
            let next = bump(p, stride_bytes(ctx, stride))?;
            access::<SUP>(sh, ctx, base, p, 8, Access::Load)?;
            set_a2(ctx, d, rd64(&sh.mem, off));
            set_m(ctx, base, next)
        }
        Inst::Ld2x64Pace { d0, d1, p0, p1 } => ld2x64(sh, ctx, env, [d0, d1], [p0, p1], 8)?,
        Inst::Ld2x64PaceStride {
            d0,
            d1,
            p0,
            p1,
            stride,
        } => {
            let inc = stride_bytes(ctx, stride);
            ld2x64(sh, ctx, env, [d0, d1], [p0, p1], inc)?
        }
        Inst::Ldst64Pace { d, s, pl, ps } => ldst64(sh, ctx, env, d, s, [pl, ps], 8)?,
        Inst::Ldst64PaceStride {
            d,
            s,
            pl,
            ps,
            stride,
        } => {
            let inc = stride_bytes(ctx, stride);
            ldst64(sh, ctx, env, d, s, [pl, ps], inc)?
        }
        Inst::Ld2xSt64Pace {
            d0,
            d1,
            s,
            p0,
            p1,
            ps,
        } => ld2xst64(sh, ctx, env, [d0, d1], s, [p0, p1, ps], 8)?,
        Inst::Ld2xSt64PaceStride {
            d0,
            d1,
            s,
            p0,
            p1,
            ps,
            stride,
        } => {
            let inc = stride_bytes(ctx, stride);
            ld2xst64(sh, ctx, env, [d0, d1], s, [p0, p1, ps], inc)?
        }
        Inst::AmpLoadW { base, quad } => {
            let p = mr(ctx, base);
            let off = env
                .layout
                .check128(p.into())
                .map_err(|e| addr_trap(e, p.into(), 16, &env.layout))?;
            let next = bump(p, 16)?;
            access::<SUP>(sh, ctx, base, p, 16, Access::Load)?;
            if SUP {
                sh.hz.supervisor_ampw(ctx.last_issue)?;
            } else {
                sh.hz.worker_ampw(ctx.last_issue)?;
            }
            let row = (quad as usize / 2) & 15;
            let col = (quad as usize % 2) * 8;
            let w = &mut sh.weights[row][col..col + 8];
            w[..4].copy_from_slice(&fp::unpack4::<F16C>(rd64(&sh.mem, off)));
            w[4..].copy_from_slice(&fp::unpack4::<F16C>(rd64(&sh.mem, off + 8)));
            set_m(ctx, base, next);
        }
        Inst::Br { a } => return check_target(mr(ctx, a)),
        Inst::Bri { target } => return Ok(Flow::Jump(target)),
        Inst::Brz { c, target } => {
            if mr(ctx, c) == 0 {
                return Ok(Flow::Jump(target));
            }
        }
        Inst::Brnz { c, target } => {
            if mr(ctx, c) != 0 {
                return Ok(Flow::Jump(target));
            }
        }
        Inst::Call { link, target } => {
            set_m(ctx, link, pc + len);
            return Ok(Flow::Jump(target));
        }
        Inst::Rpt { count, body } => {
            return Ok(Flow::Rpt {
                count: mr(ctx, count),
                body,
            });
        }
        Inst::Rpti { count, body } => {
            return Ok(Flow::Rpt {
                count: count.into(),
                body,
            });
        }
        // Only the supervisor gets here (supervisor-only, checked above).
        Inst::Send { a, bytes } => {
            let addr = mr(ctx, a);
            if !env.layout.range_ok(addr, u32::from(bytes)) {
                return Err(trap(
                    FaultKind::InvalidExchangeConfiguration,
                    format!("send of {bytes} bytes at {addr:#x} reaches outside SRAM"),
                    Some(addr),
                ));
            }
            sh.xlog.sends.push((addr, u32::from(bytes)));
        }
        Inst::Mux { tile } => sh.xlog.mux = Some(tile),
        Inst::Recv { a, msg } => {
            let Some(src) = sh.xlog.mux else {
                return Err(trap(
                    FaultKind::InvalidExchangeConfiguration,
                    format!("recv of message {msg} with no incoming mux set"),
                    None,
                ));
            };
            sh.xlog.recvs.push((mr(ctx, a), src, msg));
        }
        Inst::Exit
        | Inst::Run { .. }
        | Inst::RunAll { .. }
        | Inst::SyncLocal
        | Inst::SyncGlobal
        | Inst::Exchange { .. }
        | Inst::HostXfer { .. }
        | Inst::Mark { .. } => return Ok(Flow::Stop(*i)),
        // Aux instructions never reach here.
        _ => {
            return Err(trap(
                FaultKind::InvalidInstruction,
                "aux-pipe instruction in the main-pipe slot".into(),
                None,
            ));
        }
    }
    Ok(Flow::Next)
}

#[inline(always)]
fn apply(ctx: &mut Ctx, out: AuxOut) {
    let d = usize::from((out.0 >> 64) as u8 & 15);
    let n = (out.0 >> 72) as u8;
    if n > 0 {
        ctx.a[d] = out.0 as u32;
        if n > 1 {
            ctx.a[(d + 1) & 15] = (out.0 >> 32) as u32;
        }
    }
}

/// An aux instruction that writes no register (its effect is on the
/// accumulators).
const NO_WRITE: AuxOut = AuxOut(0);

fn one(d: AReg, v: u32) -> AuxOut {
    AuxOut::new(d.0, 1, u64::from(v))
}
fn two(d: AReg, v: u64) -> AuxOut {
    AuxOut::new(d.0 & 14, 2, v)
}

fn fbin(op: FBinOp, a: f32, b: f32) -> f32 {
    match op {
        FBinOp::Add => a + b,
        FBinOp::Sub => a - b,
        FBinOp::Mul => a * b,
        FBinOp::Max => a.max(b),
        FBinOp::Min => a.min(b),
    }
}

/// Applies `f` lane-wise to the operands of format `vec`, returning the result
/// register(s). f16 lanes are computed in f32 and rounded once to f16 (exact for
/// add, sub and mul: f32 has more than twice f16's precision plus two bits).
fn lanes(ctx: &Ctx, vec: FVec, d: AReg, a: AReg, b: AReg, f: impl Fn(f32, f32) -> f32) -> AuxOut {
    match vec {
        FVec::F32 => one(d, f(fp::f(ar(ctx, a)), fp::f(ar(ctx, b))).to_bits()),
        FVec::F32V2 => {
            let (x, y) = (ar2(ctx, a), ar2(ctx, b));
            let lo = f(fp::f(x as u32), fp::f(y as u32)).to_bits();
            let hi = f(fp::f((x >> 32) as u32), fp::f((y >> 32) as u32)).to_bits();
            two(d, u64::from(lo) | (u64::from(hi) << 32))
        }
        FVec::F16V2 => {
            let (x, y) = (ar(ctx, a), ar(ctx, b));
            let mut out = 0u32;
            for l in 0..2 {
                let r = f(fp::h(x >> (16 * l)), fp::h(y >> (16 * l)));
                out |= u32::from(fp::f32_to_f16(r)) << (16 * l);
            }
            one(d, out)
        }
        FVec::F16V4 => {
            let (x, y) = (ar2(ctx, a), ar2(ctx, b));
            let mut out = 0u64;
            for l in 0..4 {
                let r = f(fp::h((x >> (16 * l)) as u32), fp::h((y >> (16 * l)) as u32));
                out |= u64::from(fp::f32_to_f16(r)) << (16 * l);
            }
            two(d, out)
        }
    }
}

fn fmac(ctx: &Ctx, vec: FVec, d: AReg, a: AReg, b: AReg) -> AuxOut {
    let f32_lane = |acc: u32, x: u32, y: u32| fp::f(x).mul_add(fp::f(y), fp::f(acc)).to_bits();
    // f16 lanes: the product of two f16 is exact in f64 and the sum with an f16
    // accumulator rounds there without ever landing on an f16 tie, so one rounding
    // to f16 follows.
    let f16_lane = |acc: u32, x: u32, y: u32| {
        let r = f64::from(fp::h(acc)) + f64::from(fp::h(x)) * f64::from(fp::h(y));
        u32::from(fp::f64_to_f16(r))
    };
    match vec {
        FVec::F32 => one(d, f32_lane(ar(ctx, d), ar(ctx, a), ar(ctx, b))),
        FVec::F32V2 => {
            let (z, x, y) = (ar2(ctx, d), ar2(ctx, a), ar2(ctx, b));
            let lo = f32_lane(z as u32, x as u32, y as u32);
            let hi = f32_lane((z >> 32) as u32, (x >> 32) as u32, (y >> 32) as u32);
            two(d, u64::from(lo) | (u64::from(hi) << 32))
        }
        FVec::F16V2 => {
            let (z, x, y) = (ar(ctx, d), ar(ctx, a), ar(ctx, b));
            let mut out = 0;
            for l in 0..2 {
                let s = 16 * l;
                out |= f16_lane(z >> s, x >> s, y >> s) << s;
            }
            one(d, out)
        }
        FVec::F16V4 => {
            let (z, x, y) = (ar2(ctx, d), ar2(ctx, a), ar2(ctx, b));
            let mut out = 0u64;
            for l in 0..4 {
                let s = 16 * l;
                let r = f16_lane((z >> s) as u32, (x >> s) as u32, (y >> s) as u32);
                out |= u64::from(r) << s;
            }
            two(d, out)
        }
    }
}

/// `f` of both f16 lanes of `x`, each widened to f32 and the result rounded to f16.
fn f16v2_map(x: u32, f: fn(f32) -> f32) -> u32 {
    let lo = fp::f32_to_f16(f(fp::h(x)));
    let hi = fp::f32_to_f16(f(fp::h(x >> 16)));
    u32::from(lo) | (u32::from(hi) << 16)
}

/// One AMP step (docs/isa.md, "AMP"): returns the previous row's output quarter as
/// four f16 lanes, takes four partials into the next row and accumulates 64
/// products into this one.
#[inline(always)]
fn amp_step<const F16C: bool>(
    amp: &mut Amp,
    weights: &[[f32; 16]; 16],
    inp: u64,
    pin: u64,
    phase: u8,
) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: `F16C` is true only in `run_avx2`'s copy of the loop, which runs
        // once AVX2 and F16C were detected.
        return unsafe { avx2::amp_step(amp, weights, inp, pin, phase) };
    }
    let p = (phase & 3) as usize;
    // Only the portable copy gets here: its written-out conversions are what the
    // two-copy tests compare the vector step's with.
    let x = fp::unpack4::<false>(inp);
    let partial = fp::unpack4::<false>(pin);
    let result = fp::pack4(&amp.latch[4 * p..4 * p + 4]);
    // Accumulate in a local copy (registers) rather than through `amp`: the same
    // operations in the same order, without a store per step.
    let mut acc = amp.acc;
    for (k, xk) in x.iter().enumerate() {
        let w = &weights[4 * p + k];
        for j in 0..16 {
            acc[j] += xk * w[j];
        }
    }
    for (lead, pk) in amp.lead[4 * p..4 * p + 4].iter_mut().zip(partial) {
        *lead += pk;
    }
    if p == 3 {
        amp.latch = acc;
        amp.acc = amp.lead;
        amp.lead = [0.0; 16];
    } else {
        amp.acc = acc;
    }
    result
}

/// [`amp_step`] on 256-bit vectors, for `run_avx2`'s copy of the loop: the
/// products stay in two registers, and the partials go to the lead row's
/// quarter with one 128-bit add, the same addition the scalar form makes lane
/// by lane.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::Amp;
    use crate::fp::f16c::{narrow, widen};
    use std::arch::x86_64::{
        _mm_add_ps, _mm_loadu_ps, _mm_storeu_ps, _mm256_add_ps, _mm256_castps128_ps256,
        _mm256_loadu_ps, _mm256_mul_ps, _mm256_permutevar8x32_ps, _mm256_set_m128,
        _mm256_set1_epi32, _mm256_setzero_ps, _mm256_storeu_ps,
    };

    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    pub(super) fn amp_step(
        amp: &mut Amp,
        weights: &[[f32; 16]; 16],
        inp: u64,
        pin: u64,
        phase: u8,
    ) -> u64 {
        let p = (phase & 3) as usize;
        let x = _mm256_castps128_ps256(widen(inp));
        let partial = widen(pin);
        let quarter: &[f32; 4] = amp.latch[4 * p..4 * p + 4].try_into().expect("4 lanes");
        // SAFETY: every pointer below is to 4, 8 or 16 f32 inside a borrowed array
        // (unaligned loads and stores).
        unsafe {
            let result = narrow(_mm_loadu_ps(quarter.as_ptr()));
            let mut lo = _mm256_loadu_ps(amp.acc.as_ptr());
            let mut hi = _mm256_loadu_ps(amp.acc.as_ptr().add(8));
            let rows = &weights[4 * p..4 * p + 4];
            for (k, w) in rows.iter().enumerate() {
                let xk = _mm256_permutevar8x32_ps(x, _mm256_set1_epi32(k as i32));
                lo = _mm256_add_ps(lo, _mm256_mul_ps(xk, _mm256_loadu_ps(w.as_ptr())));
                hi = _mm256_add_ps(hi, _mm256_mul_ps(xk, _mm256_loadu_ps(w.as_ptr().add(8))));
            }
            let lead = amp.lead.as_mut_ptr().add(4 * p);
            let quarter = _mm_add_ps(_mm_loadu_ps(lead), partial);
            if p == 3 {
                _mm256_storeu_ps(amp.latch.as_mut_ptr(), lo);
                _mm256_storeu_ps(amp.latch.as_mut_ptr().add(8), hi);
                // The lead row becomes the accumulators: read a quarter at a time,
                // as its quarters were stored (a wider load of narrower stores
                // still in flight waits for them to reach the cache), and its last
                // quarter straight from the register.
                let row = amp.lead.as_ptr();
                let acc_lo = _mm256_set_m128(_mm_loadu_ps(row.add(4)), _mm_loadu_ps(row));
                let acc_hi = _mm256_set_m128(quarter, _mm_loadu_ps(row.add(8)));
                _mm256_storeu_ps(amp.acc.as_mut_ptr(), acc_lo);
                _mm256_storeu_ps(amp.acc.as_mut_ptr().add(8), acc_hi);
                _mm256_storeu_ps(amp.lead.as_mut_ptr(), _mm256_setzero_ps());
                _mm256_storeu_ps(amp.lead.as_mut_ptr().add(8), _mm256_setzero_ps());
            } else {
                _mm_storeu_ps(lead, quarter);
                _mm256_storeu_ps(amp.acc.as_mut_ptr(), lo);
                _mm256_storeu_ps(amp.acc.as_mut_ptr().add(8), hi);
            }
            result
        }
    }
}

/// The byte increment a strided access takes from `$mStride`: a signed count of
/// 8-byte atoms.
#[inline(always)]
fn stride_bytes(ctx: &Ctx, stride: MReg) -> i64 {
    i64::from(mr(ctx, stride) as i32) * 8
}

/// `ld2x64pace`: two loads in different elements; the first pointer advances by
/// `inc0` bytes (8, or a stride), the second by 8.
#[inline(always)]
fn ld2x64(
    sh: &mut Shared,
    ctx: &mut Ctx,
    env: &Env,
    d: [AReg; 2],
    p: [MReg; 2],
    inc0: i64,
) -> Res<()> {
    let (a0, a1) = (mr(ctx, p[0]), mr(ctx, p[1]));
    let o0 = ea8(env, a0)?;
    let o1 = ea8(env, a1)?;
    let (e0, e1) = (env.layout.element(a0), env.layout.element(a1));
    if e0 == e1 {
        return Err(conflict(&[a0, a1], e0));
    }
    let (n0, n1) = (bump(a0, inc0)?, step8(a1)?);
    let t = ctx.last_issue;
    sh.hz.note(p[0], a0, 8, t, false);
    sh.hz.note(p[1], a1, 8, t, false);
    let (v0, v1) = (rd64(&sh.mem, o0), rd64(&sh.mem, o1));
    set_a2(ctx, d[0], v0);
    set_a2(ctx, d[1], v1);
    set_m(ctx, p[0], n0);
    set_m(ctx, p[1], n1);
    Ok(())
}

/// `ldst64pace`: a load and a store in different elements; the load pointer
/// advances by `inc_l` bytes, the store pointer by 8.
#[inline(always)]
fn ldst64(
    sh: &mut Shared,
    ctx: &mut Ctx,
    env: &Env,
    d: AReg,
    s: AReg,
    p: [MReg; 2],
    inc_l: i64,
) -> Res<()> {
    let (al, as_) = (mr(ctx, p[0]), mr(ctx, p[1]));
    let ol = ea8(env, al)?;
    let os = ea8(env, as_)?;
    let (el, es) = (env.layout.element(al), env.layout.element(as_));
    if el == es {
        return Err(conflict(&[al, as_], el));
    }
    let (nl, ns) = (bump(al, inc_l)?, step8(as_)?);
    let t = ctx.last_issue;
    sh.hz.note(p[0], al, 8, t, false);
    sh.hz.note(p[1], as_, 8, t, true);
    let sv = ar2(ctx, s);
    let lv = rd64(&sh.mem, ol);
    sh.wr(env, as_, os, &sv.to_le_bytes());
    set_a2(ctx, d, lv);
    set_m(ctx, p[0], nl);
    set_m(ctx, p[1], ns);
    Ok(())
}

/// `ld2xst64pace`: two loads and a store, all in different elements; the first
/// load pointer advances by `inc0` bytes, the others by 8.
#[inline(always)]
fn ld2xst64(
    sh: &mut Shared,
    ctx: &mut Ctx,
    env: &Env,
    d: [AReg; 2],
    s: AReg,
    p: [MReg; 3],
    inc0: i64,
) -> Res<()> {
    let (a0, a1, as_) = (mr(ctx, p[0]), mr(ctx, p[1]), mr(ctx, p[2]));
    let o0 = ea8(env, a0)?;
    let o1 = ea8(env, a1)?;
    let os = ea8(env, as_)?;
    let (e0, e1, es) = (
        env.layout.element(a0),
        env.layout.element(a1),
        env.layout.element(as_),
    );
    if e0 == e1 || e0 == es || e1 == es {
        let e = if e0 == e1 || e0 == es { e0 } else { e1 };
        return Err(conflict(&[a0, a1, as_], e));
    }
    let (n0, n1, ns) = (bump(a0, inc0)?, step8(a1)?, step8(as_)?);
    let t = ctx.last_issue;
    sh.hz.note(p[0], a0, 8, t, false);
    sh.hz.note(p[1], a1, 8, t, false);
    sh.hz.note(p[2], as_, 8, t, true);
    let sv = ar2(ctx, s);
    let (v0, v1) = (rd64(&sh.mem, o0), rd64(&sh.mem, o1));
    sh.wr(env, as_, os, &sv.to_le_bytes());
    set_a2(ctx, d[0], v0);
    set_a2(ctx, d[1], v1);
    set_m(ctx, p[0], n0);
    set_m(ctx, p[1], n1);
    set_m(ctx, p[2], ns);
    Ok(())
}

/// The operands of a feeder bundle, `{ ld2xst64pace ; amp }` (plain or strided).
#[derive(Clone, Copy)]
struct Feeder {
    /// The load destinations.
    d: [AReg; 2],
    /// The stored register.
    s: AReg,
    /// The pointers: loads, then the store.
    p: [MReg; 3],
    stride: Option<MReg>,
    out: AReg,
    inp: AReg,
    pin: AReg,
    phase: u8,
}

impl Feeder {
    /// `exec_main` reads the same two forms' fields in arms of its own, like
    /// every other pace instruction there: one reader shared by both measured
    /// slower on the general path (2-layer batch-4 package, one thread, 37.40
    /// against 37.02 s; batch 1, 13.16 against 12.98 s; min of three).
    #[inline(always)]
    fn of(main: &Inst, aux: &Inst) -> Option<Feeder> {
        let &Inst::Amp {
            out,
            inp,
            pin,
            phase,
        } = aux
        else {
            return None;
        };
        let (d, s, p, stride) = match *main {
            Inst::Ld2xSt64Pace {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
            } => ([d0, d1], s, [p0, p1, ps], None),
            Inst::Ld2xSt64PaceStride {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
                stride,
            } => ([d0, d1], s, [p0, p1, ps], Some(stride)),
            _ => return None,
        };
        Some(Feeder {
            d,
            s,
            p,
            stride,
            out,
            inp,
            pin,
            phase,
        })
    }
}

/// The AMP feeder bundle `{ ld2xst64pace ; amp }`, which dominates matrix
/// products, when all three accesses are valid and conflict-free. Returns false,
/// having changed nothing, otherwise: the general path then executes the bundle
/// and raises the fault. Same operations and order as the general path (operands
/// read first, the aux result written last).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn feeder_bundle<const F16C: bool>(
    sh: &mut Shared,
    ctx: &mut Ctx,
    amp: &mut Amp,
    env: &Env,
    main: &Inst,
    aux: &Inst,
    t: u64,
    prev: u64,
) -> bool {
    let Some(Feeder {
        d: [d0, d1],
        s,
        p: [p0, p1, ps],
        stride,
        out,
        inp,
        pin,
        phase,
    }) = Feeder::of(main, aux)
    else {
        return false;
    };
    let inc0 = stride.map_or(8, |r| stride_bytes(ctx, r));
    let (a0, a1, a2) = (mr(ctx, p0), mr(ctx, p1), mr(ctx, ps));
    let l = &env.layout;
    let (lo, hi) = (l.start, l.end - 8);
    let inside = |a: u32| lo <= a && a <= hi;
    if (a0 | a1 | a2) & 7 != 0 || !inside(a0) || !inside(a1) || !inside(a2) {
        return false;
    }
    // The strided pointer's next value must not overflow (the general path faults).
    let Ok(n0) = u32::try_from(i64::from(a0) + inc0) else {
        return false;
    };
    let (e0, e1, e2) = (l.element(a0), l.element(a1), l.element(a2));
    if e0 == e1 || e0 == e2 || e1 == e2 {
        return false;
    }
    // A weights hazard: the general path raises it.
    if sh.hz.worker_amp(t).is_err() {
        return false;
    }
    sh.hz
        .feed(&ctx.m, [p0, p1, ps], [a0, a1, a2], inc0, t, prev);
    let sv = ar2(ctx, s);
    let result = amp_step::<F16C>(amp, &sh.weights, ar2(ctx, inp), ar2(ctx, pin), phase);
    let v0 = rd64(&sh.mem, (a0 - lo) as usize);
    let v1 = rd64(&sh.mem, (a1 - lo) as usize);
    sh.wr(env, a2, (a2 - lo) as usize, &sv.to_le_bytes());
    set_a2(ctx, d0, v0);
    set_a2(ctx, d1, v1);
    // Below `end - 8`, so no overflow.
    set_m(ctx, p0, n0);
    set_m(ctx, p1, a1 + 8);
    set_m(ctx, ps, a2 + 8);
    set_a2(ctx, out, result);
    true
}

#[inline(always)]
/// Executes an aux-pipe instruction and returns its register result, which the
/// caller writes back once the main pipe has read its operands.
fn exec_aux<const F16C: bool>(
    ctx: &mut Ctx,
    amp: &mut Amp,
    sh: &mut Shared,
    env: &Env,
    i: &Inst,
) -> Res<AuxOut> {
    let out = match *i {
        Inst::Amp {
            out,
            inp,
            pin,
            phase,
        } => {
            sh.hz.worker_amp(ctx.last_issue)?;
            let result = amp_step::<F16C>(amp, &sh.weights, ar2(ctx, inp), ar2(ctx, pin), phase);
            ctx.clock += env.amp_extra;
            two(out, result)
        }
        Inst::FBin { op, vec, d, a, b } => lanes(ctx, vec, d, a, b, |x, y| fbin(op, x, y)),
        Inst::FMac { vec, d, a, b } => fmac(ctx, vec, d, a, b),
        Inst::FUn { op, d, a } => {
            let x = fp::f(ar(ctx, a));
            let r = match op {
                FUnOp::Exp => x.exp(),
                FUnOp::Recip => 1.0 / x,
                FUnOp::Rsqrt => 1.0 / x.sqrt(),
                FUnOp::Sqrt => x.sqrt(),
                FUnOp::Neg => -x,
                FUnOp::Abs => x.abs(),
                FUnOp::Tanh => x.tanh(),
            };
            // Iterative units hold the issue slot for extra issues.
            let issues = match op {
                FUnOp::Exp | FUnOp::Recip | FUnOp::Rsqrt | FUnOp::Sqrt => env.transcendental_issues,
                FUnOp::Tanh => env.tanh_issues,
                FUnOp::Neg | FUnOp::Abs => 1,
            };
            ctx.clock += env.interval * issues.saturating_sub(1);
            one(d, r.to_bits())
        }
        Inst::F16v2Tanh { d, a } => one(d, f16v2_map(ar(ctx, a), f32::tanh)),
        Inst::F16v2Exp { d, a } => {
            ctx.clock += env.interval * env.f16_exp_issues.saturating_sub(1);
            one(d, f16v2_map(ar(ctx, a), f32::exp))
        }
        Inst::F16Acc { a, quad } => {
            let (lanes, base) = if quad {
                (8, (a.0 & 12) as usize)
            } else {
                (4, (a.0 & 14) as usize)
            };
            for (j, acc) in amp.acc[..lanes].iter_mut().enumerate() {
                let word = ctx.a[base + j / 2];
                *acc += fp::h(word >> (16 * (j % 2)));
            }
            NO_WRITE
        }
        Inst::F32v2Gina { d } => {
            let (lo, hi) = amp.take_pair();
            two(d, u64::from(lo.to_bits()) | (u64::from(hi.to_bits()) << 32))
        }
        Inst::F16v4Cmac { a, b } => {
            let (pa, pb) = (ar2(ctx, a), ar2(ctx, b));
            for (j, acc) in amp.acc[..4].iter_mut().enumerate() {
                let lane = |x: u64| fp::h((x >> (16 * j)) as u32);
                // An f16 times an f16 is exact in f32: one rounding, the add.
                *acc += lane(pa) * lane(pb);
            }
            NO_WRITE
        }
        Inst::F16v2Gina { d } => {
            let (lo, hi) = amp.take_pair();
            let (lo, hi) = (fp::f32_to_f16(lo), fp::f32_to_f16(hi));
            one(d, u32::from(lo) | (u32::from(hi) << 16))
        }
        Inst::F8v4ToF16 { d, a } => two(d, crate::fp8::widen4(ar(ctx, a), ctx.fp_scl)),
        Inst::F16v8ToF8 { d, a } => {
            let q = (a.0 & 12) as usize;
            let lanes = |i: usize| u64::from(ctx.a[i]) | (u64::from(ctx.a[i + 1]) << 32);
            two(d, crate::fp8::narrow8(lanes(q), lanes(q + 2), ctx.fp_scl))
        }
        Inst::UputFpScl { a } => {
            // Only the low byte: the signed exponent, as the chip's own headers
            // place it.
            ctx.fp_scl = ar(ctx, a) as u8 as i8;
            NO_WRITE
        }
        Inst::F16v2ToF32 { d, a } => {
            let x = ar(ctx, a);
            let lo = fp::h(x).to_bits();
            let hi = fp::h(x >> 16).to_bits();
            two(d, u64::from(lo) | (u64::from(hi) << 32))
        }
        Inst::F32v2ToF16 { d, a } => {
            let x = ar2(ctx, a);
            let lo = fp::f32_to_f16(fp::f(x as u32));
            let hi = fp::f32_to_f16(fp::f((x >> 32) as u32));
            one(d, u32::from(lo) | (u32::from(hi) << 16))
        }
        Inst::Sort4x16 { hi, d, a, b } => {
            let (x, y) = (ar(ctx, a), ar(ctx, b));
            one(
                d,
                if hi {
                    (x >> 16) | (y & 0xffff_0000)
                } else {
                    (x & 0xffff) | (y << 16)
                },
            )
        }
        Inst::FSum { vec, d, a } => {
            let s = match vec {
                FVec::F32 => fp::f(ar(ctx, a)),
                FVec::F32V2 => {
                    let x = ar2(ctx, a);
                    fp::f(x as u32) + fp::f((x >> 32) as u32)
                }
                FVec::F16V2 => {
                    let x = ar(ctx, a);
                    fp::h(x) + fp::h(x >> 16)
                }
                FVec::F16V4 => {
                    let x = ar2(ctx, a);
                    ((fp::h(x as u32) + fp::h((x >> 16) as u32)) + fp::h((x >> 32) as u32))
                        + fp::h((x >> 48) as u32)
                }
            };
            one(d, s.to_bits())
        }
        Inst::FMov { d, a, pair } => {
            if pair {
                two(d, ar2(ctx, a))
            } else {
                one(d, ar(ctx, a))
            }
        }
        Inst::FBcast { vec, d, a } => {
            let x = ar(ctx, a);
            let h = x & 0xffff;
            match vec {
                FVec::F32 => one(d, x),
                FVec::F32V2 => two(d, u64::from(x) | (u64::from(x) << 32)),
                FVec::F16V2 => one(d, h | (h << 16)),
                FVec::F16V4 => two(d, u64::from(h) * 0x0001_0001_0001_0001),
            }
        }
        _ => {
            return Err(trap(
                FaultKind::InvalidInstruction,
                "main-pipe instruction in the aux-pipe slot".into(),
                None,
            ));
        }
    };
    Ok(out)
}

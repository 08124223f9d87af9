//! The instruction set as a Rust type. This enum is the contract between the
//! assembler, the disassembler, the kernel emitters and the simulator. Semantics are
//! specified in `docs/isa.md`; the binary encoding lives in `encode.rs`.

/// An address/integer register `$m0`..`$m15`. `$m15` reads as zero and ignores
/// writes (`$mzero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MReg(pub u8);

/// An arithmetic register `$a0`..`$a15` (32 bits). Pairs (`$a0:1`) hold 64-bit
/// values and start at an even register; quads (`$a0:3`) start at a multiple of 4.
/// `$a15` reads as zero and ignores writes (`$azero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AReg(pub u8);

impl MReg {
    pub const ZERO: MReg = MReg(15);
}
impl AReg {
    pub const ZERO: AReg = AReg(15);
}

/// Integer ALU operations on `$m` registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IntOp {
    Add,
    Sub,
    Mul,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    /// Arithmetic shift right.
    Sar,
    /// 1 if equal else 0.
    CmpEq,
    /// 1 if unsigned less-than else 0.
    CmpUlt,
    /// 1 if signed less-than else 0.
    CmpSlt,
    Min,
    Max,
}

impl IntOp {
    /// The operation's result (docs/isa.md): shifts by 32 or more give 0 (`sar`:
    /// the sign), `min`/`max` and `cmpslt` compare as signed.
    pub fn apply(self, a: u32, b: u32) -> u32 {
        match self {
            IntOp::Add => a.wrapping_add(b),
            IntOp::Sub => a.wrapping_sub(b),
            IntOp::Mul => a.wrapping_mul(b),
            IntOp::And => a & b,
            IntOp::Or => a | b,
            IntOp::Xor => a ^ b,
            IntOp::Shl => a.checked_shl(b).unwrap_or(0),
            IntOp::Shr => a.checked_shr(b).unwrap_or(0),
            IntOp::Sar => ((a as i32) >> b.min(31)) as u32,
            IntOp::CmpEq => u32::from(a == b),
            IntOp::CmpUlt => u32::from(a < b),
            IntOp::CmpSlt => u32::from((a as i32) < (b as i32)),
            IntOp::Min => (a as i32).min(b as i32) as u32,
            IntOp::Max => (a as i32).max(b as i32) as u32,
        }
    }
}

/// Binary floating-point operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FBinOp {
    Add,
    Sub,
    Mul,
    Max,
    Min,
}

/// Lane format of a floating-point instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FVec {
    /// One f32 in a single register.
    F32,
    /// Two f32 in a register pair.
    F32V2,
    /// Two f16 in a single register.
    F16V2,
    /// Four f16 in a register pair.
    F16V4,
}

/// Scalar f32 unary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FUnOp {
    Exp,
    Recip,
    Rsqrt,
    Sqrt,
    Neg,
    Abs,
    Tanh,
}

/// One instruction. Main-pipe instructions (memory, integer, control, supervisor)
/// and aux-pipe instructions (floating point, AMP) may be paired into a bundle that
/// issues in one slot; see [`Word`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Inst {
    // ---- main pipe: integer and register moves ----
    Nop,
    /// `$mD = imm` (zero-extended, imm < 2^20).
    Setzi {
        d: MReg,
        imm: u32,
    },
    /// `$mD = $mA op $mB`.
    Int {
        op: IntOp,
        d: MReg,
        a: MReg,
        b: MReg,
    },
    /// `$mD = $mA op imm` (imm is a 12-bit unsigned value, zero-extended).
    IntImm {
        op: IntOp,
        d: MReg,
        a: MReg,
        imm: u16,
    },
    /// `$aD = $mA` (bit copy).
    MovAm {
        d: AReg,
        a: MReg,
    },
    /// `$mD = $aA` (bit copy).
    MovMa {
        d: MReg,
        a: AReg,
    },

    // ---- main pipe: memory ----
    // Effective address = $mBase + imm * access size (imm unsigned, 12 bits) unless
    // stated. Every access is checked for alignment to its size, SRAM bounds, and
    // region rules (see docs/isa.md).
    /// 32-bit load into an `$m` register.
    Ld32M {
        d: MReg,
        base: MReg,
        imm: u16,
    },
    /// 32-bit load into an `$a` register.
    Ld32 {
        d: AReg,
        base: MReg,
        imm: u16,
    },
    /// 32-bit store from an `$m` register.
    St32M {
        s: MReg,
        base: MReg,
        imm: u16,
    },
    /// 32-bit store from an `$a` register.
    St32 {
        s: AReg,
        base: MReg,
        imm: u16,
    },
    /// 64-bit load into a pair.
    Ld64 {
        d: AReg,
        base: MReg,
        imm: u16,
    },
    /// 64-bit store from a pair.
    St64 {
        s: AReg,
        base: MReg,
        imm: u16,
    },
    /// 64-bit load at `$mBase`, then `$mBase += inc * 8` (inc signed, -128..=127).
    Ld64Step {
        d: AReg,
        base: MReg,
        inc: i8,
    },
    /// 64-bit store at `$mBase`, then `$mBase += inc * 8`.
    St64Step {
        s: AReg,
        base: MReg,
        inc: i8,
    },
    /// 128-bit load into a quad; 16-byte aligned, interleaved region only.
    Ld128 {
        d: AReg,
        base: MReg,
        imm: u16,
    },
    /// Two 64-bit loads in one issue, each pointer then advanced by 8 bytes. The two
    /// addresses must be served by different memory elements (else MemoryConflict).
    Ld2x64Pace {
        d0: AReg,
        d1: AReg,
        p0: MReg,
        p1: MReg,
    },
    /// A 64-bit load and a 64-bit store in one issue, each pointer then advanced by
    /// 8 bytes; different elements required.
    Ldst64Pace {
        d: AReg,
        s: AReg,
        pl: MReg,
        ps: MReg,
    },
    /// Two 64-bit loads and one 64-bit store in one issue (the AMP feeder), each
    /// pointer then advanced by 8 bytes; all three accesses in different elements.
    Ld2xSt64Pace {
        d0: AReg,
        d1: AReg,
        s: AReg,
        p0: MReg,
        p1: MReg,
        ps: MReg,
    },
    /// The strided forms (the chip's `$mStride` operand, reduced to one register):
    /// the first pointer advances by `8 * m[stride]` bytes (`m[stride]` signed), the
    /// others by 8 as in the plain forms. They let a stream walk a row-major matrix
    /// a few columns at a time (the AMP reading rows of a wider input).
    /// `ld64step` whose pointer advances by `8 * m[stride]`.
    Ld64Stride {
        d: AReg,
        base: MReg,
        stride: MReg,
    },
    /// `ld2x64pace` whose first pointer advances by `8 * m[stride]`.
    Ld2x64PaceStride {
        d0: AReg,
        d1: AReg,
        p0: MReg,
        p1: MReg,
        stride: MReg,
    },
    /// `ldst64pace` whose load pointer advances by `8 * m[stride]`.
    Ldst64PaceStride {
        d: AReg,
        s: AReg,
        pl: MReg,
        ps: MReg,
        stride: MReg,
    },
    /// `ld2xst64pace` whose first pointer advances by `8 * m[stride]`. The two load
    /// destinations form a quad (`d1 = d0 + 2`, `d0` a multiple of 4): the encoding
    /// has no room for two separate pairs beside the stride.
    Ld2xSt64PaceStride {
        d0: AReg,
        d1: AReg,
        s: AReg,
        p0: MReg,
        p1: MReg,
        ps: MReg,
        stride: MReg,
    },
    /// Loads 16 bytes at `$mBase` (ld128 rules) into AMP weight quad `quad`
    /// (0..=31) of this tile, then `$mBase += 16`.
    AmpLoadW {
        base: MReg,
        quad: u8,
    },

    // ---- main pipe: control ----
    /// Jump to an absolute address held in `$mA`.
    Br {
        a: MReg,
    },
    /// Jump to an absolute address (imm < 2^20, 4-byte aligned).
    Bri {
        target: u32,
    },
    /// Jump if `$mC == 0`.
    Brz {
        c: MReg,
        target: u32,
    },
    /// Jump if `$mC != 0`.
    Brnz {
        c: MReg,
        target: u32,
    },
    /// `$mLink = pc + 4 (or + 8 in a bundle)`, jump to `target`.
    Call {
        link: MReg,
        target: u32,
    },
    /// Repeat the following `body` words (1..=255 bundles or single words) `$mCount`
    /// times (0..=rpt_max_count; more faults with InvalidOperand). Control
    /// instructions inside the body fault with InvalidInstruction.
    Rpt {
        count: MReg,
        body: u8,
    },
    /// Repeat with an immediate count (< 4096).
    Rpti {
        count: u16,
        body: u8,
    },
    /// Worker: finish. Supervisor: the tile's program is complete.
    Exit,

    // ---- main pipe: supervisor only ----
    /// Start worker `worker` (0..=5) at entry `$mEntry` with state pointer `$mState`
    /// (both 4-byte aligned; entry executable). The worker starts with `$m0 = state`,
    /// `$m1 = worker index`, all other registers zero.
    Run {
        entry: MReg,
        state: MReg,
        worker: u8,
    },
    /// Start all six workers at `$mEntry`, worker i with `$m0 = $mState + i * stride`
    /// and `$m1 = i`.
    RunAll {
        entry: MReg,
        state: MReg,
        stride: u16,
    },
    /// Wait until every worker of this tile has exited.
    SyncLocal,
    /// Chip-wide barrier: every tile's supervisor must arrive.
    SyncGlobal,
    /// End this tile's part of exchange phase `id`: the sends and receives its
    /// exchange code issued since the `SyncGlobal` are carried out together with
    /// every other tile's. Must follow a `SyncGlobal`; a tile whose messages another
    /// tile receives must end the same phase in the same superstep.
    Exchange {
        id: u16,
    },
    /// Exchange code: broadcast `bytes` bytes from `$mA` on this tile's exchange bus
    /// as its next message of the current exchange phase (messages are numbered from
    /// 0 in issue order). Supervisor only, between a `sync global` and `exchange`.
    Send {
        a: MReg,
        bytes: u16,
    },
    /// Exchange code: point this tile's incoming mux at tile `tile`'s bus.
    Mux {
        tile: u32,
    },
    /// Exchange code: land message `msg` of the tile the incoming mux selects at
    /// `$mA` (its length is the sender's).
    Recv {
        a: MReg,
        msg: u16,
    },
    /// Carry out the host transfers described by the descriptor list at `$mDesc`
    /// (format in docs/isa.md, host section).
    HostXfer {
        desc: MReg,
    },
    /// Record a trace event (profile marker) with a 16-bit tag.
    Mark {
        tag: u16,
    },

    // ---- aux pipe: floating point ----
    /// `$aD = $aA op $aB` over the lanes of `vec`.
    FBin {
        op: FBinOp,
        vec: FVec,
        d: AReg,
        a: AReg,
        b: AReg,
    },
    /// `$aD += $aA * $aB` over the lanes (computed in f32, rounded once to the lane
    /// format).
    FMac {
        vec: FVec,
        d: AReg,
        a: AReg,
        b: AReg,
    },
    /// Scalar f32 `$aD = op($aA)`.
    FUn {
        op: FUnOp,
        d: AReg,
        a: AReg,
    },
    /// `tanh` of both f16 lanes of `$aA` (computed in f32, rounded to f16) into
    /// `$aD`.
    F16v2Tanh {
        d: AReg,
        a: AReg,
    },
    /// `exp` of both f16 lanes of `$aA` (computed in f32, rounded to f16) into
    /// `$aD`; one issue, as `f16v2tanh`.
    F16v2Exp {
        d: AReg,
        a: AReg,
    },
    /// Pair of f32 from two f16 in `$aA`: `$aD:pair = (f32(lo), f32(hi))`.
    F16v2ToF32 {
        d: AReg,
        a: AReg,
    },
    /// Two f16 (round to nearest even) from the f32 pair `$aA`.
    F32v2ToF16 {
        d: AReg,
        a: AReg,
    },
    /// `sort4x16lo` / `sort4x16hi` (`hi`): the low (high) 16-bit halves of `$aA`
    /// and `$aB` side by side, `$aA`'s in the low half of `$aD`. Bits moved as they
    /// are: a 2x2 transpose of f16 is one of each.
    Sort4x16 {
        hi: bool,
        d: AReg,
        a: AReg,
        b: AReg,
    },
    /// `f16v4acc` (a pair) or `f16v8acc` (`quad`): the four or eight f16 lanes of
    /// `$aA`, widened, added into accumulators `0..4` or `0..8` of this worker's
    /// engine (the sixteen f32 accumulators the AMP also uses).
    F16Acc {
        a: AReg,
        quad: bool,
    },
    /// `f32v2gina`: accumulators 0 and 1 into the pair `$aD`; accumulators `2..16`
    /// move down by two and zeros enter at 14 and 15.
    F32v2Gina {
        d: AReg,
    },
    /// `f16v2gina`: accumulators 0 and 1, each rounded to f16, into `$aD` (lane 0
    /// from accumulator 0); the accumulators then move as for `f32v2gina`.
    F16v2Gina {
        d: AReg,
    },
    /// `f16v4cmac`: the four lane products of the pairs `$aA` and `$aB` (exact in
    /// f32) added into accumulators `0..4`.
    F16v4Cmac {
        a: AReg,
        b: AReg,
    },
    /// Sum of the lanes, as f32 into a single register (F16V4 and F32V2 read pairs).
    FSum {
        vec: FVec,
        d: AReg,
        a: AReg,
    },
    /// `$aD = $aA` (32 bits) or pair copy when `pair`.
    FMov {
        d: AReg,
        a: AReg,
        pair: bool,
    },
    /// Broadcast the f32 `$aA` to both lanes of the pair `$aD`... or, for F16V4, the
    /// low f16 of `$aA` to all four lanes of `$aD`.
    FBcast {
        vec: FVec,
        d: AReg,
        a: AReg,
    },
    /// AMP step on this worker's engine: the four f16 in `$aIn` (a pair) multiply
    /// weight rows `4*phase .. 4*phase+4` (phase 0..=3) into the sixteen f32
    /// accumulators (64 MACs); the four f16 partial sums in `$aPin` are added to
    /// accumulators `4*phase..4*phase+4`; `$aOut` receives accumulators
    /// `4*phase..4*phase+4` of the previously completed row, rounded to f16. At
    /// phase 3 the row completes: the accumulators move to the output latch and reset.
    Amp {
        out: AReg,
        inp: AReg,
        pin: AReg,
        phase: u8,
    },
}

/// One issue slot: a single instruction or a bundle of a main-pipe and an aux-pipe
/// instruction. A bundle occupies 8 bytes and must be 8-byte aligned; both
/// instructions read their operands before either writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Word {
    Single(Inst),
    Bundle(Inst, Inst),
}

/// Which pipe executes an instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pipe {
    Main,
    Aux,
}

impl Inst {
    pub fn pipe(&self) -> Pipe {
        match self {
            Inst::FBin { .. }
            | Inst::FMac { .. }
            | Inst::FUn { .. }
            | Inst::F16v2Tanh { .. }
            | Inst::F16v2Exp { .. }
            | Inst::F16v2ToF32 { .. }
            | Inst::F32v2ToF16 { .. }
            | Inst::Sort4x16 { .. }
            | Inst::FSum { .. }
            | Inst::F16Acc { .. }
            | Inst::F32v2Gina { .. }
            | Inst::F16v2Gina { .. }
            | Inst::F16v4Cmac { .. }
            | Inst::FMov { .. }
            | Inst::FBcast { .. }
            | Inst::Amp { .. } => Pipe::Aux,
            _ => Pipe::Main,
        }
    }

    /// Control-flow instructions: forbidden inside a repeat body.
    pub fn is_control(&self) -> bool {
        matches!(
            self,
            Inst::Br { .. }
                | Inst::Bri { .. }
                | Inst::Brz { .. }
                | Inst::Brnz { .. }
                | Inst::Call { .. }
                | Inst::Rpt { .. }
                | Inst::Rpti { .. }
                | Inst::Exit
        )
    }

    /// Instructions only the supervisor context may execute.
    pub fn is_supervisor_only(&self) -> bool {
        matches!(
            self,
            Inst::Run { .. }
                | Inst::RunAll { .. }
                | Inst::SyncLocal
                | Inst::SyncGlobal
                | Inst::Exchange { .. }
                | Inst::Send { .. }
                | Inst::Mux { .. }
                | Inst::Recv { .. }
                | Inst::HostXfer { .. }
        )
    }
}

/// The registers one instruction reads and writes, as bit sets: bit `r` for `$mr`,
/// bit `16 + r` for `$ar`. `$m15` and `$a15` (always zero) never appear.
/// Post-increments of address registers are kept apart from data results, because
/// the pipeline forwards them to the next issue while results take its full depth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegUse {
    pub reads: u32,
    pub writes: u32,
    pub increments: u32,
}

const ZERO_REGS: u32 = (1 << 15) | (1 << 31);

fn m_bit(r: MReg) -> u32 {
    1u32.checked_shl(u32::from(r.0)).unwrap_or(0) & 0xFFFF
}

fn a_bits(r: AReg, count: u32) -> u32 {
    let mask = (1u32 << count) - 1;
    (mask.checked_shl(u32::from(r.0)).unwrap_or(0) & 0xFFFF) << 16
}

impl Inst {
    /// Register reads and writes of a main-pipe instruction: what the supervisor's
    /// issue timing depends on. Aux-pipe instructions report nothing: only workers
    /// execute them, and a worker's barrel slot hides every dependency.
    #[inline]
    pub fn reg_use(&self) -> RegUse {
        let (mut r, mut w, mut inc) = (0u32, 0u32, 0u32);
        match *self {
            Inst::Nop | Inst::Bri { .. } | Inst::Rpti { .. } | Inst::Exit => {}
            Inst::SyncLocal | Inst::SyncGlobal | Inst::Exchange { .. } | Inst::Mark { .. } => {}
            Inst::Setzi { d, .. } => w |= m_bit(d),
            Inst::Int { d, a, b, .. } => {
                r |= m_bit(a) | m_bit(b);
                w |= m_bit(d);
            }
            Inst::IntImm { d, a, .. } => {
                r |= m_bit(a);
                w |= m_bit(d);
            }
            Inst::MovAm { d, a } => {
                r |= m_bit(a);
                w |= a_bits(d, 1);
            }
            Inst::MovMa { d, a } => {
                r |= a_bits(a, 1);
                w |= m_bit(d);
            }
            Inst::Ld32M { d, base, .. } => {
                r |= m_bit(base);
                w |= m_bit(d);
            }
            Inst::Ld32 { d, base, .. } => {
                r |= m_bit(base);
                w |= a_bits(d, 1);
            }
            Inst::St32M { s, base, .. } => r |= m_bit(s) | m_bit(base),
            Inst::St32 { s, base, .. } => r |= a_bits(s, 1) | m_bit(base),
            Inst::Ld64 { d, base, .. } => {
                r |= m_bit(base);
                w |= a_bits(d, 2);
            }
            Inst::St64 { s, base, .. } => r |= a_bits(s, 2) | m_bit(base),
            Inst::Ld64Step { d, base, .. } => {
                r |= m_bit(base);
                w |= a_bits(d, 2);
                inc |= m_bit(base);
            }
            Inst::St64Step { s, base, .. } => {
                r |= a_bits(s, 2) | m_bit(base);
                inc |= m_bit(base);
            }
            Inst::Ld128 { d, base, .. } => {
                r |= m_bit(base);
                w |= a_bits(d, 4);
            }
            Inst::Ld2x64Pace { d0, d1, p0, p1 } => {
                r |= m_bit(p0) | m_bit(p1);
                w |= a_bits(d0, 2) | a_bits(d1, 2);
                inc |= m_bit(p0) | m_bit(p1);
            }
            Inst::Ldst64Pace { d, s, pl, ps } => {
                r |= m_bit(pl) | m_bit(ps) | a_bits(s, 2);
                w |= a_bits(d, 2);
                inc |= m_bit(pl) | m_bit(ps);
            }
            Inst::Ld2xSt64Pace {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
            } => {
                r |= m_bit(p0) | m_bit(p1) | m_bit(ps) | a_bits(s, 2);
                w |= a_bits(d0, 2) | a_bits(d1, 2);
                inc |= m_bit(p0) | m_bit(p1) | m_bit(ps);
            }
            Inst::Ld64Stride { d, base, stride } => {
                r |= m_bit(base) | m_bit(stride);
                w |= a_bits(d, 2);
                inc |= m_bit(base);
            }
            Inst::Ld2x64PaceStride {
                d0,
                d1,
                p0,
                p1,
                stride,
            } => {
                r |= m_bit(p0) | m_bit(p1) | m_bit(stride);
                w |= a_bits(d0, 2) | a_bits(d1, 2);
                inc |= m_bit(p0) | m_bit(p1);
            }
            Inst::Ldst64PaceStride {
                d,
                s,
                pl,
                ps,
                stride,
            } => {
                r |= m_bit(pl) | m_bit(ps) | m_bit(stride) | a_bits(s, 2);
                w |= a_bits(d, 2);
                inc |= m_bit(pl) | m_bit(ps);
            }
            Inst::Ld2xSt64PaceStride {
                d0,
                d1,
                s,
                p0,
                p1,
                ps,
                stride,
            } => {
                r |= m_bit(p0) | m_bit(p1) | m_bit(ps) | m_bit(stride) | a_bits(s, 2);
                w |= a_bits(d0, 2) | a_bits(d1, 2);
                inc |= m_bit(p0) | m_bit(p1) | m_bit(ps);
            }
            Inst::AmpLoadW { base, .. } => {
                r |= m_bit(base);
                inc |= m_bit(base);
            }
            Inst::Br { a } => r |= m_bit(a),
            Inst::Brz { c, .. } | Inst::Brnz { c, .. } => r |= m_bit(c),
            Inst::Call { link, .. } => w |= m_bit(link),
            Inst::Rpt { count, .. } => r |= m_bit(count),
            Inst::Run { entry, state, .. } | Inst::RunAll { entry, state, .. } => {
                r |= m_bit(entry) | m_bit(state)
            }
            Inst::HostXfer { desc } => r |= m_bit(desc),
            Inst::Send { a, .. } | Inst::Recv { a, .. } => r |= m_bit(a),
            Inst::Mux { .. } => {}
            _ => {}
        }
        RegUse {
            reads: r & !ZERO_REGS,
            writes: w & !ZERO_REGS,
            increments: inc & !ZERO_REGS,
        }
    }
}

//! The binary encoding of [`Inst`] and [`Word`]: fixed 32-bit little-endian words,
//! specified bit by bit in `docs/isa.md` (section "Encoding"). Both directions
//! validate every field with the same rules, so whatever decodes also re-encodes to
//! the same bytes, and a decoder fed arbitrary bytes returns an error, never panics.
//!
//! Word layout: bit 31 flags the first word of a bundle (the main-pipe word; its
//! aux-pipe partner follows and has bit 31 clear); bits 30..24 are the opcode
//! (main pipe 0x01..=0x3f, aux pipe 0x40..=0x7f, 0x00 is never valid so that zeroed
//! memory does not execute); bits 23..0 hold operands. Register fields are four
//! bits wide at fixed positions R0 = 23..20, R1 = 19..16, R2 = 15..12, R3 = 11..8,
//! R4 = 7..4, R5 = 3..0. Bits an instruction does not use must be zero.

use crate::inst::*;

/// Why an instruction or word cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    #[error("{inst}: {field} = {value} {reason}")]
    Field {
        inst: &'static str,
        field: &'static str,
        value: i64,
        reason: &'static str,
    },
    #[error("bundle: {0}")]
    Bundle(&'static str),
}

/// Why bytes do not decode to a word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("truncated: {needed} bytes needed, {got} available")]
    Truncated { needed: usize, got: usize },
    #[error("unknown opcode {opcode:#04x} in word {word:#010x}")]
    UnknownOpcode { opcode: u8, word: u32 },
    #[error("reserved bits set in word {word:#010x}")]
    ReservedBits { word: u32 },
    #[error("invalid field in word {word:#010x}: {error}")]
    Field { word: u32, error: EncodeError },
    #[error("bundle {first:#010x} {second:#010x}: {reason}")]
    Bundle {
        first: u32,
        second: u32,
        reason: &'static str,
    },
}

/// Bit 31: this word starts a bundle.
pub const BUNDLE_FLAG: u32 = 1 << 31;

/// Opcode numbers (bits 30..24 of a word). Main-pipe opcodes are below
/// [`AUX_OPCODE_BASE`], aux-pipe opcodes at or above it.
pub mod opcode {
    pub const NOP: u8 = 0x01;
    pub const SETZI: u8 = 0x02;
    pub const INT: u8 = 0x03;
    pub const INT_IMM: u8 = 0x04;
    pub const MOV_AM: u8 = 0x05;
    pub const MOV_MA: u8 = 0x06;
    pub const LD32M: u8 = 0x07;
    pub const LD32: u8 = 0x08;
    pub const ST32M: u8 = 0x09;
    pub const ST32: u8 = 0x0a;
    pub const LD64: u8 = 0x0b;
    pub const ST64: u8 = 0x0c;
    pub const LD128: u8 = 0x0d;
    pub const LD64_STEP: u8 = 0x0e;
    pub const ST64_STEP: u8 = 0x0f;
    pub const LD2X64_PACE: u8 = 0x10;
    pub const LDST64_PACE: u8 = 0x11;
    pub const LD2XST64_PACE: u8 = 0x12;
    pub const AMP_LOAD_W: u8 = 0x13;
    pub const BR: u8 = 0x14;
    pub const BRI: u8 = 0x15;
    pub const BRZ: u8 = 0x16;
    pub const BRNZ: u8 = 0x17;
    pub const CALL: u8 = 0x18;
    pub const RPT: u8 = 0x19;
    pub const RPTI: u8 = 0x1a;
    pub const EXIT: u8 = 0x1b;
    pub const RUN: u8 = 0x1c;
    pub const RUN_ALL: u8 = 0x1d;
    pub const SYNC_LOCAL: u8 = 0x1e;
    pub const SYNC_GLOBAL: u8 = 0x1f;
    pub const EXCHANGE: u8 = 0x20;
    pub const HOST_XFER: u8 = 0x21;
    pub const MARK: u8 = 0x22;
    pub const LD64_STRIDE: u8 = 0x23;
    pub const LD2X64_PACE_STRIDE: u8 = 0x24;
    pub const LDST64_PACE_STRIDE: u8 = 0x25;
    pub const LD2XST64_PACE_STRIDE: u8 = 0x26;
    pub const SEND: u8 = 0x27;
    pub const MUX: u8 = 0x28;
    pub const RECV: u8 = 0x29;

    pub const F_BIN: u8 = 0x40;
    pub const F_MAC: u8 = 0x41;
    pub const F_UN: u8 = 0x42;
    pub const F16V2_TO_F32: u8 = 0x43;
    pub const F32V2_TO_F16: u8 = 0x44;
    pub const F_SUM: u8 = 0x45;
    pub const F_MOV: u8 = 0x46;
    pub const F_BCAST: u8 = 0x47;
    pub const AMP: u8 = 0x48;
    pub const F16V2_TANH: u8 = 0x49;
    pub const F16_ACC: u8 = 0x4a;
    pub const F32V2_GINA: u8 = 0x4b;
    pub const SORT4X16: u8 = 0x4c;
    pub const F16V2_EXP: u8 = 0x4d;
    pub const F16V2_GINA: u8 = 0x4e;
    pub const F16V4_CMAC: u8 = 0x4f;
}

/// First aux-pipe opcode.
pub const AUX_OPCODE_BASE: u8 = 0x40;

/// Largest branch target (exclusive): targets are 20-bit byte addresses.
pub const TARGET_LIMIT: u32 = 1 << 20;

impl Word {
    /// Encoded size in bytes: 4 for a single instruction, 8 for a bundle.
    pub fn byte_len(&self) -> usize {
        match self {
            Word::Single(_) => 4,
            Word::Bundle(..) => 8,
        }
    }
}

impl IntOp {
    /// All operations in encoding order (the 4-bit op field indexes this).
    pub const ALL: [IntOp; 14] = [
        IntOp::Add,
        IntOp::Sub,
        IntOp::Mul,
        IntOp::And,
        IntOp::Or,
        IntOp::Xor,
        IntOp::Shl,
        IntOp::Shr,
        IntOp::Sar,
        IntOp::CmpEq,
        IntOp::CmpUlt,
        IntOp::CmpSlt,
        IntOp::Min,
        IntOp::Max,
    ];
    fn code(self) -> u32 {
        Self::ALL.iter().position(|&o| o == self).unwrap_or(0) as u32
    }
}

impl FBinOp {
    /// All operations in encoding order (the 3-bit op field indexes this).
    pub const ALL: [FBinOp; 5] = [
        FBinOp::Add,
        FBinOp::Sub,
        FBinOp::Mul,
        FBinOp::Max,
        FBinOp::Min,
    ];
    fn code(self) -> u32 {
        Self::ALL.iter().position(|&o| o == self).unwrap_or(0) as u32
    }
}

impl FVec {
    /// All lane formats in encoding order (the 2-bit vec field indexes this).
    pub const ALL: [FVec; 4] = [FVec::F32, FVec::F32V2, FVec::F16V2, FVec::F16V4];
    fn code(self) -> u32 {
        Self::ALL.iter().position(|&o| o == self).unwrap_or(0) as u32
    }
    /// Whether operands of this format occupy a register pair.
    pub fn is_pair(self) -> bool {
        matches!(self, FVec::F32V2 | FVec::F16V4)
    }
}

impl FUnOp {
    /// All operations in encoding order (the 3-bit op field indexes this).
    pub const ALL: [FUnOp; 7] = [
        FUnOp::Exp,
        FUnOp::Recip,
        FUnOp::Rsqrt,
        FUnOp::Sqrt,
        FUnOp::Neg,
        FUnOp::Abs,
        FUnOp::Tanh,
    ];
    fn code(self) -> u32 {
        Self::ALL.iter().position(|&o| o == self).unwrap_or(0) as u32
    }
}

/// A stable lower-case name for an instruction kind, used in error messages.
pub fn inst_name(inst: &Inst) -> &'static str {
    match inst {
        Inst::Nop => "nop",
        Inst::Setzi { .. } => "setzi",
        Inst::Int { .. } => "int",
        Inst::IntImm { .. } => "int-imm",
        Inst::MovAm { .. } => "mov-am",
        Inst::MovMa { .. } => "mov-ma",
        Inst::Ld32M { .. } => "ld32 (m)",
        Inst::Ld32 { .. } => "ld32",
        Inst::St32M { .. } => "st32 (m)",
        Inst::St32 { .. } => "st32",
        Inst::Ld64 { .. } => "ld64",
        Inst::St64 { .. } => "st64",
        Inst::Ld64Step { .. } => "ld64step",
        Inst::St64Step { .. } => "st64step",
        Inst::Ld128 { .. } => "ld128",
        Inst::Ld2x64Pace { .. } => "ld2x64pace",
        Inst::Ldst64Pace { .. } => "ldst64pace",
        Inst::Ld2xSt64Pace { .. } => "ld2xst64pace",
        Inst::Ld64Stride { .. } => "ld64step (stride)",
        Inst::Ld2x64PaceStride { .. } => "ld2x64pace (stride)",
        Inst::Ldst64PaceStride { .. } => "ldst64pace (stride)",
        Inst::Ld2xSt64PaceStride { .. } => "ld2xst64pace (stride)",
        Inst::AmpLoadW { .. } => "amploadw",
        Inst::Br { .. } => "br",
        Inst::Bri { .. } => "bri",
        Inst::Brz { .. } => "brz",
        Inst::Brnz { .. } => "brnz",
        Inst::Call { .. } => "call",
        Inst::Rpt { .. } => "rpt",
        Inst::Rpti { .. } => "rpti",
        Inst::Exit => "exit",
        Inst::Run { .. } => "run",
        Inst::RunAll { .. } => "runall",
        Inst::SyncLocal => "sync local",
        Inst::SyncGlobal => "sync global",
        Inst::Exchange { .. } => "exchange",
        Inst::HostXfer { .. } => "hostxfer",
        Inst::Send { .. } => "send",
        Inst::Mux { .. } => "mux",
        Inst::Recv { .. } => "recv",
        Inst::Mark { .. } => "mark",
        Inst::FBin { .. } => "fbin",
        Inst::FMac { .. } => "fmac",
        Inst::FUn { .. } => "fun",
        Inst::F16v2Tanh { .. } => "f16v2tanh",
        Inst::F16v2Exp { .. } => "f16v2exp",
        Inst::F16v2ToF32 { .. } => "f16v2tof32",
        Inst::F32v2ToF16 { .. } => "f32v2tof16",
        Inst::Sort4x16 { hi: false, .. } => "sort4x16lo",
        Inst::Sort4x16 { hi: true, .. } => "sort4x16hi",
        Inst::FSum { .. } => "fsum",
        Inst::F16Acc { quad: false, .. } => "f16v4acc",
        Inst::F16Acc { quad: true, .. } => "f16v8acc",
        Inst::F32v2Gina { .. } => "f32v2gina",
        Inst::F16v2Gina { .. } => "f16v2gina",
        Inst::F16v4Cmac { .. } => "f16v4cmac",
        Inst::FMov { .. } => "fmov",
        Inst::FBcast { .. } => "fbcast",
        Inst::Amp { .. } => "amp",
    }
}

struct Check {
    inst: &'static str,
}

impl Check {
    fn err(&self, field: &'static str, value: i64, reason: &'static str) -> EncodeError {
        EncodeError::Field {
            inst: self.inst,
            field,
            value,
            reason,
        }
    }
    fn m(&self, field: &'static str, r: MReg) -> Result<u32, EncodeError> {
        if r.0 < 16 {
            Ok(r.0 as u32)
        } else {
            Err(self.err(field, r.0.into(), "is not a register ($m0..$m15)"))
        }
    }
    fn a(&self, field: &'static str, r: AReg) -> Result<u32, EncodeError> {
        if r.0 < 16 {
            Ok(r.0 as u32)
        } else {
            Err(self.err(field, r.0.into(), "is not a register ($a0..$a15)"))
        }
    }
    fn pair(&self, field: &'static str, r: AReg) -> Result<u32, EncodeError> {
        let v = self.a(field, r)?;
        if v.is_multiple_of(2) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), "is not an even register (pair)"))
        }
    }
    fn quad(&self, field: &'static str, r: AReg) -> Result<u32, EncodeError> {
        let v = self.a(field, r)?;
        if v.is_multiple_of(4) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), "is not a multiple of 4 (quad)"))
        }
    }
    fn a_vec(&self, field: &'static str, r: AReg, pair: bool) -> Result<u32, EncodeError> {
        if pair {
            self.pair(field, r)
        } else {
            self.a(field, r)
        }
    }
    fn uint(&self, field: &'static str, v: u32, bits: u32) -> Result<u32, EncodeError> {
        if u64::from(v) < (1u64 << bits) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), out_of_range(bits)))
        }
    }
    fn range(&self, field: &'static str, v: u32, lo: u32, hi: u32) -> Result<u32, EncodeError> {
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), "is out of range"))
        }
    }
    fn target(&self, t: u32) -> Result<u32, EncodeError> {
        if t >= TARGET_LIMIT {
            Err(self.err("target", t.into(), "is not below 2^20"))
        } else if !t.is_multiple_of(4) {
            Err(self.err("target", t.into(), "is not 4-byte aligned"))
        } else {
            Ok(t >> 2)
        }
    }
}

fn out_of_range(bits: u32) -> &'static str {
    match bits {
        2 => "does not fit 2 bits",
        3 => "does not fit 3 bits",
        5 => "does not fit 5 bits",
        12 => "does not fit 12 bits (0..=4095)",
        16 => "does not fit 16 bits",
        20 => "does not fit 20 bits",
        _ => "is out of range",
    }
}

fn word(op: u8, operands: u32) -> u32 {
    (u32::from(op) << 24) | operands
}
const fn r0(v: u32) -> u32 {
    v << 20
}
const fn r1(v: u32) -> u32 {
    v << 16
}
const fn r2(v: u32) -> u32 {
    v << 12
}
const fn r3(v: u32) -> u32 {
    v << 8
}
const fn r4(v: u32) -> u32 {
    v << 4
}

/// Checks every field of `inst` and returns its 32-bit encoding (bit 31 clear).
pub fn encode_inst(inst: &Inst) -> Result<u32, EncodeError> {
    use opcode::*;
    let c = Check {
        inst: inst_name(inst),
    };
    let w = match *inst {
        Inst::Nop => word(NOP, 0),
        Inst::Setzi { d, imm } => word(SETZI, r0(c.m("d", d)?) | c.uint("imm", imm, 20)?),
        Inst::Int { op, d, a, b } => word(
            INT,
            r0(c.m("d", d)?) | r1(c.m("a", a)?) | r2(c.m("b", b)?) | op.code(),
        ),
        Inst::IntImm { op, d, a, imm } => word(
            INT_IMM,
            r0(c.m("d", d)?) | r1(c.m("a", a)?) | (c.uint("imm", imm.into(), 12)? << 4) | op.code(),
        ),
        Inst::MovAm { d, a } => word(MOV_AM, r0(c.a("d", d)?) | r1(c.m("a", a)?)),
        Inst::MovMa { d, a } => word(MOV_MA, r0(c.m("d", d)?) | r1(c.a("a", a)?)),
        Inst::Ld32M { d, base, imm } => mem(LD32M, c.m("d", d)?, &c, base, imm)?,
        Inst::Ld32 { d, base, imm } => mem(LD32, c.a("d", d)?, &c, base, imm)?,
        Inst::St32M { s, base, imm } => mem(ST32M, c.m("s", s)?, &c, base, imm)?,
        Inst::St32 { s, base, imm } => mem(ST32, c.a("s", s)?, &c, base, imm)?,
        Inst::Ld64 { d, base, imm } => mem(LD64, c.pair("d", d)?, &c, base, imm)?,
        Inst::St64 { s, base, imm } => mem(ST64, c.pair("s", s)?, &c, base, imm)?,
        Inst::Ld128 { d, base, imm } => mem(LD128, c.quad("d", d)?, &c, base, imm)?,
        Inst::Ld64Step { d, base, inc } => word(
            LD64_STEP,
            r0(c.pair("d", d)?) | r1(c.m("base", base)?) | u32::from(inc as u8),
        ),
        Inst::St64Step { s, base, inc } => word(
            ST64_STEP,
            r0(c.pair("s", s)?) | r1(c.m("base", base)?) | u32::from(inc as u8),
        ),
        Inst::Ld2x64Pace { d0, d1, p0, p1 } => word(
            LD2X64_PACE,
            r0(c.pair("d0", d0)?) | r1(c.pair("d1", d1)?) | r2(c.m("p0", p0)?) | r3(c.m("p1", p1)?),
        ),
        Inst::Ldst64Pace { d, s, pl, ps } => word(
            LDST64_PACE,
            r0(c.pair("d", d)?) | r1(c.pair("s", s)?) | r2(c.m("pl", pl)?) | r3(c.m("ps", ps)?),
        ),
        Inst::Ld2xSt64Pace {
            d0,
            d1,
            s,
            p0,
            p1,
            ps,
        } => word(
            LD2XST64_PACE,
            r0(c.pair("d0", d0)?)
                | r1(c.pair("d1", d1)?)
                | r2(c.pair("s", s)?)
                | r3(c.m("p0", p0)?)
                | r4(c.m("p1", p1)?)
                | c.m("ps", ps)?,
        ),
        Inst::Ld64Stride { d, base, stride } => word(
            LD64_STRIDE,
            r0(c.pair("d", d)?) | r1(c.m("base", base)?) | r2(c.m("stride", stride)?),
        ),
        Inst::Ld2x64PaceStride {
            d0,
            d1,
            p0,
            p1,
            stride,
        } => word(
            LD2X64_PACE_STRIDE,
            r0(c.pair("d0", d0)?)
                | r1(c.pair("d1", d1)?)
                | r2(c.m("p0", p0)?)
                | r3(c.m("p1", p1)?)
                | r4(c.m("stride", stride)?),
        ),
        Inst::Ldst64PaceStride {
            d,
            s,
            pl,
            ps,
            stride,
        } => word(
            LDST64_PACE_STRIDE,
            r0(c.pair("d", d)?)
                | r1(c.pair("s", s)?)
                | r2(c.m("pl", pl)?)
                | r3(c.m("ps", ps)?)
                | r4(c.m("stride", stride)?),
        ),
        Inst::Ld2xSt64PaceStride {
            d0,
            d1,
            s,
            p0,
            p1,
            ps,
            stride,
        } => {
            let q = c.quad("d0", d0)?;
            if u32::from(d1.0) != q + 2 {
                return Err(c.err(
                    "d1",
                    d1.0.into(),
                    "is not d0 + 2 (the strided form loads a quad)",
                ));
            }
            word(
                LD2XST64_PACE_STRIDE,
                r0(q)
                    | r1(c.pair("s", s)?)
                    | r2(c.m("p0", p0)?)
                    | r3(c.m("p1", p1)?)
                    | r4(c.m("ps", ps)?)
                    | c.m("stride", stride)?,
            )
        }
        Inst::AmpLoadW { base, quad } => word(
            AMP_LOAD_W,
            r0(c.m("base", base)?) | c.range("quad", quad.into(), 0, 31)?,
        ),
        Inst::Br { a } => word(BR, r0(c.m("a", a)?)),
        Inst::Bri { target } => word(BRI, c.target(target)?),
        Inst::Brz { c: cr, target } => word(BRZ, r0(c.m("c", cr)?) | c.target(target)?),
        Inst::Brnz { c: cr, target } => word(BRNZ, r0(c.m("c", cr)?) | c.target(target)?),
        Inst::Call { link, target } => word(CALL, r0(c.m("link", link)?) | c.target(target)?),
        Inst::Rpt { count, body } => word(
            RPT,
            r0(c.m("count", count)?) | c.range("body", body.into(), 1, 255)?,
        ),
        Inst::Rpti { count, body } => word(
            RPTI,
            (c.uint("count", count.into(), 12)? << 8) | c.range("body", body.into(), 1, 255)?,
        ),
        Inst::Exit => word(EXIT, 0),
        Inst::Run {
            entry,
            state,
            worker,
        } => word(
            RUN,
            r0(c.m("entry", entry)?)
                | r1(c.m("state", state)?)
                | c.range("worker", worker.into(), 0, 5)?,
        ),
        Inst::RunAll {
            entry,
            state,
            stride,
        } => word(
            RUN_ALL,
            r0(c.m("entry", entry)?) | r1(c.m("state", state)?) | u32::from(stride),
        ),
        Inst::SyncLocal => word(SYNC_LOCAL, 0),
        Inst::SyncGlobal => word(SYNC_GLOBAL, 0),
        Inst::Exchange { id } => word(EXCHANGE, u32::from(id)),
        Inst::HostXfer { desc } => word(HOST_XFER, r0(c.m("desc", desc)?)),
        Inst::Send { a, bytes } => word(SEND, r0(c.m("a", a)?) | u32::from(bytes)),
        Inst::Mux { tile } => word(MUX, c.range("tile", tile, 0, 0xf_ffff)?),
        Inst::Recv { a, msg } => word(RECV, r0(c.m("a", a)?) | u32::from(msg)),
        Inst::Mark { tag } => word(MARK, u32::from(tag)),
        Inst::FBin { op, vec, d, a, b } => {
            let p = vec.is_pair();
            word(
                F_BIN,
                r0(c.a_vec("d", d, p)?)
                    | r1(c.a_vec("a", a, p)?)
                    | r2(c.a_vec("b", b, p)?)
                    | (op.code() << 2)
                    | vec.code(),
            )
        }
        Inst::FMac { vec, d, a, b } => {
            let p = vec.is_pair();
            word(
                F_MAC,
                r0(c.a_vec("d", d, p)?)
                    | r1(c.a_vec("a", a, p)?)
                    | r2(c.a_vec("b", b, p)?)
                    | vec.code(),
            )
        }
        Inst::FUn { op, d, a } => word(F_UN, r0(c.a("d", d)?) | r1(c.a("a", a)?) | op.code()),
        Inst::F16v2Tanh { d, a } => word(F16V2_TANH, r0(c.a("d", d)?) | r1(c.a("a", a)?)),
        Inst::F16v2Exp { d, a } => word(F16V2_EXP, r0(c.a("d", d)?) | r1(c.a("a", a)?)),
        Inst::F16v2ToF32 { d, a } => word(F16V2_TO_F32, r0(c.pair("d", d)?) | r1(c.a("a", a)?)),
        Inst::F32v2ToF16 { d, a } => word(F32V2_TO_F16, r0(c.a("d", d)?) | r1(c.pair("a", a)?)),
        Inst::Sort4x16 { hi, d, a, b } => word(
            SORT4X16,
            r0(c.a("d", d)?) | r1(c.a("a", a)?) | r2(c.a("b", b)?) | u32::from(hi),
        ),
        Inst::F16Acc { a, quad } => {
            let r = if quad {
                c.quad("a", a)?
            } else {
                c.pair("a", a)?
            };
            word(F16_ACC, r1(r) | u32::from(quad))
        }
        Inst::F32v2Gina { d } => word(F32V2_GINA, r0(c.pair("d", d)?)),
        Inst::F16v2Gina { d } => word(F16V2_GINA, r0(c.a("d", d)?)),
        Inst::F16v4Cmac { a, b } => word(F16V4_CMAC, r1(c.pair("a", a)?) | r2(c.pair("b", b)?)),
        Inst::FSum { vec, d, a } => word(
            F_SUM,
            r0(c.a("d", d)?) | r1(c.a_vec("a", a, vec.is_pair())?) | vec.code(),
        ),
        Inst::FMov { d, a, pair } => word(
            F_MOV,
            r0(c.a_vec("d", d, pair)?) | r1(c.a_vec("a", a, pair)?) | u32::from(pair),
        ),
        Inst::FBcast { vec, d, a } => word(
            F_BCAST,
            r0(c.a_vec("d", d, vec.is_pair())?) | r1(c.a("a", a)?) | vec.code(),
        ),
        Inst::Amp {
            out,
            inp,
            pin,
            phase,
        } => word(
            AMP,
            r0(c.pair("out", out)?)
                | r1(c.pair("inp", inp)?)
                | r2(c.pair("pin", pin)?)
                | c.range("phase", phase.into(), 0, 3)?,
        ),
    };
    Ok(w)
}

fn mem(op: u8, reg: u32, c: &Check, base: MReg, imm: u16) -> Result<u32, EncodeError> {
    Ok(word(
        op,
        r0(reg) | r1(c.m("base", base)?) | c.uint("imm", imm.into(), 12)?,
    ))
}

/// Checks every field of `inst` (the rules of [`encode_inst`]).
pub fn validate_inst(inst: &Inst) -> Result<(), EncodeError> {
    encode_inst(inst).map(|_| ())
}

/// Checks a word: every field, and a bundle's pipes (main first, aux second).
pub fn validate_word(w: &Word) -> Result<(), EncodeError> {
    match w {
        Word::Single(i) => validate_inst(i),
        Word::Bundle(m, a) => {
            if m.pipe() != Pipe::Main {
                return Err(EncodeError::Bundle(
                    "the first instruction must be a main-pipe instruction",
                ));
            }
            if a.pipe() != Pipe::Aux {
                return Err(EncodeError::Bundle(
                    "the second instruction must be an aux-pipe instruction",
                ));
            }
            validate_inst(m)?;
            validate_inst(a)
        }
    }
}

/// Appends the encoding of `w` (4 or 8 bytes, little-endian) to `out`. Nothing is
/// appended on error.
pub fn encode_word(w: &Word, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    validate_word(w)?;
    match w {
        Word::Single(i) => out.extend_from_slice(&encode_inst(i)?.to_le_bytes()),
        Word::Bundle(m, a) => {
            let first = encode_inst(m)? | BUNDLE_FLAG;
            let second = encode_inst(a)?;
            out.extend_from_slice(&first.to_le_bytes());
            out.extend_from_slice(&second.to_le_bytes());
        }
    }
    Ok(())
}

/// Encodes a sequence of words back to back. Alignment of bundles to 8 bytes is the
/// layout's business (the assembler pads with `nop`); this only concatenates.
pub fn encode(words: &[Word]) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(words.len() * 4);
    for w in words {
        encode_word(w, &mut out)?;
    }
    Ok(out)
}

fn field(v: u32, shift: u32, bits: u32) -> u32 {
    (v >> shift) & ((1 << bits) - 1)
}

/// Decodes one 32-bit word (bit 31 must be clear: bundles go through
/// [`decode_word`]).
pub fn decode_inst(w: u32) -> Result<Inst, DecodeError> {
    use opcode::*;
    let op = field(w, 24, 7) as u8;
    let f0 = field(w, 20, 4) as u8;
    let f1 = field(w, 16, 4) as u8;
    let f2 = field(w, 12, 4) as u8;
    let f3 = field(w, 8, 4) as u8;
    let f4 = field(w, 4, 4) as u8;
    let f5 = field(w, 0, 4) as u8;
    let imm12 = field(w, 0, 12) as u16;
    let target = field(w, 0, 18) << 2;
    // Each arm names the operand bits it uses; any other bit set is an error.
    let (inst, used): (Inst, u32) = match op {
        NOP => (Inst::Nop, 0),
        SETZI => (
            Inst::Setzi {
                d: MReg(f0),
                imm: field(w, 0, 20),
            },
            0xff_ffff,
        ),
        INT => {
            let op = *IntOp::ALL
                .get(f5 as usize)
                .ok_or(DecodeError::ReservedBits { word: w })?;
            (
                Inst::Int {
                    op,
                    d: MReg(f0),
                    a: MReg(f1),
                    b: MReg(f2),
                },
                0xfff00f,
            )
        }
        INT_IMM => {
            let op = *IntOp::ALL
                .get(f5 as usize)
                .ok_or(DecodeError::ReservedBits { word: w })?;
            (
                Inst::IntImm {
                    op,
                    d: MReg(f0),
                    a: MReg(f1),
                    imm: field(w, 4, 12) as u16,
                },
                0xff_ffff,
            )
        }
        MOV_AM => (
            Inst::MovAm {
                d: AReg(f0),
                a: MReg(f1),
            },
            0xff0000,
        ),
        MOV_MA => (
            Inst::MovMa {
                d: MReg(f0),
                a: AReg(f1),
            },
            0xff0000,
        ),
        LD32M => (
            Inst::Ld32M {
                d: MReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        LD32 => (
            Inst::Ld32 {
                d: AReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        ST32M => (
            Inst::St32M {
                s: MReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        ST32 => (
            Inst::St32 {
                s: AReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        LD64 => (
            Inst::Ld64 {
                d: AReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        ST64 => (
            Inst::St64 {
                s: AReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        LD128 => (
            Inst::Ld128 {
                d: AReg(f0),
                base: MReg(f1),
                imm: imm12,
            },
            0xff0fff,
        ),
        LD64_STEP => (
            Inst::Ld64Step {
                d: AReg(f0),
                base: MReg(f1),
                inc: field(w, 0, 8) as u8 as i8,
            },
            0xff00ff,
        ),
        ST64_STEP => (
            Inst::St64Step {
                s: AReg(f0),
                base: MReg(f1),
                inc: field(w, 0, 8) as u8 as i8,
            },
            0xff00ff,
        ),
        LD2X64_PACE => (
            Inst::Ld2x64Pace {
                d0: AReg(f0),
                d1: AReg(f1),
                p0: MReg(f2),
                p1: MReg(f3),
            },
            0xffff00,
        ),
        LDST64_PACE => (
            Inst::Ldst64Pace {
                d: AReg(f0),
                s: AReg(f1),
                pl: MReg(f2),
                ps: MReg(f3),
            },
            0xffff00,
        ),
        LD2XST64_PACE => (
            Inst::Ld2xSt64Pace {
                d0: AReg(f0),
                d1: AReg(f1),
                s: AReg(f2),
                p0: MReg(f3),
                p1: MReg(f4),
                ps: MReg(f5),
            },
            0xff_ffff,
        ),
        LD64_STRIDE => (
            Inst::Ld64Stride {
                d: AReg(f0),
                base: MReg(f1),
                stride: MReg(f2),
            },
            0xfff000,
        ),
        LD2X64_PACE_STRIDE => (
            Inst::Ld2x64PaceStride {
                d0: AReg(f0),
                d1: AReg(f1),
                p0: MReg(f2),
                p1: MReg(f3),
                stride: MReg(f4),
            },
            0xfffff0,
        ),
        LDST64_PACE_STRIDE => (
            Inst::Ldst64PaceStride {
                d: AReg(f0),
                s: AReg(f1),
                pl: MReg(f2),
                ps: MReg(f3),
                stride: MReg(f4),
            },
            0xfffff0,
        ),
        LD2XST64_PACE_STRIDE => (
            Inst::Ld2xSt64PaceStride {
                d0: AReg(f0),
                d1: AReg(f0.wrapping_add(2)),
                s: AReg(f1),
                p0: MReg(f2),
                p1: MReg(f3),
                ps: MReg(f4),
                stride: MReg(f5),
            },
            0xff_ffff,
        ),
        AMP_LOAD_W => (
            Inst::AmpLoadW {
                base: MReg(f0),
                quad: field(w, 0, 5) as u8,
            },
            0xf0001f,
        ),
        BR => (Inst::Br { a: MReg(f0) }, 0xf00000),
        BRI => (Inst::Bri { target }, 0x03ffff),
        BRZ => (
            Inst::Brz {
                c: MReg(f0),
                target,
            },
            0xf3ffff,
        ),
        BRNZ => (
            Inst::Brnz {
                c: MReg(f0),
                target,
            },
            0xf3ffff,
        ),
        CALL => (
            Inst::Call {
                link: MReg(f0),
                target,
            },
            0xf3ffff,
        ),
        RPT => (
            Inst::Rpt {
                count: MReg(f0),
                body: field(w, 0, 8) as u8,
            },
            0xf000ff,
        ),
        RPTI => (
            Inst::Rpti {
                count: field(w, 8, 12) as u16,
                body: field(w, 0, 8) as u8,
            },
            0x0f_ffff,
        ),
        EXIT => (Inst::Exit, 0),
        RUN => (
            Inst::Run {
                entry: MReg(f0),
                state: MReg(f1),
                worker: field(w, 0, 3) as u8,
            },
            0xff0007,
        ),
        RUN_ALL => (
            Inst::RunAll {
                entry: MReg(f0),
                state: MReg(f1),
                stride: field(w, 0, 16) as u16,
            },
            0xff_ffff,
        ),
        SYNC_LOCAL => (Inst::SyncLocal, 0),
        SYNC_GLOBAL => (Inst::SyncGlobal, 0),
        EXCHANGE => (
            Inst::Exchange {
                id: field(w, 0, 16) as u16,
            },
            0xffff,
        ),
        HOST_XFER => (Inst::HostXfer { desc: MReg(f0) }, 0xf00000),
        SEND => (
            Inst::Send {
                a: MReg(f0),
                bytes: field(w, 0, 16) as u16,
            },
            0xf0_ffff,
        ),
        MUX => (
            Inst::Mux {
                tile: field(w, 0, 20),
            },
            0xf_ffff,
        ),
        RECV => (
            Inst::Recv {
                a: MReg(f0),
                msg: field(w, 0, 16) as u16,
            },
            0xf0_ffff,
        ),
        MARK => (
            Inst::Mark {
                tag: field(w, 0, 16) as u16,
            },
            0xffff,
        ),
        F_BIN => {
            let op = *FBinOp::ALL
                .get(field(w, 2, 3) as usize)
                .ok_or(DecodeError::ReservedBits { word: w })?;
            (
                Inst::FBin {
                    op,
                    vec: FVec::ALL[field(w, 0, 2) as usize],
                    d: AReg(f0),
                    a: AReg(f1),
                    b: AReg(f2),
                },
                0xfff01f,
            )
        }
        F_MAC => (
            Inst::FMac {
                vec: FVec::ALL[field(w, 0, 2) as usize],
                d: AReg(f0),
                a: AReg(f1),
                b: AReg(f2),
            },
            0xfff003,
        ),
        F_UN => {
            let op = *FUnOp::ALL
                .get(field(w, 0, 3) as usize)
                .ok_or(DecodeError::ReservedBits { word: w })?;
            (
                Inst::FUn {
                    op,
                    d: AReg(f0),
                    a: AReg(f1),
                },
                0xff0007,
            )
        }
        F16V2_TANH => (
            Inst::F16v2Tanh {
                d: AReg(f0),
                a: AReg(f1),
            },
            0xff0000,
        ),
        F16V2_EXP => (
            Inst::F16v2Exp {
                d: AReg(f0),
                a: AReg(f1),
            },
            0xff0000,
        ),
        F16V2_TO_F32 => (
            Inst::F16v2ToF32 {
                d: AReg(f0),
                a: AReg(f1),
            },
            0xff0000,
        ),
        F32V2_TO_F16 => (
            Inst::F32v2ToF16 {
                d: AReg(f0),
                a: AReg(f1),
            },
            0xff0000,
        ),
        SORT4X16 => (
            Inst::Sort4x16 {
                hi: w & 1 == 1,
                d: AReg(f0),
                a: AReg(f1),
                b: AReg(f2),
            },
            0xfff001,
        ),
        F16_ACC => (
            Inst::F16Acc {
                a: AReg(f1),
                quad: w & 1 == 1,
            },
            0x0f0001,
        ),
        F32V2_GINA => (Inst::F32v2Gina { d: AReg(f0) }, 0xf00000),
        F16V2_GINA => (Inst::F16v2Gina { d: AReg(f0) }, 0xf00000),
        F16V4_CMAC => (
            Inst::F16v4Cmac {
                a: AReg(f1),
                b: AReg(f2),
            },
            0x0ff000,
        ),
        F_SUM => (
            Inst::FSum {
                vec: FVec::ALL[field(w, 0, 2) as usize],
                d: AReg(f0),
                a: AReg(f1),
            },
            0xff0003,
        ),
        F_MOV => (
            Inst::FMov {
                d: AReg(f0),
                a: AReg(f1),
                pair: w & 1 == 1,
            },
            0xff0001,
        ),
        F_BCAST => (
            Inst::FBcast {
                vec: FVec::ALL[field(w, 0, 2) as usize],
                d: AReg(f0),
                a: AReg(f1),
            },
            0xff0003,
        ),
        AMP => (
            Inst::Amp {
                out: AReg(f0),
                inp: AReg(f1),
                pin: AReg(f2),
                phase: field(w, 0, 2) as u8,
            },
            0xfff003,
        ),
        _ => {
            return Err(DecodeError::UnknownOpcode {
                opcode: op,
                word: w,
            });
        }
    };
    if w & 0x00ff_ffff & !used != 0 {
        return Err(DecodeError::ReservedBits { word: w });
    }
    validate_inst(&inst).map_err(|error| DecodeError::Field { word: w, error })?;
    Ok(inst)
}

/// Decodes the word at the start of `bytes`: a single instruction (4 bytes) or a
/// bundle (8 bytes). Returns the word and its size.
pub fn decode_word(bytes: &[u8]) -> Result<(Word, usize), DecodeError> {
    let first = read_u32(bytes, 0)?;
    if first & BUNDLE_FLAG == 0 {
        return Ok((Word::Single(decode_inst(first)?), 4));
    }
    let second = read_u32(bytes, 4)?;
    let bundle_err = |reason| DecodeError::Bundle {
        first,
        second,
        reason,
    };
    if second & BUNDLE_FLAG != 0 {
        return Err(bundle_err("the second word has the bundle flag set"));
    }
    let m = decode_inst(first & !BUNDLE_FLAG)?;
    let a = decode_inst(second)?;
    if m.pipe() != Pipe::Main {
        return Err(bundle_err(
            "the first instruction must be a main-pipe instruction",
        ));
    }
    if a.pipe() != Pipe::Aux {
        return Err(bundle_err(
            "the second instruction must be an aux-pipe instruction",
        ));
    }
    Ok((Word::Bundle(m, a), 8))
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32, DecodeError> {
    match bytes.get(at..at + 4) {
        Some(b) => Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(DecodeError::Truncated {
            needed: at + 4,
            got: bytes.len(),
        }),
    }
}

/// Decodes a whole code range: every word in order with its byte offset. Stops at
/// the first error, returning the offset where it occurred.
pub fn decode_all(bytes: &[u8]) -> Result<Vec<(usize, Word)>, (usize, DecodeError)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (w, n) = decode_word(&bytes[at..]).map_err(|e| (at, e))?;
        out.push((at, w));
        at += n;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(w: Word) {
        let mut bytes = Vec::new();
        encode_word(&w, &mut bytes).unwrap();
        assert_eq!(bytes.len(), w.byte_len());
        let (back, n) = decode_word(&bytes).unwrap();
        assert_eq!(back, w);
        assert_eq!(n, bytes.len());
    }

    #[test]
    fn fixed_encodings() {
        // Pinned so that a change to the table is deliberate (docs/isa.md).
        let w = Word::Single(Inst::Ld64Step {
            d: AReg(0),
            base: MReg(2),
            inc: 1,
        });
        assert_eq!(encode(&[w]).unwrap(), 0x0e02_0001u32.to_le_bytes());
        let w = Word::Single(Inst::Setzi {
            d: MReg(3),
            imm: 0xfffff,
        });
        assert_eq!(encode(&[w]).unwrap(), 0x023f_ffffu32.to_le_bytes());
        let b = Word::Bundle(
            Inst::Ld2xSt64Pace {
                d0: AReg(0),
                d1: AReg(2),
                s: AReg(4),
                p0: MReg(5),
                p1: MReg(6),
                ps: MReg(7),
            },
            Inst::Amp {
                out: AReg(4),
                inp: AReg(0),
                pin: AReg(2),
                phase: 3,
            },
        );
        let bytes = encode(&[b]).unwrap();
        assert_eq!(&bytes[..4], &0x9202_4567u32.to_le_bytes());
        assert_eq!(&bytes[4..], &0x4840_2003u32.to_le_bytes());
        round_trip(b);
        let w = Word::Single(Inst::FUn {
            op: FUnOp::Tanh,
            d: AReg(0),
            a: AReg(1),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x4201_0006u32.to_le_bytes());
        let w = Word::Single(Inst::F16v2Tanh {
            d: AReg(2),
            a: AReg(3),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x4923_0000u32.to_le_bytes());
        round_trip(w);
        let w = Word::Single(Inst::F16v2Exp {
            d: AReg(1),
            a: AReg(0),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x4d10_0000u32.to_le_bytes());
        round_trip(w);
        // The strided AMP feeder: a quad of loads, the stride register last.
        let w = Word::Single(Inst::Ld2xSt64PaceStride {
            d0: AReg(0),
            d1: AReg(2),
            s: AReg(4),
            p0: MReg(3),
            p1: MReg(4),
            ps: MReg(5),
            stride: MReg(9),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x2604_3459u32.to_le_bytes());
        round_trip(w);
        let w = Word::Single(Inst::Ld64Stride {
            d: AReg(0),
            base: MReg(3),
            stride: MReg(9),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x2303_9000u32.to_le_bytes());
        round_trip(w);
    }

    /// The strided `ld2xst64pace` loads a quad: a second destination that is not
    /// the first plus two, or a first that is not a quad, does not encode, and a
    /// word whose quad field is not a multiple of 4 does not decode.
    #[test]
    fn strided_feeder_needs_a_quad() {
        let mk = |d0: u8, d1: u8| {
            Word::Single(Inst::Ld2xSt64PaceStride {
                d0: AReg(d0),
                d1: AReg(d1),
                s: AReg(4),
                p0: MReg(3),
                p1: MReg(4),
                ps: MReg(5),
                stride: MReg(9),
            })
        };
        assert!(encode(&[mk(0, 2)]).is_ok());
        assert!(encode(&[mk(0, 6)]).is_err());
        assert!(encode(&[mk(2, 4)]).is_err());
        assert!(decode_word(&0x2624_3459u32.to_le_bytes()).is_err());
    }

    #[test]
    fn rejects_bad_fields() {
        let bad = [
            Inst::Ld64 {
                d: AReg(1),
                base: MReg(0),
                imm: 0,
            },
            Inst::Ld128 {
                d: AReg(2),
                base: MReg(0),
                imm: 0,
            },
            Inst::Setzi {
                d: MReg(0),
                imm: 1 << 20,
            },
            Inst::Bri { target: 6 },
            Inst::Bri { target: 1 << 20 },
            Inst::Rpti {
                count: 4096,
                body: 1,
            },
            Inst::Rpt {
                count: MReg(0),
                body: 0,
            },
            Inst::Run {
                entry: MReg(0),
                state: MReg(1),
                worker: 6,
            },
            Inst::Setzi {
                d: MReg(16),
                imm: 0,
            },
            Inst::IntImm {
                op: IntOp::Add,
                d: MReg(0),
                a: MReg(0),
                imm: 4096,
            },
            Inst::FBin {
                op: FBinOp::Add,
                vec: FVec::F16V4,
                d: AReg(0),
                a: AReg(3),
                b: AReg(4),
            },
            Inst::Amp {
                out: AReg(0),
                inp: AReg(2),
                pin: AReg(4),
                phase: 4,
            },
        ];
        for i in bad {
            assert!(encode(&[Word::Single(i)]).is_err(), "{i:?}");
        }
        let aux = Inst::FMov {
            d: AReg(0),
            a: AReg(1),
            pair: false,
        };
        assert!(matches!(
            encode(&[Word::Bundle(aux, Inst::Nop)]),
            Err(EncodeError::Bundle(_))
        ));
        assert!(encode(&[Word::Bundle(Inst::Nop, Inst::Nop)]).is_err());
    }

    #[test]
    fn rejects_bad_bytes() {
        assert!(matches!(
            decode_word(&[0, 0, 0, 0]),
            Err(DecodeError::UnknownOpcode { opcode: 0, .. })
        ));
        assert!(matches!(
            decode_word(&[0, 0]),
            Err(DecodeError::Truncated { .. })
        ));
        // A bundle flag with no second word.
        assert!(matches!(
            decode_word(&(0x8100_0000u32).to_le_bytes()),
            Err(DecodeError::Truncated { .. })
        ));
        // nop with an operand bit set.
        assert!(matches!(
            decode_word(&(0x0100_0001u32).to_le_bytes()),
            Err(DecodeError::ReservedBits { .. })
        ));
        // ld64 into an odd register.
        assert!(matches!(
            decode_word(&(0x0b10_0000u32).to_le_bytes()),
            Err(DecodeError::Field { .. })
        ));
        // The last free `FUnOp` code, and f16v2tanh and f16v2exp with an operand bit set.
        assert!(matches!(
            decode_word(&(0x4201_0007u32).to_le_bytes()),
            Err(DecodeError::ReservedBits { .. })
        ));
        assert!(matches!(
            decode_word(&(0x4923_0001u32).to_le_bytes()),
            Err(DecodeError::ReservedBits { .. })
        ));
        assert!(matches!(
            decode_word(&(0x4d10_0001u32).to_le_bytes()),
            Err(DecodeError::ReservedBits { .. })
        ));
        // f16v2gina with a source field.
        assert!(matches!(
            decode_word(&(0x4e31_0000u32).to_le_bytes()),
            Err(DecodeError::ReservedBits { .. })
        ));
    }

    #[test]
    fn every_32_bit_pattern_sample_is_safe() {
        // A cheap sweep over a structured sample of words: decode never panics, and
        // what decodes re-encodes to the same bits.
        let mut x: u32 = 0x1234_5678;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let w = x & !BUNDLE_FLAG;
            if let Ok(i) = decode_inst(w) {
                assert_eq!(encode_inst(&i).unwrap(), w);
            }
        }
    }
}

//! The instruction table: every instruction defined once. From its entry come the
//! [`Inst`] variant, the pipe and flags, the binary encoding and decoding, the
//! name in error messages, the assembly forms (parsing and `Display`), the
//! registers it reads and writes, and its test generator. Only its semantics live
//! elsewhere: `docs/isa.md` says what it does, `crates/sim` does it.
//!
//! # Format
//!
//! ```text
//! /// Documentation of the variant.
//! inst Variant { field: Type = Kind @ bits, ... } = opcode, Pipe flags, name;
//!     asm mnemonic (operand, ...) [with {...}] [when [...]] [check {...} at i "..."] [else hook] "form";
//!     ...more asm lines...
//!     [uses { reads(field, ...) writes(field, ...) increments(field, ...) };]
//! ```
//!
//! **Fields**, in the variant's declaration order, which is also the order their
//! encoding errors are reported in. `Kind` (in `field.rs`) says how the field is
//! checked, stored, written and generated: registers `M` (`$m`), `A` (one `$a`),
//! `Pair`, `Quad`, `PairIf(cond)` (a pair when `cond`), `QuadIf(cond)` (a quad
//! when `cond`, else a pair), `QuadLo`/`QuadHi(low)` (the two pairs of a quad,
//! the high one with no bits of its own); immediates `Uint` (all of its bits),
//! `Range<LO, HI>`, `Signed` (i8), `Target` (a branch target, stored divided by
//! 4); and `Op` (a sub-operation: `IntOp`, `FVec`...) and `Flag` (one bit), which
//! the mnemonic carries. A kind's arguments may name other fields (while parsing,
//! those the mnemonic or `with` sets; the others are read later). `bits` is a
//! register slot `R0` (23..20) to `R5` (3..0), a range `[hi:lo]` or one bit
//! `[b]`; a field without bits is derived from the others. Operand bits no field
//! covers must be zero in a word.
//!
//! **Header.** The opcode (bits 30..24; main pipe 0x01..=0x3f, aux pipe
//! 0x40..=0x7f), `Main` or `Aux`, the flags `control` (not allowed in a repeat
//! body) and `supervisor` (supervisor only), and the name error messages use (a
//! string, or `mnemonic` for the mnemonic of the form that prints it).
//!
//! **Assembly forms** (`asm`), one or more. The mnemonic is a string, or parts in
//! parentheses: strings and sub-operation fields, concatenated (`(vec op)` reads
//! `f32v2add`). Operands, in text order:
//! - `field`: by its kind; an immediate takes a string naming it in range errors
//!   (`imm "immediate"`), and `hex` to print it in hex;
//! - `field?`: may be left out (the last operand only; then zero);
//! - `field late`: checked after the other operands;
//! - `ptr +=`: a post-incremented pointer `$mN+=`;
//! - `ptr += stride`: a pointer advanced by a stride register `$mN+=$mS`;
//! - `"word"`: a keyword (`sync local`).
//!
//! `with { field: value }` fixes fields the text does not carry; `Display` prints
//! an instruction with the first of its forms whose `with` values it holds (the
//! last form prints the rest). Where several forms share a mnemonic, the parser
//! takes the first whose `when` pattern fits the operands' shapes (`M`, `A`,
//! `Range` (`$aN:M`), `Imm`, `Stride` (`$mN+=$mS`), `_` any, `..` any more; otherwise
//! the operands must number exactly as many) and whose keywords are present, else
//! the one with neither. If none fits, the operand count is checked, then a
//! keyword that is missing, then the `else` hook (in `syntax.rs`) reports the
//! error. `check` is a condition on the parsed fields, reported at operand `i`.
//! The final string describes the operands in count errors; forms sharing a
//! mnemonic without a fallback share it.
//!
//! **Register use** (`uses`): the fields read, written and post-incremented, each
//! as wide as its kind. Aux-pipe instructions declare none: only workers execute
//! them, and a worker's barrel slot hides every dependency.

use crate::encode::{Check, DecodeError, EncodeError};
use crate::field::*;
use crate::inst::*;
use crate::syntax::{Form, Ops, Shape, SyntaxError, err, split_mnemonic};
use std::fmt;

/// One instruction's place in the table, for the table's own tests.
#[cfg(test)]
pub(crate) struct Entry {
    pub variant: &'static str,
    pub opcode: u8,
    pub pipe: Pipe,
    pub fields: &'static [(&'static str, Bits)],
}

const OFFSET: &str = "offset (in units of the access size)";

instruction_set! {
    /// One instruction. Main-pipe instructions (memory, integer, control, supervisor)
    /// and aux-pipe instructions (floating point, AMP) may be paired into a bundle that
    /// issues in one slot; see [`Word`].
    enum Inst;

    // ---- main pipe: integer and register moves ----

    inst Nop {} = 0x01, Main, "nop";
        asm "nop" () "none";

    /// `$mD = imm` (zero-extended, imm < 2^20).
    inst Setzi { d: MReg = M @ R0, imm: u32 = Uint @ [19:0] } = 0x02, Main, "setzi";
        asm "setzi" (d, imm hex "immediate") "$mD, imm20";
        uses { writes(d) };

    /// `$mD = $mA op $mB`.
    inst Int { op: IntOp = Op @ [3:0], d: MReg = M @ R0, a: MReg = M @ R1, b: MReg = M @ R2 }
        = 0x03, Main, "int";
        asm "mov" (d, a) with { op: IntOp::Or, b: MReg::ZERO } when [M, M]
            "destination, source";
        asm (op) (d, a, b) "$mD, $mA, $mB or $mD, $mA, imm";
        uses { reads(a, b) writes(d) };

    /// `$mD = $mA op imm` (imm is a 12-bit unsigned value, zero-extended).
    inst IntImm { op: IntOp = Op @ [3:0], d: MReg = M @ R0, a: MReg = M @ R1, imm: u16 = Uint @ [15:4] }
        = 0x04, Main, "int-imm";
        asm (op) (d, a, imm "immediate") when [_, _, Imm] "$mD, $mA, $mB or $mD, $mA, imm";
        uses { reads(a) writes(d) };

    /// `$aD = $mA` (bit copy).
    inst MovAm { d: AReg = A @ R0, a: MReg = M @ R1 } = 0x05, Main, "mov-am";
        asm "mov" (d, a) when [A, M] "destination, source";
        uses { reads(a) writes(d) };

    /// `$mD = $aA` (bit copy).
    inst MovMa { d: MReg = M @ R0, a: AReg = A @ R1 } = 0x06, Main, "mov-ma";
        asm "mov" (d, a) when [M, A] "destination, source";
        uses { reads(a) writes(d) };

    // ---- main pipe: memory ----
    // Effective address = $mBase + imm * access size (imm unsigned, 12 bits) unless
    // stated. Every access is checked for alignment to its size, SRAM bounds, and
    // region rules (see docs/isa.md). The register of the plain forms is checked
    // last: for `ld32`/`st32` it decides between the `$m` and `$a` forms.

    /// 32-bit load into an `$m` register.
    inst Ld32M { d: MReg = M @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x07, Main, "ld32 (m)";
        asm "ld32" (d late, base, imm? OFFSET) when [M, ..] "register, $mBase[, offset]";
        uses { reads(base) writes(d) };

    /// 32-bit load into an `$a` register.
    inst Ld32 { d: AReg = A @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x08, Main, "ld32";
        asm "ld32" (d late, base, imm? OFFSET) "register, $mBase[, offset]";
        uses { reads(base) writes(d) };

    /// 32-bit store from an `$m` register.
    inst St32M { s: MReg = M @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x09, Main, "st32 (m)";
        asm "st32" (s late, base, imm? OFFSET) when [M, ..] "register, $mBase[, offset]";
        uses { reads(s, base) };

    /// 32-bit store from an `$a` register.
    inst St32 { s: AReg = A @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x0a, Main, "st32";
        asm "st32" (s late, base, imm? OFFSET) "register, $mBase[, offset]";
        uses { reads(s, base) };

    /// 64-bit load into a pair.
    inst Ld64 { d: AReg = Pair @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x0b, Main, "ld64";
        asm "ld64" (d late, base, imm? OFFSET) "register, $mBase[, offset]";
        uses { reads(base) writes(d) };

    /// 64-bit store from a pair.
    inst St64 { s: AReg = Pair @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x0c, Main, "st64";
        asm "st64" (s late, base, imm? OFFSET) "register, $mBase[, offset]";
        uses { reads(s, base) };

    /// 64-bit load at `$mBase`, then `$mBase += inc * 8` (inc signed, -128..=127).
    inst Ld64Step { d: AReg = Pair @ R0, base: MReg = M @ R1, inc: i8 = Signed @ [7:0] }
        = 0x0e, Main, "ld64step";
        asm "ld64step" (d, base +=, inc "increment (in units of 8 bytes)")
            "$aN:N+1, $mBase+=, increment";
        uses { reads(base) writes(d) increments(base) };

    /// 64-bit store at `$mBase`, then `$mBase += inc * 8`.
    inst St64Step { s: AReg = Pair @ R0, base: MReg = M @ R1, inc: i8 = Signed @ [7:0] }
        = 0x0f, Main, "st64step";
        asm "st64step" (s, base +=, inc "increment (in units of 8 bytes)")
            "$aN:N+1, $mBase+=, increment";
        uses { reads(s, base) increments(base) };

    /// 128-bit load into a quad; 16-byte aligned, interleaved region only.
    inst Ld128 { d: AReg = Quad @ R0, base: MReg = M @ R1, imm: u16 = Uint @ [11:0] }
        = 0x0d, Main, "ld128";
        asm "ld128" (d late, base, imm? OFFSET) "register, $mBase[, offset]";
        uses { reads(base) writes(d) };

    /// Two 64-bit loads in one issue, each pointer then advanced by 8 bytes. The two
    /// addresses must be served by different memory elements (else MemoryConflict).
    inst Ld2x64Pace { d0: AReg = Pair @ R0, d1: AReg = Pair @ R1, p0: MReg = M @ R2, p1: MReg = M @ R3 }
        = 0x10, Main, "ld2x64pace";
        asm "ld2x64pace" (d0, d1, p0 +=, p1 +=) "$aD0:pair, $aD1:pair, $mP0+=, $mP1+=";
        uses { reads(p0, p1) writes(d0, d1) increments(p0, p1) };

    /// A 64-bit load and a 64-bit store in one issue, each pointer then advanced by
    /// 8 bytes; different elements required.
    inst Ldst64Pace { d: AReg = Pair @ R0, s: AReg = Pair @ R1, pl: MReg = M @ R2, ps: MReg = M @ R3 }
        = 0x11, Main, "ldst64pace";
        asm "ldst64pace" (d, s, pl +=, ps +=) "$aD:pair, $aS:pair, $mLoad+=, $mStore+=";
        uses { reads(pl, ps, s) writes(d) increments(pl, ps) };

    /// Two 64-bit loads and one 64-bit store in one issue (the AMP feeder), each
    /// pointer then advanced by 8 bytes; all three accesses in different elements.
    inst Ld2xSt64Pace {
        d0: AReg = Pair @ R0,
        d1: AReg = Pair @ R1,
        s: AReg = Pair @ R2,
        p0: MReg = M @ R3,
        p1: MReg = M @ R4,
        ps: MReg = M @ R5,
    } = 0x12, Main, "ld2xst64pace";
        asm "ld2xst64pace" (d0, d1, s, p0 +=, p1 +=, ps +=)
            "$aD0:pair, $aD1:pair, $aS:pair, $mP0+=, $mP1+=, $mStore+=";
        uses { reads(p0, p1, ps, s) writes(d0, d1) increments(p0, p1, ps) };

    // The strided forms (the chip's `$mStride` operand, reduced to one register):
    // the first pointer advances by `8 * m[stride]` bytes (`m[stride]` signed), the
    // others by 8 as in the plain forms. They let a stream walk a row-major matrix
    // a few columns at a time (the AMP reading rows of a wider input). Each shares
    // its mnemonic with the plain form; the stride register selects it.

    /// `ld64step` whose pointer advances by `8 * m[stride]`.
    inst Ld64Stride { d: AReg = Pair @ R0, base: MReg = M @ R1, stride: MReg = M @ R2 }
        = 0x23, Main, "ld64step (stride)";
        asm "ld64step" (d, base += stride) when [_, _] "$aN:N+1, $mBase+=$mStride";
        uses { reads(base, stride) writes(d) increments(base) };

    /// `ld2x64pace` whose first pointer advances by `8 * m[stride]`.
    inst Ld2x64PaceStride {
        d0: AReg = Pair @ R0,
        d1: AReg = Pair @ R1,
        p0: MReg = M @ R2,
        p1: MReg = M @ R3,
        stride: MReg = M @ R4,
    } = 0x24, Main, "ld2x64pace (stride)";
        asm "ld2x64pace" (d0, d1, p0 += stride, p1 +=) when [_, _, Stride, _]
            "$aD0:pair, $aD1:pair, $mP0+=, $mP1+=";
        uses { reads(p0, p1, stride) writes(d0, d1) increments(p0, p1) };

    /// `ldst64pace` whose load pointer advances by `8 * m[stride]`.
    inst Ldst64PaceStride {
        d: AReg = Pair @ R0,
        s: AReg = Pair @ R1,
        pl: MReg = M @ R2,
        ps: MReg = M @ R3,
        stride: MReg = M @ R4,
    } = 0x25, Main, "ldst64pace (stride)";
        asm "ldst64pace" (d, s, pl += stride, ps +=) when [_, _, Stride, _]
            "$aD:pair, $aS:pair, $mLoad+=, $mStore+=";
        uses { reads(pl, ps, stride, s) writes(d) increments(pl, ps) };

    /// `ld2xst64pace` whose first pointer advances by `8 * m[stride]`. The two load
    /// destinations form a quad (`d1 = d0 + 2`, `d0` a multiple of 4): the encoding
    /// has no room for two separate pairs beside the stride.
    inst Ld2xSt64PaceStride {
        d0: AReg = QuadLo @ R0,
        d1: AReg = QuadHi(d0),
        s: AReg = Pair @ R1,
        p0: MReg = M @ R2,
        p1: MReg = M @ R3,
        ps: MReg = M @ R4,
        stride: MReg = M @ R5,
    } = 0x26, Main, "ld2xst64pace (stride)";
        asm "ld2xst64pace" (d0, d1, s, p0 += stride, p1 +=, ps +=) when [_, _, _, Stride, _, _]
            check { d0.0.is_multiple_of(4) && d1.0 == d0.0 + 2 } at 0
                "the strided form loads a quad: `$aN:N+1, $aN+2:N+3` with N a multiple of 4"
            "$aD0:pair, $aD1:pair, $aS:pair, $mP0+=, $mP1+=, $mStore+=";
        uses { reads(p0, p1, ps, stride, s) writes(d0, d1) increments(p0, p1, ps) };

    /// Loads 16 bytes at `$mBase` (ld128 rules) into AMP weight quad `quad`
    /// (0..=31) of this tile, then `$mBase += 16`.
    inst AmpLoadW { base: MReg = M @ R0, quad: u8 = Range<0, 31> @ [4:0] }
        = 0x13, Main, "amploadw";
        asm "ampw" (base +=, quad "weight quad") "$mBase+=, quad";
        uses { reads(base) increments(base) };

    // ---- main pipe: control ----

    /// Jump to an absolute address held in `$mA`.
    inst Br { a: MReg = M @ R0 } = 0x14, Main control, "br";
        asm "br" (a) "$mA";
        uses { reads(a) };

    /// Jump to an absolute address (imm < 2^20, 4-byte aligned).
    inst Bri { target: u32 = Target @ [17:0] } = 0x15, Main control, "bri";
        asm "bri" (target) "target";

    /// Jump if `$mC == 0`.
    inst Brz { c: MReg = M @ R0, target: u32 = Target @ [17:0] } = 0x16, Main control, "brz";
        asm "brz" (c, target) "$mC, target";
        uses { reads(c) };

    /// Jump if `$mC != 0`.
    inst Brnz { c: MReg = M @ R0, target: u32 = Target @ [17:0] } = 0x17, Main control, "brnz";
        asm "brnz" (c, target) "$mC, target";
        uses { reads(c) };

    /// `$mLink = pc + 4 (or + 8 in a bundle)`, jump to `target`.
    inst Call { link: MReg = M @ R0, target: u32 = Target @ [17:0] } = 0x18, Main control, "call";
        asm "call" (link, target) "$mLink, target";
        uses { writes(link) };

    /// Repeat the following `body` words (1..=255 bundles or single words) `$mCount`
    /// times (0..=rpt_max_count; more faults with InvalidOperand). Control
    /// instructions inside the body fault with InvalidInstruction.
    inst Rpt { count: MReg = M @ R0, body: u8 = Range<1, 255> @ [7:0] } = 0x19, Main control, "rpt";
        asm "rpt" (count late, body "body length (in words)") "$mCount or count, body words";
        uses { reads(count) };

    /// Repeat with an immediate count (< 4096).
    inst Rpti { count: u16 = Uint @ [19:8], body: u8 = Range<1, 255> @ [7:0] }
        = 0x1a, Main control, "rpti";
        asm "rpt" (count late "repeat count", body "body length (in words)") when [Imm, _]
            "$mCount or count, body words";

    /// Worker: finish. Supervisor: the tile's program is complete.
    inst Exit {} = 0x1b, Main control, "exit";
        asm "exit" () "none";

    // ---- main pipe: supervisor only ----

    /// Start worker `worker` (0..=5) at entry `$mEntry` with state pointer `$mState`
    /// (both 4-byte aligned; entry executable). The worker starts with `$m0 = state`,
    /// `$m1 = worker index`, all other registers zero.
    inst Run { entry: MReg = M @ R0, state: MReg = M @ R1, worker: u8 = Range<0, 5> @ [2:0] }
        = 0x1c, Main supervisor, "run";
        asm "run" (entry, state, worker "worker") "$mEntry, $mState, worker";
        uses { reads(entry, state) };

    /// Start all six workers at `$mEntry`, worker i with `$m0 = $mState + i * stride`
    /// and `$m1 = i`.
    inst RunAll { entry: MReg = M @ R0, state: MReg = M @ R1, stride: u16 = Uint @ [15:0] }
        = 0x1d, Main supervisor, "runall";
        asm "runall" (entry, state, stride "stride") "$mEntry, $mState, stride";
        uses { reads(entry, state) };

    /// Wait until every worker of this tile has exited.
    inst SyncLocal {} = 0x1e, Main supervisor, "sync local";
        asm "sync" ("local") "local or global";

    /// Chip-wide barrier: every tile's supervisor must arrive.
    inst SyncGlobal {} = 0x1f, Main supervisor, "sync global";
        asm "sync" ("global") "local or global";

    /// End this tile's part of exchange phase `id`: the sends and receives its
    /// exchange code issued since the `SyncGlobal` are carried out together with
    /// every other tile's. Must follow a `SyncGlobal`; a tile whose messages another
    /// tile receives must end the same phase in the same superstep.
    inst Exchange { id: u16 = Uint @ [15:0] } = 0x20, Main supervisor, "exchange";
        asm "exchange" (id "exchange id") "exchange id";

    /// Exchange code: broadcast `bytes` bytes from `$mA` on this tile's exchange bus
    /// as its next message of the current exchange phase (messages are numbered from
    /// 0 in issue order). Supervisor only, between a `sync global` and `exchange`.
    inst Send { a: MReg = M @ R0, bytes: u16 = Uint @ [15:0] } = 0x27, Main supervisor, "send";
        asm "send" (a, bytes "message bytes") "$mA, bytes";
        uses { reads(a) };

    /// Exchange code: point this tile's incoming mux at tile `tile`'s bus.
    inst Mux { tile: u32 = Range<0, 0xfffff> @ [19:0] } = 0x28, Main supervisor, "mux";
        asm "mux" (tile "source tile") "source tile";

    /// Exchange code: land message `msg` of the tile the incoming mux selects at
    /// `$mA` (its length is the sender's).
    inst Recv { a: MReg = M @ R0, msg: u16 = Uint @ [15:0] } = 0x29, Main supervisor, "recv";
        asm "recv" (a, msg "message index") "$mA, message";
        uses { reads(a) };

    /// Carry out the host transfers described by the descriptor list at `$mDesc`
    /// (format in docs/isa.md, host section).
    inst HostXfer { desc: MReg = M @ R0 } = 0x21, Main supervisor, "hostxfer";
        asm "hostxfer" (desc) "$mDesc";
        uses { reads(desc) };

    /// Record a trace event (profile marker) with a 16-bit tag.
    inst Mark { tag: u16 = Uint @ [15:0] } = 0x22, Main, "mark";
        asm "mark" (tag "tag") "tag";

    // ---- aux pipe: floating point ----

    /// `$aD = $aA op $aB` over the lanes of `vec`.
    inst FBin {
        op: FBinOp = Op @ [4:2],
        vec: FVec = Op @ [1:0],
        d: AReg = PairIf(vec.is_pair()) @ R0,
        a: AReg = PairIf(vec.is_pair()) @ R1,
        b: AReg = PairIf(vec.is_pair()) @ R2,
    } = 0x40, Aux, "fbin";
        asm (vec op) (d, a, b) "d, a, b";

    /// `$aD += $aA * $aB` over the lanes (computed in f32, rounded once to the lane
    /// format).
    inst FMac {
        vec: FVec = Op @ [1:0],
        d: AReg = PairIf(vec.is_pair()) @ R0,
        a: AReg = PairIf(vec.is_pair()) @ R1,
        b: AReg = PairIf(vec.is_pair()) @ R2,
    } = 0x41, Aux, "fmac";
        asm (vec "mac") (d, a, b) "d, a, b";

    /// Scalar f32 `$aD = op($aA)`.
    inst FUn { op: FUnOp = Op @ [2:0], d: AReg = A @ R0, a: AReg = A @ R1 } = 0x42, Aux, "fun";
        asm ("f32" op) (d, a) "$aD, $aA";

    /// `tanh` of both f16 lanes of `$aA` (computed in f32, rounded to f16) into
    /// `$aD`.
    inst F16v2Tanh { d: AReg = A @ R0, a: AReg = A @ R1 } = 0x49, Aux, "f16v2tanh";
        asm "f16v2tanh" (d, a) "$aD, $aA";

    /// `exp` of both f16 lanes of `$aA` (computed in f32, rounded to f16) into
    /// `$aD`; one issue, as `f16v2tanh`.
    inst F16v2Exp { d: AReg = A @ R0, a: AReg = A @ R1 } = 0x4d, Aux, "f16v2exp";
        asm "f16v2exp" (d, a) "$aD, $aA";

    /// Pair of f32 from two f16 in `$aA`: `$aD:pair = (f32(lo), f32(hi))`.
    inst F16v2ToF32 { d: AReg = Pair @ R0, a: AReg = A @ R1 } = 0x43, Aux, "f16v2tof32";
        asm "f16v2tof32" (d, a) "$aD:pair, $aA";

    /// Two f16 (round to nearest even) from the f32 pair `$aA`.
    inst F32v2ToF16 { d: AReg = A @ R0, a: AReg = Pair @ R1 } = 0x44, Aux, "f32v2tof16";
        asm "f32v2tof16" (d, a) "$aD, $aA:pair";

    /// `sort4x16lo` / `sort4x16hi` (`hi`): the low (high) 16-bit halves of `$aA`
    /// and `$aB` side by side, `$aA`'s in the low half of `$aD`. Bits moved as they
    /// are: a 2x2 transpose of f16 is one of each.
    inst Sort4x16 { hi: bool = Flag @ [0], d: AReg = A @ R0, a: AReg = A @ R1, b: AReg = A @ R2 }
        = 0x4c, Aux, mnemonic;
        asm "sort4x16lo" (d, a, b) with { hi: false } "$aD, $aA, $aB";
        asm "sort4x16hi" (d, a, b) with { hi: true } "$aD, $aA, $aB";

    /// `f16v4acc` (a pair) or `f16v8acc` (`quad`): the four or eight f16 lanes of
    /// `$aA`, widened, added into accumulators `0..4` or `0..8` of this worker's
    /// engine (the sixteen f32 accumulators the AMP also uses).
    inst F16Acc { a: AReg = QuadIf(quad) @ R1, quad: bool = Flag @ [0] } = 0x4a, Aux, mnemonic;
        asm "f16v4acc" (a) with { quad: false } "$aA:pair";
        asm "f16v8acc" (a) with { quad: true } "$aA:quad";

    /// `f32v2gina`: accumulators 0 and 1 into the pair `$aD`; accumulators `2..16`
    /// move down by two and zeros enter at 14 and 15.
    inst F32v2Gina { d: AReg = Pair @ R0 } = 0x4b, Aux, "f32v2gina";
        asm "f32v2gina" (d) "$aD:pair";

    /// `f16v2gina`: accumulators 0 and 1, each rounded to f16, into `$aD` (lane 0
    /// from accumulator 0); the accumulators then move as for `f32v2gina`.
    inst F16v2Gina { d: AReg = A @ R0 } = 0x4e, Aux, "f16v2gina";
        asm "f16v2gina" (d) "$aD";

    /// `f16v4cmac`: the four lane products of the pairs `$aA` and `$aB` (exact in
    /// f32) added into accumulators `0..4`.
    inst F16v4Cmac { a: AReg = Pair @ R1, b: AReg = Pair @ R2 } = 0x4f, Aux, "f16v4cmac";
        asm "f16v4cmac" (a, b) "$aA:pair, $aB:pair";

    // FP8 (IPU21's F143, `tessera_machine::fp8`): both conversions multiply by
    // `2^$FP_SCL`, the worker's scale register, which `uput $FP_SCL` sets.

    /// `f8v4tof16`: the four FP8 bytes of `$aA` (byte 0 into lane 0), each times
    /// `2^$FP_SCL` and rounded to f16, into the four lanes of the pair `$aD`.
    inst F8v4ToF16 { d: AReg = Pair @ R0, a: AReg = A @ R1 } = 0x50, Aux, "f8v4tof16";
        asm "f8v4tof16" (d, a) "$aD:pair, $aA";

    /// `f16v8tof8`: the eight f16 lanes of the quad `$aA`, each times `2^$FP_SCL`
    /// and rounded to FP8 (nearest even, saturating), into the eight bytes of the
    /// pair `$aD` (lane 0 into byte 0).
    inst F16v8ToF8 { d: AReg = Pair @ R0, a: AReg = Quad @ R1 } = 0x51, Aux, "f16v8tof8";
        asm "f16v8tof8" (d, a) "$aD:pair, $aA:quad";

    /// `uput $FP_SCL, $aA`: the worker's FP8 scale register from the low byte of
    /// `$aA` (a signed exponent).
    inst UputFpScl { a: AReg = A @ R1 } = 0x52, Aux, "uput";
        asm "uput" ("$FP_SCL", a) "$FP_SCL, $aA";

    /// Sum of the lanes, as f32 into a single register (F16V4 and F32V2 read pairs).
    inst FSum { vec: FVec = Op @ [1:0], d: AReg = A @ R0, a: AReg = PairIf(vec.is_pair()) @ R1 }
        = 0x45, Aux, "fsum";
        asm (vec "sum") (d, a) "$aD, source";

    /// `$aD = $aA` (32 bits) or pair copy when `pair`.
    inst FMov { d: AReg = PairIf(pair) @ R0, a: AReg = PairIf(pair) @ R1, pair: bool = Flag @ [0] }
        = 0x46, Aux, "fmov";
        asm "mov" (d, a) with { pair: true } when [Range, A] "destination, source";
        asm "mov" (d, a) with { pair: false } when [A, A] else mov_operands "destination, source";

    /// Broadcast the f32 `$aA` to both lanes of the pair `$aD`... or, for F16V4, the
    /// low f16 of `$aA` to all four lanes of `$aD`.
    inst FBcast { vec: FVec = Op @ [1:0], d: AReg = PairIf(vec.is_pair()) @ R0, a: AReg = A @ R1 }
        = 0x47, Aux, "fbcast";
        asm (vec "bcast") (d, a) "destination, $aA";

    /// AMP step on this worker's engine: the four f16 in `$aIn` (a pair) multiply
    /// weight rows `4*phase .. 4*phase+4` (phase 0..=3) into the sixteen f32
    /// accumulators (64 MACs); the four f16 partial sums in `$aPin` are added to
    /// accumulators `4*phase..4*phase+4`; `$aOut` receives accumulators
    /// `4*phase..4*phase+4` of the previously completed row, rounded to f16. At
    /// phase 3 the row completes: the accumulators move to the output latch and reset.
    inst Amp {
        out: AReg = Pair @ R0,
        inp: AReg = Pair @ R1,
        pin: AReg = Pair @ R2,
        phase: u8 = Range<0, 3> @ [1:0],
    } = 0x48, Aux, "amp";
        asm "amp" (out, inp, pin, phase "phase") "$aOut:pair, $aIn:pair, $aPin:pair, phase";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{decode_inst, encode_inst};
    use crate::syntax::parse_word;
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, TestRng, TestRunner};
    use std::collections::{HashMap, HashSet};

    /// Opcodes are distinct and in their pipe's range; fields fit the operand bits
    /// and do not overlap; variant names are distinct.
    #[test]
    fn entries_are_consistent() {
        let mut opcodes = HashSet::new();
        let mut names = HashSet::new();
        for e in ENTRIES {
            assert!(
                opcodes.insert(e.opcode),
                "{}: opcode {:#04x} taken",
                e.variant,
                e.opcode
            );
            assert!(names.insert(e.variant), "{} twice", e.variant);
            let range = match e.pipe {
                Pipe::Main => 0x01..0x40,
                Pipe::Aux => 0x40..0x80,
            };
            assert!(
                range.contains(&e.opcode),
                "{}: opcode {:#04x} not in {range:?}",
                e.variant,
                e.opcode
            );
            let mut used = 0u32;
            for (field, bits) in e.fields {
                assert!(
                    bits.shift + bits.width <= 24,
                    "{}.{field}: past bit 23",
                    e.variant
                );
                assert_eq!(
                    used & bits.mask(),
                    0,
                    "{}.{field}: overlaps another field",
                    e.variant
                );
                used |= bits.mask();
            }
        }
    }

    /// Every form builds a variant of the table, every variant has a form, and
    /// forms that share a mnemonic and have no fallback describe their operands
    /// alike (the description their common count error shows).
    #[test]
    fn forms_are_consistent() {
        let variants: HashSet<_> = ENTRIES.iter().map(|e| e.variant).collect();
        let with_forms: HashSet<_> = FORMS.iter().map(|f| f.variant).collect();
        assert_eq!(variants, with_forms);
        let mut by_mnemonic: HashMap<String, Vec<&Form>> = HashMap::new();
        let mut rng = runner();
        for &(_, generate) in GENERATORS {
            for _ in 0..64 {
                let inst = generate(seeds(&mut rng));
                let text = inst.to_string();
                let mn = text.split(' ').next().unwrap_or_default().to_string();
                let forms = FORMS.iter().filter(|f| (f.spells)(&mn)).collect();
                by_mnemonic.insert(mn, forms);
            }
        }
        for (mn, forms) in by_mnemonic {
            assert!(!forms.is_empty(), "`{mn}` is printed but not parsed");
            if forms
                .iter()
                .all(|f| f.guard.is_some() || !f.keywords.is_empty())
            {
                for f in &forms {
                    assert_eq!(
                        (f.count, f.optional, f.form),
                        (forms[0].count, forms[0].optional, forms[0].form),
                        "`{mn}`: {} and {}",
                        f.variant,
                        forms[0].variant
                    );
                }
            }
        }
    }

    fn runner() -> TestRunner {
        TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(Default::default(), &[7; 32]),
        )
    }

    fn seeds(r: &mut TestRunner) -> [u32; 8] {
        proptest::arbitrary::any::<[u32; 8]>()
            .new_tree(r)
            .map(|t| t.current())
            .unwrap_or_default()
    }

    /// Every variant has a generator, which makes only that variant, valid; each
    /// instruction encodes, decodes back to itself, and prints as text that parses
    /// back to itself.
    #[test]
    fn every_variant_generates_and_round_trips() {
        let mut rng = runner();
        for e in ENTRIES {
            let generators: Vec<_> = GENERATORS.iter().filter(|(n, _)| *n == e.variant).collect();
            assert_eq!(
                generators.len(),
                1,
                "{}: {} generators",
                e.variant,
                generators.len()
            );
            let generate = generators[0].1;
            for _ in 0..2000 {
                let inst = generate(seeds(&mut rng));
                assert_eq!(inst.variant_name(), e.variant, "{inst:?}");
                assert_eq!(inst.opcode(), e.opcode);
                assert_eq!(inst.pipe(), e.pipe);
                let w = encode_inst(&inst).unwrap_or_else(|err| panic!("{inst:?}: {err}"));
                assert_eq!(w >> 24, u32::from(e.opcode), "{inst:?}");
                assert_eq!(decode_inst(w), Ok(inst), "{inst:?} as {w:#010x}");
                let text = inst.to_string();
                assert_eq!(
                    parse_word(&text),
                    Ok(Word::Single(inst)),
                    "{inst:?} as `{text}`"
                );
            }
        }
    }

    /// `docs/isa.md` documents every opcode once, with register columns R0..R3
    /// filled exactly where the instruction has a register field.
    #[test]
    fn the_encoding_doc_has_a_row_per_opcode() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/isa.md");
        let doc = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut rows = HashMap::new();
        for line in doc.lines() {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let Some(hex) = cells.get(1).and_then(|c| c.strip_prefix("0x")) else {
                continue;
            };
            let Ok(opcode) = u8::from_str_radix(hex, 16) else {
                continue;
            };
            assert!(
                rows.insert(opcode, cells).is_none(),
                "opcode {opcode:#04x}: two rows"
            );
        }
        for e in ENTRIES {
            let row = rows
                .remove(&e.opcode)
                .unwrap_or_else(|| panic!("{}: no row for opcode {:#04x}", e.variant, e.opcode));
            for slot in 0..4 {
                let field = e.fields.iter().find(|(_, b)| *b == Bits::reg(slot));
                let cell = row.get(3 + slot as usize).copied().unwrap_or_default();
                assert_eq!(
                    field.is_some(),
                    !cell.is_empty(),
                    "{} (opcode {:#04x}): R{slot} is `{cell}`, the table has {field:?}",
                    e.variant,
                    e.opcode
                );
            }
        }
        let extra: Vec<_> = rows.keys().map(|o| format!("{o:#04x}")).collect();
        assert!(
            extra.is_empty(),
            "rows for opcodes no instruction has: {extra:?}"
        );
    }
}

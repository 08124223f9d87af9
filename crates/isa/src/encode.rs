//! The binary encoding of [`Inst`] and [`Word`]: fixed 32-bit little-endian words,
//! specified bit by bit in `docs/isa.md` (section "Encoding"); each instruction's
//! opcode and fields are its entry in the instruction table (`table.rs`), the
//! checks are its fields' kinds (`field.rs`). Both directions validate every field
//! with the same rules, so whatever decodes also re-encodes to
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

/// A stable lower-case name for an instruction kind, used in error messages.
pub fn inst_name(inst: &Inst) -> &'static str {
    inst.name()
}

/// Field checks for one instruction, whose name its errors carry.
pub(crate) struct Check {
    inst: &'static str,
}

impl Check {
    pub(crate) fn err(&self, field: &'static str, value: i64, reason: &'static str) -> EncodeError {
        EncodeError::Field {
            inst: self.inst,
            field,
            value,
            reason,
        }
    }
    pub(crate) fn m(&self, field: &'static str, r: MReg) -> Result<u32, EncodeError> {
        if r.0 < 16 {
            Ok(r.0 as u32)
        } else {
            Err(self.err(field, r.0.into(), "is not a register ($m0..$m15)"))
        }
    }
    pub(crate) fn a(&self, field: &'static str, r: AReg) -> Result<u32, EncodeError> {
        if r.0 < 16 {
            Ok(r.0 as u32)
        } else {
            Err(self.err(field, r.0.into(), "is not a register ($a0..$a15)"))
        }
    }
    pub(crate) fn pair(&self, field: &'static str, r: AReg) -> Result<u32, EncodeError> {
        let v = self.a(field, r)?;
        if v.is_multiple_of(2) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), "is not an even register (pair)"))
        }
    }
    pub(crate) fn quad(&self, field: &'static str, r: AReg) -> Result<u32, EncodeError> {
        let v = self.a(field, r)?;
        if v.is_multiple_of(4) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), "is not a multiple of 4 (quad)"))
        }
    }
    pub(crate) fn a_vec(
        &self,
        field: &'static str,
        r: AReg,
        pair: bool,
    ) -> Result<u32, EncodeError> {
        if pair {
            self.pair(field, r)
        } else {
            self.a(field, r)
        }
    }
    pub(crate) fn uint(&self, field: &'static str, v: u32, bits: u32) -> Result<u32, EncodeError> {
        if u64::from(v) < (1u64 << bits) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), out_of_range(bits)))
        }
    }
    pub(crate) fn range(
        &self,
        field: &'static str,
        v: u32,
        lo: u32,
        hi: u32,
    ) -> Result<u32, EncodeError> {
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(self.err(field, v.into(), "is out of range"))
        }
    }
    pub(crate) fn target(&self, t: u32) -> Result<u32, EncodeError> {
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

/// Checks every field of `inst` and returns its 32-bit encoding (bit 31 clear).
pub fn encode_inst(inst: &Inst) -> Result<u32, EncodeError> {
    inst.encode_fields(&Check {
        inst: inst_name(inst),
    })
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

/// Decodes one 32-bit word (bit 31 must be clear: bundles go through
/// [`decode_word`]).
pub fn decode_inst(w: u32) -> Result<Inst, DecodeError> {
    let (inst, used) = Inst::decode_fields(w)?;
    // Operand bits no field uses must be zero, so that every word that decodes
    // re-encodes to itself.
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
        // The FP8 conversions and the scale register.
        let w = Word::Single(Inst::F8v4ToF16 {
            d: AReg(2),
            a: AReg(5),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x5025_0000u32.to_le_bytes());
        round_trip(w);
        let w = Word::Single(Inst::F16v8ToF8 {
            d: AReg(6),
            a: AReg(8),
        });
        assert_eq!(encode(&[w]).unwrap(), 0x5168_0000u32.to_le_bytes());
        round_trip(w);
        let w = Word::Single(Inst::UputFpScl { a: AReg(3) });
        assert_eq!(encode(&[w]).unwrap(), 0x5203_0000u32.to_le_bytes());
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
        // f16v8tof8 from a register that is not a quad, f8v4tof16 into an odd
        // register, and `uput $FP_SCL` with a destination field.
        assert!(matches!(
            decode_word(&(0x5162_0000u32).to_le_bytes()),
            Err(DecodeError::Field { .. })
        ));
        assert!(matches!(
            decode_word(&(0x5010_0000u32).to_le_bytes()),
            Err(DecodeError::Field { .. })
        ));
        assert!(matches!(
            decode_word(&(0x5213_0000u32).to_le_bytes()),
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

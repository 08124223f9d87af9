//! Field kinds: how one operand field of an instruction is checked and stored in
//! its bits, read and written in assembly, counted as a register, and generated
//! for tests. The instruction table (`table.rs`) names a kind for every field;
//! everything else about the field follows from the kind and its bit position.
//!
//! Kinds whose parameters are constants take them as const generics
//! (`Range<1, 255>`); kinds that depend on another field of the same instruction
//! take its value (`PairIf(vec.is_pair())`). The split matters where fields are
//! produced one by one (decoding, test generation): the first kind can be used
//! before any field is known, the second only once the others are.

use crate::encode::{Check, EncodeError};
use crate::inst::*;
use crate::syntax::{A as TextA, M as TextM, Ops, P as TextP, Q as TextQ, SyntaxError, V as TextV};
use std::fmt;

/// Where a field sits in the 24 operand bits of a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Bits {
    pub shift: u32,
    pub width: u32,
}

impl Bits {
    /// A field with no bits of its own (derived from another).
    pub const NONE: Bits = Bits { shift: 0, width: 0 };

    /// Bits `hi..=lo`.
    pub const fn span(hi: u32, lo: u32) -> Bits {
        Bits {
            shift: lo,
            width: hi - lo + 1,
        }
    }

    /// Register slot `R<n>`: R0 = 23..20 down to R5 = 3..0.
    pub const fn reg(n: u32) -> Bits {
        Bits::span(23 - 4 * n, 20 - 4 * n)
    }

    /// The largest value the field holds.
    pub const fn max(self) -> u32 {
        ((1u64 << self.width) - 1) as u32
    }

    /// The field's bits within a word.
    pub const fn mask(self) -> u32 {
        self.max() << self.shift
    }

    /// The field's value in word `w`.
    pub const fn get(self, w: u32) -> u32 {
        (w >> self.shift) & self.max()
    }
}

/// A value every field type starts from before parsing fills it in.
pub(crate) trait Blank {
    const BLANK: Self;
}

impl Blank for MReg {
    const BLANK: Self = MReg(0);
}
impl Blank for AReg {
    const BLANK: Self = AReg(0);
}
impl Blank for bool {
    const BLANK: Self = false;
}
impl Blank for i8 {
    const BLANK: Self = 0;
}
impl Blank for u8 {
    const BLANK: Self = 0;
}
impl Blank for u16 {
    const BLANK: Self = 0;
}
impl Blank for u32 {
    const BLANK: Self = 0;
}

/// A sub-operation enum (`IntOp`, `FVec`...): a field whose code indexes `ALL`
/// and whose name is part of a mnemonic.
pub(crate) trait SubOp: Copy + PartialEq + 'static {
    const ALL: &'static [Self];
    const NAMES: &'static [&'static str];
    fn code(self) -> u32 {
        Self::ALL.iter().position(|&o| o == self).unwrap_or(0) as u32
    }
    fn name(self) -> &'static str {
        Self::NAMES[self.code() as usize]
    }
}

/// The spellings of the sub-operation type of `_v` (the type is all it is for).
pub(crate) fn names_like<T: SubOp>(_v: &T) -> &'static [&'static str] {
    T::NAMES
}

/// The sub-operation of `_v`'s type at index `i` of its `ALL`.
pub(crate) fn sub_op_like<T: SubOp>(_v: &T, i: usize) -> T {
    T::ALL[i]
}

/// How a field of type `T` is checked, stored and generated.
pub(crate) trait Kind<T: Copy> {
    /// The value stored in `raw` (the field's bits); `None` for a code that means
    /// nothing (the word is then reported as having reserved bits set).
    fn decode(raw: u32) -> Option<T>
    where
        Self: Sized;

    /// Checks `v` and returns the bits that store it (not yet shifted).
    fn encode(&self, c: &Check, field: &'static str, v: T, bits: Bits) -> Result<u32, EncodeError>;

    /// A field with no bits of its own gets its value here, once the others are
    /// decoded; any other field keeps `v`.
    fn derive(&self, v: T) -> T {
        v
    }

    /// A value for tests from random bits; `repair` then makes it valid given the
    /// other fields.
    #[cfg_attr(not(any(test, feature = "testgen")), allow(dead_code))]
    fn pick(seed: u32, bits: Bits) -> T
    where
        Self: Sized;

    /// `v`, or the nearest valid value given the other fields (a pair's even
    /// register, a quad's high pair).
    #[cfg_attr(not(any(test, feature = "testgen")), allow(dead_code))]
    fn repair(&self, v: T) -> T {
        v
    }
}

/// A field that is written as an operand in assembly.
pub(crate) trait Operand<T: Copy>: Kind<T> {
    /// Reads operand `i`; `what` names it in range errors.
    fn parse(&self, o: &Ops, i: usize, what: &str, bits: Bits) -> Result<T, SyntaxError>;
    fn show(&self, v: T, f: &mut fmt::Formatter<'_>) -> fmt::Result;
    /// The registers the field names, as [`RegUse`] bits (none for immediates).
    fn regs(&self, _v: T) -> u32 {
        0
    }
}

/// A kind with the bit position its field sits at.
pub(crate) struct Field<K> {
    pub kind: K,
    pub bits: Bits,
}

impl<K> Field<K> {
    pub fn encode<T: Copy>(&self, c: &Check, field: &'static str, v: T) -> Result<u32, EncodeError>
    where
        K: Kind<T>,
    {
        Ok(self.kind.encode(c, field, v, self.bits)? << self.bits.shift)
    }
    pub fn parse<T: Copy>(&self, o: &Ops, i: usize, what: &str) -> Result<T, SyntaxError>
    where
        K: Operand<T>,
    {
        self.kind.parse(o, i, what, self.bits)
    }
    pub fn show<T: Copy>(&self, v: T, f: &mut fmt::Formatter<'_>) -> fmt::Result
    where
        K: Operand<T>,
    {
        self.kind.show(v, f)
    }
    pub fn regs<T: Copy>(&self, v: T) -> u32
    where
        K: Operand<T>,
    {
        self.kind.regs(v)
    }
}

fn m_bit(r: MReg) -> u32 {
    1u32.checked_shl(u32::from(r.0)).unwrap_or(0) & 0xFFFF
}

fn a_bits(r: AReg, count: u32) -> u32 {
    let mask = (1u32 << count) - 1;
    (mask.checked_shl(u32::from(r.0)).unwrap_or(0) & 0xFFFF) << 16
}

/// A register number from random bits.
fn pick_reg(seed: u32) -> u8 {
    (seed % 16) as u8
}

fn align_areg(r: AReg, align: u8) -> AReg {
    AReg(r.0 / align * align)
}

// ---------------------------------------------------------------------------
// Registers
// ---------------------------------------------------------------------------

/// An `$m` register.
pub(crate) struct M;

impl Kind<MReg> for M {
    fn decode(raw: u32) -> Option<MReg> {
        Some(MReg(raw as u8))
    }
    fn encode(&self, c: &Check, field: &'static str, v: MReg, _: Bits) -> Result<u32, EncodeError> {
        c.m(field, v)
    }
    fn pick(seed: u32, _: Bits) -> MReg {
        MReg(pick_reg(seed))
    }
}

impl Operand<MReg> for M {
    fn parse(&self, o: &Ops, i: usize, _: &str, _: Bits) -> Result<MReg, SyntaxError> {
        o.m(i)
    }
    fn show(&self, v: MReg, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&TextM(v), f)
    }
    fn regs(&self, v: MReg) -> u32 {
        m_bit(v)
    }
}

/// Implements a kind of `$a` operand, whose methods see the kind as `$s`:
/// `$check` encodes, `$parse` reads, `$show` prints, `$count` registers are named
/// from the first, and test values are rounded down to a multiple of `$align`.
macro_rules! a_kind {
    (
        $kind:ty,
        |$s:ident, $c:ident, $field:ident, $v:ident| $check:expr,
        |$o:ident, $i:ident| $parse:expr,
        $show:expr,
        $count:expr,
        $align:expr $(,)?
    ) => {
        impl Kind<AReg> for $kind {
            fn decode(raw: u32) -> Option<AReg> {
                Some(AReg(raw as u8))
            }
            fn encode(
                &self,
                $c: &Check,
                $field: &'static str,
                $v: AReg,
                _: Bits,
            ) -> Result<u32, EncodeError> {
                let $s = self;
                $check
            }
            fn pick(seed: u32, _: Bits) -> AReg {
                AReg(pick_reg(seed))
            }
            fn repair(&self, v: AReg) -> AReg {
                let $s = self;
                align_areg(v, $align)
            }
        }
        impl Operand<AReg> for $kind {
            fn parse(&self, $o: &Ops, $i: usize, _: &str, _: Bits) -> Result<AReg, SyntaxError> {
                let $s = self;
                $parse
            }
            fn show(&self, v: AReg, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let $s = self;
                $show(v, f)
            }
            fn regs(&self, v: AReg) -> u32 {
                let $s = self;
                a_bits(v, $count)
            }
        }
    };
}

/// A single `$a` register.
pub(crate) struct A;
a_kind!(
    A,
    |_s, c, field, v| c.a(field, v),
    |o, i| o.a(i),
    |v, f: &mut fmt::Formatter<'_>| fmt::Display::fmt(&TextA(v), f),
    1,
    1,
);

/// An `$a` register pair `$aN:N+1` (N even).
pub(crate) struct Pair;
a_kind!(
    Pair,
    |_s, c, field, v| c.pair(field, v),
    |o, i| o.pair(i),
    |v, f: &mut fmt::Formatter<'_>| fmt::Display::fmt(&TextP(v), f),
    2,
    2,
);

/// An `$a` register quad `$aN:N+3` (N a multiple of 4).
pub(crate) struct Quad;
a_kind!(
    Quad,
    |_s, c, field, v| c.quad(field, v),
    |o, i| o.quad(i),
    |v, f: &mut fmt::Formatter<'_>| fmt::Display::fmt(&TextQ(v), f),
    4,
    4,
);

/// A pair when the argument holds, else a single register.
pub(crate) struct PairIf(pub bool);
a_kind!(
    PairIf,
    |s, c, field, v| c.a_vec(field, v, s.0),
    |o, i| o.a_vec(i, s.0),
    |v, f: &mut fmt::Formatter<'_>| fmt::Display::fmt(&TextV(v, s.0), f),
    if s.0 { 2 } else { 1 },
    if s.0 { 2 } else { 1 },
);

/// A quad when the argument holds, else a pair.
pub(crate) struct QuadIf(pub bool);
a_kind!(
    QuadIf,
    |s, c, field, v| if s.0 {
        c.quad(field, v)
    } else {
        c.pair(field, v)
    },
    |o, i| if s.0 { o.quad(i) } else { o.pair(i) },
    |v, f: &mut fmt::Formatter<'_>| if s.0 {
        fmt::Display::fmt(&TextQ(v), f)
    } else {
        fmt::Display::fmt(&TextP(v), f)
    },
    if s.0 { 4 } else { 2 },
    if s.0 { 4 } else { 2 },
);

/// The low pair of a quad: stored as a quad, written as a pair (the high pair is
/// a [`QuadHi`] field).
pub(crate) struct QuadLo;
a_kind!(
    QuadLo,
    |_s, c, field, v| c.quad(field, v),
    |o, i| o.pair(i),
    |v, f: &mut fmt::Formatter<'_>| fmt::Display::fmt(&TextP(v), f),
    2,
    4,
);

/// The high pair of the quad whose low pair is the argument: no bits of its own,
/// written as a pair.
pub(crate) struct QuadHi(pub AReg);

impl Kind<AReg> for QuadHi {
    fn decode(_: u32) -> Option<AReg> {
        Some(AReg(0))
    }
    fn encode(&self, c: &Check, field: &'static str, v: AReg, _: Bits) -> Result<u32, EncodeError> {
        if u32::from(v.0) == u32::from(self.0.0) + 2 {
            Ok(0)
        } else {
            Err(c.err(
                field,
                v.0.into(),
                "is not d0 + 2 (the strided form loads a quad)",
            ))
        }
    }
    fn derive(&self, _: AReg) -> AReg {
        AReg(self.0.0.wrapping_add(2))
    }
    fn pick(_: u32, _: Bits) -> AReg {
        AReg(0)
    }
    fn repair(&self, _: AReg) -> AReg {
        self.derive(AReg(0))
    }
}

impl Operand<AReg> for QuadHi {
    fn parse(&self, o: &Ops, i: usize, _: &str, _: Bits) -> Result<AReg, SyntaxError> {
        o.pair(i)
    }
    fn show(&self, v: AReg, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&TextP(v), f)
    }
    fn regs(&self, v: AReg) -> u32 {
        a_bits(v, 2)
    }
}

// ---------------------------------------------------------------------------
// Immediates
// ---------------------------------------------------------------------------

/// An unsigned field type.
pub(crate) trait Unsigned: Copy + fmt::Display {
    fn to_u32(self) -> u32;
    /// Only called with values that fit.
    fn from_u32(v: u32) -> Self;
}

macro_rules! unsigned {
    ($($t:ty),*) => {
        $(impl Unsigned for $t {
            fn to_u32(self) -> u32 {
                u32::from(self)
            }
            fn from_u32(v: u32) -> Self {
                v as $t
            }
        })*
    };
}
unsigned!(u8, u16, u32);

/// An unsigned immediate using all of its bits.
pub(crate) struct Uint;

impl<T: Unsigned> Kind<T> for Uint {
    fn decode(raw: u32) -> Option<T> {
        Some(T::from_u32(raw))
    }
    fn encode(&self, c: &Check, field: &'static str, v: T, bits: Bits) -> Result<u32, EncodeError> {
        c.uint(field, v.to_u32(), bits.width)
    }
    fn pick(seed: u32, bits: Bits) -> T {
        T::from_u32(seed & bits.max())
    }
}

impl<T: Unsigned> Operand<T> for Uint {
    fn parse(&self, o: &Ops, i: usize, what: &str, bits: Bits) -> Result<T, SyntaxError> {
        Ok(T::from_u32(o.int(i, 0, bits.max().into(), what)? as u32))
    }
    fn show(&self, v: T, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{v}")
    }
}

/// An unsigned immediate in `LO..=HI`.
pub(crate) struct Range<const LO: u32, const HI: u32>;

impl<T: Unsigned, const LO: u32, const HI: u32> Kind<T> for Range<LO, HI> {
    fn decode(raw: u32) -> Option<T> {
        Some(T::from_u32(raw))
    }
    fn encode(&self, c: &Check, field: &'static str, v: T, _: Bits) -> Result<u32, EncodeError> {
        c.range(field, v.to_u32(), LO, HI)
    }
    fn pick(seed: u32, _: Bits) -> T {
        T::from_u32(LO + seed % (HI - LO + 1))
    }
}

impl<T: Unsigned, const LO: u32, const HI: u32> Operand<T> for Range<LO, HI> {
    fn parse(&self, o: &Ops, i: usize, what: &str, _: Bits) -> Result<T, SyntaxError> {
        Ok(T::from_u32(o.int(i, LO.into(), HI.into(), what)? as u32))
    }
    fn show(&self, v: T, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{v}")
    }
}

/// A signed 8-bit immediate (two's complement).
pub(crate) struct Signed;

impl Kind<i8> for Signed {
    fn decode(raw: u32) -> Option<i8> {
        Some(raw as u8 as i8)
    }
    fn encode(&self, _: &Check, _: &'static str, v: i8, _: Bits) -> Result<u32, EncodeError> {
        Ok(u32::from(v as u8))
    }
    fn pick(seed: u32, _: Bits) -> i8 {
        seed as u8 as i8
    }
}

impl Operand<i8> for Signed {
    fn parse(&self, o: &Ops, i: usize, what: &str, _: Bits) -> Result<i8, SyntaxError> {
        Ok(o.int(i, i8::MIN.into(), i8::MAX.into(), what)? as i8)
    }
    fn show(&self, v: i8, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{v}")
    }
}

/// A branch target: a 4-byte aligned byte address below 2^20, stored divided by 4.
pub(crate) struct Target;

impl Kind<u32> for Target {
    fn decode(raw: u32) -> Option<u32> {
        Some(raw << 2)
    }
    fn encode(&self, c: &Check, _: &'static str, v: u32, _: Bits) -> Result<u32, EncodeError> {
        c.target(v)
    }
    fn pick(seed: u32, bits: Bits) -> u32 {
        (seed & bits.max()) << 2
    }
}

impl Operand<u32> for Target {
    fn parse(&self, o: &Ops, i: usize, _: &str, _: Bits) -> Result<u32, SyntaxError> {
        o.target(i)
    }
    fn show(&self, v: u32, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{v:#x}")
    }
}

// ---------------------------------------------------------------------------
// Fields written in the mnemonic or implied by it
// ---------------------------------------------------------------------------

/// A sub-operation (`IntOp`, `FBinOp`, `FVec`, `FUnOp`), stored as its index in
/// `ALL`; codes past the end are reserved.
pub(crate) struct Op;

impl<T: SubOp> Kind<T> for Op {
    fn decode(raw: u32) -> Option<T> {
        T::ALL.get(raw as usize).copied()
    }
    fn encode(&self, _: &Check, _: &'static str, v: T, _: Bits) -> Result<u32, EncodeError> {
        Ok(v.code())
    }
    fn pick(seed: u32, _: Bits) -> T {
        T::ALL[seed as usize % T::ALL.len()]
    }
}

/// A one-bit flag.
pub(crate) struct Flag;

impl Kind<bool> for Flag {
    fn decode(raw: u32) -> Option<bool> {
        Some(raw == 1)
    }
    fn encode(&self, _: &Check, _: &'static str, v: bool, _: Bits) -> Result<u32, EncodeError> {
        Ok(u32::from(v))
    }
    fn pick(seed: u32, _: Bits) -> bool {
        seed & 1 == 1
    }
}

//! The types instructions are made of: registers, sub-operations, words and
//! pipes. The [`Inst`] enum itself, the contract between the assembler, the
//! disassembler, the kernel emitters and the simulator, is generated from the
//! instruction table (`table.rs`). Semantics are specified in `docs/isa.md`.

/// An address/integer register `$m0`..`$m15`. `$m15` reads as zero and ignores
/// writes (`$mzero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MReg(pub u8);

/// An arithmetic register `$a0`..`$a15` (32 bits). Pairs (`$a0:1`) hold 64-bit
/// values and start at an even register; quads (`$a0:3`) start at a multiple of 4.
/// `$a15` reads as zero and ignores writes (`$azero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AReg(pub u8);

pub use crate::table::Inst;

impl MReg {
    pub const ZERO: MReg = MReg(15);
}
impl AReg {
    pub const ZERO: AReg = AReg(15);
}

/// Defines a sub-operation enum: its variants in encoding order (the code stored
/// in an instruction is the index in `ALL`), each with the name it has in
/// mnemonics.
macro_rules! operations {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )*
        }

        impl $name {
            /// All values in encoding order (the instruction field indexes this).
            pub const ALL: [$name; { [$(stringify!($variant)),*].len() }] = [$($name::$variant),*];
        }

        impl crate::field::SubOp for $name {
            const ALL: &'static [Self] = &$name::ALL;
            const NAMES: &'static [&'static str] = &[$($text),*];
        }

        impl crate::field::Blank for $name {
            const BLANK: Self = $name::ALL[0];
        }
    };
}

operations! {
    /// Integer ALU operations on `$m` registers.
    pub enum IntOp {
        Add = "add",
        Sub = "sub",
        Mul = "mul",
        And = "and",
        Or = "or",
        Xor = "xor",
        Shl = "shl",
        Shr = "shr",
        /// Arithmetic shift right.
        Sar = "sar",
        /// 1 if equal else 0.
        CmpEq = "cmpeq",
        /// 1 if unsigned less-than else 0.
        CmpUlt = "cmpult",
        /// 1 if signed less-than else 0.
        CmpSlt = "cmpslt",
        Min = "min",
        Max = "max",
    }
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

operations! {
    /// Binary floating-point operations.
    pub enum FBinOp {
        Add = "add",
        Sub = "sub",
        Mul = "mul",
        Max = "max",
        Min = "min",
    }
}

operations! {
    /// Lane format of a floating-point instruction; its name starts the mnemonic.
    pub enum FVec {
        /// One f32 in a single register.
        F32 = "f32",
        /// Two f32 in a register pair.
        F32V2 = "f32v2",
        /// Two f16 in a single register.
        F16V2 = "f16v2",
        /// Four f16 in a register pair.
        F16V4 = "f16v4",
    }
}

impl FVec {
    /// Whether operands of this format occupy a register pair.
    pub fn is_pair(self) -> bool {
        matches!(self, FVec::F32V2 | FVec::F16V4)
    }
}

operations! {
    /// Scalar f32 unary operations.
    pub enum FUnOp {
        Exp = "exp",
        Recip = "recip",
        Rsqrt = "rsqrt",
        Sqrt = "sqrt",
        Neg = "neg",
        Abs = "abs",
        Tanh = "tanh",
    }
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

impl RegUse {
    /// From register bit sets; the always-zero registers are left out.
    pub(crate) fn new(reads: u32, writes: u32, increments: u32) -> RegUse {
        RegUse {
            reads: reads & !ZERO_REGS,
            writes: writes & !ZERO_REGS,
            increments: increments & !ZERO_REGS,
        }
    }
}

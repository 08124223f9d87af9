//! The tile instruction set: instruction types, their binary encoding, the text
//! assembler and the disassembler. It owns the meaning of every bit of an
//! instruction word and the textual syntax. It must never execute instructions
//! (that is the simulator's job); it builds and reads packages only through the
//! package crate's model and format, never by knowing the format's bytes.

#[macro_use]
mod define;
mod field;
mod inst;
pub use inst::*;
mod encode;
mod table;
pub use encode::*;
mod syntax;
pub use syntax::{SyntaxError, parse_word, parse_word_with};
mod asm;
pub use asm::{AsmError, Diagnostic, assemble, assemble_file};
mod disasm;
pub use disasm::{check_filter, disassemble};
#[cfg(feature = "testgen")]
pub mod testgen;

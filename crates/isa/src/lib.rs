//! The tile instruction set: instruction types, their binary encoding, the text
//! assembler and the disassembler. It owns the meaning of every bit of an
//! instruction word and the textual syntax. It must never execute instructions
//! (that is the simulator's job) nor know about packages beyond producing and
//! consuming code bytes and symbols.

mod inst;
pub use inst::*;

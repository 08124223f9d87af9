//! One module per reader. Each target calls the same library entry the command line
//! uses for that input, then what the command line runs next on success, so that a
//! value the reader lets through but a later stage cannot stand is found too.

pub mod asm;
pub mod config;
pub mod machine;
pub mod package;
pub mod place;
pub mod safetensors;
pub mod tree;

/// The name of an enum variant from its `Debug` text (`Truncated { .. }` ->
/// `Truncated`).
pub(crate) fn variant(debug: &str) -> &str {
    let end = debug
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(debug.len());
    &debug[..end]
}

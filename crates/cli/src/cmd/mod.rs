pub mod asm;
pub mod compile;
pub mod fuzz;
pub mod machine;
pub mod place;
pub mod sim;
pub mod validate;

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

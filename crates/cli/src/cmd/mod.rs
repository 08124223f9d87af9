pub mod args;
pub mod asm;
pub mod bench;
pub mod compile;
pub mod fuzz;
pub mod machine;
pub mod place;
pub mod progress;
pub mod report;
pub mod run;
pub mod sim;

/// Prints a value as pretty JSON on stdout.
pub fn print_json<T: serde::Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

//! Owned by the isa/package work: `tessera asm` and `tessera disasm`.
use crate::Outcome;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct AsmArgs {
    /// Assembly source file.
    pub input: PathBuf,
    /// Output package.
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Args)]
pub struct DisasmArgs {
    /// Package file.
    pub input: PathBuf,
    #[arg(long)]
    pub tile: Option<u32>,
    #[arg(long)]
    pub symbol: Option<String>,
}

pub fn run_asm(_a: AsmArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("not implemented yet")
}

pub fn run_disasm(_a: DisasmArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("not implemented yet")
}

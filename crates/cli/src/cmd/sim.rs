//! Owned by the simulator work: `tessera sim` and `tessera bench sim`.
use crate::Outcome;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct SimArgs {
    /// Package file.
    pub input: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchSimArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: SimArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("not implemented yet")
}

pub fn bench(_a: BenchSimArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("not implemented yet")
}

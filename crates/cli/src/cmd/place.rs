//! Owned by the placement work: `tessera place` and `tessera bench place`.
use crate::Outcome;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct PlaceArgs {
    /// A minimalloc-format CSV or a JSON problem.
    pub problem: PathBuf,
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct BenchPlaceArgs {
    #[arg(long)]
    pub json: bool,
}

pub fn run(_a: PlaceArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("not implemented yet")
}

pub fn bench(_a: BenchPlaceArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("not implemented yet")
}

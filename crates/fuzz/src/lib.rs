//! A fuzz runner on stable Rust for every reader of outside input: packages (read,
//! then simulated under a small cycle budget), assembly listings, placement problems
//! in CSV and JSON, machine descriptions, model configurations and safetensors
//! weights. It owns the targets, their checked-in seed corpora (`corpus/<target>/`),
//! the structure-aware generators, the byte mutator and the runner that counts
//! executions and the distinct outcomes reached, catching panics and timing every
//! input. Input `i` of a run is a pure function of `(seed, target, i)`, so a run is
//! reproducible and parallel execution changes nothing but the wall time.
//!
//! It must never weaken a reader to make fuzzing pass, never read or write files
//! named by a fuzzed input (a JSON problem naming a machine file is refused here, not
//! followed), and never hold reader logic of its own: a target only calls the public
//! entry point the command line uses and classifies what comes back.

mod classify;
mod corpus;
pub mod mutate;
mod runner;
pub mod targets;

pub use classify::classify;
pub use runner::{Crash, Outcome, Report, RunOptions, input_for, run_one, run_target};

use rand_chacha::ChaCha8Rng;

/// The generator every target draws from.
pub type Rng = ChaCha8Rng;

/// One seed input checked into `corpus/<target>/`.
#[derive(Debug, Clone, Copy)]
pub struct Seed {
    pub name: &'static str,
    pub bytes: &'static [u8],
}

/// A reader of outside input under fuzzing.
pub trait Target: Sync {
    /// Short name used on the command line and in reports.
    fn name(&self) -> &'static str;
    /// What the target reads and what it runs after a successful read.
    fn about(&self) -> &'static str;
    /// The checked-in seeds: small valid inputs.
    fn corpus(&self) -> &'static [Seed];
    /// A fresh input built from the format's structure, valid or nearly so, so that
    /// the checks behind the first parse are reached.
    fn generate(&self, rng: &mut Rng) -> Vec<u8>;
    /// Repairs what a byte mutation breaks before the interesting checks (the
    /// package checksums); the default leaves the input alone.
    fn fixup(&self, _input: &mut Vec<u8>, _rng: &mut Rng) {}
    /// Runs the reader, and what follows it on success, on one input. `Ok` names
    /// the accepted outcome, `Err` the error text; the runner classifies both.
    /// A broken invariant (a round trip that differs) is a panic.
    fn execute(&self, input: &[u8]) -> Result<String, String>;
}

/// Every target, in report order.
pub fn targets() -> Vec<Box<dyn Target>> {
    vec![
        Box::new(targets::package::PackageTarget),
        Box::new(targets::asm::AsmTarget),
        Box::new(targets::place::CsvTarget),
        Box::new(targets::place::JsonTarget),
        Box::new(targets::machine::MachineTarget),
        Box::new(targets::config::ConfigTarget),
        Box::new(targets::safetensors::SafetensorsTarget),
    ]
}

/// The target called `name`, if any.
pub fn target(name: &str) -> Option<Box<dyn Target>> {
    targets().into_iter().find(|t| t.name() == name)
}

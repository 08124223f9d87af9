//! What the driver tells its caller while it works: which step runs, how far it
//! is, and the figures a long search produces along the way. The driver never
//! draws anything; a command line draws bars from these calls, a test ignores them.

/// A step of the driver's work that can take long enough to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// One compile: lowering, placement, emission.
    Compile,
    /// Several whole-model plans built in parallel (a count of them).
    Finalists,
    /// A package on the simulator (a count of supersteps, total unknown).
    Simulate,
    /// The f32 and f16-storage references.
    Reference,
}

impl Step {
    /// A short description, for a progress line.
    pub fn label(self) -> &'static str {
        match self {
            Step::Compile => "compiling (plan, place, emit)",
            Step::Finalists => "building finalists",
            Step::Simulate => "simulating",
            Step::Reference => "reference",
        }
    }
}

/// Receives the driver's progress. Every method has a default that ignores it.
/// Calls may come from several threads at once.
pub trait Progress: Sync {
    /// `step` starts; `total` is its count of units when known.
    fn start(&self, step: Step, total: Option<u64>) {
        let _ = (step, total);
    }
    /// The running step has done `done` units (of `total`, when known).
    fn advance(&self, done: u64, total: Option<u64>) {
        let _ = (done, total);
    }
    /// The running step has ended.
    fn finish(&self) {}
    /// Finalist `done` of `total` to simulate (its `rank` in the search) ran
    /// for `cycles` of tile work.
    fn finalist_simulated(&self, done: usize, total: usize, rank: usize, cycles: u64) {
        let _ = (done, total, rank, cycles);
    }
}

/// Progress nobody watches.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoProgress;

impl Progress for NoProgress {}

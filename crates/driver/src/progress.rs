//! What the driver tells its caller while it works: which step runs, how far it
//! is, and the figures a long search produces along the way. The driver never
//! draws anything; a command line draws bars from these calls, a test ignores them.

/// A step of the driver's work that can take long enough to report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// One compile: lowering, placement, emission.
    Compile,
    /// The finalist search: the fit loop, then whole-model plans lowered and
    /// built best estimate first (a count of them).
    Finalists,
    /// The selected finalist's later layers' weights filled in (a lowering of
    /// every layer: seconds at 27 So400m layers).
    LayerWeights,
    /// A package on the simulator (a count of supersteps, total unknown).
    Simulate,
    /// The f32 and f16-storage references.
    Reference,
}

impl Step {
    /// A short description, for a progress line.
    pub fn label(self) -> &'static str {
        match self {
            Step::Compile => "compiling",
            Step::Finalists => "searching finalists",
            Step::LayerWeights => "filling in every layer's weights",
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
    /// What the running step is doing now (a compile's stage, the superstep a
    /// simulation has reached).
    fn detail(&self, what: &str) {
        let _ = what;
    }
    /// The running simulation has entered encoder layer `layer` (the `i` of
    /// `layers.<i>.`, [`crate::layer_of`]) of a model with `layers` of them, or
    /// left the layers (`None`: before the first, after the last). Told once per
    /// change, before the [`Progress::detail`] of the superstep it was seen in.
    fn layer(&self, layer: Option<u32>, layers: u32) {
        let _ = (layer, layers);
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

/// Runs `work` with a sender whose messages reach `on_message` on a thread beside
/// it. The compiler's and simulator's hooks must own what they capture, and a
/// [`Progress`] is only borrowed: the hooks send, the thread calls the progress.
/// Returns once `work` has returned and every message has been passed on.
pub(crate) fn forwarded<M: Send, R>(
    on_message: impl Fn(M) + Send,
    work: impl FnOnce(std::sync::mpsc::Sender<M>) -> R,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        // Ends when the last sender, `work`'s, is dropped.
        scope.spawn(move || {
            for m in rx {
                on_message(m);
            }
        });
        work(tx)
    })
}

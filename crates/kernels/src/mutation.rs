//! Deliberate miscompilation, for validation tests: one constant of one kernel kind
//! scaled by a factor. Validation must catch a 1% error in any kernel, and a test
//! asks for one through the compile's options (`Experimental::mutate_kernel`).
//!
//! The kernels read the factor where they build a constant, deep below any
//! options they are given, so the mutation travels with the thread instead: it is
//! set for the duration of [`mutated`], on the calling work and on every thread
//! of a thread pool made for that work alone. Compiles running at the same time
//! in the same process, mutated or not, never see each other's mutation. Never
//! set in normal use: nothing in the compiler asks for one unless its options do.

use std::cell::Cell;
use std::fmt;
use std::str::FromStr;

/// A kernel kind with a constant to mutate, and which constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MutableKernel {
    /// `c1 = sqrt(2/pi)` in the vertex state.
    Gelu,
    /// `1/width` in the vertex state.
    LayerNorm,
    /// The score scale in the vertex state (row and column softmax).
    Softmax,
    /// Every packed weight (what the AMP multiplies by).
    AmpMatmul,
}

impl MutableKernel {
    pub const ALL: [MutableKernel; 4] = [
        MutableKernel::Gelu,
        MutableKernel::LayerNorm,
        MutableKernel::Softmax,
        MutableKernel::AmpMatmul,
    ];

    /// The name the kernels (and a command line) call it by.
    pub fn name(self) -> &'static str {
        match self {
            MutableKernel::Gelu => "gelu",
            MutableKernel::LayerNorm => "layernorm",
            MutableKernel::Softmax => "softmax",
            MutableKernel::AmpMatmul => "amp_matmul",
        }
    }
}

impl fmt::Display for MutableKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no kernel kind of [`MUTABLE`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` has no constant to mutate (one of {list})", list = MUTABLE.join(", "))]
pub struct UnknownMutableKernel(pub String);

impl FromStr for MutableKernel {
    type Err = UnknownMutableKernel;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        MutableKernel::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownMutableKernel(s.to_string()))
    }
}

/// The names of the kernel kinds with a constant to mutate.
pub const MUTABLE: &[&str] = &["gelu", "layernorm", "softmax", "amp_matmul"];

/// One kernel kind's constant scaled by `factor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KernelMutation {
    pub kernel: MutableKernel,
    pub factor: f32,
}

thread_local! {
    static ACTIVE: Cell<Option<KernelMutation>> = const { Cell::new(None) };
}

/// Runs `f` on this thread with `mutation` in force, then restores what was.
fn on_this_thread<R>(mutation: Option<KernelMutation>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<KernelMutation>);
    impl Drop for Restore {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(ACTIVE.with(|a| a.replace(mutation)));
    f()
}

/// Runs `f` with `mutation` in force on every thread that works for it: on a
/// thread pool of its own when the mutation differs from the caller's (so that
/// the parallel parts of a compile see it too), directly otherwise. Fails only
/// when the pool's threads cannot be started.
pub fn mutated<R: Send>(
    mutation: Option<KernelMutation>,
    f: impl FnOnce() -> R + Send,
) -> Result<R, rayon::ThreadPoolBuildError> {
    if ACTIVE.with(Cell::get) == mutation {
        return Ok(f());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .thread_name(|i| format!("tessera-mutated-{i}"))
        .spawn_handler(move |thread| {
            std::thread::Builder::new()
                .name(thread.name().unwrap_or("tessera-mutated").to_string())
                .spawn(move || on_this_thread(mutation, || thread.run()))?;
            Ok(())
        })
        .build()?;
    Ok(pool.install(f))
}

/// The factor applied to `kind`'s constant on this thread: 1 unless mutated.
pub(crate) fn factor(kind: &str) -> f32 {
    match ACTIVE.with(Cell::get) {
        Some(m) if m.kernel.name() == kind => m.factor,
        _ => 1.0,
    }
}

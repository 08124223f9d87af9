//! Deliberate miscompilation, for validation tests: one constant of one kernel kind
//! scaled by a factor, process-wide. Validation must catch a 1% error in any
//! kernel; a test sets a mutation in a fresh `tessera run` process
//! (`--mutate-kernel KIND`) and expects a mismatch. Never set in normal use: the
//! default is no mutation, and nothing in the compiler sets one.

use std::sync::RwLock;

/// The kernel kinds with a constant to mutate, and which constant:
/// - `gelu`: `c1 = sqrt(2/pi)` in the vertex state;
/// - `layernorm`: `1/width` in the vertex state;
/// - `softmax`: the score scale in the vertex state (row and column softmax);
/// - `amp_matmul`: every packed weight (what the AMP multiplies by).
pub const MUTABLE: &[&str] = &["gelu", "layernorm", "softmax", "amp_matmul"];

static MUTATION: RwLock<Option<(String, f32)>> = RwLock::new(None);

/// Scales kernel kind `kind`'s constant by `factor` from now on in this process
/// (`None` restores the true kernels). Returns false for a kind not in
/// [`MUTABLE`].
pub fn set_mutation(mutation: Option<(&str, f32)>) -> bool {
    if let Some((kind, _)) = mutation
        && !MUTABLE.contains(&kind)
    {
        return false;
    }
    let mut m = MUTATION.write().unwrap_or_else(|e| e.into_inner());
    *m = mutation.map(|(k, f)| (k.to_string(), f));
    true
}

/// The factor applied to `kind`'s constant: 1 unless mutated.
pub(crate) fn factor(kind: &str) -> f32 {
    let m = MUTATION.read().unwrap_or_else(|e| e.into_inner());
    match &*m {
        Some((k, f)) if k == kind => *f,
        _ => 1.0,
    }
}

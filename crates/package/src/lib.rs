//! The package: what the compiler hands to the simulator (and to a loader). It owns
//! the in-memory model of a package and its versioned, checksummed binary format,
//! with a validating reader. It must never interpret instructions or depend on the
//! compiler; it knows byte offsets of its own format and nothing of kernels. The
//! reader validates every field: a truncated, corrupted or inconsistent file is
//! rejected with a typed [`PackageError`], never a panic, and no allocation is
//! larger than the input could describe.

mod format;
mod model;
pub use format::*;
pub use model::*;

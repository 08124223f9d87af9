//! Models and images from outside into Tessera, and results back out. It owns
//! reading a Hugging Face SigLIP vision checkpoint (`config.json` and
//! memory-mapped safetensors, one file or shards, a `SiglipVisionModel` or a
//! whole `SiglipModel`) into Tessera's graph configuration ([`encoder_config`])
//! and weights ([`weights`], from any [`TensorSource`]: a [`Checkpoint`], or a
//! `TensorMap` in Hugging Face names, which is how the ONNX importer hands its
//! initializers over); decoding and preprocessing images exactly as
//! transformers' `SiglipImageProcessor` does ([`preprocess`]) and cutting them
//! into the graph's `patches` input ([`patches`]); and writing a run's
//! embeddings to `.npy` or `.safetensors` ([`write_output`]).
//!
//! It must never lower, place or run anything, nor know any machine: it sits
//! before the model graph stage, depends on `tessera-graph` alone among
//! Tessera's crates, and hands over a graph configuration, weights and inputs
//! that are indistinguishable from the built-in models'. Every file it reads
//! comes from a user: it returns an [`ImportError`] naming the file, tensor or
//! field, and never panics (docs/import.md).

mod config;
mod error;
mod image;
mod output;
mod source;
mod weights;

pub use config::{ACCEPTED_ACTIVATIONS, VisionConfig, encoder_config, parse_config};
pub use error::ImportError;
pub use image::{MAX_SIDE, decode_rgb, patches, preprocess, resize_bicubic};
pub use output::write_output;
pub use source::{Checkpoint, TensorSource, VISION_PREFIX};
pub use weights::weights;

//! The model IR: a shaped SSA graph of f16/f32 tensors with the operations the SigLIP
//! vision tower needs, a builder that checks shapes as a model is written, the model
//! definitions (the MLP block and the So400m/14 encoder), and host tensor values
//! (seeded weights and inputs, `.safetensors` I/O).
//!
//! It owns what a model *means*; it must never know how a model runs. No machine,
//! compiler or simulator types appear here and no lowering decision (tiling, layout on
//! tiles, kernel choice) is made here: those crates read this one, never the reverse.
//! Semantics, shape rules, weight names and initialisation are documented in
//! `docs/graph.md`.

mod builder;
mod error;
mod infer;
mod ir;
pub mod models;
mod tensors;
mod text;

pub use builder::{GAMMA_STD, GraphBuilder, SMALL_STD};
pub use error::{GraphError, ShapeMismatch};
pub use ir::{DType, Graph, Init, Op, OpId, OpKind, Output, Shape, TensorId, TensorInfo};
pub use models::{EncoderLayerConfig, MAX_BATCH, MAX_DIM, MAX_ROWS, MlpConfig, encoder_layer, mlp};
pub use tensors::{
    HostTensor, Inputs, Outputs, TensorError, TensorMap, Weights, init_weights, random_inputs,
    round_to_f16,
};

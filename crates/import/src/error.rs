//! What importing can fail with. Every variant names what a user can find: the
//! file, the tensor, the config field, the shapes.

use std::path::PathBuf;

/// Why a checkpoint, a config, an image or an output file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    // The OS error is the source only, so that a printed chain shows it once.
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint directory without the files `save_pretrained` writes.
    #[error("{}: no {what} (a Hugging Face model directory holds config.json and model.safetensors, or model.safetensors.index.json and its shards)", dir.display())]
    NotACheckpoint { dir: PathBuf, what: &'static str },
    /// A config.json that is not JSON, or a field of the wrong type.
    #[error("{origin}: {reason}")]
    ConfigSyntax { origin: String, reason: String },
    /// A config field outside what Tessera's SigLIP vision tower accepts.
    #[error("{origin}: `{field}` = {value}: {reason}")]
    ConfigField {
        origin: String,
        field: &'static str,
        value: String,
        reason: String,
    },
    /// A checkpoint of another architecture.
    #[error(
        "{origin}: model_type `{found}` is not a SigLIP vision tower (siglip_vision_model, or siglip with a vision_config)"
    )]
    Architecture { origin: String, found: String },
    /// A safetensors file whose header or layout is invalid.
    #[error("{}: invalid safetensors file: {reason}", path.display())]
    Safetensors { path: PathBuf, reason: String },
    /// A shard index that is not what `save_pretrained` writes.
    #[error("{}: {reason}", path.display())]
    Index { path: PathBuf, reason: String },
    #[error(
        "tensor `{name}` is missing from {origin} (Tessera's `{param}` is made from it, expected shape {expected:?})"
    )]
    MissingTensor {
        name: String,
        origin: String,
        param: String,
        expected: Vec<usize>,
    },
    #[error(
        "tensor `{name}` in {origin} has shape {found:?}, expected {expected:?} for this config"
    )]
    TensorShape {
        name: String,
        origin: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` in {origin} is {dtype}; F32, F16 and BF16 are accepted")]
    TensorDtype {
        name: String,
        origin: String,
        dtype: String,
    },
    /// Vision tensors no Tessera parameter was made from: a checkpoint of a
    /// variant this importer does not know, which would run without them.
    #[error("{origin}: {} vision tensor(s) Tessera's graph does not use: {}", names.len(), names.join(", "))]
    UnusedTensors { origin: String, names: Vec<String> },
    /// A graph parameter no Hugging Face tensor maps to (an importer bug, or a
    /// graph that is not the SigLIP vision tower).
    #[error("graph parameter `{0}` has no Hugging Face counterpart")]
    UnknownParam(String),
    #[error("{}: cannot decode the image (PNG and JPEG are accepted)", path.display())]
    Image {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    #[error("{}: image of {width}x{height} pixels is empty or larger than accepted ({max} per side)", path.display())]
    ImageSize {
        path: PathBuf,
        width: u32,
        height: u32,
        max: u32,
    },
    #[error("no images given")]
    NoImages,
    #[error("{}: the output is .npy or .safetensors", path.display())]
    OutputExtension { path: PathBuf },
    #[error("output `{name}` has shape {found:?}, expected {expected}")]
    OutputShape {
        name: &'static str,
        expected: &'static str,
        found: Vec<usize>,
    },
    #[error(transparent)]
    Tensor(#[from] tessera_graph::TensorError),
}

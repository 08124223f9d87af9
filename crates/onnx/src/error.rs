use std::path::PathBuf;

/// Why an ONNX file was refused. Every variant names the file, node or tensor.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("cannot read {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not an ONNX model (protobuf does not decode)")]
    Decode {
        path: PathBuf,
        #[source]
        source: prost::DecodeError,
    },
    #[error("{path}: the model has no graph")]
    NoGraph { path: PathBuf },
    #[error(
        "{path}: default-domain opset {version} is out of range (accepted: {min}..={max})",
        min = crate::OPSET_MIN,
        max = crate::OPSET_MAX
    )]
    Opset { path: PathBuf, version: i64 },
    #[error("tensor `{tensor}`: external data file {path} cannot be read")]
    ExternalMissing {
        tensor: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "tensor `{tensor}`: external data location `{location}` is not inside the model's directory"
    )]
    ExternalEscapes { tensor: String, location: String },
    #[error("tensor `{tensor}`: external data entry `{key}` is missing or malformed (`{value}`)")]
    ExternalKey {
        tensor: String,
        key: String,
        value: String,
    },
    #[error(
        "tensor `{tensor}`: external data range {offset}+{length} lies outside {path} ({file_len} bytes)"
    )]
    ExternalRange {
        tensor: String,
        path: PathBuf,
        offset: u64,
        length: u64,
        file_len: u64,
    },
    #[error("tensor `{tensor}`: data type {dtype} is not supported (f32, i64, i32 and bool are)")]
    Dtype { tensor: String, dtype: i32 },
    #[error("tensor `{tensor}`: {reason}")]
    TensorData { tensor: String, reason: String },
    #[error("graph: {reason}")]
    Graph { reason: String },
    #[error("node `{node}` ({op}): {reason}")]
    Node {
        op: String,
        node: String,
        reason: String,
    },
    #[error("{} node(s) cannot be mapped onto the SigLIP vision tower: {}", nodes.len(), list(nodes))]
    Unmapped { nodes: Vec<(String, String)> },
    #[error("the graph is a SigLIP vision tower but {what}")]
    Inconsistent { what: String },
}

fn list(nodes: &[(String, String)]) -> String {
    let shown: Vec<String> = nodes
        .iter()
        .take(20)
        .map(|(op, name)| format!("{op} `{name}`"))
        .collect();
    let more = nodes.len().saturating_sub(shown.len());
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

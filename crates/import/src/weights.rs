//! Tessera's parameters from Hugging Face tensors: names mapped, layouts
//! converted, shapes checked against the config.
//!
//! Tessera's graph (`tessera_graph::models::encoder_layer`) stores a dense layer
//! as `x @ W + b` with `W` `[in, out]`; Hugging Face's Linear computes
//! `x @ W^T + b` with `W` `[out, in]`, so every Linear weight is transposed.
//! The graph scales attention scores by `1/sqrt(head_dim)` as an operation of
//! its own, which the compiler folds into the query projection: the query
//! weights are taken as they are, never pre-scaled here.

use std::collections::BTreeSet;

use tessera_graph::{DType, Graph, HostTensor, Weights};

use crate::{ImportError, TensorSource, VisionConfig};

/// How a Hugging Face tensor becomes a Tessera parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Same values, same shape.
    Same,
    /// A Linear weight `[out, in]` into `[in, out]`.
    Transpose,
    /// The patch Conv's weight `[width, channels, p, p]` into the patch
    /// projection `[p * p * channels, width]`, rows in (row, column, channel)
    /// order as `patchify` lays a patch out.
    Conv,
    /// Part `0..3` (query, key, value) of the head's packed
    /// `attention.in_proj_weight` `[3 width, width]`, transposed.
    InProjWeight(usize),
    /// Part `0..3` of `attention.in_proj_bias` `[3 width]`.
    InProjBias(usize),
}

/// The Hugging Face tensor and layout a graph parameter is made from, or `None`
/// for a name the SigLIP vision tower does not have.
fn source_of(param: &str) -> Option<(String, Layout)> {
    use Layout::*;
    let linear = |hf: &str, leaf: &str| -> Option<(String, Layout)> {
        match leaf {
            "weight" => Some((format!("{hf}.weight"), Transpose)),
            "bias" => Some((format!("{hf}.bias"), Same)),
            _ => None,
        }
    };
    let norm = |hf: &str, leaf: &str| -> Option<(String, Layout)> {
        match leaf {
            "gamma" => Some((format!("{hf}.weight"), Same)),
            "beta" => Some((format!("{hf}.bias"), Same)),
            _ => None,
        }
    };
    let parts: Vec<&str> = param.split('.').collect();
    match parts.as_slice() {
        ["embed", "patch", "weight"] => Some(("embeddings.patch_embedding.weight".into(), Conv)),
        ["embed", "patch", "bias"] => Some(("embeddings.patch_embedding.bias".into(), Same)),
        ["embed", "pos"] => Some(("embeddings.position_embedding.weight".into(), Same)),
        ["layers", i, block, op, leaf] if i.parse::<usize>().is_ok() => {
            let l = format!("encoder.layers.{i}");
            match (*block, *op) {
                ("attn", "ln") => norm(&format!("{l}.layer_norm1"), leaf),
                ("attn", "q" | "k" | "v" | "out") => {
                    linear(&format!("{l}.self_attn.{op}_proj"), leaf)
                }
                ("mlp", "ln") => norm(&format!("{l}.layer_norm2"), leaf),
                ("mlp", "fc1" | "fc2") => linear(&format!("{l}.mlp.{op}"), leaf),
                _ => None,
            }
        }
        ["post_ln", leaf] => norm("post_layernorm", leaf),
        ["head", "probe"] => Some(("head.probe".into(), Same)),
        ["head", "attn", op @ ("q" | "k" | "v"), leaf] => {
            let part = match *op {
                "q" => 0,
                "k" => 1,
                _ => 2,
            };
            match *leaf {
                "weight" => Some(("head.attention.in_proj_weight".into(), InProjWeight(part))),
                "bias" => Some(("head.attention.in_proj_bias".into(), InProjBias(part))),
                _ => None,
            }
        }
        ["head", "attn", "out", leaf] => linear("head.attention.out_proj", leaf),
        ["head", "mlp", "ln", leaf] => norm("head.layernorm", leaf),
        ["head", "mlp", op @ ("fc1" | "fc2"), leaf] => linear(&format!("head.mlp.{op}"), leaf),
        _ => None,
    }
}

/// Tensors a checkpoint may hold that no parameter is made from, without that
/// meaning the checkpoint is of another model: the position ids buffer older
/// transformers saved.
const IGNORED: [&str; 1] = ["embeddings.position_ids"];

/// Every parameter of `graph` (the vision tower `encoder_config(cfg, ..)`
/// builds, possibly with fewer layers) from `source`: Linear weights
/// transposed, the patch Conv reordered to Tessera's patch layout, the head's
/// packed in-projection split into query, key and value, f16 parameters
/// rounded to f16 as `init_weights` rounds them.
///
/// A tensor missing, of another shape than the config implies or of a dtype
/// other than F32, F16 and BF16 is refused, naming it. A vision tensor nothing
/// is made from is refused too (`UnusedTensors`), except the layers past the
/// graph's (a tower cut short) and the position-ids buffer.
pub fn weights(
    cfg: &VisionConfig,
    source: &dyn TensorSource,
    graph: &Graph,
) -> Result<Weights, ImportError> {
    let origin = source.origin();
    let mut out = Weights::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    // The head's in-projection is read once for its three parts.
    let mut cached: Option<(String, HostTensor)> = None;
    let mut layers = 0usize;
    for (param, shape, dtype, _) in graph.param_specs() {
        let (hf, layout) =
            source_of(param).ok_or_else(|| ImportError::UnknownParam(param.to_string()))?;
        if let Some(i) = param
            .strip_prefix("layers.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
        {
            layers = layers.max(i + 1);
        }
        let dims = shape.0.clone();
        let expected: Vec<usize> = match layout {
            Layout::Same => dims.clone(),
            Layout::Transpose => vec![dims[1], dims[0]],
            Layout::Conv => vec![
                cfg.hidden_size,
                cfg.num_channels,
                cfg.patch_size,
                cfg.patch_size,
            ],
            Layout::InProjWeight(_) => vec![3 * dims[1], dims[0]],
            Layout::InProjBias(_) => vec![3 * dims[0]],
        };
        let t = match &cached {
            Some((name, t)) if *name == hf => t.clone(),
            _ => {
                let t = source
                    .tensor(&hf)?
                    .ok_or_else(|| ImportError::MissingTensor {
                        name: hf.clone(),
                        origin: origin.clone(),
                        param: param.to_string(),
                        expected: expected.clone(),
                    })?;
                if t.shape().0 != expected {
                    return Err(ImportError::TensorShape {
                        name: hf.clone(),
                        origin: origin.clone(),
                        expected,
                        found: t.shape().0.clone(),
                    });
                }
                if matches!(layout, Layout::InProjWeight(_) | Layout::InProjBias(_)) {
                    cached = Some((hf.clone(), t.clone()));
                }
                t
            }
        };
        let data = convert(t.data(), &expected, layout);
        let mut value = HostTensor::new(dims, data)?;
        if dtype == DType::F16 {
            value.round_to_f16();
        }
        out.insert(param, value);
        used.insert(hf);
    }

    let unused: Vec<String> = source
        .names()
        .into_iter()
        .filter(|n| !used.contains(n) && !IGNORED.contains(&n.as_str()))
        .filter(|n| {
            // Layers past the graph's: the caller asked for the first ones only.
            let deeper = n
                .strip_prefix("encoder.layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i >= layers);
            !deeper
        })
        .collect();
    if !unused.is_empty() {
        return Err(ImportError::UnusedTensors {
            origin,
            names: unused,
        });
    }
    Ok(out)
}

/// `hf` (of shape `hf_shape`, checked) in Tessera's layout.
fn convert(hf: &[f32], hf_shape: &[usize], layout: Layout) -> Vec<f32> {
    match layout {
        Layout::Same => hf.to_vec(),
        Layout::Transpose => transpose(hf, hf_shape[0], hf_shape[1]),
        Layout::Conv => {
            let (w, c, p) = (hf_shape[0], hf_shape[1], hf_shape[2]);
            let rows = p * p * c;
            let mut out = vec![0.0; rows * w];
            for o in 0..w {
                for ch in 0..c {
                    for r in 0..p {
                        for col in 0..p {
                            let row = (r * p + col) * c + ch;
                            out[row * w + o] = hf[((o * c + ch) * p + r) * p + col];
                        }
                    }
                }
            }
            out
        }
        Layout::InProjWeight(part) => {
            let width = hf_shape[1];
            let rows = &hf[part * width * width..(part + 1) * width * width];
            transpose(rows, width, width)
        }
        Layout::InProjBias(part) => {
            let width = hf_shape[0] / 3;
            hf[part * width..(part + 1) * width].to_vec()
        }
    }
}

/// A row-major `[rows, cols]` matrix as `[cols, rows]`.
fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            out[c * rows + r] = m[r * cols + c];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map() {
        assert_eq!(
            source_of("layers.3.attn.q.weight"),
            Some((
                "encoder.layers.3.self_attn.q_proj.weight".into(),
                Layout::Transpose
            ))
        );
        assert_eq!(
            source_of("layers.0.mlp.ln.gamma"),
            Some(("encoder.layers.0.layer_norm2.weight".into(), Layout::Same))
        );
        assert_eq!(
            source_of("head.attn.v.bias"),
            Some(("head.attention.in_proj_bias".into(), Layout::InProjBias(2)))
        );
        assert_eq!(source_of("layers.x.attn.q.weight"), None);
        assert_eq!(source_of("head.attn.q.gamma"), None);
    }

    #[test]
    fn conv_rows_follow_patch_order() {
        // width 1, 2 channels, patch 2: row (r, c, ch) holds weight[0, ch, r, c].
        let hf: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let out = convert(&hf, &[1, 2, 2, 2], Layout::Conv);
        // (r, c, ch) order: (0,0,0)=0 (0,0,1)=4 (0,1,0)=1 (0,1,1)=5 ...
        assert_eq!(out, vec![0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
    }
}

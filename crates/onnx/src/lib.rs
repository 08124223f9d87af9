//! ONNX import of transformers' `SiglipVisionModel`: reads an `.onnx` file (and
//! its external data files), folds the exporter's shape arithmetic, recognises
//! the vision tower by dataflow and gives back its dimensions and its weights
//! under Hugging Face's names and layouts, as `SiglipVisionModel.state_dict()`
//! holds them (without the `vision_model.` prefix).
//!
//! This crate never lowers anything and knows nothing of machines: it depends on
//! `tessera-graph` for `HostTensor` and `TensorMap`, and on `tessera-import` for
//! the one `VisionConfig` a checkpoint's config and an ONNX file both give. What is accepted and
//! refused, and the patterns matched, are in `docs/onnx.md`.
//!
//! The protobuf is read with prost, from a schema of the few ONNX messages the
//! importer needs (`proto/onnx_subset.proto`, the format's field numbers)
//! compiled at build time by protox: both are maintained, pure-Rust crates, so
//! a build needs no `protoc` binary and no generated code is checked in.

mod canon;
mod error;
mod fold;
mod load;
mod value;

/// The generated protobuf types (for tools and tests that edit a model).
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/onnx.rs"));
}

use std::collections::BTreeSet;
use std::path::Path;

use tessera_graph::{HostTensor, TensorMap};

pub use error::OnnxError;

use canon::{Act, Attn, Canon, Head, Layer, Ln, Source};

/// Default-domain opsets accepted: the two the exporters of the fixtures write.
/// Later opsets change types and attributes of ops the importer folds, which it
/// has not been checked against.
pub const OPSET_MIN: i64 = 17;
pub const OPSET_MAX: i64 = 18;

/// The vision tower's dimensions, as `SiglipVisionConfig` names them: the same
/// type a checkpoint's `config.json` gives (`hidden_act` is
/// `gelu_pytorch_tanh` for the tanh approximation, `gelu` for erf).
pub use tessera_import::VisionConfig;

/// What an ONNX file of the vision tower holds.
#[derive(Clone, Debug)]
pub struct OnnxVision {
    pub dims: VisionConfig,
    /// `Some(n)` when the image input's batch axis is fixed, `None` when dynamic.
    pub batch: Option<usize>,
    /// f32, Hugging Face `SiglipVisionModel` names and layouts, no prefix.
    pub tensors: TensorMap,
    /// The graph's output names, in the graph's order; each is one of the two
    /// below.
    pub outputs: Vec<String>,
    /// The output holding the tokens (`last_hidden_state`), if the graph has it.
    pub tokens_output: Option<String>,
    /// The output holding the pooled embedding (`pooler_output`), if any.
    pub pooled_output: Option<String>,
}

/// Imports the model at `path`; external data files are looked up in its directory.
pub fn import(path: &Path) -> Result<OnnxVision, OnnxError> {
    let bytes = std::fs::read(path).map_err(|source| OnnxError::Io {
        path: path.to_owned(),
        source,
    })?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    import_from(&bytes, dir, path)
}

/// Imports a model held in memory; external data files are looked up in `dir`.
pub fn import_bytes(bytes: &[u8], dir: &Path) -> Result<OnnxVision, OnnxError> {
    import_from(bytes, dir, Path::new("<bytes>"))
}

fn import_from(bytes: &[u8], dir: &Path, path: &Path) -> Result<OnnxVision, OnnxError> {
    let model = load::decode(bytes, path)?;
    load::check_opset(&model, path)?;
    let graph = model.graph.as_ref().ok_or_else(|| OnnxError::NoGraph {
        path: path.to_owned(),
    })?;
    let g = fold::fold(graph, dir)?;
    if !g.unknown.is_empty() {
        return Err(OnnxError::Unmapped {
            nodes: fold::describe(&g.nodes, g.unknown.iter().copied()),
        });
    }
    let batch = g.input_shape[0].usize();
    let mut c = Canon::new(&g, batch);
    let matched = match_tower(&mut c, &g.outputs);
    let used: BTreeSet<usize> = c.used.iter().copied().collect();
    let left: Vec<usize> = (0..g.nodes.len())
        .filter(|n| !used.contains(n) && !g.is_folded(*n))
        .collect();
    let tower = match matched {
        Some(t) if left.is_empty() => t,
        _ if !left.is_empty() => {
            return Err(OnnxError::Unmapped {
                nodes: fold::describe(&g.nodes, left),
            });
        }
        _ => {
            return Err(OnnxError::Graph {
                reason:
                    "the outputs are not the tokens or pooled embedding of a SigLIP vision tower"
                        .into(),
            });
        }
    };
    let mut vision = assemble(&g, tower)?;
    vision.batch = batch;
    Ok(vision)
}

struct Tower {
    embed: canon::Embed,
    layers: Vec<Layer>,
    post: Ln,
    head: Option<Head>,
    tokens_output: Option<String>,
    pooled_output: Option<String>,
    outputs: Vec<String>,
}

/// From the outputs back to the image: head, post-LayerNorm, layers, embeddings.
fn match_tower(c: &mut Canon, outputs: &[String]) -> Option<Tower> {
    let mut head = None;
    let mut pooled_output = None;
    for o in outputs {
        if let Some(h) = c.head(o) {
            head.is_none().then_some(())?;
            pooled_output = Some(o.clone());
            head = Some(h);
        }
    }
    let mut tokens_output = None;
    let mut post = None;
    for o in outputs
        .iter()
        .filter(|o| Some(*o) != pooled_output.as_ref())
    {
        let ln = c.layer_norm(o)?;
        if let Some((_, kv)) = &head {
            (o == kv).then_some(())?;
        }
        post.is_none().then_some(())?;
        tokens_output = Some(o.clone());
        post = Some(ln);
    }
    let post = match (post, &head) {
        (Some(p), _) => p,
        (None, Some((_, kv))) => c.layer_norm(kv)?,
        (None, None) => return None,
    };
    let mut x = post.x.clone();
    let mut layers = Vec::new();
    while let Some(l) = c.layer(&x) {
        x = l.x.clone();
        layers.push(l);
    }
    layers.reverse();
    let embed = c.embeddings(&x)?;
    Some(Tower {
        embed,
        layers,
        post,
        head: head.map(|h| h.0),
        tokens_output,
        pooled_output,
        outputs: outputs.to_vec(),
    })
}

fn inconsistent(what: impl Into<String>) -> OnnxError {
    OnnxError::Inconsistent { what: what.into() }
}

fn put(
    map: &mut TensorMap,
    name: &str,
    shape: Vec<usize>,
    data: Vec<f32>,
) -> Result<(), OnnxError> {
    let t = HostTensor::new(shape, data).map_err(|e| inconsistent(format!("`{name}`: {e}")))?;
    map.insert(name, t);
    Ok(())
}

fn put_ln(map: &mut TensorMap, prefix: &str, ln: &Ln) -> Result<(), OnnxError> {
    put(
        map,
        &format!("{prefix}.weight"),
        vec![ln.gamma.len()],
        ln.gamma.clone(),
    )?;
    put(
        map,
        &format!("{prefix}.bias"),
        vec![ln.beta.len()],
        ln.beta.clone(),
    )
}

fn put_lin(
    map: &mut TensorMap,
    prefix: &str,
    w: &value::Tensor<f32>,
    b: &[f32],
) -> Result<(), OnnxError> {
    put(
        map,
        &format!("{prefix}.weight"),
        w.shape.clone(),
        w.data.clone(),
    )?;
    put(map, &format!("{prefix}.bias"), vec![b.len()], b.to_vec())
}

fn assemble(g: &fold::Folded, t: Tower) -> Result<OnnxVision, OnnxError> {
    let e = &t.embed;
    let width = e.w.shape[0];
    let channels = e.w.shape[1];
    let image = g.input_shape[2].usize().unwrap_or(0);
    if g.input_shape[3].usize() != Some(image) || g.input_shape[1].usize() != Some(channels) {
        return Err(inconsistent(format!(
            "its image input {} is not square or not {channels} channels",
            value::show(&g.input_shape)
        )));
    }
    let Some(first) = t.layers.first() else {
        return Err(inconsistent("it has no encoder layer"));
    };
    let heads = first.attn.heads;
    let ffn = first.mlp.fc1.w.shape[0];
    let act = first.mlp.act;
    let eps = t.post.eps;
    let mut lns: Vec<&Ln> = vec![&t.post];
    for (i, l) in t.layers.iter().enumerate() {
        if l.attn.heads != heads
            || l.mlp.fc1.w.shape[0] != ffn
            || l.mlp.act != act
            || l.attn.o.w.shape[0] != width
        {
            return Err(inconsistent(format!(
                "encoder layer {i} differs from layer 0 in heads, MLP size, width or activation"
            )));
        }
        lns.extend([&l.ln1, &l.ln2]);
    }
    if let Some(h) = &t.head {
        if h.attn.heads != heads || h.mlp.fc1.w.shape[0] != ffn || h.mlp.act != act {
            return Err(inconsistent(
                "the pooling head differs from the encoder in heads, MLP size or activation",
            ));
        }
        lns.push(&h.ln);
    }
    if lns.iter().any(|l| l.eps != eps || l.gamma.len() != width) {
        return Err(inconsistent("its LayerNorms differ in epsilon or width"));
    }

    let mut m = TensorMap::new();
    put(
        &mut m,
        "embeddings.patch_embedding.weight",
        e.w.shape.clone(),
        e.w.data.clone(),
    )?;
    put(
        &mut m,
        "embeddings.patch_embedding.bias",
        vec![width],
        e.b.clone(),
    )?;
    put(
        &mut m,
        "embeddings.position_embedding.weight",
        e.pos.shape.clone(),
        e.pos.data.clone(),
    )?;
    for (i, l) in t.layers.iter().enumerate() {
        let p = format!("encoder.layers.{i}");
        put_ln(&mut m, &format!("{p}.layer_norm1"), &l.ln1)?;
        let a = &l.attn;
        put_lin(&mut m, &format!("{p}.self_attn.q_proj"), &a.q.w, &a.q.b)?;
        put_lin(&mut m, &format!("{p}.self_attn.k_proj"), &a.k.w, &a.k.b)?;
        put_lin(&mut m, &format!("{p}.self_attn.v_proj"), &a.v.w, &a.v.b)?;
        put_lin(&mut m, &format!("{p}.self_attn.out_proj"), &a.o.w, &a.o.b)?;
        put_ln(&mut m, &format!("{p}.layer_norm2"), &l.ln2)?;
        put_lin(&mut m, &format!("{p}.mlp.fc1"), &l.mlp.fc1.w, &l.mlp.fc1.b)?;
        put_lin(&mut m, &format!("{p}.mlp.fc2"), &l.mlp.fc2.w, &l.mlp.fc2.b)?;
    }
    put_ln(&mut m, "post_layernorm", &t.post)?;
    if let Some(h) = &t.head {
        put_head(&mut m, &h.attn, width)?;
        put_ln(&mut m, "head.layernorm", &h.ln)?;
        put_lin(&mut m, "head.mlp.fc1", &h.mlp.fc1.w, &h.mlp.fc1.b)?;
        put_lin(&mut m, "head.mlp.fc2", &h.mlp.fc2.w, &h.mlp.fc2.b)?;
    }
    let dims = VisionConfig {
        hidden_size: width,
        intermediate_size: ffn,
        num_hidden_layers: t.layers.len(),
        num_attention_heads: heads,
        image_size: image,
        patch_size: e.patch,
        num_channels: channels,
        layer_norm_eps: eps,
        hidden_act: match act {
            Act::Tanh => "gelu_pytorch_tanh".into(),
            Act::Erf => "gelu".into(),
        },
        vision_use_head: t.head.is_some(),
    };
    Ok(OnnxVision {
        dims,
        batch: None,
        tensors: m,
        outputs: t.outputs,
        tokens_output: t.tokens_output,
        pooled_output: t.pooled_output,
    })
}

/// `nn.MultiheadAttention` keeps the three input projections packed.
fn put_head(m: &mut TensorMap, a: &Attn, width: usize) -> Result<(), OnnxError> {
    let Source::Probe(probe) = &a.q.src else {
        return Err(inconsistent("the head's query is not a constant probe"));
    };
    put(m, "head.probe", vec![1, 1, width], probe.clone())?;
    let mut w = Vec::with_capacity(3 * width * width);
    let mut b = Vec::with_capacity(3 * width);
    for p in [&a.q, &a.k, &a.v] {
        w.extend_from_slice(&p.w.data);
        b.extend_from_slice(&p.b);
    }
    put(
        m,
        "head.attention.in_proj_weight",
        vec![3 * width, width],
        w,
    )?;
    put(m, "head.attention.in_proj_bias", vec![3 * width], b)?;
    put_lin(m, "head.attention.out_proj", &a.o.w, &a.o.b)
}

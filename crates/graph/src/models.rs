//! Model definitions: the residual MLP block that lowers first, and the SigLIP
//! So400m/14 vision encoder built from the same blocks.
//!
//! Layout: activations between blocks are 2-D `[batch * tokens, width]`, the shape the
//! compiler tiles matmuls over; attention reshapes to `[batch, tokens, width]`
//! internally. Weight matrices are `[in, out]` so every dense layer is `x @ W + b`.

use crate::builder::GraphBuilder;
use crate::error::GraphError;
use crate::ir::{DType, Graph, Init, TensorId};
use serde::{Deserialize, Serialize};

/// The SigLIP So400m/14 at 378 px dimensions.
pub mod so400m {
    pub const IMAGE_SIZE: usize = 378;
    pub const CHANNELS: usize = 3;
    pub const PATCH: usize = 14;
    /// (378 / 14)^2.
    pub const TOKENS: usize = 729;
    pub const WIDTH: usize = 1152;
    pub const HEADS: usize = 16;
    pub const MLP_HIDDEN: usize = 4304;
    pub const LAYERS: usize = 27;
    pub const LAYER_NORM_EPS: f32 = 1e-6;
}

/// The residual MLP block on its own: `y = x + fc2(gelu(fc1(ln(x))))`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MlpConfig {
    pub batch: usize,
    pub tokens: usize,
    pub width: usize,
    pub hidden: usize,
    pub eps: f32,
    /// Storage type of the input, the parameters and every activation.
    pub dtype: DType,
}

impl MlpConfig {
    /// So400m sizes: 729 tokens, 1152 -> 4304 -> 1152, eps 1e-6, f16.
    pub fn so400m(batch: usize) -> Self {
        MlpConfig {
            batch,
            tokens: so400m::TOKENS,
            width: so400m::WIDTH,
            hidden: so400m::MLP_HIDDEN,
            eps: so400m::LAYER_NORM_EPS,
            dtype: DType::F16,
        }
    }

    /// SigLIP B/16 at 224 px: 196 tokens, 768 -> 3072 -> 768.
    pub fn base(batch: usize) -> Self {
        MlpConfig {
            batch,
            tokens: 196,
            width: 768,
            hidden: 3072,
            eps: so400m::LAYER_NORM_EPS,
            dtype: DType::F16,
        }
    }

    /// A small shape with the same structure, for tests and quick runs.
    pub fn tiny(batch: usize) -> Self {
        MlpConfig {
            batch,
            tokens: 16,
            width: 32,
            hidden: 96,
            eps: so400m::LAYER_NORM_EPS,
            dtype: DType::F16,
        }
    }

    /// Rows of the 2-D activation matrix.
    pub fn rows(&self) -> usize {
        self.batch * self.tokens
    }

    fn validate(&self) -> Result<(), GraphError> {
        let dims = [
            ("batch", self.batch),
            ("tokens", self.tokens),
            ("width", self.width),
            ("hidden", self.hidden),
        ];
        check_positive(&dims)?;
        check_product("rows, batch x tokens", &[self.batch, self.tokens])?;
        check_eps(self.eps)
    }
}

impl Default for MlpConfig {
    fn default() -> Self {
        Self::so400m(1)
    }
}

/// The So400m/14 vision tower: patch embedding, `layers` pre-LN transformer layers,
/// the post-LayerNorm and the MAP (attention-pooling) head.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EncoderLayerConfig {
    pub batch: usize,
    pub image_size: usize,
    pub channels: usize,
    pub patch: usize,
    pub width: usize,
    pub heads: usize,
    pub mlp_hidden: usize,
    /// Number of transformer layers (So400m has 27; the default builds 1).
    pub layers: usize,
    pub eps: f32,
    pub dtype: DType,
    /// Build the MAP head and the `pooled` output.
    pub map_head: bool,
    /// Also send the post-LayerNorm tokens to the host as output `tokens`. With the
    /// MAP head the model's result is `pooled` (`[batch, width]`, as the seed's
    /// benchmark returns), and the tokens, 729 times its bytes at So400m, are an
    /// extra the caller asks for; without the head they are the only output and
    /// always go out.
    #[serde(default)]
    pub token_output: bool,
}

impl EncoderLayerConfig {
    /// So400m/14 at 378 px with one transformer layer and the MAP head, f16.
    pub fn so400m(batch: usize) -> Self {
        EncoderLayerConfig {
            batch,
            image_size: so400m::IMAGE_SIZE,
            channels: so400m::CHANNELS,
            patch: so400m::PATCH,
            width: so400m::WIDTH,
            heads: so400m::HEADS,
            mlp_hidden: so400m::MLP_HIDDEN,
            layers: 1,
            eps: so400m::LAYER_NORM_EPS,
            dtype: DType::F16,
            map_head: true,
            token_output: false,
        }
    }

    /// SigLIP B/16 at 224 px: 196 tokens, width 768, 12 heads, MLP 3,072, one layer
    /// and the MAP head, f16.
    pub fn base(batch: usize) -> Self {
        EncoderLayerConfig {
            batch,
            image_size: 224,
            channels: 3,
            patch: 16,
            width: 768,
            heads: 12,
            mlp_hidden: 3072,
            layers: 1,
            eps: so400m::LAYER_NORM_EPS,
            dtype: DType::F16,
            map_head: true,
            token_output: false,
        }
    }

    /// A configuration file: TOML with any of the fields `image_size`, `channels`,
    /// `patch`, `width`, `heads`, `mlp_hidden`, `layers`, `eps`, `token_output`
    /// (the rest as in So400m); the batch comes from the caller. Unknown fields are
    /// refused, and the result is validated; `origin` names the file in errors.
    pub fn from_toml(text: &str, origin: &str, batch: usize) -> Result<Self, GraphError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            image_size: Option<usize>,
            channels: Option<usize>,
            patch: Option<usize>,
            width: Option<usize>,
            heads: Option<usize>,
            mlp_hidden: Option<usize>,
            layers: Option<usize>,
            eps: Option<f32>,
            token_output: Option<bool>,
        }
        let f: File = toml::from_str(text)
            .map_err(|e| GraphError::Config(format!("{origin}: {}", e.to_string().trim_end())))?;
        let d = Self::so400m(batch);
        let cfg = EncoderLayerConfig {
            batch,
            image_size: f.image_size.unwrap_or(d.image_size),
            channels: f.channels.unwrap_or(d.channels),
            patch: f.patch.unwrap_or(d.patch),
            width: f.width.unwrap_or(d.width),
            heads: f.heads.unwrap_or(d.heads),
            mlp_hidden: f.mlp_hidden.unwrap_or(d.mlp_hidden),
            layers: f.layers.unwrap_or(d.layers),
            eps: f.eps.unwrap_or(d.eps),
            dtype: d.dtype,
            map_head: d.map_head,
            token_output: f.token_output.unwrap_or(d.token_output),
        };
        // The file's name goes before the reason, once: a `Config` error already
        // says it is about the model's configuration.
        cfg.validate().map_err(|e| match e {
            GraphError::Config(reason) => GraphError::Config(format!("{origin}: {reason}")),
            e => GraphError::Config(format!("{origin}: {e}")),
        })?;
        Ok(cfg)
    }

    /// 16 tokens (a 16 px image of 4 px patches), width 32, 4 heads, hidden 64.
    pub fn tiny(batch: usize) -> Self {
        EncoderLayerConfig {
            batch,
            image_size: 16,
            channels: 3,
            patch: 4,
            width: 32,
            heads: 4,
            mlp_hidden: 64,
            layers: 1,
            eps: so400m::LAYER_NORM_EPS,
            dtype: DType::F16,
            map_head: true,
            token_output: false,
        }
    }

    /// Patches per image.
    pub fn tokens(&self) -> usize {
        let side = self.image_size / self.patch.max(1);
        side * side
    }

    /// Values per flattened patch, `patch * patch * channels`.
    pub fn patch_dim(&self) -> usize {
        self.patch * self.patch * self.channels
    }

    pub fn head_dim(&self) -> usize {
        self.width / self.heads.max(1)
    }

    /// Checks the dimensions: all positive, the image a whole number of patches,
    /// the width a whole number of heads, `eps` finite and positive.
    pub fn validate(&self) -> Result<(), GraphError> {
        check_positive(&[
            ("batch", self.batch),
            ("layers", self.layers),
            ("image_size", self.image_size),
            ("channels", self.channels),
            ("patch", self.patch),
            ("width", self.width),
            ("heads", self.heads),
            ("mlp_hidden", self.mlp_hidden),
        ])?;
        let side = self.image_size / self.patch;
        check_product("rows, batch x tokens", &[self.batch, side, side])?;
        check_product(
            "values per patch, patch x patch x channels",
            &[self.patch, self.patch, self.channels],
        )?;
        if !self.image_size.is_multiple_of(self.patch) {
            return Err(GraphError::Config(format!(
                "image_size {} is not a multiple of patch {}",
                self.image_size, self.patch
            )));
        }
        if !self.width.is_multiple_of(self.heads) {
            return Err(GraphError::Config(format!(
                "width {} is not divisible into {} heads",
                self.width, self.heads
            )));
        }
        if self.layers > MAX_LAYERS {
            return Err(GraphError::Config(format!(
                "layers {} is more than {MAX_LAYERS}",
                self.layers
            )));
        }
        let side = self.image_size / self.patch;
        let tokens = side.checked_mul(side);
        let (b, c, p, w, h, m) = (
            Some(self.batch),
            Some(self.channels),
            Some(self.patch),
            Some(self.width),
            Some(self.heads),
            Some(self.mlp_hidden),
        );
        // Every tensor the builder shapes is at most one of these, so its element
        // count (and every product on the way) is checked before anything multiplies
        // unchecked.
        let largest = [
            ("the patches", [b, tokens, p, p, c]),
            ("the patch projection", [p, p, c, w, Some(1)]),
            ("the activations", [b, tokens, w, Some(1), Some(1)]),
            ("the MLP activations", [b, tokens, m, Some(1), Some(1)]),
            ("the attention scores", [b, h, tokens, tokens, Some(1)]),
            ("the MLP weights", [w, m, Some(1), Some(1), Some(1)]),
        ];
        for (what, dims) in largest {
            let n = dims
                .iter()
                .try_fold(1usize, |acc, d| d.and_then(|d| acc.checked_mul(d)));
            if n.is_none_or(|n| n > MAX_ELEMENTS) {
                return Err(GraphError::Config(format!(
                    "{what} would hold more than 2^40 elements (batch {}, image_size {}, patch {}, \
                     channels {}, width {}, heads {}, mlp_hidden {})",
                    self.batch,
                    self.image_size,
                    self.patch,
                    self.channels,
                    self.width,
                    self.heads,
                    self.mlp_hidden
                )));
            }
        }
        check_eps(self.eps)
    }
}

/// The most layers a configuration may ask for: So400m has 27. A mistyped count
/// must be refused, not build a graph of millions of operations.
pub const MAX_LAYERS: usize = 1024;

/// The most elements any tensor of a configuration may hold: far beyond any
/// machine's memory, and small enough that shape arithmetic cannot overflow.
pub const MAX_ELEMENTS: usize = 1 << 40;

impl Default for EncoderLayerConfig {
    fn default() -> Self {
        Self::so400m(1)
    }
}

/// The largest batch a model accepts (`docs/limits.md`). Far above anything that
/// fits a chip; it keeps `batch * tokens` and byte counts in range, so that the
/// fit check, not an overflow, answers for large batches.
pub const MAX_BATCH: usize = 1 << 20;
/// The largest model dimension accepted (`image_size`, `channels`, `patch`, `width`,
/// `heads`, `mlp_hidden`, `layers`, and `tokens`/`hidden` of the MLP block).
pub const MAX_DIM: usize = 1 << 20;
/// The most rows (`batch * tokens`) and values per patch a model may have: the
/// planner counts them in `u32`.
pub const MAX_ROWS: usize = u32::MAX as usize;

/// Every dimension in `1..=MAX_DIM` (`batch` in `1..=MAX_BATCH`).
fn check_positive(dims: &[(&str, usize)]) -> Result<(), GraphError> {
    for &(name, v) in dims {
        let max = if name == "batch" { MAX_BATCH } else { MAX_DIM };
        if v == 0 {
            return Err(GraphError::Config(format!("{name} must be > 0")));
        }
        if v > max {
            return Err(GraphError::Config(format!(
                "{name} {v} is above the largest accepted, {max} (docs/limits.md)"
            )));
        }
    }
    Ok(())
}

/// `factors` multiplied without overflow and at most [`MAX_ROWS`].
fn check_product(what: &str, factors: &[usize]) -> Result<(), GraphError> {
    match factors.iter().try_fold(1usize, |a, &f| a.checked_mul(f)) {
        Some(p) if p <= MAX_ROWS => Ok(()),
        _ => Err(GraphError::Config(format!(
            "{what} ({}) is above the largest accepted, {MAX_ROWS} (docs/limits.md)",
            factors
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(" x ")
        ))),
    }
}

fn check_eps(eps: f32) -> Result<(), GraphError> {
    if eps.is_finite() && eps > 0.0 {
        Ok(())
    } else {
        Err(GraphError::Config(format!(
            "eps {eps} must be finite and > 0"
        )))
    }
}

/// The pre-LN residual MLP block in the current scope:
/// `x + fc2(gelu(fc1(ln(x))))`, parameters `ln.{gamma,beta}`, `fc1.{weight,bias}`,
/// `fc2.{weight,bias}`. `x` is `[..., width]`.
pub fn mlp_block(
    b: &mut GraphBuilder,
    x: TensorId,
    hidden: usize,
    eps: f32,
) -> Result<TensorId, GraphError> {
    let width = b.shape(x)?.last();
    let h = b.layer_norm(x, "ln", eps)?;
    let h = b.linear(h, "fc1", hidden)?;
    let h = b.gelu(h)?;
    let h = b.linear(h, "fc2", width)?;
    b.add(x, h)
}

/// Multi-head attention in the current scope: queries from `query` `[Bq, Tq, W]`,
/// keys and values from `context` `[B, T, W]` (Bq is B or 1), parameters
/// `{q,k,v,out}.{weight,bias}`. Returns `[B, Tq, W]`.
pub fn multi_head_attention(
    b: &mut GraphBuilder,
    query: TensorId,
    context: TensorId,
    heads: usize,
) -> Result<TensorId, GraphError> {
    let width = b.shape(context)?.last();
    let head_dim = width / heads.max(1);
    let q = b.linear(query, "q", width)?;
    let k = b.linear(context, "k", width)?;
    let v = b.linear(context, "v", width)?;
    let q = b.split_heads(q, heads)?;
    let k = b.split_heads(k, heads)?;
    let v = b.split_heads(v, heads)?;
    let scores = b.matmul_t(q, k)?;
    let scores = b.scale(scores, 1.0 / (head_dim as f32).sqrt())?;
    let probs = b.softmax(scores)?;
    let ctx = b.matmul(probs, v)?;
    let ctx = b.merge_heads(ctx)?;
    b.linear(ctx, "out", width)
}

/// The pre-LN self-attention block in the current scope on 2-D `x`
/// `[batch * tokens, width]`: `x + attn(ln(x))`, parameters `ln.*` and those of
/// [`multi_head_attention`].
pub fn attention_block(
    b: &mut GraphBuilder,
    x: TensorId,
    batch: usize,
    tokens: usize,
    heads: usize,
    eps: f32,
) -> Result<TensorId, GraphError> {
    let width = b.shape(x)?.last();
    let h = b.layer_norm(x, "ln", eps)?;
    let h = b.reshape(h, [batch, tokens, width])?;
    let h = multi_head_attention(b, h, h, heads)?;
    let h = b.reshape(h, [batch * tokens, width])?;
    b.add(x, h)
}

/// The MLP block as a graph. Input `x` and output `y` are `[batch * tokens, width]`;
/// parameters are `mlp.ln.gamma`, `mlp.ln.beta` `[width]`, `mlp.fc1.weight`
/// `[width, hidden]`, `mlp.fc1.bias` `[hidden]`, `mlp.fc2.weight` `[hidden, width]`,
/// `mlp.fc2.bias` `[width]`.
pub fn mlp(cfg: &MlpConfig) -> Result<Graph, GraphError> {
    cfg.validate()?;
    let mut b = GraphBuilder::new();
    let x = b.input("x", [cfg.rows(), cfg.width], cfg.dtype)?;
    let y = b.with_scope("mlp", |b| mlp_block(b, x, cfg.hidden, cfg.eps))?;
    b.output("y", y)?;
    b.finish()
}

/// The vision encoder as a graph.
///
/// Input `patches` is `[batch * tokens, patch * patch * channels]`: each row one
/// patch, rows in raster order of patches per image, values in (row, column, channel)
/// order inside a patch (see [`patchify`]). Outputs: with `map_head`, `pooled`
/// `[batch, width]`; `tokens` `[batch * tokens, width]` after the post-LayerNorm
/// when `token_output` asks for them or there is no head.
pub fn encoder_layer(cfg: &EncoderLayerConfig) -> Result<Graph, GraphError> {
    cfg.validate()?;
    let (batch, tokens, width) = (cfg.batch, cfg.tokens(), cfg.width);
    let mut b = GraphBuilder::new();
    let patches = b.input("patches", [batch * tokens, cfg.patch_dim()], cfg.dtype)?;

    let mut x = b.with_scope("embed", |b| {
        let e = b.linear(patches, "patch", width)?;
        let pos = b.parameter(
            "pos",
            [tokens, width],
            cfg.dtype,
            Init::Normal {
                mean: 0.0,
                std: crate::builder::SMALL_STD,
            },
        )?;
        let e = b.reshape(e, [batch, tokens, width])?;
        let e = b.add(e, pos)?;
        b.reshape(e, [batch * tokens, width])
    })?;

    for layer in 0..cfg.layers {
        x = b.with_scope(&format!("layers.{layer}"), |b| {
            let x = b.with_scope("attn", |b| {
                attention_block(b, x, batch, tokens, cfg.heads, cfg.eps)
            })?;
            b.with_scope("mlp", |b| mlp_block(b, x, cfg.mlp_hidden, cfg.eps))
        })?;
    }
    let x = b.layer_norm(x, "post_ln", cfg.eps)?;
    if cfg.token_output || !cfg.map_head {
        b.output("tokens", x)?;
    }

    if cfg.map_head {
        let pooled = b.with_scope("head", |b| {
            // One learned query shared by every image; the batched matmul
            // broadcasts it against each image's keys.
            let probe = b.parameter(
                "probe",
                [1, 1, width],
                cfg.dtype,
                Init::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
            )?;
            let ctx = b.reshape(x, [batch, tokens, width])?;
            let h = b.with_scope("attn", |b| multi_head_attention(b, probe, ctx, cfg.heads))?;
            let h = b.reshape(h, [batch, width])?;
            b.with_scope("mlp", |b| mlp_block(b, h, cfg.mlp_hidden, cfg.eps))
        })?;
        b.output("pooled", pooled)?;
    }
    b.finish()
}

/// Cuts images `[batch, height, width, channels]` (row-major, channels last) into the
/// `patches` input layout of [`encoder_layer`]. `None` when the data length or the
/// patch size does not fit the dimensions.
pub fn patchify(
    images: &[f32],
    batch: usize,
    side: usize,
    channels: usize,
    patch: usize,
) -> Option<Vec<f32>> {
    if patch == 0 || !side.is_multiple_of(patch) || images.len() != batch * side * side * channels {
        return None;
    }
    let per_side = side / patch;
    let mut out = Vec::with_capacity(images.len());
    for img in 0..batch {
        for py in 0..per_side {
            for px in 0..per_side {
                for r in 0..patch {
                    let row = py * patch + r;
                    let start = ((img * side + row) * side + px * patch) * channels;
                    out.extend_from_slice(&images[start..start + patch * channels]);
                }
            }
        }
    }
    Some(out)
}

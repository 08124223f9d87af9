//! A Hugging Face SigLIP vision config (`config.json`) and its mapping onto
//! Tessera's [`EncoderLayerConfig`].

use serde_json::{Map, Value};
use tessera_graph::models::MAX_LAYERS;
use tessera_graph::{DType, EncoderLayerConfig, MAX_DIM};

use crate::ImportError;

/// The fields of transformers' `SiglipVisionConfig` that shape the vision tower.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub image_size: usize,
    pub patch_size: usize,
    pub num_channels: usize,
    pub layer_norm_eps: f32,
    pub hidden_act: String,
    /// The attention-pooling head and its `pooler_output`.
    pub vision_use_head: bool,
}

impl Default for VisionConfig {
    /// transformers' `SiglipVisionConfig()` defaults (SigLIP B/16 at 224 px):
    /// what a field absent from `config.json` means.
    fn default() -> Self {
        VisionConfig {
            hidden_size: 768,
            intermediate_size: 3072,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            image_size: 224,
            patch_size: 16,
            num_channels: 3,
            layer_norm_eps: 1e-6,
            hidden_act: "gelu_pytorch_tanh".to_string(),
            vision_use_head: true,
        }
    }
}

/// The `hidden_act` values Tessera's GELU (the tanh form,
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`) computes: transformers'
/// `gelu_pytorch_tanh` and `gelu_new` are that formula, and `gelu_fast` is the
/// same with `sqrt(2/pi)` written to ten digits (equal in f32). The exact
/// (erf) `gelu` and the other activations differ from it and are refused.
pub const ACCEPTED_ACTIVATIONS: [&str; 3] = ["gelu_pytorch_tanh", "gelu_new", "gelu_fast"];

impl VisionConfig {
    /// Patches per image side.
    pub fn side(&self) -> usize {
        self.image_size / self.patch_size.max(1)
    }

    /// Patches (tokens) per image.
    pub fn tokens(&self) -> usize {
        self.side() * self.side()
    }

    /// Refuses a field Tessera cannot build, naming it; `origin` names the file.
    pub fn validate(&self, origin: &str) -> Result<(), ImportError> {
        let field = |field: &'static str, value: String, reason: String| ImportError::ConfigField {
            origin: origin.to_string(),
            field,
            value,
            reason,
        };
        let sizes = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("image_size", self.image_size),
            ("patch_size", self.patch_size),
            ("num_channels", self.num_channels),
        ];
        for (name, v) in sizes {
            if v == 0 {
                return Err(field(name, v.to_string(), "must be at least 1".into()));
            }
            let max = if name == "num_hidden_layers" {
                MAX_LAYERS
            } else {
                MAX_DIM
            };
            if v > max {
                return Err(field(
                    name,
                    v.to_string(),
                    format!("above the largest accepted, {max} (docs/limits.md)"),
                ));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(field(
                "hidden_size",
                self.hidden_size.to_string(),
                format!(
                    "not divisible into num_attention_heads = {} heads",
                    self.num_attention_heads
                ),
            ));
        }
        // transformers' patch Conv (stride = patch) drops the pixels past the
        // last whole patch: google/siglip-so400m-patch14-384 sees 27 x 27
        // patches, 378 of its 384 pixels a side. Only an image smaller than one
        // patch has none.
        if self.image_size < self.patch_size {
            return Err(field(
                "image_size",
                self.image_size.to_string(),
                format!("smaller than one patch of patch_size = {}", self.patch_size),
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps > 0.0) {
            return Err(field(
                "layer_norm_eps",
                self.layer_norm_eps.to_string(),
                "must be finite and above 0".into(),
            ));
        }
        if !ACCEPTED_ACTIVATIONS.contains(&self.hidden_act.as_str()) {
            return Err(field(
                "hidden_act",
                format!("\"{}\"", self.hidden_act),
                format!(
                    "Tessera's GELU is the tanh form: {} are accepted",
                    ACCEPTED_ACTIVATIONS.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// Reads a `config.json`: a `SiglipVisionModel`'s (the fields at the top) or a
/// whole `SiglipModel`'s (the fields inside `vision_config`; the text tower is
/// ignored). Absent fields take transformers' defaults; the result is validated.
/// `origin` names the file in errors.
pub fn parse_config(text: &str, origin: &str) -> Result<VisionConfig, ImportError> {
    let syntax = |reason: String| ImportError::ConfigSyntax {
        origin: origin.to_string(),
        reason,
    };
    let root: Value = serde_json::from_str(text).map_err(|e| syntax(e.to_string()))?;
    let Value::Object(root) = root else {
        return Err(syntax("not a JSON object".into()));
    };
    let model_type = |obj: &Map<String, Value>| match obj.get("model_type") {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(syntax(format!("`model_type` is {v}, not a string"))),
    };
    let architecture = |found: String| ImportError::Architecture {
        origin: origin.to_string(),
        found,
    };
    let empty = Map::new();
    let vision = match model_type(&root)?.as_deref() {
        Some("siglip") => match root.get("vision_config") {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(v)) => v,
            Some(v) => return Err(syntax(format!("`vision_config` is {v}, not an object"))),
        },
        Some("siglip_vision_model") => &root,
        Some(other) => return Err(architecture(other.to_string())),
        // Without a model type, the nesting says which it is.
        None => match root.get("vision_config") {
            Some(Value::Object(v)) => v,
            _ => &root,
        },
    };
    if let Some(t) = model_type(vision)?
        && t != "siglip_vision_model"
    {
        return Err(architecture(t));
    }

    let d = VisionConfig::default();
    let size = |name: &'static str, default: usize| -> Result<usize, ImportError> {
        match vision.get(name) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| ImportError::ConfigField {
                    origin: origin.to_string(),
                    field: name,
                    value: v.to_string(),
                    reason: "must be a whole number".into(),
                }),
        }
    };
    let eps = match vision.get("layer_norm_eps") {
        None | Some(Value::Null) => d.layer_norm_eps,
        Some(v) => v.as_f64().ok_or_else(|| ImportError::ConfigField {
            origin: origin.to_string(),
            field: "layer_norm_eps",
            value: v.to_string(),
            reason: "must be a number".into(),
        })? as f32,
    };
    let hidden_act = match vision.get("hidden_act") {
        None | Some(Value::Null) => d.hidden_act.clone(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return Err(ImportError::ConfigField {
                origin: origin.to_string(),
                field: "hidden_act",
                value: v.to_string(),
                reason: "must be a string".into(),
            });
        }
    };
    let vision_use_head = match vision.get("vision_use_head") {
        None | Some(Value::Null) => d.vision_use_head,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(ImportError::ConfigField {
                origin: origin.to_string(),
                field: "vision_use_head",
                value: v.to_string(),
                reason: "must be true or false".into(),
            });
        }
    };
    let cfg = VisionConfig {
        hidden_size: size("hidden_size", d.hidden_size)?,
        intermediate_size: size("intermediate_size", d.intermediate_size)?,
        num_hidden_layers: size("num_hidden_layers", d.num_hidden_layers)?,
        num_attention_heads: size("num_attention_heads", d.num_attention_heads)?,
        image_size: size("image_size", d.image_size)?,
        patch_size: size("patch_size", d.patch_size)?,
        num_channels: size("num_channels", d.num_channels)?,
        layer_norm_eps: eps,
        hidden_act,
        vision_use_head,
    };
    cfg.validate(origin)?;
    Ok(cfg)
}

/// Tessera's vision tower for `cfg` at `batch` images, its image the whole
/// patches of `cfg`'s (`patches` cuts the rest off, as the Conv does): every encoder layer of
/// the config, f16, the attention-pooling head when `vision_use_head`, no token
/// output (the caller sets `token_output` and may cut `layers`). The graph
/// builder validates it again.
pub fn encoder_config(cfg: &VisionConfig, batch: usize) -> EncoderLayerConfig {
    EncoderLayerConfig {
        batch,
        image_size: cfg.side() * cfg.patch_size,
        channels: cfg.num_channels,
        patch: cfg.patch_size,
        width: cfg.hidden_size,
        heads: cfg.num_attention_heads,
        mlp_hidden: cfg.intermediate_size,
        layers: cfg.num_hidden_layers,
        eps: cfg.layer_norm_eps,
        dtype: DType::F16,
        map_head: cfg.vision_use_head,
        token_output: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_model_reads_vision_config_and_ignores_text() {
        let text = r#"{"model_type": "siglip", "text_config": {"hidden_size": 32, "hidden_act": "relu"},
            "vision_config": {"hidden_size": 64, "num_attention_heads": 4, "image_size": 32, "patch_size": 8}}"#;
        let c = parse_config(text, "config.json").unwrap();
        assert_eq!(c.hidden_size, 64);
        assert_eq!(c.intermediate_size, 3072); // transformers' default
        assert_eq!(c.tokens(), 16);
    }

    #[test]
    fn pixels_past_the_last_patch_are_dropped() {
        let c = parse_config(r#"{"image_size": 384, "patch_size": 14}"#, "c").unwrap();
        assert_eq!(c.tokens(), 729);
        assert_eq!(encoder_config(&c, 1).image_size, 378);
    }

    #[test]
    fn defaults_are_transformers() {
        let c = parse_config("{}", "c").unwrap();
        assert_eq!(c, VisionConfig::default());
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (r#"{"hidden_act": "gelu"}"#, "hidden_act"),
            (r#"{"hidden_size": 0}"#, "hidden_size"),
            (
                r#"{"hidden_size": 100, "num_attention_heads": 3}"#,
                "hidden_size",
            ),
            (r#"{"image_size": 8}"#, "image_size"),
            (r#"{"patch_size": -1}"#, "patch_size"),
            (r#"{"layer_norm_eps": 0}"#, "layer_norm_eps"),
            (r#"{"num_hidden_layers": 100000}"#, "num_hidden_layers"),
            (r#"{"vision_use_head": "yes"}"#, "vision_use_head"),
        ];
        for (text, field) in cases {
            let e = parse_config(text, "c").unwrap_err();
            assert!(
                matches!(&e, ImportError::ConfigField { field: f, .. } if *f == field),
                "{text}: {e}"
            );
            assert!(e.to_string().contains(field), "{e}");
        }
        let e = parse_config(r#"{"model_type": "clip_vision_model"}"#, "c").unwrap_err();
        assert!(e.to_string().contains("clip_vision_model"), "{e}");
        assert!(parse_config("[1]", "c").is_err());
        assert!(parse_config("{", "c").is_err());
    }
}

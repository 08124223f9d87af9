//! The built-in models as a user names them, and a model ready to compile: its
//! graph, weights and inputs.

use std::path::PathBuf;

use tessera_graph::{
    EncoderLayerConfig, Graph, Inputs, MlpConfig, Weights, encoder_layer, init_weights, mlp,
    random_inputs,
};
use tessera_machine::Machine;

use crate::Error;

/// The built-in dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// So400m/14 at 378 px (729 tokens, width 1152, 16 heads, MLP 4304).
    So400m,
    /// SigLIP B/16 at 224 px (196 tokens, width 768, 12 heads, MLP 3072).
    Base,
    /// 16 tokens, width 32, 4 heads, MLP 64 (the MLP block alone: hidden 96).
    Tiny,
}

impl Size {
    /// The name a report gives it.
    pub fn label(self) -> &'static str {
        match self {
            Size::So400m => "So400m",
            Size::Base => "base",
            Size::Tiny => "tiny",
        }
    }
}

/// Where a layer's dimensions come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayerDims {
    Preset(Size),
    /// A TOML file of `EncoderLayerConfig` fields (the rest as So400m).
    File(PathBuf),
}

/// Which model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// The MLP block alone: LayerNorm, fc1, GELU, fc2, residual.
    Mlp(Size),
    /// The vision tower: patch projection, encoder layers, post-LayerNorm and the
    /// attention-pooling head. `tokens` also sends the post-LayerNorm tokens to
    /// the host as an output; `layers`, when given, is the number of encoder
    /// layers, in place of the dimensions' own (`layers` of a config file, one
    /// for the presets).
    Layer {
        dims: LayerDims,
        tokens: bool,
        layers: Option<usize>,
    },
}

/// A built-in model at a batch size, with the seed of its weights (its inputs use
/// the next seed, wrapping).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    pub kind: ModelKind,
    pub batch: usize,
    pub seed: u64,
}

impl ModelSpec {
    /// The tiny vision tower with one encoder layer, seed 1: the quick check.
    pub fn tiny_layer(batch: usize) -> ModelSpec {
        ModelSpec {
            kind: ModelKind::Layer {
                dims: LayerDims::Preset(Size::Tiny),
                tokens: false,
                layers: None,
            },
            batch,
            seed: 1,
        }
    }

    /// What a report calls the model, and its dimensions.
    pub fn title(&self) -> (String, String) {
        let tower = |layers: &Option<usize>| match layers {
            Some(n) if *n != 1 => format!("vision tower with {n} encoder layers"),
            _ => "vision tower with one encoder layer".to_string(),
        };
        match &self.kind {
            ModelKind::Mlp(size) => ("MLP block".to_string(), size.label().to_string()),
            ModelKind::Layer {
                dims: LayerDims::File(p),
                layers,
                ..
            } => (
                match layers {
                    Some(_) => format!("{} (config file)", tower(layers)),
                    None => "encoder layer (config file)".to_string(),
                },
                p.display().to_string(),
            ),
            ModelKind::Layer {
                dims: LayerDims::Preset(size),
                layers,
                ..
            } => (tower(layers), size.label().to_string()),
        }
    }

    /// The model's graph, without weights.
    pub fn graph(&self) -> Result<Graph, Error> {
        if self.batch == 0 {
            return Err(Error::ZeroBatch);
        }
        let batch = self.batch;
        Ok(match &self.kind {
            ModelKind::Mlp(size) => mlp(&match size {
                Size::So400m => MlpConfig::so400m(batch),
                Size::Base => MlpConfig::base(batch),
                Size::Tiny => MlpConfig::tiny(batch),
            })?,
            ModelKind::Layer {
                dims,
                tokens,
                layers,
            } => {
                let mut cfg = match dims {
                    LayerDims::File(path) => {
                        let text =
                            std::fs::read_to_string(path).map_err(|source| Error::ReadConfig {
                                path: path.clone(),
                                source,
                            })?;
                        EncoderLayerConfig::from_toml(&text, &path.display().to_string(), batch)?
                    }
                    LayerDims::Preset(Size::So400m) => EncoderLayerConfig::so400m(batch),
                    LayerDims::Preset(Size::Base) => EncoderLayerConfig::base(batch),
                    LayerDims::Preset(Size::Tiny) => EncoderLayerConfig::tiny(batch),
                };
                cfg.token_output |= *tokens;
                if let Some(n) = *layers {
                    if n == 0 {
                        return Err(Error::ZeroLayers);
                    }
                    cfg.layers = n;
                }
                encoder_layer(&cfg)?
            }
        })
    }
}

/// A model ready to compile and run: its graph, weights and inputs.
#[derive(Debug, Clone)]
pub struct Model {
    pub graph: Graph,
    pub weights: Weights,
    pub inputs: Inputs,
}

impl Model {
    /// Builds `spec` for `machine`: a model that cannot fit the machine is refused
    /// before its weights are generated (gigabytes at large batches).
    pub fn build(spec: &ModelSpec, machine: &Machine) -> Result<Model, Error> {
        let graph = spec.graph()?;
        tessera_plan::precheck(machine, &graph)?;
        let weights = init_weights(&graph, spec.seed);
        // Any u64 is a seed: the largest one wraps rather than overflowing.
        let inputs = random_inputs(&graph, spec.seed.wrapping_add(1));
        Ok(Model {
            graph,
            weights,
            inputs,
        })
    }
}

//! The built-in models as a user names them, and a model ready to compile: its
//! graph, weights and inputs.

use std::path::PathBuf;

use tessera_graph::{
    EncoderLayerConfig, Graph, HostTensor, Inputs, MlpConfig, Weights, encoder_layer, init_weights,
    mlp, random_inputs,
};
use tessera_import::{Checkpoint, TensorSource, VisionConfig};
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
    /// The vision tower of a Hugging Face SigLIP checkpoint directory
    /// (`tessera_import::Checkpoint`): dimensions from its `config.json`,
    /// weights from its safetensors. `layers` keeps the first N encoder layers
    /// (at most the checkpoint's); `images` are the inputs, one a batch entry,
    /// preprocessed as transformers does (seeded random inputs when empty).
    HuggingFace {
        dir: PathBuf,
        tokens: bool,
        layers: Option<usize>,
        images: Vec<PathBuf>,
    },
    /// The vision tower of an ONNX file as `torch.onnx.export` writes it from
    /// transformers' `SiglipVisionModel` (`tessera_onnx`: shape arithmetic
    /// folded, the rest canonicalised into the tower's dimensions and its
    /// tensors in Hugging Face names), then built as a checkpoint is. A batch
    /// the file fixes must be the spec's.
    Onnx {
        file: PathBuf,
        tokens: bool,
        layers: Option<usize>,
        images: Vec<PathBuf>,
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
            ModelKind::HuggingFace { dir, layers, .. } => (
                match layers {
                    Some(n) => format!("Hugging Face vision tower, first {n} encoder layers"),
                    None => "Hugging Face vision tower".to_string(),
                },
                dir.display().to_string(),
            ),
            ModelKind::Onnx { file, layers, .. } => (
                match layers {
                    Some(n) => format!("ONNX vision tower, first {n} encoder layers"),
                    None => "ONNX vision tower".to_string(),
                },
                file.display().to_string(),
            ),
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
            ModelKind::HuggingFace {
                dir,
                tokens,
                layers,
                images,
            } => {
                check_image_batch(images, batch)?;
                let path = dir.join("config.json");
                let text = std::fs::read_to_string(&path).map_err(|source| Error::ReadConfig {
                    path: path.clone(),
                    source,
                })?;
                let cfg = tessera_import::parse_config(&text, &path.display().to_string())?;
                imported_graph(&cfg, batch, *tokens, *layers)?
            }
            ModelKind::Onnx {
                file,
                tokens,
                layers,
                images,
            } => {
                check_image_batch(images, batch)?;
                let onnx = read_onnx(file, batch)?;
                imported_graph(&onnx.dims, batch, *tokens, *layers)?
            }
        })
    }
}

/// The ONNX file's tower, refused when the file fixes a batch other than
/// `batch`.
fn read_onnx(file: &std::path::Path, batch: usize) -> Result<tessera_onnx::OnnxVision, Error> {
    let onnx = tessera_onnx::import(file)?;
    match onnx.batch {
        Some(fixed) if fixed != batch => Err(Error::OnnxBatch {
            file: file.to_path_buf(),
            fixed,
            batch,
        }),
        _ => Ok(onnx),
    }
}

/// The batch an ONNX file fixes, if it fixes one: what a caller with no
/// images and no batch of its own runs it at.
pub fn onnx_fixed_batch(file: &std::path::Path) -> Result<Option<usize>, Error> {
    Ok(tessera_onnx::import(file)?.batch)
}

/// Images, when given, are the batch.
fn check_image_batch(images: &[PathBuf], batch: usize) -> Result<(), Error> {
    if !images.is_empty() && images.len() != batch {
        return Err(Error::ImageBatch {
            images: images.len(),
            batch,
        });
    }
    Ok(())
}

/// The vision tower `cfg` describes at `batch`, with the token output if asked
/// and the first `layers` encoder layers (at most the config's).
fn imported_graph(
    cfg: &VisionConfig,
    batch: usize,
    tokens: bool,
    layers: Option<usize>,
) -> Result<Graph, Error> {
    let mut ecfg = tessera_import::encoder_config(cfg, batch);
    ecfg.token_output |= tokens;
    if let Some(n) = layers {
        if n == 0 {
            return Err(Error::ZeroLayers);
        }
        if n > cfg.num_hidden_layers {
            return Err(Error::CheckpointLayers {
                asked: n,
                has: cfg.num_hidden_layers,
            });
        }
        ecfg.layers = n;
    }
    Ok(encoder_layer(&ecfg)?)
}

/// A vision tower from tensors in Hugging Face names and layouts: what
/// [`Model::import`] builds. The `--weights` path fills it from a
/// [`Checkpoint`]; the ONNX importer from its initializers (a `TensorMap`,
/// which is a [`TensorSource`]) and the dimensions it read.
pub struct Import<'a> {
    pub config: &'a VisionConfig,
    pub source: &'a dyn TensorSource,
    /// Input images, one a batch entry; empty for seeded random inputs.
    pub images: &'a [PathBuf],
    /// The batch: the number of images when there are any.
    pub batch: usize,
    /// Also output the post-LayerNorm tokens.
    pub tokens: bool,
    /// Keep only the first N encoder layers (at most the config's).
    pub layers: Option<usize>,
    /// Seed of the random inputs when there are no images.
    pub seed: u64,
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
        // An imported model's batch and images are checked before its files are
        // read (a So400m checkpoint is gigabytes).
        let checked = |images: &[PathBuf]| {
            if spec.batch == 0 {
                return Err(Error::ZeroBatch);
            }
            check_image_batch(images, spec.batch)
        };
        let import = |config, source, tokens, layers, images| Import {
            config,
            source,
            images,
            batch: spec.batch,
            tokens,
            layers,
            seed: spec.seed,
        };
        match &spec.kind {
            ModelKind::HuggingFace {
                dir,
                tokens,
                layers,
                images,
            } => {
                checked(images)?;
                let ckpt = Checkpoint::open(dir)?;
                let i = import(ckpt.config(), &ckpt, *tokens, *layers, images);
                return Model::import(&i, machine);
            }
            ModelKind::Onnx {
                file,
                tokens,
                layers,
                images,
            } => {
                checked(images)?;
                let onnx = read_onnx(file, spec.batch)?;
                let i = import(&onnx.dims, &onnx.tensors, *tokens, *layers, images);
                return Model::import(&i, machine);
            }
            ModelKind::Mlp(_) | ModelKind::Layer { .. } => {}
        }
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

    /// A vision tower from Hugging Face tensors (`import`'s fields): the graph
    /// from the config, refused before any weight is converted when it cannot
    /// fit `machine`; every parameter from the source (`tessera_import::weights`:
    /// a missing or misshapen tensor is refused by name); the input from the
    /// images as `SiglipImageProcessor` prepares them, or seeded random values.
    /// Weights are f16 as the built-in models' are; a compile with FP8 weights
    /// rounds them further as it does for those.
    pub fn import(import: &Import<'_>, machine: &Machine) -> Result<Model, Error> {
        if import.batch == 0 {
            return Err(Error::ZeroBatch);
        }
        check_image_batch(import.images, import.batch)?;
        let cfg = import.config;
        cfg.validate("the model's config")?;
        let graph = imported_graph(cfg, import.batch, import.tokens, import.layers)?;
        tessera_plan::precheck(machine, &graph)?;
        let weights = tessera_import::weights(cfg, import.source, &graph)?;
        let inputs = if import.images.is_empty() {
            random_inputs(&graph, import.seed.wrapping_add(1))
        } else {
            let pixels = tessera_import::preprocess(import.images, cfg)?;
            let mut patches = tessera_import::patches(&pixels, cfg)?;
            // The input is f16 on the tiles; the references see what the tiles see.
            patches.round_to_f16();
            let mut inputs = Inputs::new();
            inputs.insert("patches", patches);
            inputs
        };
        inputs.check_inputs(&graph)?;
        Ok(Model {
            graph,
            weights,
            inputs,
        })
    }

    /// The run's embeddings shaped for a file, the model run at `batch`:
    /// `pooled` `[batch, width]` and `tokens` `[batch, tokens, width]`, each
    /// when the model outputs it.
    pub fn embeddings(
        &self,
        run: &crate::Run,
        batch: usize,
    ) -> Result<(Option<HostTensor>, Option<HostTensor>), Error> {
        let get = |name: &str| -> Result<Option<HostTensor>, Error> {
            let Some(id) = self.graph.output(name) else {
                return Ok(None);
            };
            let data = run
                .output(name)
                .ok_or_else(|| Error::MissingOutput(name.to_string()))?;
            Ok(Some(HostTensor::new(self.graph.shape(id).clone(), data)?))
        };
        let pooled = get("pooled")?;
        let tokens = match get("tokens")? {
            // The graph's tokens are `[batch * tokens, width]`.
            Some(t) => {
                let d = t.shape().dims().to_vec();
                Some(t.reshaped(vec![batch, d[0] / batch.max(1), d[1]])?)
            }
            None => None,
        };
        Ok((pooled, tokens))
    }
}

//! The model options `compile`, `run` and the benches share, and what they mean
//! to the driver.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};
use tessera_driver::{
    Experimental, KernelMutation, LayerDims, MAX_FINALISTS, Machine, ModelSpec, MutableKernel,
    Options, WeightDtype,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ModelKind {
    /// The vision tower with one encoder layer: patch projection, attention, MLP,
    /// post-LayerNorm and the attention-pooling head.
    Layer,
    /// The MLP block alone: LayerNorm, fc1, GELU, fc2, residual.
    Mlp,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Mlp => "mlp",
            ModelKind::Layer => "layer",
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Size {
    /// So400m/14 at 378 px (729 tokens, width 1152, 16 heads, MLP 4304).
    So400m,
    /// SigLIP B/16 at 224 px (196 tokens, width 768, 12 heads, MLP 3072).
    Base,
    /// 16 tokens, width 32, 4 heads, MLP 64 (the MLP block alone: hidden 96): for
    /// quick checks.
    Tiny,
}

impl From<Size> for tessera_driver::Size {
    fn from(s: Size) -> Self {
        match s {
            Size::So400m => tessera_driver::Size::So400m,
            Size::Base => tessera_driver::Size::Base,
            Size::Tiny => tessera_driver::Size::Tiny,
        }
    }
}

#[derive(Args, Clone)]
pub struct ModelArgs {
    #[arg(long, value_enum, default_value = "layer")]
    pub model: ModelKind,
    /// The model's dimensions [default: so400m]
    #[arg(long, value_enum)]
    pub size: Option<Size>,
    /// Layer dimensions from a TOML file (`image_size`, `channels`, `patch`,
    /// `width`, `heads`, `mlp_hidden`, `layers`, `eps`, and `token_output` as
    /// `--tokens`; the rest as So400m). Only with `--model layer`; instead of `--size`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Machine preset or TOML file.
    #[arg(long, default_value = "c600")]
    pub machine: String,
    /// Override the machine's tile count.
    #[arg(long)]
    pub tiles: Option<u32>,
    /// Images per inference [default: 2; with --weights or --onnx, the number
    /// of --image files, else the batch an ONNX file fixes, else 1]
    #[arg(long)]
    pub batch: Option<usize>,
    /// A Hugging Face SigLIP checkpoint directory (`config.json` and
    /// `model.safetensors`, or the sharded form with its index), of a
    /// SiglipVisionModel or a whole SiglipModel: the model's dimensions and
    /// weights, in place of --size/--config (docs/import.md)
    #[arg(long, value_name = "DIR", conflicts_with = "onnx")]
    pub weights: Option<PathBuf>,
    /// An ONNX file of transformers' SiglipVisionModel as torch.onnx.export
    /// writes it (opset 17 or 18; external data beside it): the model's
    /// dimensions and weights, in place of --size/--config (docs/onnx.md)
    #[arg(long, value_name = "FILE")]
    pub onnx: Option<PathBuf>,
    /// An input image, PNG or JPEG (repeatable: the batch is the number of
    /// images), preprocessed as transformers' SiglipImageProcessor; with --weights
    /// or --onnx
    #[arg(long = "image", value_name = "FILE")]
    pub images: Vec<PathBuf>,
    /// Also send the post-LayerNorm tokens `[batch*tokens, width]` to the host and
    /// check them (`--model layer`; the layer's result is `pooled`, `[batch, width]`).
    /// At So400m they are 1.7 MB an image, about 80,000 cycles of host link.
    #[arg(long)]
    pub tokens: bool,
    /// Usable SRAM bytes per tile from the first SRAM address, for placement (at
    /// most the machine's): squeezes a compile without editing the machine.
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Encoder layers of the vision tower (`--model layer`), in place of the
    /// dimensions' own (`layers` in a `--config` file; one for `--size`).
    /// `--layers 27` is the whole So400m tower.
    #[arg(long)]
    pub layers: Option<usize>,
    /// Seed of the weights (inputs use seed + 1, wrapping).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Declare the rearrangement's operands 2-byte aligned, as the seed's bug did,
    /// and move those buffers off 8-byte alignment where placement allows: the
    /// simulator must then fault at the kernel's 64-bit load.
    #[arg(long, hide = true)]
    pub weaken_rearrange_contract: bool,
    /// Validation test hook: scale one constant of this kernel kind by 1.01
    /// (`gelu`, `layernorm`, `softmax`, `amp_matmul`); the run must then report a
    /// mismatch.
    #[arg(long, hide = true)]
    pub mutate_kernel: Option<String>,
    /// Test hook: lower every multi-query attention with scores `Q K^T` and the row
    /// softmax, the path otherwise taken only where the transposed one does not
    /// apply.
    #[arg(long, hide = true)]
    pub row_attention: bool,
    /// Give every transposed attention's tiles whole keys, also where its groups
    /// are an odd number of tiles and the key cut would apply (for comparisons).
    #[arg(long, hide = true)]
    pub whole_keys: bool,
    /// Test hook: lower an attention with a constant query (the pooling head) with
    /// its projections as they are, not absorbed.
    #[arg(long, hide = true)]
    pub unabsorbed_head: bool,
    /// Keep one copy of every weight on the tiles and copy each operation's
    /// weights into its layout while it runs, instead of keeping every replica
    /// resident (what a whole model needs)
    #[arg(long)]
    pub stage_weights: bool,
    /// Lower every encoder layer on its own (unrolled, each with its own code
    /// and resident weights) instead of once as a loop the program runs once a
    /// layer, which is the default for two layers or more
    #[arg(long)]
    pub unrolled_layers: bool,
    /// How linears' weights are stored on the tiles: f16, or fp8 (IPU21's F143
    /// at a power-of-two scale a weight, widened to f16 on the tile; biases,
    /// LayerNorm parameters and activations stay f16)
    #[arg(long, value_enum, default_value = "f16")]
    pub weight_dtype: WeightDtypeArg,
    /// Stage every FP8 weight of a layer loop into its layout each iteration,
    /// instead of letting the planner keep linears' weights resident in their
    /// layout (an instance a layer) where the whole model's memory allows
    #[arg(long)]
    pub stage_all_weights: bool,
    /// Whole-model plans to build completely before selecting one (1: the rules'
    /// defaults, no search; at most 64, docs/limits.md)
    #[arg(long, default_value_t = 8, value_parser = finalists_in_range)]
    pub finalists: usize,
    /// Simulate the N best-estimated feasible finalists and select the fewest
    /// simulated cycles among them (with `--finalists` above 1)
    #[arg(long, default_value_t = 0)]
    pub simulate_finalists: usize,
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
}

/// `--weight-dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightDtypeArg {
    F16,
    Fp8,
}

fn finalists_in_range(text: &str) -> Result<usize, String> {
    let n: usize = text.parse().map_err(|e| format!("`{text}`: {e}"))?;
    if n > MAX_FINALISTS {
        return Err(format!(
            "{n} is above the largest accepted, {MAX_FINALISTS}"
        ));
    }
    Ok(n)
}

impl ModelArgs {
    /// The machine, with `--tiles` applied.
    pub fn machine(&self) -> anyhow::Result<Machine> {
        let mut machine = Machine::load(&self.machine)?;
        if let Some(t) = self.tiles {
            machine = machine.with_tiles(t);
            machine.validate()?;
        }
        Ok(machine)
    }

    /// Refuses options that conflict or that this model does not use, before any
    /// work.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.batch == Some(0) {
            bail!("--batch must be at least 1");
        }
        self.check_weights()?;
        if self.layers == Some(0) {
            bail!("--layers must be at least 1");
        }
        if self.model == ModelKind::Mlp {
            let layer_only = [
                (self.config.is_some(), "--config sets layer dimensions"),
                (
                    self.layers.is_some(),
                    "--layers sets the encoder's layer count",
                ),
                (self.tokens, "--tokens adds the layer's token output"),
                (self.row_attention, "--row-attention lowers attentions"),
                (self.whole_keys, "--whole-keys lowers attentions"),
                (
                    self.unabsorbed_head,
                    "--unabsorbed-head lowers the pooling head",
                ),
            ];
            if let Some((_, what)) = layer_only.iter().find(|(set, _)| *set) {
                bail!("{what}; it applies to --model layer only");
            }
        }
        if self.config.is_some() && self.size.is_some() {
            bail!("--size and --config both set the layer's dimensions: give one");
        }
        if self.simulate_finalists > 0 && self.finalists <= 1 {
            bail!(
                "--simulate-finalists selects among finalists: it needs --finalists above 1 (it is {})",
                self.finalists
            );
        }
        Ok(())
    }

    /// `--weights` and `--image`: a checkpoint replaces the built-in dimensions,
    /// and images are its batch.
    fn check_weights(&self) -> anyhow::Result<()> {
        if self.weights.is_none() && self.onnx.is_none() {
            if !self.images.is_empty() {
                bail!(
                    "--image is an input of an imported model: give --weights DIR or --onnx FILE"
                );
            }
            return Ok(());
        }
        let from = if self.weights.is_some() {
            "--weights"
        } else {
            "--onnx"
        };
        let conflicts = [
            (self.size.is_some(), "--size"),
            (self.config.is_some(), "--config"),
            (self.model == ModelKind::Mlp, "--model mlp"),
        ];
        if let Some((_, flag)) = conflicts.iter().find(|(set, _)| *set) {
            bail!(
                "{from} gives the model's dimensions and weights: {flag} cannot be given with it"
            );
        }
        if let Some(b) = self.batch
            && !self.images.is_empty()
            && b != self.images.len()
        {
            bail!(
                "--batch {b} conflicts with the {} --image files given (the batch is the number of images)",
                self.images.len()
            );
        }
        Ok(())
    }

    /// The batch: as given, else the number of images, else the built-in
    /// models' 2 (one with --weights and no images).
    ///
    /// An ONNX file is read for its batch only when neither --batch nor
    /// --image gives one.
    pub fn batch(&self) -> anyhow::Result<usize> {
        Ok(match (self.batch, &self.weights, &self.onnx) {
            (Some(b), _, _) => b,
            (None, Some(_), _) => self.images.len().max(1),
            (None, None, Some(_)) if !self.images.is_empty() => self.images.len(),
            (None, None, Some(file)) => tessera_driver::onnx_fixed_batch(file)?.unwrap_or(1),
            (None, None, None) => 2,
        })
    }

    /// The model the options name ([`ModelArgs::check`] refuses the conflicts).
    pub fn spec(&self) -> anyhow::Result<ModelSpec> {
        self.check()?;
        let size = self.size.unwrap_or(Size::So400m);
        let kind = match self.model {
            ModelKind::Layer if self.weights.is_some() => tessera_driver::ModelKind::HuggingFace {
                dir: self.weights.clone().unwrap_or_default(),
                tokens: self.tokens,
                layers: self.layers,
                images: self.images.clone(),
            },
            ModelKind::Layer if self.onnx.is_some() => tessera_driver::ModelKind::Onnx {
                file: self.onnx.clone().unwrap_or_default(),
                tokens: self.tokens,
                layers: self.layers,
                images: self.images.clone(),
            },
            ModelKind::Mlp => tessera_driver::ModelKind::Mlp(size.into()),
            ModelKind::Layer => tessera_driver::ModelKind::Layer {
                dims: match &self.config {
                    Some(path) => LayerDims::File(path.clone()),
                    None => LayerDims::Preset(size.into()),
                },
                tokens: self.tokens,
                layers: self.layers,
            },
        };
        Ok(ModelSpec {
            kind,
            batch: self.batch()?,
            seed: self.seed,
        })
    }

    /// The compile options these stand for; `keep_layouts` for the HTML
    /// profile's SRAM viewer.
    pub fn options(&self, keep_layouts: bool) -> anyhow::Result<Options> {
        let mut experimental = Experimental {
            row_attention: self.row_attention,
            whole_keys: self.whole_keys,
            unabsorbed: self.unabsorbed_head,
            mutate_kernel: match &self.mutate_kernel {
                Some(kind) => Some(KernelMutation {
                    kernel: kind
                        .parse::<MutableKernel>()
                        .map_err(|e| anyhow::anyhow!("--mutate-kernel: {e}"))?,
                    factor: 1.01,
                }),
                None => None,
            },
            ..Experimental::default()
        };
        if self.weaken_rearrange_contract {
            experimental = experimental.weakened_rearrange_contract();
        }
        Ok(Options {
            finalists: self.finalists,
            simulate_finalists: self.simulate_finalists,
            capacity: self.capacity,
            keep_layouts,
            stage_weights: self.stage_weights,
            loop_layers: !self.unrolled_layers,
            weight_dtype: match self.weight_dtype {
                WeightDtypeArg::F16 => WeightDtype::F16,
                WeightDtypeArg::Fp8 => WeightDtype::Fp8,
            },
            resident_weights: !self.stage_all_weights,
            experimental,
        })
    }
}

/// Refuses an output path that cannot be written, before any work: a run of
/// minutes must not end in "cannot write" with its result lost. Leaves nothing
/// behind (a file that did not exist still does not).
pub fn check_writable(flag: &str, path: &Path) -> anyhow::Result<()> {
    let shown = path.display();
    if path.is_dir() {
        bail!("{flag} {shown}: is a directory");
    }
    if path.exists() {
        // Opening without truncating leaves an existing file as it was.
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .with_context(|| format!("{flag} {shown}: cannot write"))?;
        return Ok(());
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "{flag} {shown}: the directory {} does not exist",
            dir.display()
        );
    }
    let probe = dir.join(format!(
        ".tessera-write-check-{}-{}",
        std::process::id(),
        flag.trim_start_matches('-')
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .with_context(|| format!("{flag} {shown}: cannot create a file in {}", dir.display()))?;
    // The probe was ours; failing to remove it leaves a stray empty file, not a
    // wrong result.
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

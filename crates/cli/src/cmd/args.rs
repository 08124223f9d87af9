//! The model options `compile`, `run` and the benches share, and what they mean
//! to the driver.

use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, ValueEnum};
use tessera_driver::{
    Experimental, KernelMutation, LayerDims, MAX_FINALISTS, Machine, ModelSpec, MutableKernel,
    Options,
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
    #[arg(long, value_enum, default_value = "so400m")]
    pub size: Size,
    /// Layer dimensions from a TOML file (`image_size`, `channels`, `patch`,
    /// `width`, `heads`, `mlp_hidden`, `layers`, `eps`, and `token_output` as
    /// `--tokens`; the rest as So400m). Only with `--model layer`; replaces `--size`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Machine preset or TOML file.
    #[arg(long, default_value = "c600")]
    pub machine: String,
    /// Override the machine's tile count.
    #[arg(long)]
    pub tiles: Option<u32>,
    #[arg(long, default_value_t = 2)]
    pub batch: usize,
    /// Also send the post-LayerNorm tokens `[batch*tokens, width]` to the host and
    /// check them (`--model layer`; the layer's result is `pooled`, `[batch, width]`).
    /// At So400m they are 1.7 MB an image, about 80,000 cycles of host link.
    #[arg(long)]
    pub tokens: bool,
    /// Usable SRAM bytes per tile from the first SRAM address, for placement (at
    /// most the machine's): squeezes a compile without editing the machine.
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Seed of the weights (inputs use seed + 1, wrapping).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Declare the rearrangement's operands 2-byte aligned, as the seed's bug did,
    /// and move those buffers off 8-byte alignment where placement allows: the
    /// simulator must then fault at the kernel's 64-bit load.
    #[arg(long)]
    pub weaken_rearrange_contract: bool,
    /// Validation test hook: scale one constant of this kernel kind by 1.01
    /// (`gelu`, `layernorm`, `softmax`, `amp_matmul`); the run must then report a
    /// mismatch.
    #[arg(long, hide = true)]
    pub mutate_kernel: Option<String>,
    /// Validation test hook: scale one tile's part of this plan operation's output
    /// by 1.01 in tile memory where the operation ends (the simulator's
    /// `Perturb`); the run must then report a mismatch at that operation.
    #[arg(long, hide = true)]
    pub perturb: Option<String>,
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
    /// Whole-model plans to build completely before selecting one (1: the rules'
    /// defaults, no search; at most 64, docs/limits.md)
    #[arg(long, default_value_t = 8, value_parser = finalists_in_range)]
    pub finalists: usize,
    /// Write the run as a Chrome trace-event file (Perfetto UI, chrome://tracing)
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Write the run as one self-contained HTML page: timeline, per-operation table,
    /// per-tile heat maps, SRAM viewer, faults (docs/profile.md)
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Simulate the N best-estimated feasible finalists and select the fewest
    /// simulated cycles among them (with `--finalists`)
    #[arg(long, default_value_t = 0)]
    pub simulate_finalists: usize,
    #[arg(long)]
    pub json: bool,
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

    /// The model the options name; conflicting options are refused.
    pub fn spec(&self) -> anyhow::Result<ModelSpec> {
        if self.batch == 0 {
            bail!("--batch must be at least 1");
        }
        let kind = match self.model {
            ModelKind::Mlp => {
                if self.config.is_some() {
                    bail!("--config sets layer dimensions; it applies to --model layer only");
                }
                if self.tokens {
                    bail!(
                        "--tokens adds the layer's token output; it applies to --model layer only"
                    );
                }
                tessera_driver::ModelKind::Mlp(self.size.into())
            }
            ModelKind::Layer => tessera_driver::ModelKind::Layer {
                dims: match &self.config {
                    Some(path) => LayerDims::File(path.clone()),
                    None => LayerDims::Preset(self.size.into()),
                },
                tokens: self.tokens,
            },
        };
        Ok(ModelSpec {
            kind,
            batch: self.batch,
            seed: self.seed,
        })
    }

    /// The compile options these stand for.
    pub fn options(&self) -> anyhow::Result<Options> {
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
            keep_layouts: self.profile.is_some(),
            experimental,
        })
    }
}

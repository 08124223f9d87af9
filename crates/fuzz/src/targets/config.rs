//! `EncoderLayerConfig::from_toml`, then, as `tessera compile --config` does, the
//! model graph built from it (`encoder_layer`). The generator mutates the seed
//! configurations' values to extremes and also writes configurations from scratch
//! whose dimensions are consistent, so that the graph builder is reached.

use crate::mutate::number;
use crate::targets::tree::mutate_toml;
use crate::{Rng, Seed, Target, corpus};
use rand::Rng as _;
use tessera_graph::{EncoderLayerConfig, encoder_layer};

pub struct ConfigTarget;

/// The batch the command line passes by default.
const BATCH: usize = 2;

impl Target for ConfigTarget {
    fn name(&self) -> &'static str {
        "config"
    }
    fn about(&self) -> &'static str {
        "EncoderLayerConfig::from_toml (batch 2), then encoder_layer"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::CONFIG
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        if rng.random_bool(0.5) {
            let seeds = self.corpus();
            let seed = seeds[rng.random_range(0..seeds.len())];
            return mutate_toml(std::str::from_utf8(seed.bytes).unwrap_or(""), rng).into_bytes();
        }
        // Consistent dimensions (image a multiple of the patch, width of the heads),
        // some of them large.
        let dim = |rng: &mut Rng| -> i128 {
            if rng.random_bool(0.15) {
                number(rng)
            } else {
                rng.random_range(1..=16)
            }
        };
        let patch = dim(rng);
        let heads = dim(rng);
        let eps = ["1e-6", "0.0", "-1e-6", "nan", "inf", "1e39", "1"][rng.random_range(0..7)];
        let fields = [
            ("patch", patch.to_string()),
            ("image_size", patch.saturating_mul(dim(rng)).to_string()),
            ("channels", dim(rng).to_string()),
            ("heads", heads.to_string()),
            ("width", heads.saturating_mul(dim(rng)).to_string()),
            ("mlp_hidden", dim(rng).to_string()),
            ("layers", rng.random_range(0..=4).to_string()),
            ("eps", eps.to_string()),
        ];
        let mut out = String::new();
        for (key, value) in fields {
            if rng.random_bool(0.85) {
                out.push_str(&format!("{key} = {value}\n"));
            }
        }
        out.into_bytes()
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        let text = std::str::from_utf8(input).map_err(|_| "input is not UTF-8".to_string())?;
        let cfg = EncoderLayerConfig::from_toml(text, "fuzz.toml", BATCH)
            .map_err(|e| format!("config: {e}"))?;
        let g = encoder_layer(&cfg).map_err(|e| format!("graph: {e}"))?;
        let _ = g;
        Ok("graph built".into())
    }
}

//! Times the reference on the So400m MLP block (and, with `--encoder`, one full-size
//! encoder layer with the MAP head). Run with `--release`; arguments are batch sizes.

use std::time::Instant;
use tessera_graph::{
    EncoderLayerConfig, MlpConfig, encoder_layer, init_weights, mlp, random_inputs,
};
use tessera_reference::{EvalOptions, evaluate_with};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let encoder = args.iter().any(|a| a == "--encoder");
    let mut batches: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if batches.is_empty() {
        batches = vec![2, 4];
    }
    println!("rayon threads: {}", rayon::current_num_threads());
    for batch in batches {
        let (name, graph) = if encoder {
            (
                "encoder layer + MAP head",
                encoder_layer(&EncoderLayerConfig::so400m(batch))?,
            )
        } else {
            ("mlp", mlp(&MlpConfig::so400m(batch))?)
        };
        let t = Instant::now();
        let weights = init_weights(&graph, 0);
        let inputs = random_inputs(&graph, 1);
        let setup = t.elapsed();
        for round_f16_storage in [false, true] {
            let opts = EvalOptions {
                round_f16_storage,
                ..EvalOptions::default()
            };
            // Best of three: the machine may be shared, and the fastest run is the
            // one least disturbed by other work.
            let mut best = f64::INFINITY;
            let mut out = None;
            for _ in 0..3 {
                let t = Instant::now();
                out = Some(evaluate_with(&graph, &weights, &inputs, &opts)?);
                best = best.min(t.elapsed().as_secs_f64());
            }
            let out = out.unwrap_or_default();
            let shapes: Vec<String> = out
                .iter()
                .map(|(n, v)| format!("{n}{}", v.shape()))
                .collect();
            println!(
                "So400m {name} batch {batch}: setup {:.3} s, evaluate (round_f16_storage={round_f16_storage}) best of 3 {best:.3} s -> {}",
                setup.as_secs_f64(),
                shapes.join(", ")
            );
        }
    }
    Ok(())
}

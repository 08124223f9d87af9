//! Prints a model graph: `dump mlp [batch]` or `dump encoder [batch]` (So400m sizes).

use tessera_graph::{EncoderLayerConfig, MlpConfig, encoder_layer, mlp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let batch = args.get(1).and_then(|b| b.parse().ok()).unwrap_or(1);
    let graph = match args.first().map(String::as_str) {
        Some("encoder") => encoder_layer(&EncoderLayerConfig::so400m(batch))?,
        _ => mlp(&MlpConfig::so400m(batch))?,
    };
    print!("{graph}");
    println!(
        "# {} ops, {} parameters ({} values)",
        graph.ops().len(),
        graph.params().len(),
        graph.param_count()
    );
    Ok(())
}

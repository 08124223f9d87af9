//! Tessera as a library, end to end: build the tiny vision tower (one encoder
//! layer and the attention-pooling head), compile it for the `small` machine,
//! run it on the simulator and print its validation and where its cycles went.
//!
//!     cargo run --release -p tessera-driver --example tiny_layer

use tessera_driver::{Machine, Model, ModelSpec, NoProgress, Options, SimulateOptions};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let machine = Machine::load("small")?;
    let model = Model::build(&ModelSpec::tiny_layer(2), &machine)?;
    let compiled = tessera_driver::compile(&machine, &model, &Options::default(), &NoProgress)?;
    let run =
        tessera_driver::simulate(&model, &compiled, &SimulateOptions::default(), &NoProgress)?;
    let validation = tessera_driver::validate(&model, &compiled, &run, &NoProgress)?;
    let cycles = tessera_driver::attribute(&machine, &model.graph, &compiled, &run);

    println!(
        "{}: {} cycles per inference on {} tiles, {:.1}% of f16 peak",
        validation.status.as_str(),
        run.run_cycles,
        compiled.report.tiles_used,
        100.0 * cycles.peak_share
    );
    for o in &validation.outputs {
        println!(
            "output `{}`: max abs error {:.6} (tolerance {:.6}), cosine {:.6}",
            o.name,
            o.max_abs_error.unwrap_or(f32::NAN),
            o.tolerance,
            o.cosine.unwrap_or(f64::NAN)
        );
    }
    for (op, check) in cycles.ops.iter().zip(&validation.ops) {
        let verdict = match check.passed {
            Some(true) => "ok",
            Some(false) => "MISMATCH",
            None => "-",
        };
        println!("  {:36} {:>8} cycles  {verdict}", op.name, op.cycles);
    }
    if !validation.passed() {
        return Err(format!("the run did not validate: {}", validation.status.as_str()).into());
    }
    Ok(())
}

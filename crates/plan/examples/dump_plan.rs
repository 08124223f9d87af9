//! Prints a layer's plan, or with `stats`, the busiest tile's live bytes by buffer
//! name at its worst step, or with `cands`, each linear's strategies (estimate,
//! bytes, passes) and the one chosen:
//! `cargo run -p tessera-plan --example dump_plan -- so400m 2 c600 stats`.
use std::collections::BTreeMap;

use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, busiest, lower};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let batch: usize = args.get(2).map_or(2, |b| b.parse().expect("batch"));
    let cfg = match args.get(1).map(String::as_str) {
        Some("base") => EncoderLayerConfig::base(batch),
        Some("so400m") => EncoderLayerConfig::so400m(batch),
        _ => EncoderLayerConfig::tiny(batch),
    };
    let machine = Machine::load(args.get(3).map_or("c600", String::as_str)).expect("machine");
    let graph = encoder_layer(&cfg).expect("graph");
    let weights = init_weights(&graph, 1);
    // Knobs from the environment, for exploring the budgets: TW, TT, TB in KiB.
    let kib = |v: &str| {
        std::env::var(v)
            .ok()
            .map(|x| x.parse::<u64>().expect("KiB") * 1024)
    };
    let mut opts = LowerOptions::default();
    if let Some(v) = kib("TW") {
        opts.weight_bytes = v;
    }
    if let Some(v) = kib("TT") {
        opts.transient_bytes = v;
    }
    if let Some(v) = kib("TB") {
        opts.slab_bias_bytes = v as u32;
    }
    let plan = match lower(&machine, &graph, &weights, &opts) {
        Ok(plan) => plan,
        Err(e) => return eprintln!("{e}"),
    };
    if args.get(4).map(String::as_str) == Some("cands") {
        for c in &plan.candidates {
            println!("{} chosen {}", c.op, c.chosen);
            for x in &c.candidates {
                println!(
                    "   {} est {} bytes {} passes {}",
                    x.grid, x.estimated_cycles, x.bytes_per_tile, x.passes
                );
            }
        }
        return;
    }
    if args.get(4).map(String::as_str) != Some("stats") {
        return print!("{plan}");
    }
    let (tile, step, bytes) = busiest(&plan);
    let (tile, step) = (tile as usize, step as usize);
    println!(
        "busiest: tile {tile} step {step} ({}): {bytes} bytes live",
        plan.step_ops[step]
    );
    let mut by: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.tile as usize == tile && b.first as usize <= step && step <= b.last as usize)
    {
        let e = by.entry(b.name.clone()).or_default();
        e.0 += u64::from(b.bytes);
        e.1 += 1;
    }
    let mut v: Vec<_> = by.into_iter().collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1.0));
    for (name, (bytes, n)) in v.iter().take(30) {
        println!("{bytes:>9} {n:>4} {name}");
    }
    for d in &plan.decisions {
        println!("{d}");
    }
}

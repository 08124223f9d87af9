//! `cargo run --release -p tessera-sim --example bench_sim [rows] [repeats] [tiles]`:
//! the throughput half of `tessera bench sim`, without the CLI.
use std::time::Instant;
use tessera_machine::Machine;
use tessera_sim::bench::amp_package;
use tessera_sim::{SimOptions, Simulator};

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let rows = args.first().copied().unwrap_or(2048);
    let repeats = args.get(1).copied().unwrap_or(4);
    let machine = Machine::c600();
    let tiles = args.get(2).copied().unwrap_or(machine.tiles);
    let t = Instant::now();
    let pkg = amp_package(&machine, tiles, rows, repeats).expect("kernel encodes");
    let mut sim = Simulator::new(&pkg).expect("benchmark package loads");
    println!("load {:.3}s", t.elapsed().as_secs_f64());
    let opts = SimOptions {
        trace: false,
        ..SimOptions::default()
    };
    for _ in 0..2 {
        let t = Instant::now();
        let r = sim.run(&opts);
        let s = t.elapsed().as_secs_f64();
        println!(
            "{:?}: {} instructions, {} cycles in {:.3}s: {:.1} M inst/s, {:.2} M cycles/s",
            r.status,
            r.instructions,
            r.cycles,
            s,
            r.instructions as f64 / s / 1e6,
            r.cycles as f64 / s / 1e6
        );
    }
}

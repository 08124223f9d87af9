//! Prints a layer's plan, or with `stats`, the plan's estimate, its weight budget
//! and the busiest tile's live bytes by buffer name and memory class at its worst
//! step, or with `cands`, each linear's strategies (estimate, bytes, passes) and
//! the one chosen, or with `xmsg`, the busiest tile's exchange messages by phase:
//! `cargo run -p tessera-plan --example dump_plan -- so400m 2 c600 stats`.
//! `LAYERS=n`, `FP8=1`, `STAGE=1`: depth, FP8 weights, staged weights.
//! `CHOICE=layers.0.attn.q=6` lowers with that strategy at the fitted budgets
//! without the fit loop (to see how far it is from fitting).
use std::collections::BTreeMap;

use tessera_graph::{EncoderLayerConfig, encoder_layer, init_weights};
use tessera_machine::Machine;
use tessera_plan::{LowerOptions, busiest, lower_exact, lower_fitted};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let batch: usize = args.get(2).map_or(2, |b| b.parse().expect("batch"));
    let mut cfg = match args.get(1).map(String::as_str) {
        Some("base") => EncoderLayerConfig::base(batch),
        Some("so400m") => EncoderLayerConfig::so400m(batch),
        _ => EncoderLayerConfig::tiny(batch),
    };
    // `LAYERS=n` encoder layers (a layer loop from two).
    if let Ok(v) = std::env::var("LAYERS") {
        cfg.layers = v.parse().expect("layers");
    }
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
    // `FP8=1` stores weights as FP8, `STAGE=1` stages them as a layer loop does.
    if std::env::var("FP8").is_ok() {
        opts.weight_dtype = tessera_plan::WeightDtype::Fp8;
    }
    if std::env::var("STAGE").is_ok() {
        opts.stage_weights = true;
    }
    if let Some(v) = kib("TW") {
        opts.weight_bytes = v;
    }
    if let Some(v) = kib("TT") {
        opts.transient_bytes = v;
    }
    if let Some(v) = kib("TB") {
        opts.slab_bias_bytes = v as u32;
    }
    let (mut plan, mut fitted) = match lower_fitted(&machine, &graph, &weights, &opts) {
        Ok(x) => x,
        Err(e) => return eprintln!("{e}"),
    };
    // `CHOICE=op=index,...`: those strategies at the fitted budgets, unfitted (how
    // far a strategy is from fitting).
    if let Ok(v) = std::env::var("CHOICE") {
        for c in v.split(',') {
            let (op, i) = c.split_once('=').expect("op=index");
            fitted
                .choices
                .insert(op.to_string(), i.parse().expect("index"));
        }
        plan = match lower_exact(&machine, &graph, &weights, &fitted) {
            Ok(plan) => plan,
            Err(e) => return eprintln!("{e}"),
        };
    }
    if args.get(4).map(String::as_str) == Some("xmsg") {
        // Messages per tile by exchange phase: the busiest tile's, with the sizes
        // of what it sends, and what counting every tile's exchange code costs.
        let mut total = vec![0usize; plan.tiles as usize];
        let all: Vec<_> = plan
            .exchanges
            .iter()
            .map(|x| tessera_plan::exchange_code::exchange_parts(&plan, x))
            .collect();
        for parts in &all {
            for (t, p) in parts.iter().enumerate() {
                total[t] += p.sends.len() + p.recvs.len();
            }
        }
        let (tile, most) = total.iter().enumerate().max_by_key(|x| x.1).unwrap();
        println!("busiest tile {tile}: {most} messages");
        let copies: usize = plan.exchanges.iter().map(|x| x.copies.len()).sum();
        let dsts: usize = plan
            .exchanges
            .iter()
            .flat_map(|x| x.copies.iter().map(|c| c.dsts.len()))
            .sum();
        println!("{copies} copies to {dsts} destinations");
        let t = std::time::Instant::now();
        let bytes = tessera_plan::exchange_code::code_bytes_per_tile(&plan);
        println!(
            "exchange code: at most {} bytes a tile, counted in {:.1} ms",
            bytes.iter().max().unwrap_or(&0),
            t.elapsed().as_secs_f64() * 1e3
        );
        let t = std::time::Instant::now();
        let b = tessera_plan::busiest(&plan);
        println!("busiest {b:?} in {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
        for (x, parts) in plan.exchanges.iter().zip(&all) {
            let p = &parts[tile];
            let mut sizes: BTreeMap<u32, usize> = BTreeMap::new();
            for s in &p.sends {
                *sizes.entry(s.1).or_default() += 1;
            }
            println!(
                "{:>3} {:<28} sends {:>5} recvs {:>5} sources {:>4} send sizes {:?}",
                x.id,
                x.name,
                p.sends.len(),
                p.recvs.len(),
                p.recv_groups().len(),
                sizes.iter().take(6).collect::<Vec<_>>()
            );
        }
        return;
    }
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
    // `STEPS=1` lists each step's estimate and operation.
    if std::env::var("STEPS").is_ok() {
        let (_, steps) = tessera_plan::estimate_steps(&machine, &plan);
        let t = &machine.timing;
        // Each step's calls with their estimates, grouped once.
        let mut by_step: Vec<Vec<(u32, String, u64)>> = vec![Vec::new(); steps.len()];
        for k in &plan.calls {
            let kk = k.kernel.kernel();
            by_step[k.step as usize].push((k.tile, kk.symbol(), kk.estimate_cycles_with(t)));
        }
        for (s, (c, calls)) in steps.iter().zip(&by_step).enumerate() {
            println!("step {s:3} {:>8} {}", c, plan.step_ops[s]);
            // The busiest tile's calls, where a compute step is long.
            let mut by: BTreeMap<u32, u64> = BTreeMap::new();
            for (tile, _, cycles) in calls {
                *by.entry(*tile).or_default() += cycles;
            }
            if let Some((&tile, _)) = by.iter().max_by_key(|(t, c)| (**c, std::cmp::Reverse(**t))) {
                for (_, symbol, cycles) in calls.iter().filter(|k| k.0 == tile) {
                    println!("          tile {tile} {symbol} {cycles}");
                }
            }
        }
    }
    let (tile, step, bytes) = busiest(&plan);
    let (tile, step) = (tile as usize, step as usize);
    // `AT=tile,step` lists another tile and step than the busiest.
    let (tile, step) = std::env::var("AT").ok().map_or((tile, step), |v| {
        let (t, s) = v.split_once(',').expect("AT=tile,step");
        (t.parse().expect("tile"), s.parse().expect("step"))
    });
    println!(
        "busiest: tile {tile} step {step} ({}): {bytes} bytes live",
        plan.step_ops[step]
    );
    println!(
        "estimate {} cycles, weight budget {} KiB",
        tessera_plan::estimate(&machine, &plan).cycles,
        fitted.weight_bytes / 1024
    );
    let mut by: BTreeMap<String, (u64, u32)> = BTreeMap::new();
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.tile as usize == tile && b.first as usize <= step && step <= b.last as usize)
    {
        let e = by.entry(format!("{} {:?}", b.name, b.class)).or_default();
        e.0 += u64::from(b.bytes);
        e.1 += 1;
    }
    let mut v: Vec<_> = by.into_iter().collect();
    println!(
        "live at tile {tile} step {step}: {} bytes",
        v.iter().map(|x| x.1.0).sum::<u64>()
    );
    v.sort_by_key(|x| std::cmp::Reverse(x.1.0));
    for (name, (bytes, n)) in v.iter().take(30) {
        println!("{bytes:>9} {n:>4} {name}");
    }
    for d in &plan.decisions {
        println!("{d}");
    }
}

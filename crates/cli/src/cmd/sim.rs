//! Owned by the simulator work: `tessera sim` and `tessera bench sim`.
use crate::Outcome;
use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use tessera_machine::Machine;
use tessera_sim::bench::{
    CalibrationFit, CalibrationPoint, amp_package, calibration, calibration_fit,
};
use tessera_sim::{DEFAULT_CYCLE_BUDGET, Fault, SimOptions, Simulator, Status};

#[derive(Args)]
pub struct SimArgs {
    /// Package file.
    pub input: PathBuf,
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
    /// Contexts whose clock reaches this many cycles fault with Timeout.
    #[arg(long, default_value_t = DEFAULT_CYCLE_BUDGET)]
    pub cycle_budget: u64,
    /// Write input/weight bindings into tile memory before the run and read outputs
    /// back after it (for packages without host-transfer code).
    #[arg(long)]
    pub preload_bindings: bool,
}

#[derive(Args)]
pub struct BenchSimArgs {
    /// Print the result as JSON on stdout (and no progress on stderr)
    #[arg(long)]
    pub json: bool,
    /// Rows per tile of the throughput kernel.
    #[arg(long, default_value_t = 2048)]
    pub rows: u32,
    /// Times the supervisor runs the kernel (more work per measurement).
    #[arg(long, default_value_t = 4)]
    pub repeats: u32,
}

/// Timeout faults `tessera sim` lists before it counts the rest.
const TIMEOUTS_LISTED: usize = 8;

#[derive(Serialize)]
struct SimJson<'a> {
    status: Status,
    cycles: u64,
    supersteps: u32,
    instructions: u64,
    /// Wall time of the run (loading excluded), and the part of it outside the
    /// per-tile work that runs in parallel (exchanges, host transfers, syncs),
    /// the same figures as `tessera run --json`'s.
    simulate_ms: f64,
    simulate_serial_ms: f64,
    faults: &'a [Fault],
}

pub fn run(a: SimArgs) -> anyhow::Result<Outcome> {
    // The package errors name the file already.
    let package = tessera_package::read_package_file(&a.input)?;
    let mut sim = Simulator::from_package(package)
        .with_context(|| format!("loading {} into the simulator", a.input.display()))?;
    let (t0, parallel0) = (Instant::now(), sim.parallel_ms());
    let report = sim.run(&SimOptions {
        cycle_budget: a.cycle_budget,
        preload_bindings: a.preload_bindings,
        trace: false,
        ..SimOptions::default()
    });
    let simulate_ms = t0.elapsed().as_secs_f64() * 1e3;
    let simulate_serial_ms = (simulate_ms - (sim.parallel_ms() - parallel0)).max(0.0);
    if a.json {
        super::print_json(&SimJson {
            status: report.status,
            cycles: report.cycles,
            supersteps: report.supersteps,
            instructions: report.instructions,
            simulate_ms,
            simulate_serial_ms,
            faults: &report.faults,
        })?;
    } else {
        let status = match report.status {
            Status::Ok => "ok",
            Status::Fault => "fault",
        };
        println!(
            "{status}: {} cycles ({:.3} ms at {} MHz), {} superstep{}, {} instructions",
            report.cycles,
            sim.machine().cycles_to_seconds(report.cycles) * 1e3,
            sim.machine().clock_hz / 1_000_000,
            report.supersteps,
            if report.supersteps == 1 { "" } else { "s" },
            report.instructions
        );
        // A package longer than the budget times out on every context of every
        // tile: thousands of identical lines say less than one and a count.
        let mut timeouts = 0;
        let mut tiles = std::collections::BTreeSet::new();
        for f in &report.faults {
            if f.kind == tessera_sim::FaultKind::Timeout {
                timeouts += 1;
                tiles.insert(f.tile);
                if timeouts > TIMEOUTS_LISTED {
                    continue;
                }
            }
            let addr = f
                .address
                .map(|a| format!(" [address {a:#x}]"))
                .unwrap_or_default();
            println!("  {f}{addr}");
        }
        if timeouts > TIMEOUTS_LISTED {
            println!(
                "  ... and {} more timeouts: {timeouts} contexts on {} tiles reached the cycle budget of {} cycles; a longer program needs a larger --cycle-budget",
                timeouts - TIMEOUTS_LISTED,
                tiles.len(),
                a.cycle_budget
            );
        }
    }
    Ok(match report.status {
        Status::Ok => Outcome::Ok,
        Status::Fault => Outcome::Failed,
    })
}

#[derive(Serialize)]
struct BenchJson {
    machine: String,
    tiles: u32,
    rows_per_tile: u32,
    repeats: u32,
    status: Status,
    simulated_instructions: u64,
    simulated_issues: u64,
    simulated_cycles: u64,
    wall_seconds: f64,
    simulated_instructions_per_second: f64,
    simulated_cycles_per_second: f64,
    simulated_tile_cycles_per_second: f64,
    threads: usize,
    debug_build: bool,
    calibration: Vec<CalibrationPoint>,
    calibration_fit: Option<CalibrationFit>,
}

pub fn bench(a: BenchSimArgs) -> anyhow::Result<Outcome> {
    let machine = Machine::c600();
    let package = amp_package(&machine, machine.tiles, a.rows, a.repeats.max(1))?;
    let mut sim = Simulator::new(&package).context("loading the benchmark package")?;
    let opts = SimOptions {
        trace: false,
        ..SimOptions::default()
    };
    let t0 = Instant::now();
    let report = sim.run(&opts);
    let secs = t0.elapsed().as_secs_f64().max(1e-9);
    let tile_cycles: u64 = report.per_tile.iter().map(|t| t.cycles).sum();
    let cal = calibration(&machine, machine.tiles, &[16, 128, 256, 2048]);
    let out = BenchJson {
        machine: machine.name.clone(),
        tiles: machine.tiles,
        rows_per_tile: a.rows,
        repeats: a.repeats.max(1),
        status: report.status,
        simulated_instructions: report.instructions,
        simulated_issues: report.issues,
        simulated_cycles: report.cycles,
        wall_seconds: secs,
        simulated_instructions_per_second: report.instructions as f64 / secs,
        simulated_cycles_per_second: report.cycles as f64 / secs,
        simulated_tile_cycles_per_second: tile_cycles as f64 / secs,
        threads: rayon::current_num_threads(),
        debug_build: cfg!(debug_assertions),
        calibration_fit: calibration_fit(&cal),
        calibration: cal,
    };
    if a.json {
        super::print_json(&out)?;
    } else {
        println!(
            "AMP kernel, {} rows x {} repeats on {} {} tiles ({} threads{}):",
            out.rows_per_tile,
            out.repeats,
            out.tiles,
            out.machine,
            out.threads,
            if out.debug_build { ", debug build" } else { "" }
        );
        println!(
            "  {:.1} M simulated instructions/s, {:.2} M simulated cycles/s ({} instructions, {} cycles in {:.3} s)",
            out.simulated_instructions_per_second / 1e6,
            out.simulated_cycles_per_second / 1e6,
            out.simulated_instructions,
            out.simulated_cycles,
            out.wall_seconds
        );
        println!("  calibration, f16 [N,16] x [16,16] per tile (reference: Bow fit 340 + 4N):");
        println!(
            "  {:>6} {:>10} {:>10} {:>8}",
            "N", "cycles", "reference", "dev %"
        );
        for c in &out.calibration {
            println!(
                "  {:>6} {:>10} {:>10} {:>+8.1}",
                c.n, c.cycles, c.reference_cycles, c.deviation_percent
            );
        }
        if let Some(f) = &out.calibration_fit {
            println!(
                "  fit: {:.3} cycles per row ({:+.2}% against 4), {:.0} cycles per call (measured vertex: 340; see docs/sim.md)",
                f.slope, f.slope_deviation_percent, f.intercept
            );
        }
    }
    Ok(match report.status {
        Status::Ok => Outcome::Ok,
        Status::Fault => Outcome::Failed,
    })
}

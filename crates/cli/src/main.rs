//! `tessera`: the command line. It owns argument parsing, human-readable reports,
//! `--json` output and exit codes; every piece of real work lives in a library crate.
//! It must never hold compiler or simulator logic of its own.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "tessera",
    version,
    about = "Ahead-of-time compiler and simulator for IPU-class tile machines"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Machine descriptions.
    Machine {
        #[command(subcommand)]
        which: cmd::machine::MachineCmd,
    },
    /// Assemble a text program into a package.
    Asm(cmd::asm::AsmArgs),
    /// Disassemble a package.
    Disasm(cmd::asm::DisasmArgs),
    /// Run a package on the simulator.
    Sim(cmd::sim::SimArgs),
    /// Place SRAM buffers for one or many tiles.
    Place(cmd::place::PlaceArgs),
    /// Compile a model into a package.
    Compile(cmd::compile::CompileArgs),
    /// Compile a model, simulate it and validate it against the f32 reference.
    Run(cmd::run::RunArgs),
    /// Benchmarks that print figures.
    Bench {
        #[command(subcommand)]
        which: BenchCmd,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Simulator throughput and AMP calibration.
    Sim(cmd::sim::BenchSimArgs),
    /// Placement against public benchmark suites.
    Place(cmd::place::BenchPlaceArgs),
    /// The MLP block's cycles with each timing assumption halved and doubled.
    Sensitivity(cmd::bench::BenchSensitivityArgs),
    /// Every finalist built and simulated: estimated against simulated cycles
    Select(cmd::bench::BenchSelectArgs),
    /// Every reader of outside input against generated and mutated inputs.
    Fuzz(cmd::fuzz::BenchFuzzArgs),
}

/// What a command reports back to `main`: success, or a result that is not an error
/// of the tool but must still exit non-zero (a simulated fault, a placement that
/// does not fit).
pub enum Outcome {
    Ok,
    Failed,
}

fn main() -> ExitCode {
    // Reports are often piped into `head`: a closed pipe should end the process
    // quietly, as it does for other command-line tools, not panic in `println!`.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Machine { which } => cmd::machine::run(which),
        Command::Asm(a) => cmd::asm::run_asm(a),
        Command::Disasm(a) => cmd::asm::run_disasm(a),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Place(a) => cmd::place::run(a),
        Command::Compile(a) => cmd::compile::compile(a),
        Command::Run(a) => cmd::run::run(a),
        Command::Bench { which } => match which {
            BenchCmd::Sim(a) => cmd::sim::bench(a),
            BenchCmd::Place(a) => cmd::place::bench(a),
            BenchCmd::Sensitivity(a) => cmd::bench::sensitivity(a),
            BenchCmd::Select(a) => cmd::bench::bench_select(a),
            BenchCmd::Fuzz(a) => cmd::fuzz::bench(a),
        },
    };
    match result {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Failed) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

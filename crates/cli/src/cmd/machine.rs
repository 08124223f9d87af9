use crate::Outcome;
use clap::Subcommand;
use tessera_machine::Machine;

#[derive(Subcommand)]
pub enum MachineCmd {
    /// Print a machine description (a preset name or a TOML file).
    Show {
        name: String,
        /// Override the tile count.
        #[arg(long)]
        tiles: Option<u32>,
        /// Print the description as JSON on stdout instead of TOML
        #[arg(long)]
        json: bool,
    },
    /// List the preset names.
    List,
}

pub fn run(cmd: MachineCmd) -> anyhow::Result<Outcome> {
    match cmd {
        MachineCmd::List => {
            for p in tessera_machine::PRESETS {
                println!("{p}");
            }
        }
        MachineCmd::Show { name, tiles, json } => {
            let mut m = Machine::load(&name)?;
            if let Some(t) = tiles {
                m = m.with_tiles(t);
                m.validate()?;
            }
            if json {
                super::print_json(&m)?;
            } else {
                print!("{}", m.to_toml());
            }
        }
    }
    Ok(Outcome::Ok)
}

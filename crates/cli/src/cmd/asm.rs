//! Owned by the isa/package work: `tessera asm` and `tessera disasm`.
use crate::Outcome;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct AsmArgs {
    /// Assembly source file.
    pub input: PathBuf,
    /// Output package.
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Args)]
pub struct DisasmArgs {
    /// Package file.
    pub input: PathBuf,
    /// Only this tile's image.
    #[arg(long)]
    pub tile: Option<u32>,
    /// Only the address range of this symbol.
    #[arg(long)]
    pub symbol: Option<String>,
}

pub fn run_asm(a: AsmArgs) -> anyhow::Result<Outcome> {
    let package = match tessera_isa::assemble_file(&a.input) {
        Ok(p) => p,
        Err(e) => {
            // Diagnostics are already `file:line:col: error: ...`, one per line.
            eprintln!("{e}");
            let n = e.diagnostics.len();
            anyhow::bail!(
                "{}: {n} error{}, nothing written",
                a.input.display(),
                if n == 1 { "" } else { "s" }
            );
        }
    };
    // The package errors name the file already.
    tessera_package::write_package_file(&a.output, &package)?;
    let bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    let code: usize = package
        .tiles
        .iter()
        .flat_map(|t| &t.segments)
        .filter(|s| s.perms.execute)
        .map(|s| s.bytes.len())
        .sum();
    let n =
        |count: usize, what: &str| format!("{count} {what}{}", if count == 1 { "" } else { "s" });
    println!(
        "wrote {}: {}, {code} bytes of code in total, {}, {}, {bytes} bytes",
        a.output.display(),
        n(package.tiles.len(), "tile image"),
        n(package.exchanges.len(), "exchange"),
        n(package.bindings.len(), "binding"),
    );
    Ok(Outcome::Ok)
}

pub fn run_disasm(a: DisasmArgs) -> anyhow::Result<Outcome> {
    let package = tessera_package::read_package_file(&a.input)?;
    tessera_isa::check_filter(&package, a.tile, a.symbol.as_deref())
        .map_err(|m| anyhow::anyhow!("{}: {m}", a.input.display()))?;
    print!(
        "{}",
        tessera_isa::disassemble(&package, a.tile, a.symbol.as_deref())
    );
    Ok(Outcome::Ok)
}

//! `tessera compile`: a model into a package file.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use tessera_driver::{CompileReport, Compiled, Machine, Model, ModelSpec, Options};

use super::args::ModelArgs;
use super::progress::Bars;
use super::report::print_report;
use crate::Outcome;

#[derive(Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(short, long)]
    pub output: PathBuf,
}

/// The machine, the model `a` names, built, and the compile options.
pub struct Prepared {
    pub machine: Machine,
    pub spec: ModelSpec,
    pub model: Model,
    pub options: Options,
}

pub fn prepare(a: &ModelArgs) -> anyhow::Result<Prepared> {
    let options = a.options()?;
    let machine = a.machine()?;
    let spec = a.spec()?;
    let model = Model::build(&spec, &machine)?;
    Ok(Prepared {
        machine,
        spec,
        model,
        options,
    })
}

/// A compile that did not fit (no finalist did, with `--finalists`) is a result,
/// not a tool error: its out-of-memory report, then exit 1, as `tessera place`.
pub fn compile_or_report(a: &ModelArgs, p: &Prepared) -> anyhow::Result<Result<Compiled, Outcome>> {
    match tessera_driver::compile(&p.machine, &p.model, &p.options, &Bars::new(a.json)) {
        Ok(c) => Ok(Ok(c)),
        Err(e) if e.does_not_fit() => {
            eprintln!("error: {:#}", anyhow::Error::new(e));
            Ok(Err(Outcome::Failed))
        }
        Err(e) => Err(e.into()),
    }
}

#[derive(Serialize)]
struct CompileJson<'a> {
    output: String,
    /// The report carries `package_bytes`: a field here too would print the key twice.
    #[serde(flatten)]
    report: &'a CompileReport,
}

pub fn compile(a: CompileArgs) -> anyhow::Result<Outcome> {
    let p = prepare(&a.model)?;
    let mut c = match compile_or_report(&a.model, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    let bytes = tessera_package::write_package(&c.package);
    c.report.package_bytes = bytes.len();
    std::fs::write(&a.output, &bytes).with_context(|| format!("writing {}", a.output.display()))?;
    if a.model.json {
        super::print_json(&CompileJson {
            output: a.output.display().to_string(),
            report: &c.report,
        })?;
    } else {
        eprintln!(
            "wrote {} ({} bytes, {} tiles) in {:.0} ms",
            a.output.display(),
            bytes.len(),
            c.report.tiles_used,
            c.report.compile_ms
        );
        print_report(&c.report);
    }
    Ok(Outcome::Ok)
}

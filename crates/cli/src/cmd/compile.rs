//! `tessera compile`: a model into a package file.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Args;
use serde::Serialize;
use tessera_driver::{CompileReport, Compiled, Machine, Model, ModelSpec, Options};

use super::args::{ModelArgs, check_writable};
use super::progress::Bars;
use super::report::{count, print_report};
use crate::Outcome;

#[derive(Args)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The package file to write
    #[arg(short, long)]
    pub output: PathBuf,
    /// Refused: a profile is of a run (`tessera run --profile`)
    #[arg(long, hide = true)]
    pub profile: Option<PathBuf>,
    /// Refused: a trace is of a run (`tessera run --trace`)
    #[arg(long, hide = true)]
    pub trace: Option<PathBuf>,
}

/// The machine, the model `a` names, built, and the compile options.
pub struct Prepared {
    pub machine: Machine,
    pub spec: ModelSpec,
    pub model: Model,
    pub options: Options,
}

/// Checks `a` and the `outputs` it will write (flag, path), then loads the
/// machine and builds the model: every refusal comes before any work.
pub fn prepare(
    a: &ModelArgs,
    keep_layouts: bool,
    outputs: &[(&str, &Path)],
) -> anyhow::Result<Prepared> {
    let spec = a.spec()?;
    let options = a.options(keep_layouts)?;
    for (flag, path) in outputs {
        check_writable(flag, path)?;
    }
    let machine = a.machine()?;
    options.check(&machine)?;
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
/// With the compile, its whole wall time in milliseconds (the finalist search
/// and any finalist simulations included; the report's `compile_ms` is the
/// selected build's alone).
pub fn compile_or_report(
    a: &ModelArgs,
    p: &Prepared,
) -> anyhow::Result<Result<(Compiled, f64), Outcome>> {
    let start = Instant::now();
    match tessera_driver::compile(&p.machine, &p.model, &p.options, &Bars::new(a.json)) {
        Ok(c) => Ok(Ok((c, start.elapsed().as_secs_f64() * 1e3))),
        Err(e) if e.does_not_fit() => {
            // The figures a script wants: what is missing, in all and tile by
            // tile, beside the message the text report prints.
            let shortfall = a
                .json
                .then(|| serde_json::to_value(e.shortfall()))
                .transpose()?;
            let message = format!("{:#}", anyhow::Error::new(e));
            if let Some(mut report) = shortfall {
                report["status"] = "does_not_fit".into();
                report["error"] = message.clone().into();
                println!("{}", serde_json::to_string_pretty(&report)?);
            }
            eprintln!("error: {message}");
            Ok(Err(Outcome::Failed))
        }
        Err(e) => Err(e.into()),
    }
}

/// How long the compile took, as `tessera run` and `tessera compile` say it.
pub fn compile_time(c: &Compiled, whole_ms: f64) -> String {
    match c.report.finalists.len() {
        0 => format!("{whole_ms:.0} ms"),
        n => {
            let st = &c.report.stage_ms;
            let weights = if st.layer_weights > 0.0 {
                format!(", every layer's weights {:.0} ms", st.layer_weights)
            } else {
                String::new()
            };
            format!(
                "{whole_ms:.0} ms (fit loop {:.0} ms, {} {:.0} ms{weights}; the selected one built in {:.0} ms)",
                st.fit,
                count(n, "finalist"),
                st.finalists,
                c.report.compile_ms
            )
        }
    }
}

#[derive(Serialize)]
struct CompileJson<'a> {
    output: String,
    /// Code bytes per tile, category by category (the most on one tile): what a
    /// layer loop keeps as it was at one layer (`code.max_per_tile`).
    code_bytes_per_tile: &'a tessera_driver::CodeBytes,
    /// The report carries `package_bytes`: a field here too would print the key twice.
    #[serde(flatten)]
    report: &'a CompileReport,
}

pub fn compile(a: CompileArgs) -> anyhow::Result<Outcome> {
    for (flag, given) in [("--profile", &a.profile), ("--trace", &a.trace)] {
        if given.is_some() {
            bail!(
                "{flag} writes what a run did: `tessera compile` does not run the model (use `tessera run {flag} FILE`)"
            );
        }
    }
    let p = prepare(&a.model, false, &[("--output", &a.output)])?;
    let (mut c, whole_ms) = match compile_or_report(&a.model, &p)? {
        Ok(c) => c,
        Err(outcome) => return Ok(outcome),
    };
    let bytes = tessera_package::write_package(&c.package);
    c.report.package_bytes = bytes.len();
    std::fs::write(&a.output, &bytes).with_context(|| format!("writing {}", a.output.display()))?;
    if a.model.json {
        super::print_json(&CompileJson {
            output: a.output.display().to_string(),
            code_bytes_per_tile: &c.report.code.max_per_tile,
            report: &c.report,
        })?;
    } else {
        eprintln!(
            "wrote {} ({} bytes, {}) in {}",
            a.output.display(),
            bytes.len(),
            count(c.report.tiles_used, "tile"),
            compile_time(&c, whole_ms)
        );
        print_report(&c.report);
    }
    Ok(Outcome::Ok)
}

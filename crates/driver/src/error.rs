//! Everything the driver's calls can fail with. Each variant keeps the error it
//! came from as its source (or is that error, transparently), so that a caller
//! can match on the cause and a report can print the whole chain.

use std::path::PathBuf;

use tessera_compile::CompileError;

/// Why a driver call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Machine(#[from] tessera_machine::MachineError),
    /// A layer configuration file that could not be read.
    #[error("reading {}", path.display())]
    ReadConfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Graph(#[from] tessera_graph::GraphError),
    /// The model cannot fit the machine, found before its weights are generated.
    #[error(transparent)]
    Plan(#[from] tessera_plan::PlanError),
    /// A placement capacity outside the machine's SRAM.
    #[error(transparent)]
    Capacity(#[from] tessera_place::PlaceError),
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("loading the package")]
    Load(#[source] tessera_sim::LoadError),
    #[error(transparent)]
    Binding(#[from] tessera_sim::SimError),
    #[error(transparent)]
    Reference(#[from] tessera_reference::RefError),
    #[error(transparent)]
    Tensor(#[from] tessera_graph::TensorError),
    #[error(transparent)]
    Html(#[from] tessera_profile::html::HtmlError),
    /// A checkpoint, config, image or output file refused by the importer.
    #[error(transparent)]
    Import(#[from] tessera_import::ImportError),
    /// An ONNX file refused by its importer.
    #[error(transparent)]
    Onnx(#[from] tessera_onnx::OnnxError),
    /// An ONNX file whose batch axis is fixed, run at another batch.
    #[error("{}: the file fixes the batch at {fixed}, but the batch asked for is {batch} (export with a dynamic batch axis, or give {fixed} images)", file.display())]
    OnnxBatch {
        file: PathBuf,
        fixed: usize,
        batch: usize,
    },
    /// Images given with a batch that is not their number.
    #[error("{images} images make a batch of {images}, but the batch asked for is {batch}")]
    ImageBatch { images: usize, batch: usize },
    /// More encoder layers asked for than the checkpoint has.
    #[error("{asked} encoder layers asked for, but the checkpoint has {has}")]
    CheckpointLayers { asked: usize, has: usize },
    #[error("batch must be at least 1")]
    ZeroBatch,
    #[error("a vision tower needs at least one encoder layer")]
    ZeroLayers,
    #[error("the model has no input")]
    NoInput,
    #[error("the model has no output")]
    NoOutput,
    /// A graph output the reference or the run did not produce.
    #[error("output `{0}`: no value")]
    MissingOutput(String),
    /// A plan result naming a tensor the graph does not have (a compiler bug).
    #[error("the plan names `{0}`, not in the graph")]
    UnknownTensor(String),
    /// The perturbation's operation leaves nothing on the tiles to scale.
    #[error("perturbation: `{0}` leaves no readable tensor on the tiles")]
    NothingToPerturb(String),
    /// A measurement that needs a run to complete saw it fault.
    #[error("the run faulted: {0}")]
    Faulted(usize),
}

impl Error {
    /// A compile that did not fit (no finalist did, with the search): a result of
    /// the model and machine rather than a failure of the tool.
    pub fn does_not_fit(&self) -> bool {
        self.shortfall().is_some()
    }

    /// What a compile that did not fit misses: the tiles over their capacity by
    /// their live bytes alone, those bytes in all, and each tile's diagnosis
    /// (none where the plan was refused before placement).
    pub fn shortfall(&self) -> Option<Shortfall<'_>> {
        match self {
            Error::Compile(CompileError::DoesNotFit(d)) => {
                let (bytes_over, tiles_over) = tessera_compile::missing_in_all(d);
                Some(Shortfall {
                    tiles_over,
                    bytes_over,
                    tiles: d,
                    whole_program: None,
                })
            }
            Error::Compile(CompileError::Plan(tessera_plan::PlanError::Resident {
                total_missing,
                tiles,
                floor_missing,
                floor_tiles,
                ..
            })) => Some(Shortfall {
                tiles_over: *floor_tiles as usize,
                bytes_over: *floor_missing,
                tiles: &[],
                whole_program: Some(WholeProgram {
                    tiles_over: *tiles as usize,
                    bytes_over: *total_missing,
                }),
            }),
            _ => None,
        }
    }
}

/// See [`Error::shortfall`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct Shortfall<'a> {
    pub tiles_over: usize,
    pub bytes_over: u64,
    pub tiles: &'a [tessera_place::Diagnosis],
    /// With a plan refused before placement: what lives for the whole program
    /// alone misses, in the plan (of the fit loop's first and smallest
    /// budgets) that misses less (a lower bound for that plan), beside the
    /// totals above, which are the plan at the smallest budgets with its
    /// busiest steps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whole_program: Option<WholeProgram>,
}

/// See [`Shortfall::whole_program`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct WholeProgram {
    pub tiles_over: usize,
    pub bytes_over: u64,
}

//! Tessera as a library: the steps a user takes with a model, each one call. It owns
//! building the built-in models with their weights and inputs ([`Model`]),
//! compiling one for a machine with the finalist search ([`compile`]), simulating
//! the package on the model's inputs ([`simulate`]), validating the run against
//! the f32 and f16-storage references, operation by operation ([`validate`]),
//! charging the run's cycles to the plan's operations with their floors, the
//! encoder interval and its layers ([`attribute`]; an operation's layer is
//! [`layer_of`] its name), and what is assembled from those (the HTML
//! profile, the trace, the timing-sensitivity sweep). The command line is a shell
//! over it; tests and programs call it directly.
//!
//! A model comes built in ([`ModelSpec`]) or from outside: a Hugging Face
//! checkpoint ([`ModelKind::HuggingFace`]), an ONNX file ([`ModelKind::Onnx`]:
//! `tessera_onnx` canonicalises it into Hugging Face tensors), or any Hugging
//! Face tensors with their config ([`Model::import`], which both take).
//!
//! It must never print, read the environment or exit: progress goes to the
//! caller's [`Progress`], failures are typed [`Error`]s that keep their sources.
//! It must never decide a mapping, an address or an instruction's timing itself
//! (the planner, placement and the simulator do), and no knob here may change a
//! package unless the caller set it: the default options build what
//! `tessera compile` builds, byte for byte.

mod attribute;
mod compile;
mod error;
mod html;
mod layers;
mod model;
mod progress;
mod sensitivity;
mod simulate;
mod validate;

pub use attribute::{Attribution, Interval, OpRow, attribute, op_flop, superstep_layers};
pub use compile::{MAX_FINALISTS, Options, compile, median_estimate_error};
pub use error::{Error, Shortfall, WholeProgram};
pub use html::{chrome_trace, profile_html};
pub use layers::{LayerRow, SummedOp, layer_of, layers_in, sum_over_layers};
pub use model::{Import, LayerDims, Model, ModelKind, ModelSpec, Size, onnx_fixed_batch};
pub use progress::{NoProgress, Progress, Step};
pub use sensitivity::{
    ASSUMPTIONS, Assumption, BoundRow, EXCHANGE_CODE_BOUNDS, EXCHANGE_RULE_BOUNDS,
    RULE_ASSUMPTIONS, Sensitivity, SensitivityRow, Variant, sensitivity,
};
pub use simulate::{Run, SimulateOptions, simulate};
pub use validate::{
    Mismatch, OpCheck, OutputCheck, Perturbed, RunStatus, TensorCheck, ULPS, Validation,
    encoder_layers, output_tolerance, tolerance, validate,
};

// What a caller needs to name the inputs and results of these calls without
// depending on every crate behind them.
pub use tessera_compile::error_chain;
pub use tessera_compile::finalists::FinalistReport;
pub use tessera_compile::{
    CodeBytes, CodeSummary, CompileError, CompileReport, Compiled, HostReport, PlacementSummary,
};
pub use tessera_graph::{EncoderLayerConfig, Graph, HostTensor, Inputs, MlpConfig, Weights};
pub use tessera_import::{
    Checkpoint, ImportError, TensorSource, VisionConfig, parse_config, write_output,
};
pub use tessera_kernels::{KernelMutation, MUTABLE, MutableKernel};
pub use tessera_machine::Machine;
pub use tessera_plan::{Experimental, PlanEstimate, WeightDtype};
pub use tessera_sim::{Fault, SimReport, Status};

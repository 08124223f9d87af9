//! The tile-plan IR: per-tile buffers with lifetimes and access requirements, kernel
//! calls bound to buffers, exchange copies between buffers, and host bindings. No
//! addresses: placement turns buffers into addresses, emission turns calls and copies
//! into code and exchange programs.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use tessera_kernels::{
    Add, AddBias, AmpMatmul, BlocksToRows, ColExpShift, ColMax, Contract, ExpShift, Fp8ToF16, Gelu,
    Kernel, LayerNorm, MemClass, Rearrange, RecipSum, ReduceAdd, ReduceNorm, RowMax, ScaleCols,
    ScaleRows, Softmax, SoftmaxCols, TransposeBlocks, ZeroFill,
};

/// A BSP step index. Buffer lifetimes are inclusive step ranges.
pub type Step = u32;

/// Names one buffer of a plan; prints as `buf12`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct BufId(pub u32);

impl fmt::Display for BufId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "buf{}", self.0)
    }
}

/// What a buffer holds, for memory reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Activation,
    Weight,
    /// The one resident copy of staged weights, which an exchange copies into
    /// `Weight` buffers while their operation runs.
    WeightStore,
    Partial,
    VertexState,
}

impl Category {
    pub fn name(self) -> &'static str {
        match self {
            Category::Activation => "activations",
            Category::Weight => "weights",
            Category::WeightStore => "weight_store",
            Category::Partial => "partials",
            Category::VertexState => "vertex_state",
        }
    }
}

/// One tensor-like buffer on one tile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Buffer {
    pub id: BufId,
    pub tile: u32,
    pub name: String,
    pub bytes: u32,
    /// The strictest alignment any use declares.
    pub align: u32,
    pub class: MemClass,
    pub tail: u32,
    pub first: Step,
    pub last: Step,
    pub category: Category,
    /// Copies of the buffer, one per iteration of the plan's layer loop (1
    /// elsewhere): a layer's weight store, which iteration `i` reads at
    /// [`Buffer::stride`] times `i` past the first copy.
    pub instances: u32,
}

impl Buffer {
    /// Bytes from one instance to the next: the size rounded up to 8 and to the
    /// buffer's alignment, so every instance keeps both.
    pub fn stride(&self) -> u32 {
        self.bytes.next_multiple_of(self.align.max(8))
    }

    /// Bytes all its instances take.
    pub fn total_bytes(&self) -> u64 {
        if self.instances <= 1 {
            u64::from(self.bytes)
        } else {
            u64::from(self.stride()) * u64::from(self.instances)
        }
    }
}

/// The kernels the planner can call.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelKind {
    Rearrange(Rearrange),
    Matmul(AmpMatmul),
    LayerNorm(LayerNorm),
    Gelu(Gelu),
    Add(Add),
    AddBias(AddBias),
    ReduceAdd(ReduceAdd),
    Softmax(Softmax),
    ZeroFill(ZeroFill),
    BlocksToRows(BlocksToRows),
    TransposeBlocks(TransposeBlocks),
    RowMax(RowMax),
    ExpShift(ExpShift),
    ColMax(ColMax),
    ColExpShift(ColExpShift),
    ReduceNorm(ReduceNorm),
    ScaleRows(ScaleRows),
    ScaleCols(ScaleCols),
    SoftmaxCols(SoftmaxCols),
    RecipSum(RecipSum),
    Fp8ToF16(Fp8ToF16),
}

impl KernelKind {
    pub fn kernel(&self) -> &dyn Kernel {
        match self {
            KernelKind::Rearrange(k) => k,
            KernelKind::Matmul(k) => k,
            KernelKind::LayerNorm(k) => k,
            KernelKind::Gelu(k) => k,
            KernelKind::Add(k) => k,
            KernelKind::AddBias(k) => k,
            KernelKind::ReduceAdd(k) => k,
            KernelKind::Softmax(k) => k,
            KernelKind::ZeroFill(k) => k,
            KernelKind::BlocksToRows(k) => k,
            KernelKind::TransposeBlocks(k) => k,
            KernelKind::RowMax(k) => k,
            KernelKind::ExpShift(k) => k,
            KernelKind::ColMax(k) => k,
            KernelKind::ColExpShift(k) => k,
            KernelKind::ReduceNorm(k) => k,
            KernelKind::ScaleRows(k) => k,
            KernelKind::ScaleCols(k) => k,
            KernelKind::SoftmaxCols(k) => k,
            KernelKind::RecipSum(k) => k,
            KernelKind::Fp8ToF16(k) => k,
        }
    }
    pub fn contract(&self) -> Contract {
        self.kernel().contract()
    }

    /// Whether the kernel reads `operand` at the layer loop's current offset
    /// (`$m13`) past its address: only such an operand may be in a weight store.
    pub fn reads_by_layer(&self, operand: &str) -> bool {
        matches!(self, KernelKind::Fp8ToF16(k) if k.layered && operand == "src")
    }
}

macro_rules! kernel_kind_from {
    ($($kernel:ident => $variant:ident),* $(,)?) => {
        $(impl From<$kernel> for KernelKind {
            fn from(k: $kernel) -> Self {
                KernelKind::$variant(k)
            }
        })*
    };
}

kernel_kind_from!(
    Rearrange => Rearrange,
    AmpMatmul => Matmul,
    LayerNorm => LayerNorm,
    Gelu => Gelu,
    Add => Add,
    AddBias => AddBias,
    ReduceAdd => ReduceAdd,
    Softmax => Softmax,
    ZeroFill => ZeroFill,
    BlocksToRows => BlocksToRows,
    TransposeBlocks => TransposeBlocks,
    RowMax => RowMax,
    ExpShift => ExpShift,
    ColMax => ColMax,
    ColExpShift => ColExpShift,
    ReduceNorm => ReduceNorm,
    ScaleRows => ScaleRows,
    ScaleCols => ScaleCols,
    SoftmaxCols => SoftmaxCols,
    RecipSum => RecipSum,
    Fp8ToF16 => Fp8ToF16,
);

/// A place inside a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Loc {
    pub buf: BufId,
    pub offset: u32,
}

/// One kernel invocation on one tile at one step. Operand names follow the kernel's
/// contract; `state` is the call's vertex-state buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub tile: u32,
    pub step: Step,
    pub kernel: KernelKind,
    pub operands: BTreeMap<String, Loc>,
    pub state: BufId,
}

/// Bytes from one buffer to the same offsets' worth of bytes in one or more buffers
/// on other tiles, in one exchange phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Copy {
    pub src: Loc,
    pub bytes: u32,
    pub dsts: Vec<Loc>,
}

/// One exchange phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Exchange {
    pub id: u16,
    pub name: String,
    pub step: Step,
    pub copies: Vec<Copy>,
}

/// What happens at a step, chip-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// Host inputs arrive.
    HostIn,
    /// Tiles run their calls of this step.
    Compute,
    /// Exchange phase with this id.
    Exchange(u16),
    /// Host outputs leave.
    HostOut,
}

/// Direction of a host binding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BindingDir {
    /// Host to tiles, every run.
    Input,
    /// Tiles to host, every run.
    Output,
    /// Host to tiles once, at initialisation; the plan carries the image.
    Weight,
}

/// A byte range of a host buffer that lives in a buffer on a tile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Slice {
    pub loc: Loc,
    /// Which instance of the buffer (see [`Buffer::instances`]).
    pub instance: u32,
    /// Byte offset in the host buffer.
    pub offset: u32,
    pub bytes: u32,
}

/// A named host tensor and where its bytes live on the tiles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Binding {
    pub name: String,
    pub dir: BindingDir,
    pub bytes: u32,
    pub slices: Vec<Slice>,
    /// The host image of a weight binding (`bytes` long): the device layout of every
    /// tile's part, concatenated; empty for inputs and outputs.
    #[serde(skip)]
    pub data: Vec<u8>,
}

/// Steps run several times: the body of a model's identical layers, lowered
/// once. The supervisor runs steps `first..=last` `count` times; iteration `i`
/// stands for the graph operations of layer `i` (named with `prefix` and `i`
/// where the body's are named with 0: `layers.0.mlp.fc1` in the body is
/// `layers.5.mlp.fc1` in iteration 5), reads its weights from instance `i` of
/// the weight stores, and ends by copying its output into the buffers its input
/// came in, which the next iteration reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LayerLoop {
    pub first: Step,
    pub last: Step,
    pub count: u32,
    pub prefix: String,
}

impl LayerLoop {
    /// The name in iteration `i` of a body operation named `name`.
    pub fn rename(&self, name: &str, i: u32) -> String {
        let zero = format!("{}0.", self.prefix);
        match name.strip_prefix(&zero) {
            Some(rest) => format!("{}{i}.{rest}", self.prefix),
            None => name.to_string(),
        }
    }

    /// The iteration a body operation named `name` belongs to (`rename`'s
    /// inverse), `None` for a name outside the loop.
    pub fn layer_of(&self, name: &str) -> Option<u32> {
        let rest = name.strip_prefix(&self.prefix)?;
        rest.split_once('.')?.0.parse().ok()
    }

    pub fn contains(&self, step: Step) -> bool {
        (self.first..=self.last).contains(&step)
    }
}

/// A whole tile plan.
#[derive(Debug, Clone, Default)]
pub struct TilePlan {
    /// The layer loop, when the plan has one.
    pub layer_loop: Option<LayerLoop>,
    /// Products whose weights are stored as FP8: the graph operation, the scale
    /// and the factor the stored weight is the graph's times (a folded attention
    /// scale, a GELU's halving), for a reference that rounds as the program does.
    pub fp8_weights: Vec<(String, i8, f32)>,
    /// A plan lowered for its shape only: its later layers' weight bindings hold
    /// the first layer's bytes. A finalist compiled from it has its weights
    /// filled in before it is used (`tessera_compile::complete_layer_weights`).
    pub layer_weights_pending: bool,
    /// The later layers' weights were made from their parameters by the
    /// body's recipes, not by replaying the body (`lower/recipe.rs`).
    pub layer_weights_by_recipe: bool,
    pub tiles: u32,
    pub steps: Vec<StepKind>,
    /// The graph operation each step belongs to (empty for host transfers), for
    /// per-operation profiles.
    pub step_ops: Vec<String>,
    pub buffers: Vec<Buffer>,
    pub calls: Vec<Call>,
    pub exchanges: Vec<Exchange>,
    pub bindings: Vec<Binding>,
    /// Pairs of buffers on one tile that a kernel streams in the same issue.
    pub separations: Vec<(BufId, BufId)>,
    /// Human-readable notes on each mapping decision, for reports.
    pub decisions: Vec<String>,
    /// The operations as lowered, in order: what each rule covered.
    pub ops: Vec<PlanOp>,
    /// The strategies each operation with a choice was offered, in lowering order.
    pub candidates: Vec<OpCandidates>,
    /// The graph tensors each operation computes and where the ones that exist on
    /// the tiles live when it ends, in lowering order: what a run can be checked
    /// against op by op.
    pub results: Vec<OpResult>,
}

/// One graph tensor an operation of [`TilePlan::ops`] computes (its own output or
/// a fused operation's).
#[derive(Debug, Clone, PartialEq)]
pub struct OpResult {
    /// Index into [`TilePlan::ops`].
    pub op: usize,
    /// The graph operation whose output this is.
    pub tensor: String,
    /// Where it lives when the operation's last step ends; `None` when it never
    /// exists whole on the tiles (an intermediate of a fused epilogue, a projection
    /// folded away), with the reason in `note`.
    pub stored: Option<StoredTensor>,
    pub note: Option<String>,
}

/// How a graph tensor sits in a distributed tensor: as 2-D rows (the product of
/// the leading dimensions of its merged form) and logical columns, each logical
/// column `c` at stored column `offset + physical(c)`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTensor {
    pub t: crate::dist::DistTensor,
    /// `(heads, d, dp)`: `heads` runs of `d` logical columns, each stored in `dp`;
    /// `None` for dense columns. A 4-D `[batch, heads, tokens, d]` graph tensor
    /// with such a layout is stored merged, `[batch * tokens, heads * dp]`.
    pub heads: Option<(u32, u32, u32)>,
    pub offset: u32,
    /// The stored values are the graph tensor's times this (an attention's scale
    /// folded into its query projection); 1 otherwise.
    pub scale: f32,
}

impl StoredTensor {
    /// Stored column of logical column `c`.
    pub fn stored_col(&self, c: u32) -> u32 {
        self.offset
            + match self.heads {
                None => c,
                Some((_, d, dp)) => (c / d) * dp + c % d,
            }
    }

    /// Logical columns of the merged 2-D form.
    pub fn logical_cols(&self) -> u32 {
        match self.heads {
            None => self.t.cols - self.offset,
            Some((heads, d, _)) => heads * d,
        }
    }
}

/// One strategy a rule offered for an operation: what the finalist search chooses
/// among.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// The rule's own estimate of the operation's cycles.
    pub estimated_cycles: u64,
    /// Tensor bytes on the operation's busiest tile.
    pub bytes_per_tile: u64,
    /// The grid, as `passes x (rows, inner, columns)`.
    pub grid: String,
    /// Row passes; each pass receives its input and sends its output once.
    pub passes: u32,
    /// Input bytes the busiest tile receives per pass (the AMP operand blocks).
    pub in_bytes_per_tile: u64,
    /// Output bytes the busiest tile holds per pass, which a consumer's
    /// redistribution sends from it.
    pub out_bytes_per_tile: u64,
    /// Needs more than the activation budget (`LowerOptions::transient_bytes`):
    /// offered to the fit loop's growth phase, which checks the whole plan's
    /// bytes; the finalist search takes it only where growth did.
    pub beyond_budget: bool,
}

/// The strategies an operation was offered (none dominated by another on both
/// cycles and bytes; the first is the rule's default) and the one the plan used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpCandidates {
    pub op: String,
    /// The operation with strategies whose output this one reads directly (its
    /// layout then decides this input's redistribution).
    pub input_from: Option<String>,
    pub candidates: Vec<Candidate>,
    pub chosen: usize,
}

/// One lowered operation: the graph operation a rule matched and the ones it fused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanOp {
    /// The graph operation's name; steps of this operation carry it.
    pub name: String,
    /// The rule: `linear`, `attention`, `layer_norm`, `output`.
    pub kind: String,
    /// Graph operations lowered with it (epilogues, views, the softmax).
    pub fused: Vec<String>,
    /// A matmul whose inner dimension is split over tiles: 16-wide chunks per
    /// inner group (each group's f16 partial is rounded before the groups are
    /// summed), for a reference that rounds where the program does.
    pub inner_chunks: Option<u32>,
    /// FLOP of its matrix products as lowered, where the rule computes something
    /// other than the graph's products (an attention with its projections
    /// absorbed); `None` where they are the graph's.
    pub flop: Option<u64>,
}

impl TilePlan {
    /// The operations whose weights a layered kernel reads from the layer
    /// loop's store (resident in their layout, `LowerOptions::resident`), in
    /// name order.
    pub fn resident_linears(&self) -> Vec<String> {
        let names: std::collections::BTreeSet<&String> = self
            .calls
            .iter()
            .filter(|c| c.kernel.reads_by_layer("src"))
            .map(|c| &self.step_ops[c.step as usize])
            .collect();
        names.into_iter().cloned().collect()
    }

    pub fn buffer(&self, id: BufId) -> &Buffer {
        &self.buffers[id.0 as usize]
    }

    pub fn last_step(&self) -> Step {
        self.steps.len().saturating_sub(1) as Step
    }

    /// Adds a buffer live at no step yet; uses extend its lifetime.
    pub(crate) fn add_buffer(
        &mut self,
        tile: u32,
        name: String,
        bytes: u32,
        category: Category,
    ) -> BufId {
        let id = BufId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            id,
            tile,
            name,
            bytes,
            align: 4,
            class: MemClass::Any,
            tail: 0,
            first: Step::MAX,
            last: 0,
            category,
            instances: 1,
        });
        id
    }

    pub(crate) fn touch(&mut self, id: BufId, step: Step) {
        let b = &mut self.buffers[id.0 as usize];
        b.first = b.first.min(step);
        b.last = b.last.max(step);
    }
}

//! The lowering context the rules share: steps handed out as operations are
//! lowered, buffers whose lifetimes follow their uses, constants streamed from the
//! host once, kernel calls bound to buffers, exchange phases and host bindings.

use std::collections::{BTreeMap, HashMap};

use half::f16;
use tessera_machine::Machine;

use super::recipe::{LinearSource, Recipe};
use crate::dist::{DistTensor, Part};
use crate::ir::*;
use crate::lower::LowerOptions;
use tessera_kernels::{Contract, MemClass};

/// A weight binding under construction: distinct tile images, concatenated.
#[derive(Default)]
struct WeightImage {
    image: Vec<u8>,
    /// Tile image -> its offset in `image`.
    // Keys are whole weight slices (tens of kilobytes, one per tile): a fast
    // hash, since only the lookup depends on it (offsets go in creation order).
    offsets: HashMap<Vec<u8>, u32, foldhash::fast::FixedState>,
    slices: Vec<Slice>,
}

impl WeightImage {
    /// Where `bytes` are in the image, added at its end unless an earlier
    /// tile's are the same: tiles that hold identical weights (replicas over
    /// row groups) share one copy in the host image, several slices at it.
    fn offset_of(&mut self, bytes: Vec<u8>) -> u32 {
        let image = &mut self.image;
        *self.offsets.entry(bytes).or_insert_with_key(|b| {
            let at = image.len() as u32;
            image.extend_from_slice(b);
            at
        })
    }
}

pub(crate) struct Lowering<'a> {
    pub plan: TilePlan,
    weights: BTreeMap<String, WeightImage>,
    pub machine: &'a Machine,
    pub opts: &'a LowerOptions,
    /// Buffers that live to the end of the program (constants, vertex states);
    /// their lifetimes are closed when the last step is known.
    forever: Vec<BufId>,
    inputs: Vec<Binding>,
    /// Output bindings: name, host bytes, slices; bound at the last step.
    outputs: Vec<(String, u32, Vec<Slice>)>,
    /// The graph operation being lowered; steps handed out now belong to it.
    pub op: String,
    /// The current operation's staging phase, with `LowerOptions::stage_weights`.
    staging: Option<Staging>,
    /// Which tile each store chunk goes to.
    spread: StoreSpread,
    /// While the layer loop's body is lowered.
    body: Option<Body>,
    /// The body as it was lowered, once it is closed: what replays follow.
    lowered_body: Option<Body>,
    /// While a later layer replays the body for its weights.
    replay: Option<Replay>,
    /// Each later layer's weight images, by the body binding they stand for.
    layer_images: BTreeMap<(u32, String), LayerImage>,
    /// The first way a replay differed from the body.
    pub replay_error: Option<String>,
    /// The contracts of the kernels called last, most recent first: a kernel's
    /// contract counts its code bytes by emitting it, and a rule calls the
    /// same kernel on tile after tile (a fifth of a 27-layer compile's replays
    /// went to emitting them again).
    contracts: Vec<(KernelKind, std::sync::Arc<Contract>)>,
}

/// Kernels whose contracts [`Lowering::contract`] keeps.
const CONTRACTS_KEPT: usize = 8;

/// The layer loop's body under construction.
#[derive(Default)]
struct Body {
    count: u32,
    /// Each tile's store of the body's weights: one buffer, an instance a layer.
    stores: BTreeMap<u32, BufId>,
    /// Every constant the body made, in order: (binding, offset in its image,
    /// bytes). A replay's `k`-th constant lands where the body's `k`-th did.
    constants: Vec<(String, u32, u32)>,
    /// How each of them follows from its layer's parameters, where known.
    recipes: Vec<Option<Recipe>>,
    /// The linears the recipes name.
    sources: Vec<LinearSource>,
}

/// A later layer lowering the body again to produce its weights.
struct Replay {
    layer: u32,
    /// Constants made so far.
    made: usize,
}

/// One binding's image for one later layer, and which offsets are written.
struct LayerImage {
    image: Vec<u8>,
    written: std::collections::HashSet<u32>,
}

/// What a replay adds to the plan, to be taken back: lengths before it, and
/// every earlier buffer's lifetime.
pub(crate) struct Snapshot {
    steps: usize,
    buffers: usize,
    calls: usize,
    exchanges: usize,
    separations: usize,
    decisions: usize,
    ops: usize,
    candidates: usize,
    results: usize,
    forever: usize,
    lifetimes: Vec<(Step, Step)>,
}

/// Where weight-store chunks go: to the tile storing the fewest bytes so far
/// (a layer-loop body's chunk counted once a layer), the one waiting longest
/// among equals. Going round the tiles in order instead leaves the few tiles
/// that take a bias's or a LayerNorm's small chunk each layer the busiest by
/// that chunk times the depth: 13.8 KB more on each such tile at 27 So400m
/// layers (307,096 bytes stored on the busiest tile at batch 4, 293,784 now).
#[derive(Debug, Clone)]
struct StoreSpread {
    /// (bytes stored, turn, tile), least first.
    queue: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u64, u32)>>,
    turns: u64,
    /// Bytes each tile stored outside `take` (resident weights) not yet in
    /// its queue entry: added when the entry comes up.
    charged: Vec<u64>,
}

impl StoreSpread {
    fn new(tiles: u32) -> Self {
        StoreSpread {
            queue: (0..tiles)
                .map(|t| std::cmp::Reverse((0, u64::from(t), t)))
                .collect(),
            turns: u64::from(tiles),
            charged: vec![0; tiles as usize],
        }
    }

    /// `bytes` stored on `tile` by other means than [`Self::take`].
    fn charge(&mut self, tile: u32, bytes: u64) {
        if let Some(c) = self.charged.get_mut(tile as usize) {
            *c += bytes;
        }
    }

    /// The tile to store a chunk costing `bytes` of its SRAM, other than those
    /// in `holding` (which already store a chunk of the same image). Each chunk
    /// is a host slice, a descriptor record an instance, and the descriptors'
    /// reservation is the busiest tile's: a tile far behind (one of the few
    /// an image's chunks do not reach) would otherwise take every small image's
    /// chunks, a few hundred records.
    fn take(&mut self, bytes: u64, holding: &std::collections::BTreeSet<u32>) -> u32 {
        let mut passed = Vec::new();
        let (stored, tile) = loop {
            let std::cmp::Reverse((stored, turn, tile)) = self
                .queue
                .pop()
                .expect("an image has no more chunks than tiles");
            let extra = std::mem::take(&mut self.charged[tile as usize]);
            if extra > 0 {
                // Behind by what it stores otherwise: in the queue again at
                // its true count.
                self.queue
                    .push(std::cmp::Reverse((stored + extra, turn, tile)));
                continue;
            }
            if !holding.contains(&tile) {
                break (stored, tile);
            }
            passed.push(std::cmp::Reverse((stored, turn, tile)));
        };
        self.queue.extend(passed);
        self.queue
            .push(std::cmp::Reverse((stored + bytes, self.turns, tile)));
        self.turns += 1;
        tile
    }
}

/// Constants of one operation streamed from their store into compute buffers by an
/// exchange before the operation's first step.
struct Staging {
    /// The exchange's index in `plan.exchanges` and its step.
    exchange: usize,
    step: Step,
    /// Compute buffers to fill: (buffer, weight binding, offset in its image, bytes).
    fills: Vec<(BufId, String, u32, u32)>,
}

/// The smallest piece of a weight image one tile stores: smaller pieces would
/// only add messages.
const STORE_CHUNK_MIN: u32 = 512;

pub(crate) fn f16_bytes(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|v| f16::from_f32(v).to_le_bytes())
        .collect()
}

/// `total` split into runs of `per` (the last one shorter): (start, len).
pub(crate) fn groups(total: u32, per: u32) -> Vec<(u32, u32)> {
    (0..total.div_ceil(per.max(1)))
        .map(|g| (g * per, per.min(total - g * per)))
        .collect()
}

impl<'a> Lowering<'a> {
    pub fn new(machine: &'a Machine, opts: &'a LowerOptions) -> Self {
        Lowering {
            plan: TilePlan {
                steps: vec![StepKind::HostIn],
                step_ops: vec![String::new()],
                ..TilePlan::default()
            },
            weights: BTreeMap::new(),
            machine,
            opts,
            forever: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            op: String::new(),
            staging: None,
            spread: StoreSpread::new(machine.tiles.max(1)),
            body: None,
            lowered_body: None,
            replay: None,
            layer_images: BTreeMap::new(),
            replay_error: None,
            contracts: Vec::new(),
        }
    }

    /// `kernel`'s contract, made once while the kernel is among the last few
    /// called.
    fn contract(&mut self, kernel: &KernelKind) -> std::sync::Arc<Contract> {
        let hit = self.contracts.iter().position(|(k, _)| k == kernel);
        let entry = match hit {
            Some(i) => self.contracts.remove(i),
            None => {
                self.contracts.truncate(CONTRACTS_KEPT - 1);
                (kernel.clone(), std::sync::Arc::new(kernel.contract()))
            }
        };
        let contract = std::sync::Arc::clone(&entry.1);
        self.contracts.insert(0, entry);
        contract
    }

    /// `name` as the body's operation it stands for: during layer `l`'s replay,
    /// `layers.<l>.x` is the body's `layers.0.x`.
    pub fn body_name<'n>(&self, name: &'n str) -> std::borrow::Cow<'n, str> {
        match &self.replay {
            Some(r) => {
                let from = format!("{}{}.", super::layers::PREFIX, r.layer);
                match name.strip_prefix(&from) {
                    Some(rest) => format!("{}0.{rest}", super::layers::PREFIX).into(),
                    None => name.into(),
                }
            }
            None => name.into(),
        }
    }

    /// Starts the layer loop's body: the steps from here to
    /// [`Self::end_body`] run `count` times.
    pub fn begin_body(&mut self, count: u32) {
        self.body = Some(Body {
            count,
            ..Body::default()
        });
    }

    /// Ends the body's lowering (its steps are all handed out).
    pub fn end_body(&mut self) {
        self.lowered_body = self.body.take();
    }

    /// Starts layer `layer`'s replay of the body; returns what to restore.
    pub fn begin_replay(&mut self, layer: u32) -> Snapshot {
        self.replay = Some(Replay { layer, made: 0 });
        let p = &self.plan;
        Snapshot {
            steps: p.steps.len(),
            buffers: p.buffers.len(),
            calls: p.calls.len(),
            exchanges: p.exchanges.len(),
            separations: p.separations.len(),
            decisions: p.decisions.len(),
            ops: p.ops.len(),
            candidates: p.candidates.len(),
            results: p.results.len(),
            forever: self.forever.len(),
            lifetimes: p.buffers.iter().map(|b| (b.first, b.last)).collect(),
        }
    }

    /// Ends a replay: checks it made the body's steps and constants, and takes
    /// back everything it added to the plan (its weights are kept). `Err` names
    /// what differs.
    pub fn end_replay(&mut self, snap: Snapshot, body_steps: &[StepKind]) -> Result<(), String> {
        let replay = self.replay.take().expect("a replay is open");
        let made = self.lowered_body.as_ref().map_or(0, |b| b.constants.len());
        let steps = &self.plan.steps[snap.steps..];
        let same_steps = steps.len() == body_steps.len()
            && steps
                .iter()
                .zip(body_steps)
                .all(|(a, b)| std::mem::discriminant(a) == std::mem::discriminant(b));
        let result = if !same_steps {
            Err(format!(
                "layer {} lowers to {} steps where the first lowers to {}",
                replay.layer,
                steps.len(),
                body_steps.len()
            ))
        } else if replay.made != made {
            Err(format!(
                "layer {} makes {} constants where the first makes {made}",
                replay.layer, replay.made
            ))
        } else {
            Ok(())
        };
        let p = &mut self.plan;
        p.steps.truncate(snap.steps);
        p.step_ops.truncate(snap.steps);
        p.buffers.truncate(snap.buffers);
        p.calls.truncate(snap.calls);
        p.exchanges.truncate(snap.exchanges);
        p.separations.truncate(snap.separations);
        p.decisions.truncate(snap.decisions);
        p.ops.truncate(snap.ops);
        p.candidates.truncate(snap.candidates);
        p.results.truncate(snap.results);
        for (b, (first, last)) in p.buffers.iter_mut().zip(snap.lifetimes) {
            b.first = first;
            b.last = last;
        }
        self.forever.truncate(snap.forever);
        result
    }

    /// A replay's constant: its bytes go into its layer's image of the body
    /// binding the body's constant of the same rank went to, at the same offset.
    fn replayed_constant(&mut self, bytes: &[u8]) -> Result<(), String> {
        let replay = self.replay.as_mut().expect("a replay is open");
        let body = self
            .lowered_body
            .as_ref()
            .expect("the body precedes replays");
        let Some((binding, offset, len)) = body.constants.get(replay.made).cloned() else {
            return Err(format!(
                "layer {} makes more constants than the first",
                replay.layer
            ));
        };
        replay.made += 1;
        if len as usize != bytes.len() {
            return Err(format!(
                "layer {}'s constant {} has {} bytes where the first's has {len}",
                replay.layer,
                replay.made - 1,
                bytes.len()
            ));
        }
        let full = self.weights[&binding].image.len();
        let img = self
            .layer_images
            .entry((replay.layer, binding.clone()))
            .or_insert_with(|| LayerImage {
                image: vec![0; full],
                written: Default::default(),
            });
        let range = offset as usize..(offset + len) as usize;
        if !img.written.insert(offset) && img.image[range.clone()] != *bytes {
            // The first layer's image holds one copy of equal bytes; this layer's
            // are not equal there, so one image layout cannot serve both.
            return Err(format!(
                "layer {}'s `{binding}` differs where the first layer's repeats",
                replay.layer
            ));
        }
        img.image[range].copy_from_slice(bytes);
        Ok(())
    }

    /// Opens the staging phase of the operation about to be lowered: with
    /// `LowerOptions::stage_weights`, the constants it creates live only while
    /// it runs, filled from their store (one copy of each on the tiles, spread
    /// over all of them) by this exchange. Without it, nothing happens.
    pub fn begin_staging(&mut self) {
        if !self.opts.staged() {
            return;
        }
        let exchange = self.plan.exchanges.len();
        let id = u16::try_from(exchange).expect("exchange ids fit 16 bits");
        let step = self.step(StepKind::Exchange(id));
        self.plan.exchanges.push(Exchange {
            id,
            name: format!("{}.stage", self.op),
            step,
            copies: Vec::new(),
        });
        self.staging = Some(Staging {
            exchange,
            step,
            fills: Vec::new(),
        });
    }

    /// Closes the staging phase: the operation's weight images are complete, so
    /// each is cut into chunks stored round the tiles (its host binding lands
    /// there) and every compute buffer gets the copies that fill it.
    pub fn end_staging(&mut self) {
        let Some(st) = self.staging.take() else {
            return;
        };
        if self.replay.is_some() {
            return;
        }
        // Each touched binding's store: (chunk bytes, where each chunk is).
        let mut stores: BTreeMap<String, (u32, Vec<Loc>)> = BTreeMap::new();
        for (_, name, _, _) in &st.fills {
            if stores.contains_key(name) {
                continue;
            }
            let len = self
                .weights
                .get(name)
                .expect("a fill names its binding")
                .image
                .len() as u32;
            let tiles = self.machine.tiles.max(1);
            let chunk = len.div_ceil(tiles).max(STORE_CHUNK_MIN).next_multiple_of(8);
            let mut bufs = Vec::new();
            let mut holding = std::collections::BTreeSet::new();
            // A body's chunk is stored once a layer.
            let instances = u64::from(self.body.as_ref().map_or(1, |b| b.count));
            let mut slices = Vec::new();
            for (i, at) in (0..len).step_by(chunk as usize).enumerate() {
                let bytes = chunk.min(len - at);
                let tile = self
                    .spread
                    .take(u64::from(bytes.next_multiple_of(8)) * instances, &holding);
                holding.insert(tile);
                // The body's chunks on a tile share one store, an instance a
                // layer: an iteration reads its layer's at one offset.
                let loc = if self.body.is_some() {
                    self.body_store_space(tile, bytes)
                } else {
                    let id = self.plan.add_buffer(
                        tile,
                        format!("{}.store{i}", &name["weights/".len()..]),
                        bytes,
                        Category::WeightStore,
                    );
                    self.plan.touch(id, 0);
                    self.forever.push(id);
                    Loc { buf: id, offset: 0 }
                };
                slices.push(Slice {
                    loc,
                    instance: 0,
                    offset: at,
                    bytes,
                });
                bufs.push(loc);
            }
            self.weights.get_mut(name).expect("made above").slices = slices;
            stores.insert(name.clone(), (chunk, bufs));
        }
        // One copy per store chunk a compute buffer overlaps; replicas of the
        // same bytes merge into one message with several destinations.
        let mut copies: BTreeMap<(Loc, u32), Vec<Loc>> = BTreeMap::new();
        for (buf, name, offset, bytes) in &st.fills {
            let (chunk, bufs) = &stores[name];
            let mut at = *offset;
            while at < offset + bytes {
                let c = at / chunk;
                let within = at - c * chunk;
                let n = (chunk - within).min(offset + bytes - at);
                let chunk_at = bufs[c as usize];
                let src = Loc {
                    buf: chunk_at.buf,
                    offset: chunk_at.offset + within,
                };
                copies.entry((src, n)).or_default().push(Loc {
                    buf: *buf,
                    offset: at - offset,
                });
                at += n;
            }
        }
        for ((src, bytes), dsts) in copies {
            self.plan.touch(src.buf, st.step);
            for d in &dsts {
                self.plan.touch(d.buf, st.step);
            }
            self.plan.exchanges[st.exchange]
                .copies
                .push(Copy { src, bytes, dsts });
        }
    }

    /// `bytes` more of the body's store on `tile` (made on first use: one
    /// buffer, an instance a layer), 8-byte aligned; where they start.
    fn body_store_space(&mut self, tile: u32, bytes: u32) -> Loc {
        let body = self.body.as_mut().expect("a body is open");
        let buf = *body.stores.entry(tile).or_insert_with(|| {
            let id =
                self.plan
                    .add_buffer(tile, "layers.store".to_string(), 0, Category::WeightStore);
            self.plan.buffers[id.0 as usize].instances = body.count;
            self.plan.touch(id, 0);
            self.forever.push(id);
            id
        });
        let b = &mut self.plan.buffers[buf.0 as usize];
        let offset = b.bytes.next_multiple_of(8);
        b.bytes = offset + bytes;
        Loc { buf, offset }
    }

    /// Whether the operation being lowered keeps its weights resident in the
    /// body's store (`LowerOptions::resident`), read by layered kernels.
    pub fn resident_here(&self, op: &str) -> bool {
        (self.body.is_some() || self.replay.is_some())
            && self.opts.resident.contains(self.body_name(op).as_ref())
    }

    /// A constant of the layer loop's body kept where it is read: `bytes` in
    /// the tile's store, an instance a layer, which a layered kernel reads at
    /// the iteration's offset. Its binding and image are as [`Self::constant`]
    /// makes them (replicas share the image's bytes), so each later layer's
    /// replay fills its instance the same way.
    pub fn layer_constant(
        &mut self,
        tile: u32,
        name: String,
        bytes: Vec<u8>,
        recipe: Option<Recipe>,
    ) -> Loc {
        if self.replay.is_some() {
            // The body's addresses are the ones kept; a replay only gives bytes.
            let id = self
                .plan
                .add_buffer(tile, name, bytes.len() as u32, Category::Weight);
            if let Err(e) = self.replayed_constant(&bytes)
                && self.replay_error.is_none()
            {
                self.replay_error = Some(e);
            }
            return Loc { buf: id, offset: 0 };
        }
        let len = bytes.len() as u32;
        let loc = self.body_store_space(tile, len);
        self.spread.charge(
            tile,
            u64::from(len.next_multiple_of(8))
                * u64::from(self.body.as_ref().map_or(1, |b| b.count)),
        );
        let binding = format!("weights/{name}");
        let w = self.weights.entry(binding.clone()).or_default();
        let offset = w.offset_of(bytes);
        w.slices.push(Slice {
            loc,
            instance: 0,
            offset,
            bytes: len,
        });
        if let Some(body) = &mut self.body {
            body.constants.push((binding, offset, len));
            body.recipes.push(recipe);
        }
        loc
    }

    /// Registers a linear of the body whose constants will carry recipes;
    /// `None` outside the body (and in a replay, which needs none).
    pub fn linear_source(&mut self, source: LinearSource) -> Option<usize> {
        let body = self.body.as_mut()?;
        body.sources.push(source);
        Some(body.sources.len() - 1)
    }

    /// Whether every constant of the lowered body has a recipe, so that later
    /// layers' images can be made by [`Self::layer_from_recipes`].
    pub fn recipes_complete(&self) -> bool {
        self.lowered_body
            .as_ref()
            .is_some_and(|b| b.recipes.iter().all(Option::is_some))
    }

    /// Layer `layer`'s weight images from its parameters (`data`: the body's
    /// parameter's values in that layer, checked to have `len` of them), by
    /// the body's recipes, each constant landing where the body's did (as a
    /// replay's would, with the same checks).
    pub fn layer_from_recipes<'d>(
        &mut self,
        layer: u32,
        data: &dyn Fn(tessera_graph::TensorId, usize) -> Result<&'d [f32], crate::PlanError>,
    ) -> Result<(), crate::PlanError> {
        let body = self
            .lowered_body
            .as_ref()
            .expect("the body precedes its layers");
        // Every linear the recipes name, then each distinct recipe once
        // (replicas repeat theirs), then every constant in the body's order.
        let built = body
            .sources
            .iter()
            .map(|s| s.build(data))
            .collect::<Result<Vec<_>, _>>()?;
        let mut distinct: HashMap<&Recipe, usize> = HashMap::new();
        let mut images: Vec<Vec<u8>> = Vec::new();
        let mut order = Vec::with_capacity(body.recipes.len());
        for r in &body.recipes {
            let r = r.as_ref().expect("recipes_complete was checked");
            let k = match distinct.get(r) {
                Some(&k) => k,
                None => {
                    images.push(super::recipe::bytes(r, &body.sources, &built, data)?);
                    distinct.insert(r, images.len() - 1);
                    images.len() - 1
                }
            };
            order.push(k);
        }
        self.replay = Some(Replay { layer, made: 0 });
        let placed = order
            .into_iter()
            .try_for_each(|k| self.replayed_constant(&images[k]));
        self.replay = None;
        placed.map_err(crate::PlanError::Unsupported)
    }

    /// A new step of `kind` after every step handed out so far.
    pub fn step(&mut self, kind: StepKind) -> Step {
        self.plan.steps.push(kind);
        self.plan.step_ops.push(self.op.clone());
        (self.plan.steps.len() - 1) as Step
    }

    pub fn compute_step(&mut self) -> Step {
        self.step(StepKind::Compute)
    }

    pub fn buffer(&mut self, tile: u32, name: String, bytes: u32, category: Category) -> BufId {
        self.plan.add_buffer(tile, name, bytes, category)
    }

    /// An activation buffer named `{op}.{what}`.
    pub fn activation(&mut self, tile: u32, op: &str, what: &str, bytes: u32) -> BufId {
        self.buffer(tile, format!("{op}.{what}"), bytes, Category::Activation)
    }

    /// A buffer of constant contents: the host streams `bytes` into it once, at
    /// initialisation, through the weight binding `weights/NAME`, whose image is
    /// every tile's part in device layout, concatenated in the order of creation.
    pub fn constant(
        &mut self,
        tile: u32,
        name: String,
        bytes: Vec<u8>,
        category: Category,
    ) -> BufId {
        self.constant_with(tile, name, bytes, category, None)
    }

    /// [`Self::constant`], with how its bytes follow from the layer's
    /// parameters (for a layer loop's body: `recipe.rs`).
    pub fn constant_with(
        &mut self,
        tile: u32,
        name: String,
        bytes: Vec<u8>,
        category: Category,
        recipe: Option<Recipe>,
    ) -> BufId {
        let id = self
            .plan
            .add_buffer(tile, name.clone(), bytes.len() as u32, category);
        if self.replay.is_some() {
            if let Err(e) = self.replayed_constant(&bytes)
                && self.replay_error.is_none()
            {
                self.replay_error = Some(e);
            }
            return id;
        }
        let binding = format!("weights/{name}");
        let w = self.weights.entry(binding.clone()).or_default();
        let len = bytes.len() as u32;
        let offset = w.offset_of(bytes);
        if self.body.is_some() && self.staging.is_none() && self.replay_error.is_none() {
            // A resident constant would hold the first layer's values in every
            // iteration.
            self.replay_error = Some(format!(
                "`{name}` is a constant of an operation the loop body cannot stage"
            ));
        }
        if let Some(st) = &mut self.staging {
            // Filled by the staging exchange, live only while the operation runs.
            if let Some(body) = &mut self.body {
                body.constants.push((binding.clone(), offset, len));
                body.recipes.push(recipe);
            }
            st.fills.push((id, binding, offset, len));
            return id;
        }
        w.slices.push(Slice {
            loc: Loc { buf: id, offset: 0 },
            instance: 0,
            offset,
            bytes: len,
        });
        self.plan.touch(id, 0);
        self.forever.push(id);
        id
    }

    /// One kernel call; the contract's requirements bind the buffers it touches.
    pub fn call(
        &mut self,
        tile: u32,
        step: Step,
        kernel: impl Into<KernelKind>,
        ops: &[(&str, Loc)],
    ) {
        let kernel: KernelKind = kernel.into();
        let contract = self.contract(&kernel);
        let state_op = contract.operands.iter().find(|o| o.name == "state");
        let state_bytes = state_op.map_or(64, |o| o.bytes);
        let state = self.plan.add_buffer(
            tile,
            format!("{}.state", contract.kernel),
            state_bytes,
            Category::VertexState,
        );
        // The state is an operand like any other: its contract's alignment and
        // class bind the buffer.
        if let Some(op) = state_op {
            let buf = &mut self.plan.buffers[state.0 as usize];
            buf.align = buf.align.max(op.align);
            buf.tail = buf.tail.max(op.tail_bytes);
            buf.class = op.mem_class;
        }
        self.plan.touch(state, 0);
        self.forever.push(state);
        let operands: BTreeMap<String, Loc> =
            ops.iter().map(|(n, l)| (n.to_string(), *l)).collect();
        for (name, loc) in &operands {
            self.plan.touch(loc.buf, step);
            let Some(op) = contract.operand(name) else {
                panic!("kernel {} has no operand `{name}`", contract.kernel);
            };
            let buf = &mut self.plan.buffers[loc.buf.0 as usize];
            assert!(
                loc.offset + op.bytes <= buf.bytes,
                "operand `{name}` of {} overruns {} ({} + {} > {})",
                contract.kernel,
                buf.name,
                loc.offset,
                op.bytes,
                buf.bytes
            );
            buf.align = buf.align.max(op.align);
            buf.tail = buf.tail.max(op.tail_bytes);
            buf.class = match (buf.class, op.mem_class) {
                (MemClass::Any, c) => c,
                (c, MemClass::Any) => c,
                (a, b) if a == b => a,
                (a, b) => panic!("buffer {} needs both {a:?} and {b:?}", buf.name),
            };
        }
        for op in &contract.operands {
            for other in &op.separate_from {
                if let (Some(a), Some(b)) = (operands.get(&op.name), operands.get(other))
                    && a.buf < b.buf
                {
                    self.plan.separations.push((a.buf, b.buf));
                }
            }
        }
        self.plan.calls.push(Call {
            tile,
            step,
            kernel,
            operands,
            state,
        });
    }

    /// A new exchange phase holding `copies`, or no step at all when there is
    /// nothing to move. Every buffer the copies touch is live at its step.
    pub fn exchange(&mut self, name: &str, copies: Vec<Copy>) -> Option<Step> {
        if copies.is_empty() {
            return None;
        }
        let id = self.plan.exchanges.len() as u16;
        let step = self.step(StepKind::Exchange(id));
        for c in &copies {
            self.plan.touch(c.src.buf, step);
            for d in &c.dsts {
                self.plan.touch(d.buf, step);
            }
        }
        self.plan.exchanges.push(Exchange {
            id,
            name: name.to_string(),
            step,
            copies,
        });
        Some(step)
    }

    /// Rows `rows` of a `[rows, cols]` host input, spread over row owners (whole
    /// rows, consecutive tiles from 0), written by the host at step 0.
    pub fn input(&mut self, name: &str, rows: u32, cols: u32) -> DistTensor {
        let owners = self.row_owners(rows);
        let row_bytes = cols * 2;
        let mut parts = Vec::new();
        let mut slices = Vec::new();
        for (o, &(r0, n)) in owners.iter().enumerate() {
            let buf = self.buffer(
                o as u32,
                name.to_string(),
                n * row_bytes,
                Category::Activation,
            );
            self.plan.touch(buf, 0);
            parts.push(Part {
                at: Loc { buf, offset: 0 },
                rows: r0..r0 + n,
                cols: 0..cols,
            });
            slices.push(Slice {
                loc: Loc { buf, offset: 0 },
                instance: 0,
                offset: r0 * row_bytes,
                bytes: n * row_bytes,
            });
        }
        self.inputs.push(Binding {
            name: name.to_string(),
            dir: BindingDir::Input,
            bytes: rows * row_bytes,
            slices,
            data: Vec::new(),
        });
        DistTensor {
            rows,
            cols,
            elem_bytes: 2,
            parts,
        }
    }

    /// The row groups of a `rows`-row tensor spread one group per tile.
    pub fn row_owners(&self, rows: u32) -> Vec<(u32, u32)> {
        groups(rows, rows.div_ceil(self.machine.tiles))
    }

    /// Whole-row buffers of `t` on its row owners: `t`'s own parts when they are
    /// already that, otherwise new buffers filled by an exchange.
    pub fn gather_rows(&mut self, t: &DistTensor, name: &str) -> DistTensor {
        let owners = self.row_owners(t.rows);
        let already = t.parts.len() == owners.len()
            && t.parts
                .iter()
                .zip(&owners)
                .enumerate()
                .all(|(o, (p, &(r0, n)))| {
                    p.rows == (r0..r0 + n)
                        && p.cols == (0..t.cols)
                        && p.at.offset == 0
                        && self.plan.buffer(p.at.buf).tile == o as u32
                });
        if already {
            return t.clone();
        }
        let mut parts = Vec::new();
        for (o, &(r0, n)) in owners.iter().enumerate() {
            let buf = self.buffer(
                o as u32,
                name.to_string(),
                n * t.cols * t.elem_bytes,
                Category::Activation,
            );
            parts.push(Part {
                at: Loc { buf, offset: 0 },
                rows: r0..r0 + n,
                cols: 0..t.cols,
            });
        }
        let dst = DistTensor {
            rows: t.rows,
            cols: t.cols,
            elem_bytes: t.elem_bytes,
            parts,
        };
        let copies = crate::dist::redistribute(t, &dst)
            .unwrap_or_else(|e| panic!("row owners of `{name}` cover the tensor: {e}"));
        self.exchange(&format!("{name}.rows"), copies);
        dst
    }

    /// Makes `t` (on its row owners, see [`Self::gather_rows`]) the host output
    /// `name`, read after the last step.
    pub fn output(&mut self, name: &str, t: &DistTensor) {
        let t = self.gather_rows(t, &format!("{name}.out"));
        let row_bytes = t.cols * t.elem_bytes;
        let slices = t
            .parts
            .iter()
            .map(|p| Slice {
                loc: p.at,
                instance: 0,
                offset: p.rows.start * row_bytes,
                bytes: (p.rows.end - p.rows.start) * row_bytes,
            })
            .collect();
        self.outputs
            .push((name.to_string(), t.rows * row_bytes, slices));
    }

    /// The finished plan: the host-out step, lifetimes of constants and states
    /// closed, bindings in a fixed order (weights by name, inputs, outputs).
    pub fn finish(mut self) -> TilePlan {
        self.op.clear();
        let last = self.step(StepKind::HostOut);
        for id in std::mem::take(&mut self.forever) {
            self.plan.touch(id, last);
        }
        // Each later layer's bindings: the body's, at that layer's instance of
        // the stores, with that layer's images.
        let mut layer_bindings = Vec::new();
        if let (Some(body), Some(lp)) = (&self.lowered_body, &self.plan.layer_loop) {
            let names: std::collections::BTreeSet<&String> =
                body.constants.iter().map(|c| &c.0).collect();
            for layer in 1..body.count {
                for &b0 in &names {
                    let w = &self.weights[b0];
                    // Without a replay (a plan for its shape only), the first
                    // layer's bytes stand in.
                    let data = self
                        .layer_images
                        .remove(&(layer, b0.clone()))
                        .map_or_else(|| w.image.clone(), |i| i.image);
                    layer_bindings.push(Binding {
                        name: format!("weights/{}", lp.rename(&b0["weights/".len()..], layer)),
                        dir: BindingDir::Weight,
                        bytes: data.len() as u32,
                        slices: w
                            .slices
                            .iter()
                            .map(|s| Slice {
                                instance: layer,
                                ..*s
                            })
                            .collect(),
                        data,
                    });
                }
            }
        }
        for (name, w) in std::mem::take(&mut self.weights) {
            self.plan.bindings.push(Binding {
                name,
                dir: BindingDir::Weight,
                bytes: w.image.len() as u32,
                slices: w.slices,
                data: w.image,
            });
        }
        self.plan.bindings.extend(layer_bindings);
        self.plan.bindings.sort_by(|a, b| a.name.cmp(&b.name));
        self.plan.bindings.append(&mut self.inputs);
        for (name, bytes, slices) in std::mem::take(&mut self.outputs) {
            for s in &slices {
                self.plan.touch(s.loc.buf, last);
            }
            self.plan.bindings.push(Binding {
                name,
                dir: BindingDir::Output,
                bytes,
                slices,
                data: Vec::new(),
            });
        }
        self.plan.tiles = self
            .plan
            .buffers
            .iter()
            .map(|b| b.tile + 1)
            .max()
            .unwrap_or(1);
        self.plan
    }
}

#[cfg(test)]
mod tests {
    use super::StoreSpread;
    use std::collections::BTreeSet;

    /// A So400m tower's images in lowering order, FP8: the patch embedding's,
    /// the layer loop body's (27 instances), the head's. Every image's chunks
    /// go to distinct tiles; the busiest tile stores less than going round the
    /// tiles in order gives, and within the largest chunk of the least stored.
    #[test]
    fn store_chunks_go_to_the_least_stored_tile_once_an_image() {
        let tiles = 1472u32;
        let embed = [(677_376u32, 1u32), (2304, 1)];
        let body = [
            2304u32, 2304, 3_981_312, 6912, 1_327_104, 2304, 2304, 2304, 4_958_208, 8608,
            4_958_208, 2304,
        ]
        .map(|len| (len, 27));
        let head = [
            (1_327_104u32, 1u32),
            (2304, 1),
            (1_327_104, 1),
            (4_958_208, 1),
            (4_958_208, 1),
        ];
        let images: Vec<(u32, u32)> = embed.into_iter().chain(body).chain(head).collect();
        let mut spread = StoreSpread::new(tiles);
        let mut stored = vec![0u64; tiles as usize];
        let mut in_order = vec![0u64; tiles as usize];
        let mut cursor = 0;
        for (len, instances) in images {
            let chunk = len
                .div_ceil(tiles)
                .max(super::STORE_CHUNK_MIN)
                .next_multiple_of(8);
            let mut holding = BTreeSet::new();
            for at in (0..len).step_by(chunk as usize) {
                let bytes =
                    u64::from(chunk.min(len - at).next_multiple_of(8)) * u64::from(instances);
                let t = spread.take(bytes, &holding);
                assert!(holding.insert(t), "two chunks of one image on tile {t}");
                stored[t as usize] += bytes;
                in_order[cursor] += bytes;
                cursor = (cursor + 1) % tiles as usize;
            }
        }
        let (max, min) = (*stored.iter().max().unwrap(), *stored.iter().min().unwrap());
        let round = *in_order.iter().max().unwrap();
        assert!(
            max < round,
            "{max} stored on the busiest tile, {round} round the tiles"
        );
        assert!(max - min <= 3376 * 27, "{max} - {min}");
    }
}

//! The plan verifier: checks a finished [`TilePlan`] against the rules every later
//! stage relies on, and returns every violation it finds, each with its location
//! (Cranelift's verifier is the model: one run, all errors). It shares no logic with
//! the lowering that built the plan; it reads only the IR and the kernels'
//! contracts.
//!
//! The rules:
//! - every slice (call operand, copy source and destination, binding slice) lies
//!   inside its buffer, on the tile the buffer lives on, at a step inside the
//!   buffer's lifetime and of the right kind;
//! - every byte read was written earlier: at an earlier step (by a call, a copy, an
//!   input binding, or at initialisation by a weight binding or a vertex state), or
//!   by an earlier call of the same step on the same tile (calls of a step run in
//!   plan order);
//! - the uses of one buffer do not ask for incompatible memory classes, and the
//!   buffer is at least as aligned, with at least the tail, as every use declares;
//! - no two copies of one exchange write the same bytes;
//! - every output binding's bytes are covered by exactly one slice;
//! - a layer loop's body (`TilePlan::layer_loop`) is a range of steps the
//!   program has; a buffer with one instance a layer is a weight store that the
//!   body's exchanges and layered kernels (`KernelKind::reads_by_layer`) read
//!   and only weight bindings write, each binding slice
//!   naming an instance the buffer has; a buffer live before the body and used in
//!   it lives to the body's end (the next iteration reads it again), and only
//!   such a buffer or one of the body's own is used in the body.
//!
//! A kernel's `InOut` operand is scratch the kernel writes before it reads (the
//! matmul's ping-pong partials): it counts as written by the call and needs no
//! earlier write.

use std::collections::BTreeMap;
use std::fmt;

use tessera_kernels::{MemClass, Role};

use crate::ir::{BindingDir, BufId, Loc, Step, StepKind, TilePlan};

/// Where in the plan a problem is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Site {
    /// Call `index` (in plan order) to `kernel`, operand `operand`.
    Call {
        index: usize,
        kernel: String,
        operand: String,
    },
    /// Copy `copy` of exchange `exchange`, its source or its destination `dst`.
    Copy {
        exchange: u16,
        copy: usize,
        dst: Option<usize>,
    },
    /// Slice `slice` of binding `binding`.
    Binding { binding: String, slice: usize },
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Site::Call {
                index,
                kernel,
                operand,
            } => write!(f, "call {index} ({kernel}) operand `{operand}`"),
            Site::Copy {
                exchange,
                copy,
                dst: None,
            } => write!(f, "exchange #{exchange} copy {copy} source"),
            Site::Copy {
                exchange,
                copy,
                dst: Some(d),
            } => write!(f, "exchange #{exchange} copy {copy} destination {d}"),
            Site::Binding { binding, slice } => write!(f, "binding `{binding}` slice {slice}"),
        }
    }
}

/// One violation of the plan's rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("{site}: no buffer {buf}")]
    NoBuffer { site: Site, buf: BufId },
    #[error("{site}: bytes {start}..{end} lie outside {buf} `{name}` of {bytes} bytes")]
    OutOfBounds {
        site: Site,
        buf: BufId,
        name: String,
        start: u64,
        end: u64,
        bytes: u32,
    },
    #[error("{site}: {buf} lives on tile {buffer_tile}, the use is on tile {tile}")]
    WrongTile {
        site: Site,
        buf: BufId,
        buffer_tile: u32,
        tile: u32,
    },
    #[error("{site}: step {step} is outside the lifetime {first}..={last} of {buf}")]
    OutsideLifetime {
        site: Site,
        buf: BufId,
        step: Step,
        first: Step,
        last: Step,
    },
    #[error("{site}: step {step} is {found}, not {expected}")]
    WrongStep {
        site: Site,
        step: Step,
        found: String,
        expected: String,
    },
    #[error("{site}: reads bytes {start}..{end} of {buf} at step {step}, never written before")]
    ReadBeforeWrite {
        site: Site,
        buf: BufId,
        step: Step,
        start: u32,
        end: u32,
    },
    #[error("{buf} `{name}` on tile {tile}: {first} asks for {a:?} memory, {second} for {b:?}")]
    ConflictingClass {
        buf: BufId,
        name: String,
        tile: u32,
        first: Site,
        a: MemClass,
        second: Site,
        b: MemClass,
    },
    #[error("{site}: needs {need:?} memory but {buf} `{name}` is placed as {has:?}")]
    ClassNotKept {
        site: Site,
        buf: BufId,
        name: String,
        need: MemClass,
        has: MemClass,
    },
    #[error("{site}: needs {what} {need} but {buf} `{name}` has {has}")]
    WeakerBuffer {
        site: Site,
        buf: BufId,
        name: String,
        what: &'static str,
        need: u32,
        has: u32,
    },
    #[error(
        "exchange #{exchange}: copies {first} and {second} both write bytes {start}..{end} of {buf}"
    )]
    OverlappingCopies {
        exchange: u16,
        buf: BufId,
        first: usize,
        second: usize,
        start: u32,
        end: u32,
    },
    #[error("layer loop: {0}")]
    Loop(String),
    #[error("output binding `{binding}`: bytes {start}..{end} are covered {times} times, not once")]
    OutputCoverage {
        binding: String,
        start: u32,
        end: u32,
        times: u32,
    },
}

/// When something happens: a step, and the position in that step's program order
/// (0 for exchanges and host transfers, `1 + call index` for calls, so a call sees
/// what an earlier call of the same step wrote on its tile).
type At = (Step, u32);

/// Bytes `start..end` of a buffer written at a time (`None`: at initialisation).
type Write = (Option<At>, u32, u32);

struct Checker<'p> {
    plan: &'p TilePlan,
    errors: Vec<VerifyError>,
    writes: BTreeMap<BufId, Vec<Write>>,
    /// Reads to check once every write is known: site, buffer, step, range.
    reads: Vec<(Site, BufId, At, u32, u32)>,
    /// The first use of each buffer asking for a specific class.
    classes: BTreeMap<BufId, (Site, MemClass)>,
}

/// Checks `plan`; an empty list means it keeps every rule.
pub fn verify(plan: &TilePlan) -> Vec<VerifyError> {
    let mut c = Checker {
        plan,
        errors: Vec::new(),
        writes: BTreeMap::new(),
        reads: Vec::new(),
        classes: BTreeMap::new(),
    };
    c.calls();
    c.exchanges();
    c.bindings();
    c.read_after_write();
    c.layer_loop();
    c.errors
}

impl Checker<'_> {
    /// Bounds, tile and lifetime of one use; `false` when the buffer is missing or
    /// the range is out of bounds (no further checks on it).
    fn slice(
        &mut self,
        site: &Site,
        loc: Loc,
        bytes: u32,
        tile: Option<u32>,
        step: Option<Step>,
    ) -> bool {
        let Some(b) = self.plan.buffers.get(loc.buf.0 as usize) else {
            self.errors.push(VerifyError::NoBuffer {
                site: site.clone(),
                buf: loc.buf,
            });
            return false;
        };
        let end = u64::from(loc.offset) + u64::from(bytes);
        if end > u64::from(b.bytes) {
            self.errors.push(VerifyError::OutOfBounds {
                site: site.clone(),
                buf: loc.buf,
                name: b.name.clone(),
                start: loc.offset.into(),
                end,
                bytes: b.bytes,
            });
            return false;
        }
        if let Some(t) = tile
            && t != b.tile
        {
            self.errors.push(VerifyError::WrongTile {
                site: site.clone(),
                buf: loc.buf,
                buffer_tile: b.tile,
                tile: t,
            });
        }
        if let Some(s) = step
            && (s < b.first || s > b.last)
        {
            self.errors.push(VerifyError::OutsideLifetime {
                site: site.clone(),
                buf: loc.buf,
                step: s,
                first: b.first,
                last: b.last,
            });
        }
        true
    }

    fn step_kind(
        &mut self,
        site: &Site,
        step: Step,
        ok: impl Fn(StepKind) -> bool,
        expected: &str,
    ) {
        let found = self.plan.steps.get(step as usize).copied();
        if !found.is_some_and(ok) {
            self.errors.push(VerifyError::WrongStep {
                site: site.clone(),
                step,
                found: found.map_or("past the last step".into(), |k| format!("{k:?}")),
                expected: expected.into(),
            });
        }
    }

    fn write(&mut self, buf: BufId, step: Option<At>, start: u32, bytes: u32) {
        self.writes
            .entry(buf)
            .or_default()
            .push((step, start, start + bytes));
    }

    fn calls(&mut self) {
        for (index, call) in self.plan.calls.iter().enumerate() {
            let contract = call.kernel.contract();
            let kernel = call.kernel.kernel().symbol();
            let site = |operand: &str| Site::Call {
                index,
                kernel: kernel.clone(),
                operand: operand.to_string(),
            };
            self.step_kind(
                &site("*"),
                call.step,
                |k| k == StepKind::Compute,
                "a compute step",
            );
            for op in &contract.operands {
                let loc = if op.role == Role::State {
                    Some(Loc {
                        buf: call.state,
                        offset: 0,
                    })
                } else {
                    call.operands.get(&op.name).copied()
                };
                let Some(loc) = loc else {
                    // A kernel that cannot run without the operand would not have
                    // been emitted; the emitter reports the missing name.
                    continue;
                };
                let s = site(&op.name);
                if !self.slice(&s, loc, op.bytes, Some(call.tile), Some(call.step)) {
                    continue;
                }
                self.contract_use(&s, loc.buf, op.mem_class, op.align, op.tail_bytes);
                match op.role {
                    // Weights were written at initialisation by their binding,
                    // which the read check finds like any other write.
                    Role::Input | Role::Weights => {
                        self.reads.push((
                            s,
                            loc.buf,
                            (call.step, 1 + index as u32),
                            loc.offset,
                            loc.offset + op.bytes,
                        ));
                    }
                    Role::Output | Role::InOut => self.write(
                        loc.buf,
                        Some((call.step, 1 + index as u32)),
                        loc.offset,
                        op.bytes,
                    ),
                    // Emission writes vertex states into the tile image.
                    Role::State => self.write(loc.buf, None, loc.offset, op.bytes),
                }
            }
        }
    }

    fn contract_use(&mut self, site: &Site, buf: BufId, class: MemClass, align: u32, tail: u32) {
        let b = &self.plan.buffers[buf.0 as usize];
        for (what, need, has) in [("alignment", align, b.align), ("tail", tail, b.tail)] {
            if need > has {
                self.errors.push(VerifyError::WeakerBuffer {
                    site: site.clone(),
                    buf,
                    name: b.name.clone(),
                    what,
                    need,
                    has,
                });
            }
        }
        if class == MemClass::Any {
            return;
        }
        if b.class != class {
            self.errors.push(VerifyError::ClassNotKept {
                site: site.clone(),
                buf,
                name: b.name.clone(),
                need: class,
                has: b.class,
            });
        }
        match self.classes.get(&buf) {
            None => {
                self.classes.insert(buf, (site.clone(), class));
            }
            Some((first, a)) if *a != class => {
                self.errors.push(VerifyError::ConflictingClass {
                    buf,
                    name: b.name.clone(),
                    tile: b.tile,
                    first: first.clone(),
                    a: *a,
                    second: site.clone(),
                    b: class,
                });
            }
            Some(_) => {}
        }
    }

    fn exchanges(&mut self) {
        for x in &self.plan.exchanges {
            let here = Site::Copy {
                exchange: x.id,
                copy: 0,
                dst: None,
            };
            self.step_kind(
                &here,
                x.step,
                |k| k == StepKind::Exchange(x.id),
                "its exchange step",
            );
            // Destination ranges of this exchange per buffer: (start, end, copy).
            let mut written: BTreeMap<BufId, Vec<(u32, u32, usize)>> = BTreeMap::new();
            for (k, copy) in x.copies.iter().enumerate() {
                let src = Site::Copy {
                    exchange: x.id,
                    copy: k,
                    dst: None,
                };
                if self.slice(&src, copy.src, copy.bytes, None, Some(x.step)) {
                    self.reads.push((
                        src,
                        copy.src.buf,
                        (x.step, 0),
                        copy.src.offset,
                        copy.src.offset + copy.bytes,
                    ));
                }
                for (d, dst) in copy.dsts.iter().enumerate() {
                    let site = Site::Copy {
                        exchange: x.id,
                        copy: k,
                        dst: Some(d),
                    };
                    if self.slice(&site, *dst, copy.bytes, None, Some(x.step)) {
                        self.write(dst.buf, Some((x.step, 0)), dst.offset, copy.bytes);
                        written.entry(dst.buf).or_default().push((
                            dst.offset,
                            dst.offset + copy.bytes,
                            k,
                        ));
                    }
                }
            }
            for (buf, mut ranges) in written {
                ranges.sort_unstable();
                for w in ranges.windows(2) {
                    if w[1].0 < w[0].1 {
                        self.errors.push(VerifyError::OverlappingCopies {
                            exchange: x.id,
                            buf,
                            first: w[0].2,
                            second: w[1].2,
                            start: w[1].0,
                            end: w[0].1.min(w[1].1),
                        });
                    }
                }
            }
        }
    }

    fn layer_loop(&mut self) {
        let plan = self.plan;
        let mut err = |m: String| self.errors.push(VerifyError::Loop(m));
        let Some(lp) = &plan.layer_loop else {
            if let Some(b) = plan.buffers.iter().find(|b| b.instances > 1) {
                err(format!(
                    "{} `{}` has {} instances, but the plan has no loop",
                    b.id, b.name, b.instances
                ));
            }
            return;
        };
        if lp.count < 2 || lp.first > lp.last || lp.last as usize >= plan.steps.len() {
            err(format!(
                "steps {}..={} run {} times, in a plan of {} steps",
                lp.first,
                lp.last,
                lp.count,
                plan.steps.len()
            ));
            return;
        }
        let in_body = |s: Step| lp.contains(s);
        // Where each buffer is used inside the body.
        let mut used_in_body = vec![false; plan.buffers.len()];
        for c in plan.calls.iter().filter(|c| in_body(c.step)) {
            for loc in c.operands.values().chain(std::iter::once(&Loc {
                buf: c.state,
                offset: 0,
            })) {
                if let Some(u) = used_in_body.get_mut(loc.buf.0 as usize) {
                    *u = true;
                }
            }
        }
        for x in plan.exchanges.iter().filter(|x| in_body(x.step)) {
            for c in &x.copies {
                for loc in std::iter::once(&c.src).chain(&c.dsts) {
                    if let Some(u) = used_in_body.get_mut(loc.buf.0 as usize) {
                        *u = true;
                    }
                }
            }
        }
        for b in &plan.buffers {
            let used = used_in_body[b.id.0 as usize];
            if b.instances > 1 {
                if b.instances != lp.count {
                    err(format!(
                        "{} `{}` has {} instances for {} iterations",
                        b.id, b.name, b.instances, lp.count
                    ));
                }
                if b.category != crate::ir::Category::WeightStore {
                    err(format!(
                        "{} `{}` has instances but is not a weight store",
                        b.id, b.name
                    ));
                }
            } else if used && b.first < lp.first && b.last < lp.last {
                err(format!(
                    "{} `{}` lives from before the body to step {}, inside it: the next iteration reads it freed",
                    b.id, b.name, b.last
                ));
            }
        }
        // Instanced stores: read by the body's exchanges and layered kernels
        // only (each at the iteration's instance), written by weight bindings
        // only, each slice naming an instance. A kernel that reads one any
        // other way would read the first layer's weights in every iteration,
        // and a layered read of anything else moves off its buffer.
        for c in &plan.calls {
            for (name, loc) in &c.operands {
                let store = plan
                    .buffers
                    .get(loc.buf.0 as usize)
                    .is_some_and(|b| b.instances > 1);
                let symbol = || c.kernel.kernel().symbol();
                match (store, c.kernel.reads_by_layer(name), in_body(c.step)) {
                    (true, _, false) => err(format!(
                        "call {} operand `{name}` uses weight store {} outside the loop's body",
                        symbol(),
                        loc.buf
                    )),
                    (true, false, true) => err(format!(
                        "call {} operand `{name}` uses weight store {} but does not read it at the layer's offset",
                        symbol(),
                        loc.buf
                    )),
                    (false, true, _) => err(format!(
                        "call {} reads `{name}` at the layer's offset from {}, not a weight store",
                        symbol(),
                        loc.buf
                    )),
                    _ => {}
                }
            }
        }
        for x in &plan.exchanges {
            for c in &x.copies {
                let store = |l: &Loc| {
                    plan.buffers
                        .get(l.buf.0 as usize)
                        .is_some_and(|b| b.instances > 1)
                };
                if store(&c.src) && !in_body(x.step) {
                    err(format!(
                        "exchange #{} outside the body reads weight store {}",
                        x.id, c.src.buf
                    ));
                }
                if c.dsts.iter().any(store) {
                    err(format!("exchange #{} writes a weight store", x.id));
                }
            }
        }
        for bind in &plan.bindings {
            for (k, s) in bind.slices.iter().enumerate() {
                let Some(b) = plan.buffers.get(s.loc.buf.0 as usize) else {
                    continue;
                };
                if s.instance >= b.instances {
                    err(format!(
                        "binding `{}` slice {k}: instance {} of {} `{}`, which has {}",
                        bind.name, s.instance, b.id, b.name, b.instances
                    ));
                }
                if b.instances > 1 && bind.dir != BindingDir::Weight {
                    err(format!(
                        "binding `{}` is not a weight but lands in a weight store",
                        bind.name
                    ));
                }
            }
        }
    }

    fn bindings(&mut self) {
        let step_of = |kind: StepKind| {
            self.plan
                .steps
                .iter()
                .position(|&k| k == kind)
                .map(|s| s as Step)
        };
        let (host_in, host_out) = (step_of(StepKind::HostIn), step_of(StepKind::HostOut));
        for b in &self.plan.bindings {
            let step = match b.dir {
                BindingDir::Input => host_in,
                BindingDir::Output => host_out,
                BindingDir::Weight => None,
            };
            for (k, s) in b.slices.iter().enumerate() {
                let site = Site::Binding {
                    binding: b.name.clone(),
                    slice: k,
                };
                if u64::from(s.offset) + u64::from(s.bytes) > u64::from(b.bytes) {
                    self.errors.push(VerifyError::OutOfBounds {
                        site: site.clone(),
                        buf: s.loc.buf,
                        name: format!("host buffer `{}`", b.name),
                        start: s.offset.into(),
                        end: u64::from(s.offset) + u64::from(s.bytes),
                        bytes: b.bytes,
                    });
                }
                if !self.slice(&site, s.loc, s.bytes, None, step) {
                    continue;
                }
                match b.dir {
                    BindingDir::Input => {
                        self.write(s.loc.buf, step.map(|s| (s, 0)), s.loc.offset, s.bytes)
                    }
                    BindingDir::Weight => self.write(s.loc.buf, None, s.loc.offset, s.bytes),
                    BindingDir::Output => self.reads.push((
                        site,
                        s.loc.buf,
                        (step.unwrap_or(Step::MAX), 0),
                        s.loc.offset,
                        s.loc.offset + s.bytes,
                    )),
                }
            }
            if b.dir == BindingDir::Output {
                self.coverage(b);
            }
        }
    }

    /// Every byte of an output's host buffer comes from exactly one slice.
    fn coverage(&mut self, b: &crate::ir::Binding) {
        // Boundaries with +1 at a slice's start and -1 at its end.
        let mut edges: BTreeMap<u32, i64> = BTreeMap::new();
        edges.insert(0, 0);
        edges.insert(b.bytes, 0);
        for s in &b.slices {
            *edges.entry(s.offset).or_default() += 1;
            *edges.entry(s.offset.saturating_add(s.bytes)).or_default() -= 1;
        }
        let mut depth = 0i64;
        let points: Vec<(u32, i64)> = edges.into_iter().collect();
        for w in points.windows(2) {
            depth += w[0].1;
            let (start, end) = (w[0].0, w[1].0.min(b.bytes));
            if start < b.bytes && start < end && depth != 1 {
                self.errors.push(VerifyError::OutputCoverage {
                    binding: b.name.clone(),
                    start,
                    end,
                    times: depth.max(0) as u32,
                });
            }
        }
    }

    /// Every read is covered by writes earlier in program order (or at
    /// initialisation).
    fn read_after_write(&mut self) {
        for w in self.writes.values_mut() {
            w.sort_unstable();
        }
        let reads = std::mem::take(&mut self.reads);
        for (site, buf, at, start, end) in reads {
            let mut before: Vec<(u32, u32)> = self
                .writes
                .get(&buf)
                .into_iter()
                .flatten()
                .filter(|w| w.0.is_none_or(|s| s < at))
                .map(|w| (w.1, w.2))
                .collect();
            before.sort_unstable();
            let mut covered = start;
            for (a, b) in before {
                if a > covered {
                    break;
                }
                covered = covered.max(b);
                if covered >= end {
                    break;
                }
            }
            if covered < end {
                self.errors.push(VerifyError::ReadBeforeWrite {
                    site,
                    buf,
                    step: at.0,
                    start: covered,
                    end,
                });
            }
        }
    }
}

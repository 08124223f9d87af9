//! Emission: kernel code, vertex states and the supervisor program of every tile at
//! their placed addresses, exchange programs and host bindings at buffer addresses.
//!
//! The supervisor program is built by one function for both sizing (addresses all
//! zero: every snippet's size is independent of addresses) and the final package, so
//! the size placement reserved is the size emitted.

use std::collections::{BTreeMap, HashMap};

use rayon::prelude::*;
use std::ops::Range;

use tessera_host::{BindingSpec, HostPlan, SliceSpec, TileHost};
use tessera_isa::{Inst, IntOp, MReg, Word, encode};
use tessera_kernels::exchange::{ExchangePart, LAYER, LINK};
use tessera_kernels::{Call as KCall, OperandAddrs, code_bytes};
use tessera_machine::Machine;
use tessera_package::{
    BindingKind, ExchangeProgram, Package, Perms, Segment, Symbol, SymbolKind, TileImage,
};
use tessera_place::TilePlacement;
use tessera_plan::exchange_code::{TilePart, exchange_parts};
use tessera_plan::{BindingDir, BufId, Buffer, Call, Category, StepKind, TilePlan};

use crate::CompileError;
use crate::requests::{Item, Problems, buffer_request_name};

/// The symbol (and segment) of a tile's exchange code.
pub const EXCHANGE_SYMBOL: &str = "exchange";

/// Code sizes per tile, known before placement.
#[derive(Debug, Clone, Default)]
pub struct SizedCode {
    pub tiles: Vec<TileCode>,
    /// Every tile's part of each exchange phase (by the plan's exchange index,
    /// then tile), before addresses.
    pub exchange_parts: Vec<Vec<TilePart>>,
}

#[derive(Debug, Clone, Default)]
pub struct TileCode {
    /// Distinct kernels (by symbol) and their worker-code bytes.
    pub kernels: Vec<(String, u32)>,
    /// A call of each kernel symbol, to emit its code from.
    pub representative: BTreeMap<String, usize>,
    /// Indices into `plan.calls`, in program order.
    pub calls: Vec<usize>,
    pub supervisor_bytes: u32,
    /// Offset of each exchange phase's block in the tile's exchange code (by the
    /// plan's exchange index; `None` where the tile has no part) and the code's
    /// bytes.
    pub exchange_blocks: Vec<Option<u32>>,
    pub exchange_bytes: u32,
    /// Bytes the layer loop's offset advances by an iteration on this tile.
    pub layer_stride: u32,
}

fn kernel_err(tile: u32, kernel: String, source: tessera_kernels::KernelError) -> CompileError {
    CompileError::Kernel {
        tile,
        kernel,
        source,
    }
}

/// The host phases a supervisor program runs, and the tile's descriptor blocks.
pub struct HostCode<'a> {
    pub tile: &'a TileHost,
    /// Weight phases (once, at initialisation) and input phases, in this order.
    pub inputs: Range<usize>,
    pub outputs: Range<usize>,
}

/// The phases a program runs at its start: the host crate orders weight phases
/// before input phases, so they form one range.
fn initial_phases(host: &HostPlan) -> Range<usize> {
    let w = host.phases_of(BindingKind::Weight);
    let i = host.phases_of(BindingKind::Input);
    let start = if w.is_empty() { i.start } else { w.start };
    let end = if i.is_empty() { w.end } else { i.end };
    debug_assert!(w.is_empty() || i.is_empty() || w.end == i.start);
    start..end.max(start)
}

/// The register the host snippets load descriptor addresses into; kernel
/// snippets clobber `$m0..=$m12` only, and nothing lives across steps.
const HOST_REG: MReg = MReg(13);

/// Where a supervisor program finds things: a buffer's address, a kernel
/// symbol's code address, the tile's exchange block for an exchange id (none
/// when the tile has no part).
struct Where<'a> {
    addr: &'a dyn Fn(BufId) -> u32,
    entry: &'a dyn Fn(&str) -> u32,
    xblock: &'a dyn Fn(u16) -> Option<u32>,
}

/// The supervisor program of one tile: the input host phases, each step's calls, a
/// sync and the tile's exchange code per exchange phase, the output host phases,
/// then exit.
fn supervisor_words(
    plan: &TilePlan,
    tile: u32,
    code: &TileCode,
    base: u32,
    at: &Where<'_>,
    host: &HostCode<'_>,
) -> Result<Vec<Word>, CompileError> {
    let Where {
        addr,
        entry,
        xblock,
    } = *at;
    let host_err = CompileError::Host;
    let mut words = Vec::new();
    let mut pc = base;
    let mut next_call = 0;
    let looped = plan.layer_loop.as_ref();
    let mut body_start = 0;
    for (step, kind) in plan.steps.iter().enumerate() {
        if let Some(lp) = looped
            && lp.first as usize == step
        {
            words.push(Word::Single(Inst::Setzi { d: LAYER, imm: 0 }));
            pc += 4;
            body_start = pc;
        }
        match kind {
            StepKind::Compute => {
                while let Some(&ci) = code.calls.get(next_call) {
                    let call = &plan.calls[ci];
                    if call.step as usize != step {
                        break;
                    }
                    next_call += 1;
                    let k = call.kernel.kernel();
                    let addrs = operand_addrs(call, addr);
                    let snippet = k
                        .supervisor(
                            &KCall {
                                entry: entry(&k.symbol()),
                                state: addr(call.state),
                                addrs: &addrs,
                            },
                            pc,
                        )
                        .map_err(|e| kernel_err(tile, k.symbol(), e))?;
                    pc += code_bytes(&snippet);
                    words.extend(snippet);
                }
            }
            StepKind::Exchange(id) => {
                words.push(Word::Single(Inst::SyncGlobal));
                // A tile with a part calls its block, which ends with the
                // `exchange`; one without ends the phase in place.
                words.push(Word::Single(match xblock(*id) {
                    Some(target) => Inst::Call { link: LINK, target },
                    None => Inst::Exchange { id: *id },
                }));
                pc += 8;
            }
            StepKind::HostIn | StepKind::HostOut => {
                let phases = if *kind == StepKind::HostIn {
                    host.inputs.clone()
                } else {
                    host.outputs.clone()
                };
                let snippet = host
                    .tile
                    .supervisor_code(phases, HOST_REG)
                    .map_err(host_err)?;
                pc += code_bytes(&snippet);
                words.extend(snippet);
            }
        }
        if let Some(lp) = looped
            && lp.last as usize == step
        {
            let tail = loop_tail(code.layer_stride, lp.count, body_start);
            pc += code_bytes(&tail);
            words.extend(tail);
        }
    }
    words.push(Word::Single(Inst::Exit));
    Ok(words)
}

/// Bytes [`LAYER`] advances by each iteration, by tile: the stride of the tile's
/// weight store (one per tile at most), or 8 where the tile stores none and the
/// register only counts. One pass over the buffers for every tile.
fn layer_strides(plan: &TilePlan) -> Vec<u32> {
    let mut strides = vec![8; plan.tiles as usize];
    for b in plan.buffers.iter().filter(|b| b.instances > 1) {
        strides[b.tile as usize] = b.stride();
    }
    strides
}

/// The end of a loop body: the layer offset advanced by a stride, and back to
/// `body` until it has passed every instance.
fn loop_tail(stride: u32, count: u32, body: u32) -> Vec<Word> {
    let scratch = MReg(0);
    vec![
        Word::Single(Inst::Setzi {
            d: scratch,
            imm: stride,
        }),
        Word::Single(Inst::Int {
            op: IntOp::Add,
            d: LAYER,
            a: LAYER,
            b: scratch,
        }),
        Word::Single(Inst::Setzi {
            d: scratch,
            imm: stride * count,
        }),
        Word::Single(Inst::Int {
            op: IntOp::Sub,
            d: scratch,
            a: scratch,
            b: LAYER,
        }),
        Word::Single(Inst::Brnz {
            c: scratch,
            target: body,
        }),
    ]
}

fn operand_addrs(call: &Call, addr: &dyn Fn(BufId) -> u32) -> OperandAddrs {
    let mut a = OperandAddrs::new();
    for (name, loc) in &call.operands {
        a.insert(name, addr(loc.buf) + loc.offset);
    }
    a
}

/// Code sizes of every tile, computed with all addresses zero and the host plan's
/// provisional descriptor blocks.
pub fn size_code(plan: &TilePlan, host: &HostPlan) -> Result<SizedCode, CompileError> {
    let mut tiles: Vec<TileCode> = vec![TileCode::default(); plan.tiles as usize];
    let parts: Vec<Vec<TilePart>> = plan
        .exchanges
        .par_iter()
        .map(|x| exchange_parts(plan, x))
        .collect();
    for (xi, x) in plan.exchanges.iter().enumerate() {
        for (tile, p) in parts[xi].iter().enumerate() {
            let code = &mut tiles[tile];
            if p.is_empty() {
                code.exchange_blocks.push(None);
                continue;
            }
            let max = usize::from(u16::MAX) + 1;
            if p.max_message() > max {
                return Err(CompileError::ExchangeMessages {
                    tile: tile as u32,
                    exchange: x.id,
                    name: x.name.clone(),
                    messages: p.max_message(),
                    max,
                });
            }
            code.exchange_blocks.push(Some(code.exchange_bytes));
            code.exchange_bytes += p.code_bytes();
        }
    }
    for (ci, call) in plan.calls.iter().enumerate() {
        tiles[call.tile as usize].calls.push(ci);
    }
    for (code, stride) in tiles.iter_mut().zip(layer_strides(plan)) {
        code.layer_stride = stride;
    }
    for (tile, code) in tiles.iter_mut().enumerate() {
        code.calls.sort_by_key(|&ci| plan.calls[ci].step);
        for &ci in &code.calls {
            let k = plan.calls[ci].kernel.kernel();
            let symbol = k.symbol();
            if !code.representative.contains_key(&symbol) {
                let bytes = k
                    .code_bytes()
                    .map_err(|e| kernel_err(tile as u32, symbol.clone(), e))?;
                code.kernels.push((symbol.clone(), bytes));
                code.representative.insert(symbol, ci);
            }
        }
        let provisional =
            tessera_host::emit_provisional(host, tile as u32).map_err(CompileError::Host)?;
        let hc = HostCode {
            tile: &provisional,
            inputs: initial_phases(host),
            outputs: host.phases_of(BindingKind::Output),
        };
        let blocks = block_of(plan, &code.exchange_blocks, 0);
        let at = Where {
            addr: &|_| 0,
            entry: &|_| 0,
            xblock: &blocks,
        };
        let words = supervisor_words(plan, tile as u32, code, 0, &at, &hc)?;
        code.supervisor_bytes = code_bytes(&words);
    }
    Ok(SizedCode {
        tiles,
        exchange_parts: parts,
    })
}

/// A tile's part of an exchange at the addresses `addr` gives.
fn part_at(p: &TilePart, addr: &dyn Fn(BufId) -> u32) -> ExchangePart {
    ExchangePart {
        sends: p
            .sends
            .iter()
            .map(|(l, bytes)| (addr(l.buf) + l.offset, *bytes))
            .collect(),
        recvs: p
            .recvs
            .iter()
            .map(|&(src, msg, l)| {
                let msg = u16::try_from(msg).expect("message counts checked when sized");
                (src, msg, addr(l.buf) + l.offset)
            })
            .collect(),
        relative: p.relative,
    }
}

/// The address of a tile's block for each exchange id, from the blocks' offsets
/// and the exchange code's base.
fn block_of(plan: &TilePlan, blocks: &[Option<u32>], base: u32) -> impl Fn(u16) -> Option<u32> {
    let by_id: HashMap<u16, Option<u32>> = plan
        .exchanges
        .iter()
        .zip(blocks)
        .map(|(x, b)| (x.id, b.map(|o| base + o)))
        .collect();
    move |id| by_id.get(&id).copied().flatten()
}

fn encode_words(tile: u32, what: &str, words: &[Word]) -> Result<Vec<u8>, CompileError> {
    encode(words).map_err(|source| CompileError::Encode {
        tile,
        what: what.to_string(),
        source,
    })
}

/// Host data of the final package: the plan at placed addresses and each tile's
/// emitted descriptor blocks.
pub struct FinalHost {
    pub plan: HostPlan,
    pub tiles: Vec<TileHost>,
}

/// The plan's host bindings as the host crate's specs, at the addresses `addr`
/// gives (provisional or final).
pub fn binding_specs(plan: &TilePlan, addr: &dyn Fn(BufId) -> u32) -> Vec<BindingSpec> {
    plan.bindings
        .iter()
        .map(|b| BindingSpec {
            name: b.name.clone(),
            kind: match b.dir {
                BindingDir::Input => BindingKind::Input,
                BindingDir::Output => BindingKind::Output,
                BindingDir::Weight => BindingKind::Weight,
            },
            bytes: b.bytes,
            slices: b
                .slices
                .iter()
                .map(|s| SliceSpec {
                    tile: plan.buffer(s.loc.buf).tile,
                    offset: s.offset,
                    bytes: s.bytes,
                    tile_addr: addr(s.loc.buf)
                        + s.loc.offset
                        + s.instance * plan.buffer(s.loc.buf).stride(),
                })
                .collect(),
        })
        .collect()
}

/// Buffer addresses from the placements (indexed by buffer id), and code
/// addresses per tile (kernel symbol, or "" for the supervisor).
pub fn addresses(
    plan: &TilePlan,
    problems: &Problems,
    placements: &[TilePlacement],
) -> (Vec<u32>, Vec<BTreeMap<String, u32>>) {
    // Buffer and code addresses, per tile.
    let mut buf_addr = vec![0u32; plan.buffers.len()];
    let mut code_addr: Vec<BTreeMap<String, u32>> = vec![BTreeMap::new(); plan.tiles as usize];
    for (pi, placement) in placements.iter().enumerate() {
        let tile = problems.problems[pi].tile as usize;
        for a in &placement.allocations {
            let addr = u32::try_from(a.offset).expect("placed addresses lie in SRAM");
            match problems.items[pi].get(&a.id) {
                Some(Item::Buffer(b)) => buf_addr[b.0 as usize] = addr,
                Some(Item::Kernel(s)) => {
                    code_addr[tile].insert(s.clone(), addr);
                }
                Some(Item::Supervisor) => {
                    code_addr[tile].insert(String::new(), addr);
                }
                Some(Item::ExchangeCode) => {
                    code_addr[tile].insert(EXCHANGE_SYMBOL.into(), addr);
                }
                None => unreachable!("placement invented request `{}`", a.id),
            }
        }
    }
    (buf_addr, code_addr)
}

/// Emits the package from placed tiles.
pub fn emit(
    machine: &Machine,
    plan: &TilePlan,
    sized: &SizedCode,
    (buf_addr, code_addr): &(Vec<u32>, Vec<BTreeMap<String, u32>>),
    host: &FinalHost,
) -> Result<Package, CompileError> {
    let addr = |b: BufId| buf_addr[b.0 as usize];
    let inputs = initial_phases(&host.plan);
    let outputs = host.plan.phases_of(BindingKind::Output);
    // Each tile's weight buffers, in buffer order: found once, not by a scan of
    // every buffer per tile (a quarter million buffers over 1,472 tiles).
    let mut weights_of: Vec<Vec<&Buffer>> = vec![Vec::new(); plan.tiles as usize];
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.category == Category::Weight)
    {
        weights_of[b.tile as usize].push(b);
    }

    let tiles: Result<Vec<TileImage>, CompileError> = (0..plan.tiles)
        .into_par_iter()
        .map(|tile| {
            let code = &sized.tiles[tile as usize];
            let codes = &code_addr[tile as usize];
            let mut segments = Vec::new();
            let mut symbols = Vec::new();
            let (rx, rw) = (Perms::RX, Perms::RW);
            let entry = |s: &str| codes[s];
            let sup_base = codes[""];
            let tile_host = &host.tiles[tile as usize];
            let hc = HostCode {
                tile: tile_host,
                inputs: inputs.clone(),
                outputs: outputs.clone(),
            };
            let x_base = codes.get(EXCHANGE_SYMBOL).copied().unwrap_or(0);
            let blocks = block_of(plan, &code.exchange_blocks, x_base);
            let at = Where {
                addr: &addr,
                entry: &entry,
                xblock: &blocks,
            };
            let sup = supervisor_words(plan, tile, code, sup_base, &at, &hc)?;
            segments.extend(tile_host.package_segments());
            let bytes = encode_words(tile, "supervisor", &sup)?;
            assert_eq!(
                bytes.len() as u32,
                code.supervisor_bytes,
                "supervisor size changed"
            );
            symbols.push(Symbol {
                name: "supervisor".into(),
                addr: sup_base,
                size: bytes.len() as u32,
                kind: SymbolKind::Code,
            });
            segments.push(Segment {
                name: "supervisor".into(),
                addr: sup_base,
                size: bytes.len() as u32,
                bytes,
                perms: rx,
            });
            if code.exchange_bytes > 0 {
                let mut words = Vec::new();
                for (xi, x) in plan.exchanges.iter().enumerate() {
                    if let Some(offset) = code.exchange_blocks[xi] {
                        let p = &sized.exchange_parts[xi][tile as usize];
                        // Each phase's block named, so that a fault in it says
                        // which phase (`exchange.7+0x1c`).
                        symbols.push(Symbol {
                            name: format!("{EXCHANGE_SYMBOL}.{}", x.id),
                            addr: x_base + offset,
                            size: p.code_bytes(),
                            kind: SymbolKind::Code,
                        });
                        words.extend(part_at(p, &addr).words(x.id));
                    }
                }
                let bytes = encode_words(tile, EXCHANGE_SYMBOL, &words)?;
                assert_eq!(
                    bytes.len() as u32,
                    code.exchange_bytes,
                    "exchange code size changed"
                );
                symbols.push(Symbol {
                    name: EXCHANGE_SYMBOL.into(),
                    addr: x_base,
                    size: code.exchange_bytes,
                    kind: SymbolKind::Code,
                });
                segments.push(Segment {
                    name: EXCHANGE_SYMBOL.into(),
                    addr: x_base,
                    size: code.exchange_bytes,
                    bytes,
                    perms: rx,
                });
            }
            for (symbol, size) in &code.kernels {
                let base = codes[symbol];
                let k = plan.calls[code.representative[symbol]].kernel.kernel();
                let kc = k
                    .emit(base)
                    .map_err(|e| kernel_err(tile, symbol.clone(), e))?;
                let bytes = encode_words(tile, symbol, &kc.words)?;
                assert_eq!(bytes.len() as u32, *size, "kernel {symbol} size changed");
                symbols.push(Symbol {
                    name: symbol.clone(),
                    addr: base,
                    size: *size,
                    kind: SymbolKind::Code,
                });
                segments.push(Segment {
                    name: symbol.clone(),
                    addr: base,
                    size: *size,
                    bytes,
                    perms: rx,
                });
            }
            // Section names must be unique on a tile: the disassembly names each
            // segment as a section, and the assembler refuses to open one twice, so a
            // kernel called more than once numbers its states.
            let mut states: HashMap<String, u32> = HashMap::new();
            for &ci in &code.calls {
                let call = &plan.calls[ci];
                let k = call.kernel.kernel();
                let state = k
                    .state(&operand_addrs(call, &addr))
                    .map_err(|e| kernel_err(tile, k.symbol(), e))?;
                let buf = plan.buffer(call.state);
                assert!(
                    state.bytes.len() as u32 <= buf.bytes,
                    "state outgrew its buffer"
                );
                let n = states.entry(k.symbol()).or_default();
                *n += 1;
                segments.push(Segment {
                    name: format!("{}.state.{}", k.symbol(), *n - 1),
                    addr: addr(call.state),
                    size: buf.bytes,
                    bytes: state.bytes,
                    perms: rw,
                });
            }
            // Weights stay for the whole program at one address: name them for
            // diagnostics and disassembly.
            for b in &weights_of[tile as usize] {
                symbols.push(Symbol {
                    name: buffer_request_name(plan, b.id),
                    addr: addr(b.id),
                    size: b.bytes,
                    kind: SymbolKind::Data,
                });
            }
            segments.sort_by_key(|s| s.addr);
            symbols.sort_by(|a, b| (a.addr, &a.name).cmp(&(b.addr, &b.name)));
            Ok(TileImage {
                tile,
                segments,
                entry: sup_base,
                symbols,
            })
        })
        .collect();

    let exchanges = plan
        .exchanges
        .iter()
        .map(|x| ExchangeProgram {
            id: x.id,
            name: x.name.clone(),
        })
        .collect();
    // The package carries each weight image; the host streams it at initialisation.
    let mut bindings = host.plan.package_bindings();
    for (b, p) in bindings.iter_mut().zip(&plan.bindings) {
        debug_assert_eq!(b.name, p.name);
        b.data = p.data.clone();
    }
    Ok(Package {
        machine_toml: machine.to_toml(),
        tiles: tiles?,
        exchanges,
        bindings,
    })
}

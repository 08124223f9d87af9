//! Access contracts: what a kernel needs from the memory its operands live in.
//!
//! The types mirror, but do not import, the placement engine's request types: the
//! compiler maps a contract to placement requests, so placement can change its
//! representation without touching every kernel. The memory class is the exception:
//! it is the machine's ([`tessera_machine::MemClass`]), which both read. [`Contract::check`] verifies a
//! concrete set of addresses against the declared contract, using only the machine
//! description, so tests and the compiler's placement checker share one reading of it.

use serde::{Deserialize, Serialize};
use tessera_machine::Machine;

use crate::OperandAddrs;

/// How a kernel uses an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Read only, produced elsewhere.
    Input,
    /// Written in full; prior contents are irrelevant.
    Output,
    /// Read and written (accumulators, ping-pong partials).
    InOut,
    /// Read only, constant for the whole program (loaded once).
    Weights,
    /// The vertex state: built by [`crate::Kernel::state`], read by the workers and,
    /// for kernels with a supervisor loop, rewritten by the supervisor per call.
    State,
}

// The memory map's own class, which placement reads too: one type, so the compiler
// passes a contract's class to placement as it is.
pub use tessera_machine::MemClass;

/// One operand's requirements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operand {
    pub name: String,
    pub role: Role,
    pub bytes: u32,
    /// Power of two; the address must be a multiple of it.
    pub align: u32,
    pub mem_class: MemClass,
    /// Bytes the kernel may read past the end; they must be readable memory of the
    /// same region. Every kernel in this crate currently declares 0.
    pub tail_bytes: u32,
    /// Operands that must not share a placement element (an element, or an element
    /// pair in an interleaved region) with this one, because the kernel streams them
    /// in the same issue. Listed symmetrically on both operands.
    pub separate_from: Vec<String>,
}

impl Operand {
    pub(crate) fn new(name: &str, role: Role, bytes: u32, align: u32) -> Operand {
        Operand {
            name: name.to_string(),
            role,
            bytes,
            align,
            mem_class: MemClass::Any,
            tail_bytes: 0,
            separate_from: Vec::new(),
        }
    }

    pub(crate) fn class(mut self, mem_class: MemClass) -> Operand {
        self.mem_class = mem_class;
        self
    }
}

/// The kernel's code requirement (the worker code emitted by `emit`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeRequirement {
    pub bytes: u32,
    /// Bundles must be 8-byte aligned and padding is computed relative to the start,
    /// so the code base must be a multiple of this.
    pub align: u32,
    pub mem_class: MemClass,
}

/// Everything a kernel needs from placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Contract {
    /// The kernel's symbol (unique per parameter set).
    pub kernel: String,
    pub code: CodeRequirement,
    /// Bytes of supervisor code the kernel's call snippet occupies.
    pub supervisor_bytes: u32,
    pub operands: Vec<Operand>,
}

/// One way a set of addresses breaks a contract.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("operand `{0}` has no address")]
    Missing(String),
    #[error("operand `{name}` at {addr:#x} is not {align}-byte aligned")]
    Misaligned { name: String, addr: u32, align: u32 },
    #[error("operand `{name}` at {addr:#x}+{bytes} (+{tail} tail) is not inside one region")]
    OutOfRegion {
        name: String,
        addr: u32,
        bytes: u32,
        tail: u32,
    },
    #[error("operand `{name}` at {addr:#x} is in a region its class {class:?} does not admit")]
    WrongClass {
        name: String,
        addr: u32,
        class: MemClass,
    },
    #[error("operands `{a}` and `{b}` share placement element {element}")]
    SharedElement { a: String, b: String, element: u32 },
}

impl Contract {
    pub fn operand(&self, name: &str) -> Option<&Operand> {
        self.operands.iter().find(|o| o.name == name)
    }

    /// Every way `addrs` breaks this contract on `machine` (empty: satisfied).
    /// Operand extents are checked as declared, so a contract that understates its
    /// kernel's needs passes here and is left for the simulator to catch.
    pub fn check(&self, machine: &Machine, addrs: &OperandAddrs) -> Vec<Violation> {
        let mut out = Vec::new();
        let mut spans: Vec<(&Operand, u32, u32)> = Vec::new();
        for op in &self.operands {
            let Some(addr) = addrs.get(&op.name) else {
                out.push(Violation::Missing(op.name.clone()));
                continue;
            };
            if addr % op.align.max(1) != 0 {
                out.push(Violation::Misaligned {
                    name: op.name.clone(),
                    addr,
                    align: op.align,
                });
            }
            let len = op.bytes.max(1) + op.tail_bytes;
            let last = addr.checked_add(len - 1);
            let region = machine.region_of(addr);
            let same_region = match (region, last) {
                (Some(r), Some(last)) => machine.region_of(last) == Some(r),
                _ => false,
            };
            if !same_region {
                out.push(Violation::OutOfRegion {
                    name: op.name.clone(),
                    addr,
                    bytes: op.bytes,
                    tail: op.tail_bytes,
                });
                continue;
            }
            let r = &machine.regions[region.expect("checked above")];
            if !op.mem_class.admits(r.interleaved, r.executable) {
                out.push(Violation::WrongClass {
                    name: op.name.clone(),
                    addr,
                    class: op.mem_class,
                });
            }
            let first_el = machine.element_span_of(addr).expect("inside SRAM");
            let last_el = machine
                .element_span_of(addr + op.bytes.max(1) - 1)
                .expect("inside SRAM");
            spans.push((op, first_el, last_el));
        }
        for (i, &(a, a0, a1)) in spans.iter().enumerate() {
            for &(b, b0, b1) in &spans[i + 1..] {
                let separated =
                    a.separate_from.contains(&b.name) || b.separate_from.contains(&a.name);
                if separated && a0 <= b1 && b0 <= a1 {
                    out.push(Violation::SharedElement {
                        a: a.name.clone(),
                        b: b.name.clone(),
                        element: a0.max(b0),
                    });
                }
            }
        }
        out
    }
}

/// Marks every pair in `names` as mutually separated.
pub(crate) fn separate_all(ops: &mut [Operand], names: &[&str]) {
    for op in ops.iter_mut() {
        if names.contains(&op.name.as_str()) {
            for other in names {
                if *other != op.name && !op.separate_from.iter().any(|s| s == other) {
                    op.separate_from.push(other.to_string());
                }
            }
        }
    }
}

//! The cost model's view of a supervisor snippet: it walks the words the emitter
//! produced, evaluating the integer registers that steer its loops, and charges
//! every issue by the machine's rules (docs/sim.md): the supervisor issues in
//! barrel slots no worker holds, waits `supervisor_result_latency` cycles for a
//! result it reads (post-increments are forwarded), and refills the pipeline after
//! a taken branch. Workers started by `runall` take the next free slots and hold
//! them for their issue count.
//!
//! It is a second, independent statement of the simulator's issue rules for the
//! straight-line snippets kernels emit; tests compare the two on every kernel.

use tessera_isa::{Inst, Word};
use tessera_machine::Timing;

/// Cycles from the snippet's first issue until the supervisor could issue the word
/// after it. `workers(k)` gives the issue slots of each worker for the `k`-th
/// `runall` the snippet executes. Loads read as zero; memory is not modelled.
pub(crate) fn supervisor_cycles(
    t: &Timing,
    words: &[Word],
    mut workers: impl FnMut(usize) -> Vec<u64>,
) -> u64 {
    let slots = u64::from(t.worker_issue_interval.max(1));
    let latency = u64::from(t.supervisor_result_latency);
    let mut m = [0u32; 16];
    let mut ready = [0u64; 32];
    // (start, end) of each worker's slot.
    let mut holds: Vec<(u64, u64)> = Vec::new();
    let mut clock = 0u64;
    let mut runs = 0usize;
    let mut pc = 0usize;
    // A runaway snippet is a bug in an emitter; stop rather than spin.
    let mut budget = 10_000_000u64;
    while pc < words.len() && budget > 0 {
        budget -= 1;
        let Word::Single(inst) = words[pc] else {
            pc += 1;
            continue;
        };
        let uses = inst.reg_use();
        let mut at = clock;
        for (r, &when) in ready.iter().enumerate() {
            if uses.reads & (1 << r) != 0 {
                at = at.max(when);
            }
        }
        at = first_free(&holds, slots, at);
        clock = at + 1;
        for (r, when) in ready.iter_mut().enumerate() {
            if uses.increments & (1 << r) != 0 {
                *when = at + 1;
            }
            if uses.writes & (1 << r) != 0 {
                *when = at + latency;
            }
        }
        let get = |m: &[u32; 16], r: tessera_isa::MReg| if r.0 >= 15 { 0 } else { m[r.0 as usize] };
        let mut next = pc + 1;
        match inst {
            Inst::Setzi { d, imm } => set(&mut m, d.0, imm),
            Inst::Int { op, d, a, b } => {
                let v = op.apply(get(&m, a), get(&m, b));
                set(&mut m, d.0, v)
            }
            Inst::IntImm { op, d, a, imm } => {
                let v = op.apply(get(&m, a), u32::from(imm));
                set(&mut m, d.0, v)
            }
            Inst::Ld32M { d, .. } => set(&mut m, d.0, 0),
            Inst::Brnz { c, target } | Inst::Brz { c, target } => {
                let taken = matches!(inst, Inst::Brnz { .. }) == (get(&m, c) != 0);
                if taken {
                    next = index_of(words, target);
                    clock = clock.max(at + latency);
                }
            }
            Inst::RunAll { .. } => {
                holds.clear();
                for (w, issues) in workers(runs).into_iter().enumerate() {
                    let start = first_free(&holds, slots, at + 1 + w as u64);
                    holds.push((start, start + issues * slots));
                }
                runs += 1;
            }
            Inst::SyncLocal => {
                clock = clock.max(holds.iter().map(|h| h.1).max().unwrap_or(0));
            }
            _ => {}
        }
        pc = next;
    }
    clock
}

/// Word index of a branch target, given that snippets are laid out from address
/// [`crate::ESTIMATE_CODE_BASE`] in the estimate.
fn index_of(words: &[Word], target: u32) -> usize {
    let mut addr = crate::ESTIMATE_CODE_BASE;
    for (i, w) in words.iter().enumerate() {
        if addr == target {
            return i;
        }
        addr += match w {
            Word::Single(_) => 4,
            Word::Bundle(..) => 8,
        };
    }
    words.len()
}

fn set(m: &mut [u32; 16], r: u8, v: u32) {
    if r < 15 {
        m[r as usize] = v;
    }
}

/// The first cycle at or after `from` whose barrel slot no worker holds.
fn first_free(holds: &[(u64, u64)], slots: u64, from: u64) -> u64 {
    let held = |c: u64| {
        holds
            .iter()
            .any(|&(s, e)| s <= c && c < e && s % slots == c % slots)
    };
    let mut c = from;
    loop {
        if let Some(k) = (0..slots).find(|&k| !held(c + k)) {
            return c + k;
        }
        // Every slot of the round is held: the first release of any hold in it.
        let round_end = c + slots;
        c = holds
            .iter()
            .filter(|&&(s, e)| s < round_end && c < e)
            .map(|h| h.1)
            .min()
            .unwrap_or(round_end)
            .max(c + 1);
    }
}

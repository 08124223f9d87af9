//! Exchange phases as the tiles' code makes them: each supervisor's `send`, `mux`
//! and `recv` since its global sync are logged as they issue; when every tile of
//! the superstep has stopped, the tiles that ended phase `id` with `exchange id`
//! are matched here. A `recv` names message `k` of the tile its mux selects; that
//! tile must have ended the same phase and sent at least `k + 1` messages. All
//! sources are read before any destination is written (BSP), and what moves is
//! exactly what the decoded instructions say.

use std::collections::HashMap;

use rayon::prelude::*;
use tessera_machine::{ExchangeLoad, Machine};

use crate::mem::Layout;
use crate::tile::Tile;

/// One supervisor's exchange instructions since its last global sync.
#[derive(Debug, Clone, Default)]
pub(crate) struct ExchangeLog {
    /// (address, bytes) of each message, in message order.
    pub sends: Vec<(u32, u32)>,
    /// The source tile the incoming mux selects.
    pub mux: Option<u32>,
    /// (destination address, source tile, message).
    pub recvs: Vec<(u32, u32, u16)>,
}

impl ExchangeLog {
    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty()
    }
}

/// One message landing on a tile.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Landing {
    pub dst: u32,
    /// The sending tile's slot.
    pub from: usize,
    pub src: u32,
    pub bytes: u32,
    /// The message's number among all messages of the phase.
    pub msg: usize,
}

/// A matched phase: each executing tile slot's landings, the cycle its tiles were
/// released by their sync (where it begins), and the cycle it ends.
pub(crate) struct Matched {
    pub lands: Vec<(usize, Vec<Landing>)>,
    pub begin: u64,
    pub end: u64,
}

/// Matches the logs of the tiles in `executers` (slots that ended phase `id`,
/// in increasing order), or returns the faults, (slot, cause), in slot order.
pub(crate) fn match_phase(
    machine: &Machine,
    layout: &Layout,
    tiles: &[Tile],
    slot_of: &crate::Slots,
    id: u16,
    executers: &[usize],
) -> Result<Matched, Vec<(usize, String)>> {
    // Each executer's messages get consecutive numbers, so that the receivers of
    // a message are counted in a vector, not a map: a phase of a whole tower
    // lands hundreds of thousands of messages, and this part of the phase is
    // serial.
    let mut first_msg = vec![usize::MAX; tiles.len()];
    let mut messages = 0;
    for &s in executers {
        first_msg[s] = messages;
        messages += tiles[s].sh.xlog.sends.len();
    }
    // Every tile's own landings checked apart from the others', in parallel.
    let resolved: Vec<Result<Vec<Landing>, String>> = executers
        .par_iter()
        .map(|&s| landings(layout, tiles, slot_of, &first_msg, id, s))
        .collect();
    let mut faults = Vec::new();
    let mut lands = Vec::with_capacity(executers.len());
    for (&s, r) in executers.iter().zip(resolved) {
        match r {
            Ok(mine) => lands.push((s, mine)),
            Err(f) => faults.push((s, f)),
        }
    }
    if !faults.is_empty() {
        return Err(faults);
    }
    // The receivers of message `m` are `receivers[at[m]..at[m + 1]]`.
    let mut at = vec![0usize; messages + 1];
    for (_, mine) in &lands {
        for l in mine {
            at[l.msg + 1] += 1;
        }
    }
    for m in 0..messages {
        at[m + 1] += at[m];
    }
    let mut receivers = vec![0u32; at[messages]];
    let mut next = at.clone();
    for (s, mine) in &lands {
        for l in mine {
            receivers[next[l.msg]] = tiles[*s].id;
            next[l.msg] += 1;
        }
    }
    // Counted by parts of the executers in parallel, then summed.
    let load = executers
        .par_iter()
        .fold(
            || ExchangeLoad::new(machine),
            |mut load, &s| {
                let t = &tiles[s];
                for (k, &(_, bytes)) in t.sh.xlog.sends.iter().enumerate() {
                    let m = first_msg[s] + k;
                    load.add(
                        t.id,
                        u64::from(bytes),
                        receivers[at[m]..at[m + 1]].iter().copied(),
                    );
                }
                load
            },
        )
        .reduce(
            || ExchangeLoad::new(machine),
            |mut a, b| {
                a.merge(&b);
                a
            },
        );
    let base = executers
        .iter()
        .map(|&s| tiles[s].released)
        .min()
        .unwrap_or(0);
    let code: HashMap<u32, u64> = executers
        .iter()
        .map(|&s| (tiles[s].id, tiles[s].clock().saturating_sub(base)))
        .collect();
    let end = base + load.cycles_with(|t| code.get(&t).copied().unwrap_or(0));
    Ok(Matched {
        lands,
        begin: base,
        end,
    })
}

/// The messages tile slot `s` receives, each checked against its source's log,
/// or the first fault among them.
fn landings(
    layout: &Layout,
    tiles: &[Tile],
    slot_of: &crate::Slots,
    first_msg: &[usize],
    id: u16,
    s: usize,
) -> Result<Vec<Landing>, String> {
    let t = &tiles[s];
    let mut mine = Vec::with_capacity(t.sh.xlog.recvs.len());
    for &(addr, src, msg) in &t.sh.xlog.recvs {
        // A source that did not end this phase has no message numbers.
        let from = slot_of.get(src).filter(|&f| first_msg[f] != usize::MAX);
        let Some(from) = from else {
            return Err(format!(
                "exchange #{id}: tile {} receives message {msg} of tile {src}, which did not end exchange #{id} in this superstep",
                t.id
            ));
        };
        let sent = &tiles[from].sh.xlog.sends;
        let Some(&(src_addr, bytes)) = sent.get(usize::from(msg)) else {
            return Err(format!(
                "exchange #{id}: tile {} receives message {msg} of tile {src}, which sent {}",
                t.id,
                sent.len()
            ));
        };
        if !layout.range_ok(addr, bytes) {
            return Err(format!(
                "exchange #{id}: message {msg} of tile {src} ({bytes} bytes) lands at {addr:#x}, outside SRAM"
            ));
        }
        mine.push(Landing {
            dst: addr,
            from,
            src: src_addr,
            bytes,
            msg: first_msg[from] + usize::from(msg),
        });
    }
    match first_overlap(id, t.id, &mine) {
        Some(f) => Err(f),
        None => Ok(mine),
    }
}

/// The first two landings of one tile that write the same bytes.
fn first_overlap(id: u16, tile: u32, lands: &[Landing]) -> Option<String> {
    let mut r: Vec<(u32, u32, usize)> = lands
        .iter()
        .enumerate()
        .filter(|(_, l)| l.bytes > 0)
        .map(|(k, l)| (l.dst, l.dst + l.bytes, k))
        .collect();
    r.sort_unstable();
    r.windows(2).find(|w| w[1].0 < w[0].1).map(|w| {
        format!(
            "exchange #{id}: conflict: receives {} and {} both write bytes {:#x}..{:#x} of tile {tile}",
            w[0].2,
            w[1].2,
            w[1].0,
            w[0].1.min(w[1].1)
        )
    })
}

/// Carries out a matched phase: every source read, then every destination
/// written, the tiles in parallel. A tile's incoming bytes are gathered in its
/// buffer of `bufs` (one a tile slot, kept by the caller from phase to phase:
/// a tower's phase lands hundreds of thousands of messages).
pub(crate) fn land(tiles: &mut [Tile], layout: &Layout, m: &Matched, bufs: &mut Vec<Vec<u8>>) {
    let start = layout.start;
    bufs.resize_with(tiles.len(), Vec::new);
    let mut by_slot: Vec<&[Landing]> = vec![&[]; tiles.len()];
    for (s, ls) in &m.lands {
        by_slot[*s] = ls;
    }
    let sources: &[Tile] = tiles;
    bufs.par_iter_mut().zip(&by_slot).for_each(|(buf, ls)| {
        buf.clear();
        for l in *ls {
            let off = (l.src - start) as usize;
            buf.extend_from_slice(&sources[l.from].sh.mem[off..off + l.bytes as usize]);
        }
    });
    tiles
        .par_iter_mut()
        .zip(bufs.par_iter())
        .zip(by_slot)
        .for_each(|((t, buf), ls)| {
            let mut from = 0;
            for l in ls {
                let (off, n) = ((l.dst - start) as usize, l.bytes as usize);
                t.sh.mem[off..off + n].copy_from_slice(&buf[from..from + n]);
                from += n;
                crate::write_code_check(&mut t.sh, start, l.dst, l.bytes);
            }
        });
}

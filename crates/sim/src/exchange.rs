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
}

/// A matched phase: each executing tile slot's landings, the cycle its tiles were
/// released by their sync (where it begins), and the cycle it ends.
pub(crate) struct Matched {
    pub lands: Vec<(usize, Vec<Landing>)>,
    pub begin: u64,
    pub end: u64,
}

/// Bytes to write on one tile: (address, bytes).
type Writes = Vec<(u32, Vec<u8>)>;

/// Matches the logs of the tiles in `executers` (slots that ended phase `id`),
/// or returns the faults, (slot, cause), in slot order.
pub(crate) fn match_phase(
    machine: &Machine,
    layout: &Layout,
    tiles: &[Tile],
    slot_of: &HashMap<u32, usize>,
    id: u16,
    executers: &[usize],
) -> Result<Matched, Vec<(usize, String)>> {
    let ends = |s: usize| executers.binary_search(&s).is_ok();
    let mut faults = Vec::new();
    let mut lands = Vec::with_capacity(executers.len());
    // Receivers of each (source slot, message), for the phase's timing.
    let mut receivers: HashMap<(usize, u16), Vec<u32>> = HashMap::new();
    for &s in executers {
        let t = &tiles[s];
        let mut mine = Vec::with_capacity(t.sh.xlog.recvs.len());
        let mut fault = None;
        for &(addr, src, msg) in &t.sh.xlog.recvs {
            let from = slot_of.get(&src).copied().filter(|&f| ends(f));
            let Some(from) = from else {
                fault = Some(format!(
                    "exchange #{id}: tile {} receives message {msg} of tile {src}, which did not end exchange #{id} in this superstep",
                    t.id
                ));
                break;
            };
            let sent = &tiles[from].sh.xlog.sends;
            let Some(&(src_addr, bytes)) = sent.get(usize::from(msg)) else {
                fault = Some(format!(
                    "exchange #{id}: tile {} receives message {msg} of tile {src}, which sent {}",
                    t.id,
                    sent.len()
                ));
                break;
            };
            if !layout.range_ok(addr, bytes) {
                fault = Some(format!(
                    "exchange #{id}: message {msg} of tile {src} ({bytes} bytes) lands at {addr:#x}, outside SRAM"
                ));
                break;
            }
            receivers.entry((from, msg)).or_default().push(t.id);
            mine.push(Landing {
                dst: addr,
                from,
                src: src_addr,
                bytes,
            });
        }
        if fault.is_none() {
            fault = first_overlap(id, t.id, &mine);
        }
        match fault {
            Some(f) => faults.push((s, f)),
            None => lands.push((s, mine)),
        }
    }
    if !faults.is_empty() {
        return Err(faults);
    }
    let mut load = ExchangeLoad::new(machine);
    for &s in executers {
        let t = &tiles[s];
        for (k, &(_, bytes)) in t.sh.xlog.sends.iter().enumerate() {
            let dsts = u16::try_from(k)
                .ok()
                .and_then(|k| receivers.get(&(s, k)))
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            load.add(t.id, u64::from(bytes), dsts.iter().copied());
        }
    }
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
/// written, the tiles in parallel.
pub(crate) fn land(tiles: &mut [Tile], layout: &Layout, m: &Matched) {
    let start = layout.start;
    let data: Vec<(usize, Writes)> = m
        .lands
        .par_iter()
        .map(|(s, ls)| {
            let bytes = ls
                .iter()
                .map(|l| {
                    let off = (l.src - start) as usize;
                    let n = l.bytes as usize;
                    (l.dst, tiles[l.from].sh.mem[off..off + n].to_vec())
                })
                .collect();
            (*s, bytes)
        })
        .collect();
    let mut by_slot: Vec<Option<Writes>> = (0..tiles.len()).map(|_| None).collect();
    for (s, d) in data {
        by_slot[s] = Some(d);
    }
    tiles.par_iter_mut().zip(by_slot).for_each(|(t, d)| {
        for (dst, bytes) in d.into_iter().flatten() {
            let off = (dst - start) as usize;
            t.sh.mem[off..off + bytes.len()].copy_from_slice(&bytes);
            crate::write_code_check(&mut t.sh, start, dst, bytes.len() as u32);
        }
    });
}

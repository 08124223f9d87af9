//! Copying tile memory out at superstep boundaries during a run: a simulator's
//! privilege (hardware would need the program to send the bytes to the host), used
//! to check every operation's output where it ends, not only what the program
//! sends out. And its test hook: scaling f16 values in tile memory there, to see
//! that the checks catch a wrong block.

use crate::fp::{f16_to_f32, f32_to_f16};
use crate::tile::TileState;
use crate::{SimOptions, Simulator};

/// A superstep boundary at which every tile has stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CapturePoint {
    /// The tiles have reached exchange program `id` for the `n`-th time
    /// (from 0; a program that loops runs one exchange many times), and it has
    /// not run yet: the compute before it is done everywhere.
    Exchange(u16, u32),
    /// The run has ended (every tile exited, or a superstep with a fault ended).
    End,
}

/// `len` bytes of tile memory from `addr`, copied out at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capture {
    pub at: CapturePoint,
    pub tile: u32,
    pub addr: u32,
    pub len: u32,
}

/// Test hook: at `at`, before that point's captures, multiply the `len / 2` f16
/// values from `addr` by `factor` (rounded to f16) in tile memory; the run goes on
/// with them.
#[derive(Debug, Clone, PartialEq)]
pub struct Perturb {
    pub at: CapturePoint,
    pub tile: u32,
    pub addr: u32,
    pub len: u32,
    pub factor: f32,
}

impl Simulator {
    /// The bytes of each of the last run's [`SimOptions::captures`], in request
    /// order: `None` for a point the run never reached (it faulted before) or a
    /// range outside the tile's memory (or a tile without an image), and for
    /// every capture when [`SimOptions::on_capture`] took them.
    pub fn captured(&self) -> &[Option<Vec<u8>>] {
        &self.captured
    }

    /// Perturbs and captures at the exchanges the tiles have stopped at.
    pub(crate) fn capture_at_exchanges(&mut self, opts: &SimOptions) {
        if opts.captures.is_empty() && opts.perturb.is_empty() {
            return;
        }
        let mut ids: Vec<u16> = self
            .tiles
            .iter()
            .filter_map(|t| match t.state {
                TileState::AtExchange { id, .. } => Some(id),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let n = self.exchanges_reached.entry(id).or_insert(0);
            let nth = *n;
            *n += 1;
            self.capture_at(CapturePoint::Exchange(id, nth), opts);
        }
    }

    /// Perturbs, then captures, at `point`.
    pub(crate) fn capture_at(&mut self, point: CapturePoint, opts: &SimOptions) {
        for p in opts.perturb.iter().filter(|p| p.at == point) {
            let Some(i) = self.slot_of.get(p.tile) else {
                continue;
            };
            if !self.layout.range_ok(p.addr, p.len) {
                continue;
            }
            let off = (p.addr - self.layout.start) as usize;
            let sh = &mut self.tiles[i].sh;
            for v in sh.mem[off..off + p.len as usize].chunks_exact_mut(2) {
                let x = f16_to_f32(u16::from_le_bytes([v[0], v[1]])) * p.factor;
                v.copy_from_slice(&f32_to_f16(x).to_le_bytes());
            }
            crate::write_code_check(sh, self.layout.start, p.addr, p.len);
        }
        // A point is reached once in a run, so each capture is taken once.
        let Some(ks) = self.capture_points.remove(&point) else {
            return;
        };
        for k in ks {
            let c = &opts.captures[k];
            let bytes = self.read_memory(c.tile, c.addr, c.len).map(<[u8]>::to_vec);
            match (&opts.on_capture, bytes) {
                (Some(hook), Some(b)) => (hook.0)(k, b),
                (None, b) => self.captured[k] = b,
                (Some(_), None) => {}
            }
        }
    }
}

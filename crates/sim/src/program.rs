//! Pre-decoded code: each tile's executable segments decoded once into one slot per
//! 4-byte address, so the interpreter fetches by indexing. Tiles with identical code
//! share one program. A store into code re-decodes the words it touched (the tile's
//! copy becomes private first), so self-modifying code stays correct.

use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use tessera_isa::{Word, decode_word};
use tessera_package::TileImage;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Slot {
    /// A word that decodes (4 or 8 bytes, by its variant).
    Word(Word),
    /// Bytes that do not decode; re-decoded for the message only if executed.
    Invalid,
    /// Not part of an executable segment.
    NoCode,
}

#[derive(Debug, Clone)]
pub(crate) struct Program {
    /// Byte range covered by `slots` (from the lowest executable segment to the end
    /// of the highest).
    pub start: u32,
    pub end: u32,
    pub slots: Vec<Slot>,
}

/// Why fetching at a pc failed.
pub(crate) enum FetchError {
    /// Outside executable code.
    NoCode,
    /// Executable but undecodable.
    Invalid,
}

impl Program {
    pub fn empty() -> Program {
        Program {
            start: 0,
            end: 0,
            slots: Vec::new(),
        }
    }

    /// Decodes the executable segments of `image` (assumed validated: 4-byte
    /// aligned, inside SRAM).
    pub fn build(image: &TileImage) -> Program {
        let exec: Vec<_> = image.segments.iter().filter(|s| s.perms.execute).collect();
        let Some(start) = exec.iter().map(|s| s.addr).min() else {
            return Program::empty();
        };
        let end = exec
            .iter()
            .map(|s| (s.addr + s.size).next_multiple_of(4))
            .max()
            .unwrap_or(start);
        let len = (end - start) as usize;
        let mut bytes = vec![0u8; len + 4];
        let mut code = vec![false; len / 4];
        for s in &exec {
            let off = (s.addr - start) as usize;
            let n = s.bytes.len().min(s.size as usize);
            bytes[off..off + n].copy_from_slice(&s.bytes[..n]);
            let words = (s.size as usize).div_ceil(4);
            for c in &mut code[off / 4..off / 4 + words] {
                *c = true;
            }
        }
        let slots = (0..len / 4)
            .map(|i| {
                if !code[i] {
                    return Slot::NoCode;
                }
                let at = i * 4;
                // A bundle's second half must itself be code.
                let limit = if i + 1 < code.len() && code[i + 1] {
                    at + 8
                } else {
                    at + 4
                };
                decode_slot(&bytes[at..limit])
            })
            .collect();
        Program { start, end, slots }
    }

    /// The word at `pc` (any alignment is rejected by the caller's rules).
    #[inline(always)]
    pub fn fetch(&self, pc: u32) -> Result<&Word, FetchError> {
        let idx = (pc.wrapping_sub(self.start) / 4) as usize;
        if !pc.is_multiple_of(4) {
            return Err(FetchError::NoCode);
        }
        match self.slots.get(idx) {
            Some(Slot::Word(w)) => Ok(w),
            Some(Slot::Invalid) => Err(FetchError::Invalid),
            _ => Err(FetchError::NoCode),
        }
    }

    pub fn is_code(&self, pc: u32) -> bool {
        pc.is_multiple_of(4)
            && pc >= self.start
            && matches!(
                self.slots.get(((pc - self.start) / 4) as usize),
                Some(Slot::Word(_) | Slot::Invalid)
            )
    }

    /// Whether a store to `[addr, addr + len)` touches decoded code.
    #[inline(always)]
    pub fn overlaps(&self, addr: u32, len: u32) -> bool {
        addr < self.end && addr + len > self.start
    }

    /// Re-decodes the slots a store to `[addr, addr + len)` may have changed, from
    /// the tile memory `mem` (which starts at `sram_start`).
    pub fn redecode(&mut self, mem: &[u8], sram_start: u32, addr: u32, len: u32) {
        let first = addr.saturating_sub(4).max(self.start);
        let last = (addr + len).min(self.end);
        let mut pc = first & !3;
        while pc < last {
            let i = ((pc - self.start) / 4) as usize;
            if !matches!(self.slots[i], Slot::NoCode) {
                let off = (pc - sram_start) as usize;
                let next_is_code =
                    matches!(self.slots.get(i + 1), Some(Slot::Word(_) | Slot::Invalid));
                let limit = if next_is_code { off + 8 } else { off + 4 };
                self.slots[i] = decode_slot(&mem[off..limit.min(mem.len())]);
            }
            pc += 4;
        }
    }
}

fn decode_slot(bytes: &[u8]) -> Slot {
    match decode_word(bytes) {
        Ok((w, _)) => Slot::Word(w),
        Err(_) => Slot::Invalid,
    }
}

/// The executable segments of an image: (address, size, initial bytes).
/// A code segment by reference: address, size and bytes.
type CodeRef<'a> = (u32, u32, &'a [u8]);

/// The decoded programs of a package's tiles, one per distinct code (most tiles
/// run the same kernels): the code segments are compared by reference, so no code
/// is copied, and the distinct programs are decoded in parallel.
pub(crate) fn programs(images: &[TileImage]) -> Vec<Arc<Program>> {
    let keys: Vec<Vec<CodeRef>> = images
        .par_iter()
        .map(|image| {
            image
                .segments
                .iter()
                .filter(|s| s.perms.execute)
                .map(|s| (s.addr, s.size, s.bytes.as_slice()))
                .collect()
        })
        .collect();
    let mut first_of: HashMap<&[CodeRef], usize> = HashMap::new();
    let rep: Vec<usize> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| *first_of.entry(k.as_slice()).or_insert(i))
        .collect();
    let built: HashMap<usize, Arc<Program>> = (0..images.len())
        .into_par_iter()
        .filter(|&i| rep[i] == i)
        .map(|i| (i, Arc::new(Program::build(&images[i]))))
        .collect();
    rep.iter().map(|r| built[r].clone()).collect()
}

//! The tile address map as the interpreter needs it: bounds, alignment, region
//! rules and memory elements, precomputed from the machine description.

use tessera_machine::Machine;

#[derive(Debug, Clone, Copy, Default)]
struct RegionInfo {
    start: u32,
    end: u32,
    interleaved: bool,
    executable: bool,
    /// log2 of `element_bytes` (a power of two, validated by the machine).
    element_shift: u32,
    first_element: u32,
}

/// Why an access is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrError {
    Outside,
    Misaligned,
    NotInterleaved,
}

#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub start: u32,
    pub end: u32,
    regions: Vec<RegionInfo>,
    /// The first two regions inline (every preset has two), so that the element
    /// of an address needs no pointer chase; `split` is the first region's end.
    fast: [RegionInfo; 2],
    split: u32,
    two_regions: bool,
}

#[inline(always)]
fn element_in(r: &RegionInfo, addr: u32) -> u32 {
    let off = addr.wrapping_sub(r.start);
    if r.interleaved {
        r.first_element + ((off >> (r.element_shift + 1)) << 1) + ((off >> 3) & 1)
    } else {
        r.first_element + (off >> r.element_shift)
    }
}

impl Layout {
    pub fn new(m: &Machine) -> Layout {
        let mut first_element = 0;
        let regions = m
            .regions
            .iter()
            .map(|r| {
                let info = RegionInfo {
                    start: r.start,
                    end: r.end,
                    interleaved: r.interleaved,
                    executable: r.executable,
                    element_shift: r.element_bytes.trailing_zeros(),
                    first_element,
                };
                first_element += r.len() / r.element_bytes;
                info
            })
            .collect::<Vec<RegionInfo>>();
        let fast = [
            regions.first().copied().unwrap_or_default(),
            regions.get(1).copied().unwrap_or_default(),
        ];
        Layout {
            start: m.sram_start(),
            end: m.sram_end(),
            split: fast[0].end,
            two_regions: regions.len() == 2,
            fast,
            regions,
        }
    }

    pub fn bytes(&self) -> usize {
        (self.end - self.start) as usize
    }

    /// Offset into tile memory of an access of `size` (a power of two) bytes.
    /// Addresses are u64 so that base + offset arithmetic can never wrap.
    #[inline(always)]
    pub fn check(&self, addr: u64, size: u32) -> Result<usize, AddrError> {
        if addr < u64::from(self.start) || addr + u64::from(size) > u64::from(self.end) {
            return Err(AddrError::Outside);
        }
        if addr & u64::from(size - 1) != 0 {
            return Err(AddrError::Misaligned);
        }
        Ok((addr - u64::from(self.start)) as usize)
    }

    /// As [`Layout::check`] for 16 bytes, and the region must be interleaved.
    #[inline]
    pub fn check128(&self, addr: u64) -> Result<usize, AddrError> {
        let off = self.check(addr, 16)?;
        if self.region(addr as u32).is_some_and(|r| r.interleaved) {
            Ok(off)
        } else {
            Err(AddrError::NotInterleaved)
        }
    }

    /// Whether a byte range lies inside SRAM.
    pub fn range_ok(&self, addr: u32, len: u32) -> bool {
        u64::from(addr) >= u64::from(self.start)
            && u64::from(addr) + u64::from(len) <= u64::from(self.end)
    }

    fn region(&self, addr: u32) -> Option<&RegionInfo> {
        self.regions
            .iter()
            .find(|r| r.start <= addr && addr < r.end)
    }

    pub fn is_executable(&self, addr: u32) -> bool {
        self.region(addr).is_some_and(|r| r.executable)
    }

    /// Whether `[addr, addr + len)` lies inside one executable region.
    pub fn range_executable(&self, addr: u32, len: u32) -> bool {
        let end = u64::from(addr) + u64::from(len);
        self.region(addr)
            .is_some_and(|r| r.executable && end <= u64::from(r.end))
    }

    /// The memory element serving `addr` (same numbering as
    /// `Machine::element_of`); only called on checked addresses.
    #[inline(always)]
    pub fn element(&self, addr: u32) -> u32 {
        if self.two_regions {
            let r = &self.fast[usize::from(addr >= self.split)];
            return element_in(r, addr);
        }
        self.element_slow(addr)
    }

    fn element_slow(&self, addr: u32) -> u32 {
        for r in &self.regions {
            if addr < r.end {
                return element_in(r, addr);
            }
        }
        u32::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_match_the_machine() {
        let m = Machine::c600();
        let l = Layout::new(&m);
        for addr in (m.sram_start()..m.sram_end()).step_by(8 * 97) {
            assert_eq!(Some(l.element(addr)), m.element_of(addr), "{addr:#x}");
        }
    }

    #[test]
    fn checks() {
        let l = Layout::new(&Machine::c600());
        assert_eq!(l.check(0x4_C000, 8), Ok(0));
        assert_eq!(l.check(0x4_C002, 8), Err(AddrError::Misaligned));
        assert_eq!(l.check(0x4_BFF8, 8), Err(AddrError::Outside));
        assert_eq!(l.check(0xE_7FF8, 8), Ok(0xE_7FF8 - 0x4_C000));
        assert_eq!(l.check(0xE_8000, 4), Err(AddrError::Outside));
        assert_eq!(l.check(u64::from(u32::MAX) + 8, 8), Err(AddrError::Outside));
        assert_eq!(l.check128(0x7_FFF0), Err(AddrError::NotInterleaved));
        assert_eq!(l.check128(0x8_0000), Ok(0x8_0000 - 0x4_C000));
    }
}

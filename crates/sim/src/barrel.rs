//! The tile's barrel: `slots` issue slots taken in turn, one per cycle, so cycle `c`
//! belongs to slot `c % slots`. A running worker holds one slot from its start to
//! the cycle after its last issue; the supervisor issues in every slot no worker
//! holds. Workers therefore issue once per round whatever the supervisor does,
//! while the supervisor's pace depends on how many workers run (none: a slot every
//! cycle; six: no slot at all until one exits).

/// Where one worker's slot is held: cycles `start..end`, in slot `slot`
/// (`start % slots`, kept so that the supervisor's every issue does not divide).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Hold {
    pub start: u64,
    pub end: u64,
    pub slot: u64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Barrel {
    pub slots: u64,
    /// One entry per worker context; an empty range when it never ran.
    pub holds: Vec<Hold>,
}

impl Barrel {
    pub fn new(slots: u64, workers: usize) -> Barrel {
        Barrel {
            slots: slots.max(1),
            holds: vec![Hold::default(); workers],
        }
    }

    /// Whether a worker other than `except` holds cycle `c`, whose slot is `slot`.
    #[inline]
    fn held(&self, c: u64, slot: u64, except: Option<usize>) -> bool {
        self.holds
            .iter()
            .enumerate()
            .any(|(w, h)| h.slot == slot && h.start <= c && c < h.end && Some(w) != except)
    }

    /// The first cycle at or after `from` whose slot no worker (other than
    /// `except`) holds.
    pub fn first_free(&self, from: u64, except: Option<usize>) -> u64 {
        let mut c = from;
        loop {
            // The supervisor asks on every issue (a sixth of the simulator's time
            // went to this search when it divided per hold and cycle): one
            // division a round, the other cycles' slots by counting.
            let mut slot = c % self.slots;
            for k in 0..self.slots {
                if !self.held(c + k, slot, except) {
                    return c + k;
                }
                slot += 1;
                if slot == self.slots {
                    slot = 0;
                }
            }
            // Every slot is held for a whole round: skip to the first release of
            // any hold in that round (a worker that started late in it may exit
            // before the ones that started early).
            let round_end = c + self.slots;
            c = self
                .holds
                .iter()
                .enumerate()
                .filter(|&(w, h)| Some(w) != except && h.start < round_end && c < h.end)
                .map(|(_, h)| h.end)
                .min()
                .unwrap_or(round_end)
                .max(c + 1);
        }
    }

    /// Worker `w` takes its slot from `start` (a cycle `first_free` returned) until
    /// it is known to end.
    pub fn hold(&mut self, w: usize, start: u64, end: u64) {
        let slot = start % self.slots;
        if let Some(h) = self.holds.get_mut(w) {
            *h = Hold { start, end, slot };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supervisor_takes_free_slots() {
        let mut b = Barrel::new(6, 6);
        assert_eq!(b.first_free(10, None), 10);
        // Six workers started at 11..=16 hold every slot until the first exits.
        for w in 0..6 {
            b.hold(w, 11 + w as u64, 11 + w as u64 + 600);
        }
        assert_eq!(b.first_free(11, None), 611);
        // Before they start, cycle 10's slot is still the supervisor's.
        assert_eq!(b.first_free(10, None), 10);
        // With worker 2 gone early, its slot comes round every six cycles.
        b.hold(2, 13, 13 + 60);
        assert_eq!(b.first_free(20, None), 73);
        assert_eq!(b.first_free(74, None), 79);
        // The last worker to start is the first to exit: its slot comes back then.
        let mut b = Barrel::new(6, 6);
        for w in 0..6 {
            let start = 8 + w as u64;
            b.hold(w, start, start + 6 * (25 - 3 * w as u64));
        }
        assert_eq!(b.first_free(8, None), 13 + 60);
    }
}

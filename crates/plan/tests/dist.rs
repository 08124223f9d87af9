//! The redistribution against a byte-level oracle: random source and destination
//! layouts (fixed seeds) of random tensors; applying the copies must give every
//! destination part exactly the tensor's values, no two copies may write the same
//! destination bytes, and whole blocks move as single copies.

use std::collections::BTreeMap;

use tessera_plan::{BufId, Copy, DistError, DistTensor, Loc, Part, redistribute};

/// A small deterministic generator (splitmix64): the test needs no crate for it.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n.max(1))) as u32
    }
}

/// Cuts `0..n` into 1..=k ranges.
fn cuts(rng: &mut Rng, n: u32, k: u32) -> Vec<std::ops::Range<u32>> {
    let mut points: Vec<u32> = (0..rng.below(k)).map(|_| 1 + rng.below(n - 1)).collect();
    points.push(0);
    points.push(n);
    points.sort_unstable();
    points.dedup();
    points.windows(2).map(|w| w[0]..w[1]).collect()
}

/// A grid layout of `[rows, cols]`, each block in its own buffer from `first_buf`;
/// `replicas` extra copies of some blocks.
fn layout(rng: &mut Rng, rows: u32, cols: u32, first_buf: u32, replicas: u32) -> DistTensor {
    let mut parts = Vec::new();
    let mut buf = first_buf;
    for r in cuts(rng, rows, 4) {
        for c in cuts(rng, cols, 4) {
            for _ in 0..=rng.below(replicas + 1).min(replicas) {
                parts.push(Part {
                    at: Loc {
                        buf: BufId(buf),
                        offset: 8 * rng.below(4),
                    },
                    rows: r.clone(),
                    cols: c.clone(),
                });
                buf += 1;
            }
        }
    }
    DistTensor {
        rows,
        cols,
        elem_bytes: 2,
        parts,
    }
}

type Memory = BTreeMap<BufId, Vec<u8>>;

/// The value of element (r, c): two bytes that identify it.
fn value(r: u32, c: u32) -> [u8; 2] {
    (((r * 131 + c * 7) & 0xffff) as u16).to_le_bytes()
}

fn fill(t: &DistTensor, mem: &mut Memory) {
    for p in &t.parts {
        let b = mem.entry(p.at.buf).or_insert_with(|| vec![0xEE; 8192]);
        for r in p.rows.clone() {
            for c in p.cols.clone() {
                let off = p.at.offset as usize
                    + 2 * ((r - p.rows.start) * (p.cols.end - p.cols.start) + (c - p.cols.start))
                        as usize;
                b[off..off + 2].copy_from_slice(&value(r, c));
            }
        }
    }
}

fn check(src: &DistTensor, dst: &DistTensor, copies: &[Copy]) {
    let mut mem = Memory::new();
    fill(src, &mut mem);
    for p in &dst.parts {
        mem.entry(p.at.buf).or_insert_with(|| vec![0xEE; 8192]);
    }
    // BSP semantics: read every source, then write; no byte written twice.
    let data: Vec<Vec<u8>> = copies
        .iter()
        .map(|c| {
            let s = c.src.offset as usize;
            mem[&c.src.buf][s..s + c.bytes as usize].to_vec()
        })
        .collect();
    let mut written: BTreeMap<(BufId, u32), usize> = BTreeMap::new();
    for (k, (c, d)) in copies.iter().zip(&data).enumerate() {
        for to in &c.dsts {
            for i in 0..c.bytes {
                if let Some(j) = written.insert((to.buf, to.offset + i), k) {
                    panic!(
                        "copies {j} and {k} both write {:?}+{}",
                        to.buf,
                        to.offset + i
                    );
                }
            }
            let o = to.offset as usize;
            mem.get_mut(&to.buf).unwrap()[o..o + d.len()].copy_from_slice(d);
        }
    }
    let mut want = Memory::new();
    fill(dst, &mut want);
    for p in &dst.parts {
        let n = 2 * (p.rows.len() * p.cols.len());
        let o = p.at.offset as usize;
        assert_eq!(
            mem[&p.at.buf][o..o + n],
            want[&p.at.buf][o..o + n],
            "part on {:?}",
            p.at.buf
        );
    }
}

#[test]
fn random_layouts_against_the_oracle() {
    let mut rng = Rng(7);
    for case in 0..300 {
        let (rows, cols) = (1 + rng.below(40), 1 + rng.below(40));
        let src = layout(&mut rng, rows, cols, 0, 1);
        let dst = layout(&mut rng, rows, cols, 1000, 2);
        let copies = redistribute(&src, &dst).unwrap_or_else(|e| panic!("case {case}: {e}"));
        check(&src, &dst, &copies);
    }
}

/// Destinations that include the source's own blocks (a consumer reading in
/// place, beside replicas elsewhere): the blocks in place take no copy, the rest
/// are filled as usual.
#[test]
fn destinations_already_in_place_take_no_copy() {
    let mut rng = Rng(11);
    for case in 0..200 {
        let (rows, cols) = (1 + rng.below(40), 1 + rng.below(40));
        let src = layout(&mut rng, rows, cols, 0, 0);
        let mut dst = layout(&mut rng, rows, cols, 1000, 2);
        // The source's blocks interleaved with the others, so that groups of equal
        // blocks mix parts in and out of the source.
        for (i, p) in src.parts.iter().enumerate() {
            let at = (i * 3).min(dst.parts.len());
            dst.parts.insert(at, p.clone());
        }
        let copies = redistribute(&src, &dst).unwrap_or_else(|e| panic!("case {case}: {e}"));
        check(&src, &dst, &copies);
        for c in &copies {
            assert!(
                c.dsts.iter().all(|d| d.buf.0 >= 1000),
                "case {case}: a copy into the source itself: {c:?}"
            );
        }
    }
}

#[test]
fn whole_blocks_move_as_one_copy_and_shared_data_is_sent_once() {
    let part = |buf: u32, rows: std::ops::Range<u32>| Part {
        at: Loc {
            buf: BufId(buf),
            offset: 0,
        },
        rows,
        cols: 0..16,
    };
    // Row owners 0..8 and 8..16 on tiles 0 and 1; the destination replicates all
    // rows on tiles 2 and 3.
    let src = DistTensor {
        rows: 16,
        cols: 16,
        elem_bytes: 2,
        parts: vec![part(0, 0..8), part(1, 8..16)],
    };
    let dst = DistTensor {
        rows: 16,
        cols: 16,
        elem_bytes: 2,
        parts: vec![part(2, 0..16), part(3, 0..16)],
    };
    let copies = redistribute(&src, &dst).unwrap();
    assert_eq!(copies.len(), 2, "{copies:?}");
    for c in &copies {
        assert_eq!((c.bytes, c.dsts.len()), (256, 2));
    }
    check(&src, &dst, &copies);
    // The same layout on both sides needs nothing.
    assert_eq!(redistribute(&src, &src).unwrap(), vec![]);
}

#[test]
fn errors_name_the_problem() {
    let part = |rows: std::ops::Range<u32>| Part {
        at: Loc {
            buf: BufId(0),
            offset: 0,
        },
        rows,
        cols: 0..4,
    };
    let t = |rows, parts| DistTensor {
        rows,
        cols: 4,
        elem_bytes: 2,
        parts,
    };
    assert_eq!(
        redistribute(&t(4, vec![part(0..2)]), &t(4, vec![part(0..4)])),
        Err(DistError::Uncovered { row: 2, col: 0 })
    );
    assert!(matches!(
        redistribute(&t(4, vec![part(0..5)]), &t(4, vec![part(0..4)])),
        Err(DistError::OutOfRange { part: 0, .. })
    ));
    assert_eq!(
        redistribute(&t(4, vec![]), &t(5, vec![])),
        Err(DistError::Shape(4, 4, 5, 4))
    );
}

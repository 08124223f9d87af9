//! Byte-level mutation: bit flips, byte insertion and deletion, interesting integers
//! written over the input, block duplication and truncation, and splices of two
//! inputs. The structure-aware generators get past the first parse; these reach the
//! corners a generator would not think of.

use crate::Rng;
use rand::Rng as _;

/// Values at the edges of every width a reader might decode: zero, one, the signed
/// and unsigned extremes, and lengths just past a power of two.
pub const INTERESTING: [u64; 14] = [
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0x7fff,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    u64::MAX,
];

/// Inputs are kept below this size so that one execution stays cheap.
pub const MAX_LEN: usize = 1 << 16;

/// Applies one to eight random byte-level edits to `input`; `other` is the
/// partner for splices.
pub fn mutate(input: &mut Vec<u8>, other: &[u8], rng: &mut Rng) {
    let edits = 1 + rng.random_range(0..8u32).min(rng.random_range(0..8u32));
    for _ in 0..edits {
        mutate_once(input, other, rng);
    }
    input.truncate(MAX_LEN);
}

fn mutate_once(input: &mut Vec<u8>, other: &[u8], rng: &mut Rng) {
    let len = input.len();
    match rng.random_range(0..10u32) {
        // Flip one bit.
        0 if len > 0 => {
            let i = rng.random_range(0..len);
            input[i] ^= 1 << rng.random_range(0..8u32);
        }
        // Replace one byte.
        1 if len > 0 => {
            let i = rng.random_range(0..len);
            input[i] = rng.random();
        }
        // Insert a few random bytes.
        2 => {
            let i = rng.random_range(0..=len);
            let n = rng.random_range(1..=8);
            for _ in 0..n {
                input.insert(i, rng.random());
            }
        }
        // Delete a short run.
        3 if len > 0 => {
            let i = rng.random_range(0..len);
            let n = rng.random_range(1..=16.min(len - i));
            input.drain(i..i + n);
        }
        // An interesting integer, little-endian, at a random offset and width.
        4 | 5 if len > 0 => {
            let v = interesting(rng);
            let width = [1usize, 2, 4, 8][rng.random_range(0..4)];
            let bytes = v.to_le_bytes();
            let i = rng.random_range(0..len);
            let n = width.min(len - i);
            input[i..i + n].copy_from_slice(&bytes[..n]);
        }
        // An interesting integer as decimal text (text formats).
        6 if len > 0 => {
            let v = interesting(rng);
            let text = if rng.random_bool(0.3) {
                format!("-{v}")
            } else {
                v.to_string()
            };
            let i = rng.random_range(0..len);
            let n = rng.random_range(0..=4.min(len - i));
            input.splice(i..i + n, text.into_bytes());
        }
        // Duplicate a block.
        7 if len > 0 => {
            let i = rng.random_range(0..len);
            let n = rng.random_range(1..=64.min(len - i));
            let block = input[i..i + n].to_vec();
            let at = rng.random_range(0..=len);
            input.splice(at..at, block);
        }
        // Truncate.
        8 if len > 0 => {
            let n = rng.random_range(0..len);
            input.truncate(n);
        }
        // Splice: a prefix of this input, a suffix of the other.
        9 if !other.is_empty() => {
            let cut = rng.random_range(0..=len);
            let from = rng.random_range(0..other.len());
            input.truncate(cut);
            input.extend_from_slice(&other[from..]);
        }
        _ => input.push(rng.random()),
    }
}

/// One of [`INTERESTING`], sometimes off by one.
pub fn interesting(rng: &mut Rng) -> u64 {
    let v = INTERESTING[rng.random_range(0..INTERESTING.len())];
    match rng.random_range(0..4u32) {
        0 => v.wrapping_add(1),
        1 => v.wrapping_sub(1),
        _ => v,
    }
}

/// A signed value for text formats: small, typical, or at an edge.
pub fn number(rng: &mut Rng) -> i128 {
    match rng.random_range(0..6u32) {
        0 => rng.random_range(-4..=64),
        1 => rng.random_range(0..=1 << 20),
        2 => -(interesting(rng) as i128),
        3 => 1i128 << rng.random_range(0..70u32),
        _ => interesting(rng) as i128,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn mutation_is_deterministic_and_bounded() {
        let run = || {
            let mut rng = Rng::seed_from_u64(7);
            let mut out = Vec::new();
            for _ in 0..200 {
                let mut v = b"id,lower,upper,size\nb0,0,4,16\n".to_vec();
                mutate(&mut v, b"other,bytes", &mut rng);
                assert!(v.len() <= MAX_LEN);
                out.push(v);
            }
            out
        };
        assert_eq!(run(), run());
    }
}

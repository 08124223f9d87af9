//! The FP8 conversions of `f8v4tof16` and `f16v8tof8`, with the simulator's own
//! reading of the F143 format (docs/isa.md, "FP8"). It deliberately shares no code
//! with `tessera_machine::fp8`: the tests compare the two on every code, so a
//! mistake in either shows up as a disagreement rather than being copied.

use std::sync::OnceLock;

use crate::fp;

/// The NaN code; also the f16 NaN the widening produces from it.
const NAN: u8 = 0x80;
const F16_NAN: u16 = 0x7e00;
/// The code of the largest magnitude.
const TOP: u8 = 0x7f;

/// The magnitude of the low seven bits of `code` as an integer significand and
/// the exponent of its unit: a subnormal (exponent field 0) counts in units of
/// 2^-10, a normal has its implicit bit and units of 2^(field - 11).
fn parts(code: u8) -> (u32, i32) {
    let field = (code >> 3) & 0xf;
    let mantissa = u32::from(code & 7);
    if field == 0 {
        (mantissa, -10)
    } else {
        (mantissa | 8, i32::from(field) - 11)
    }
}

/// `2^k`, exactly, for the exponents FP8 codes and scales reach (`powi` is a
/// library call, and the widening runs once a weight byte).
fn pow2(k: i32) -> f64 {
    debug_assert!((-1022..=1023).contains(&k));
    f64::from_bits(((1023 + k) as u64) << 52)
}

fn magnitude(code: u8) -> f64 {
    let (sig, e) = parts(code);
    f64::from(sig) * pow2(e)
}

/// One FP8 code times `2^scale`, rounded once to f16 (to nearest even; out of
/// range to infinity, below half the smallest subnormal to zero).
pub(crate) fn to_f16(code: u8, scale: i8) -> u16 {
    if code == NAN {
        return F16_NAN;
    }
    let (sig, e) = parts(code & 0x7f);
    // Four significant bits times a power of two: exact in f64.
    let v = f64::from(sig) * pow2(e + i32::from(scale));
    let h = fp::f64_to_f16(v);
    if code & 0x80 != 0 { h | 0x8000 } else { h }
}

/// One f16 times `2^scale`, rounded to the nearest FP8 code (ties to the even
/// code), saturating at ±240; NaN gives the NaN code and a result of zero is
/// always `0x00`.
pub(crate) fn from_f16(h: u16, scale: i8) -> u8 {
    let x = fp::f16_to_f32(h);
    if x.is_nan() {
        return NAN;
    }
    let sign = if h & 0x8000 != 0 { 0x80 } else { 0 };
    // An f16 times a power of two: exact (infinity stays infinite).
    let q = f64::from(x.abs()) * pow2(i32::from(scale));
    if q >= magnitude(TOP) {
        return sign | TOP;
    }
    // The codes 0..=0x7f are in increasing order of magnitude: bracket `q`
    // between neighbours `lo` (at or below it) and `hi` (above it).
    let (mut lo, mut hi) = (0u8, TOP);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if magnitude(mid) <= q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    // Both differences are exact: `q` and its neighbours are a few binades apart
    // at most and carry few significant bits.
    let (below, above) = (q - magnitude(lo), magnitude(hi) - q);
    let code = if below < above || (below == above && lo % 2 == 0) {
        lo
    } else {
        hi
    };
    if code == 0 { 0 } else { sign | code }
}

/// Every code's [`to_f16`] at one scale, made the first time the scale is used:
/// a kernel widens every weight byte of a layer, at one scale a tensor.
fn table(scale: i8) -> &'static [u16; 256] {
    static TABLES: [OnceLock<[u16; 256]>; 256] = [const { OnceLock::new() }; 256];
    TABLES[usize::from(scale as u8)]
        .get_or_init(|| std::array::from_fn(|code| to_f16(code as u8, scale)))
}

/// `f8v4tof16`: the four bytes of `x` (byte 0 first) as four f16 lanes.
pub(crate) fn widen4(x: u32, scale: i8) -> u64 {
    let t = table(scale);
    (0..4).fold(0u64, |acc, i| {
        acc | (u64::from(t[usize::from((x >> (8 * i)) as u8)]) << (16 * i))
    })
}

/// `f16v8tof8`: eight f16 lanes (`lo` holds lanes 0..4) as eight bytes.
pub(crate) fn narrow8(lo: u64, hi: u64, scale: i8) -> u64 {
    (0..8).fold(0u64, |acc, i| {
        let lanes = if i < 4 { lo } else { hi };
        let h = (lanes >> (16 * (i % 4))) as u16;
        acc | (u64::from(from_f16(h, scale)) << (8 * i))
    })
}

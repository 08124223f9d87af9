//! Bit-level float helpers: f32 and f16 lanes packed in 32- and 64-bit registers.
//! f16 conversion rounds to nearest even, overflowing to infinity (the `half`
//! crate's IEEE conversions).

use half::f16;

#[inline(always)]
pub(crate) fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// The f16 in the low 16 bits of `bits`, widened (exactly) to f32.
#[inline(always)]
pub(crate) fn h(bits: u32) -> f32 {
    f16_to_f32(bits as u16)
}

/// Exact widening. Normal numbers (the hot case) take a few integer operations
/// inline; zeros, subnormals, infinities and NaNs go through `half`.
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    let exp = (bits >> 10) & 0x1f;
    let b = u32::from(bits);
    if exp == 0 || exp == 0x1f {
        if bits & 0x7fff == 0 {
            return f32::from_bits((b & 0x8000) << 16);
        }
        return f16::from_bits(bits).to_f32();
    }
    f32::from_bits(((b & 0x8000) << 16) | (((b & 0x7fff) << 13) + ((127 - 15) << 23)))
}

/// Round to nearest even. Results in the normal f16 range (including the
/// rounding overflow to infinity) are computed inline; the rest through `half`.
#[inline(always)]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let abs = b & 0x7fff_ffff;
    // 2^-14 (smallest normal f16) <= |x| < 2^16.
    if !(0x3880_0000..0x4780_0000).contains(&abs) {
        if abs == 0 {
            return (b >> 16) as u16;
        }
        return f16::from_f32(x).to_bits();
    }
    let sign = ((b >> 16) & 0x8000) as u16;
    let rebiased = abs - ((127 - 15) << 23);
    let round = 0xfff + ((rebiased >> 13) & 1);
    sign | ((rebiased + round) >> 13) as u16
}

#[inline(always)]
pub(crate) fn f64_to_f16(x: f64) -> u16 {
    f16::from_f64(x).to_bits()
}

/// Four f16 lanes (lane 0 in the low bits) widened to f32.
///
/// The AMP converts eight lanes in and four out per issue, so on a host with F16C
/// the conversions take one instruction each: `F16C` is true only where the
/// interpreter found the feature at run time (`interp::run`; the build stays
/// portable). IEEE conversions are exact or correctly rounded, so both forms give
/// the same bits; `conversions_agree_with_f16c` checks every f16 and millions of
/// f32.
#[inline(always)]
pub(crate) fn unpack4<const F16C: bool>(v: u64) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    if F16C {
        // SAFETY: `F16C` is true only on a host with F16C (see above).
        return unsafe { f16c::unpack4(v) };
    }
    unpack4_portable(v)
}

#[inline(always)]
fn unpack4_portable(v: u64) -> [f32; 4] {
    if v == 0 {
        return [0.0; 4];
    }
    let lanes = [
        v as u32 & 0xffff,
        (v >> 16) as u32 & 0xffff,
        (v >> 32) as u32 & 0xffff,
        (v >> 48) as u32,
    ];
    // All four lanes normal (exponent field 1..=30): widen without branches.
    if lanes
        .iter()
        .all(|l| ((l >> 10) & 0x1f).wrapping_sub(1) < 30)
    {
        // Written out: `lanes.map` is not always inlined, and this is the AMP's
        // hottest path.
        let w = |b: u32| {
            f32::from_bits(((b & 0x8000) << 16) | (((b & 0x7fff) << 13) + ((127 - 15) << 23)))
        };
        return [w(lanes[0]), w(lanes[1]), w(lanes[2]), w(lanes[3])];
    }
    [
        f16_to_f32(v as u16),
        f16_to_f32((v >> 16) as u16),
        f16_to_f32((v >> 32) as u16),
        f16_to_f32((v >> 48) as u16),
    ]
}

/// Four f32 rounded to f16 lanes (lane 0 in the low bits), written out: the
/// scalar AMP step's form; the vector step narrows with [`f16c::narrow`].
#[inline(always)]
pub(crate) fn pack4(x: &[f32]) -> u64 {
    u64::from(f32_to_f16(x[0]))
        | (u64::from(f32_to_f16(x[1])) << 16)
        | (u64::from(f32_to_f16(x[2])) << 32)
        | (u64::from(f32_to_f16(x[3])) << 48)
}

/// The F16C forms of the conversions, on the vector registers the AVX2 loop
/// keeps its lanes in. Callers must have detected F16C.
#[cfg(target_arch = "x86_64")]
pub(crate) mod f16c {
    use std::arch::x86_64::{
        __m128, _MM_FROUND_TO_NEAREST_INT, _mm_cvtph_ps, _mm_cvtps_ph, _mm_cvtsi64_si128,
        _mm_cvtsi128_si64,
    };

    /// Four f16 lanes widened to f32 (exact).
    #[target_feature(enable = "f16c")]
    #[inline]
    pub(crate) fn widen(v: u64) -> __m128 {
        _mm_cvtph_ps(_mm_cvtsi64_si128(v as i64))
    }

    /// Four f32 lanes rounded to f16, to nearest even.
    #[target_feature(enable = "f16c")]
    #[inline]
    pub(crate) fn narrow(x: __m128) -> u64 {
        _mm_cvtsi128_si64(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) as u64
    }

    #[target_feature(enable = "f16c")]
    #[inline]
    pub(super) fn unpack4(v: u64) -> [f32; 4] {
        // SAFETY: `__m128` and `[f32; 4]` have the same size, lane 0 first.
        unsafe { std::mem::transmute::<__m128, [f32; 4]>(widen(v)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` xorshift draws from `seed`, every other one mapped by `near`.
    fn draws(seed: u32, n: u32, near: impl Fn(u32) -> u32) -> impl Iterator<Item = (u32, u32)> {
        let mut x = seed;
        (0..n).map(move |i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (i, if i % 2 == 0 { x } else { near(x) })
        })
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn conversions_agree_with_f16c() {
        if !std::arch::is_x86_feature_detected!("f16c") {
            return;
        }
        // Every f16 in every lane position, NaN payloads included.
        for bits in 0..=u16::MAX {
            let v = (u64::from(bits) * 0x0001_0001_0001_0001) ^ 0x0000_8000_0000_8000;
            let (want, got) = (unpack4_portable(v), unsafe { f16c::unpack4(v) });
            assert_eq!(want.map(f32::to_bits), got.map(f32::to_bits), "{v:#x}");
        }
        let mut lanes = [0f32; 4];
        // Half the draws near the f16 range (either sign), where rounding and
        // overflow are.
        for (i, bits) in draws(0x1234_5678, 4_000_000, |x| {
            (x & 0x8000_0000) | (0x3000_0000 + (x % 0x1800_0000))
        }) {
            lanes[(i % 4) as usize] = f32::from_bits(bits);
            // SAFETY: F16C was detected above; `lanes` holds four f32.
            let got = unsafe { f16c::narrow(std::arch::x86_64::_mm_loadu_ps(lanes.as_ptr())) };
            let want = pack4(&lanes);
            assert_eq!(want, got, "{lanes:?}");
        }
    }

    #[test]
    fn widening_matches_half_for_every_f16() {
        for bits in 0..=u16::MAX {
            let want = f16::from_bits(bits).to_f32();
            let got = f16_to_f32(bits);
            assert!(
                want.to_bits() == got.to_bits() || (want.is_nan() && got.is_nan()),
                "{bits:#x}"
            );
        }
    }

    #[test]
    fn narrowing_matches_half() {
        // Every f16 boundary region densely, then a sweep of all exponents.
        for (_, bits) in draws(0x2545_f491, 2_000_000, |x| 0x3800_0000 + (x % 0x1000_0000)) {
            let v = f32::from_bits(bits);
            let want = f16::from_f32(v).to_bits();
            let got = f32_to_f16(v);
            assert!(
                want == got || (v.is_nan() && (got & 0x7c00) == 0x7c00),
                "{bits:#x}"
            );
        }
        for v in [
            65504.0f32,
            65519.99,
            65520.0,
            1.0 + 1.0 / 2048.0,
            1.0 + 3.0 / 2048.0,
        ] {
            assert_eq!(f32_to_f16(v), f16::from_f32(v).to_bits(), "{v}");
        }
    }
}

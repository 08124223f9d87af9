//! The tile's 8-bit float: IPU21's F143 format, the one Poplar's `QUARTER` type
//! uses with `QuarterMetadata::Format::F143` (sources in `docs/machine.md`, "FP8").
//!
//! A code is 1 sign bit, 4 exponent bits (bias 8) and 3 mantissa bits. Exponent
//! field 0 holds subnormals (`m/8 * 2^-7`); there are no infinities, so exponent 15
//! is an ordinary binade and the largest magnitude is `1.875 * 2^7 = 240` (`0x7f`).
//! There is no negative zero: its code, `0x80`, is the single NaN.
//!
//! A tensor of codes carries one power-of-two scale, an exponent as Poplar's
//! metadata holds it: the value of a code is `decode(code) * 2^scale`, and a value
//! is stored as the code of `value * 2^-scale`.

/// The one NaN code (the bit pattern a negative zero would have).
pub const NAN: u8 = 0x80;
/// Exponent bias.
pub const BIAS: i32 = 8;
/// The largest finite magnitude at scale 0 (code `0x7f`).
pub const MAX: f32 = 240.0;
/// The code of [`MAX`].
pub const MAX_CODE: u8 = 0x7f;
/// The scales Poplar accepts in a metadata tensor (`createConstantMetadataTensor`:
/// -31 to +31); [`scale_for`] chooses within them.
pub const SCALE_MIN: i8 = -31;
/// The largest scale Poplar accepts (see [`SCALE_MIN`]).
pub const SCALE_MAX: i8 = 31;

/// The value of `code` in a tensor of scale `scale`: `NaN` for [`NAN`], else exact
/// (as long as the product is an f32: every scale of `SCALE_MIN..=SCALE_MAX` and
/// far beyond; past `2^127` it overflows to infinity).
pub fn decode(code: u8, scale: i8) -> f32 {
    if code == NAN {
        return f32::NAN;
    }
    let field = i32::from((code >> 3) & 0xf);
    let mantissa = i32::from(code & 7);
    // A subnormal has exponent field 0 but the exponent of field 1, without the
    // implicit bit; normals add the implicit 8.
    let (significand, exponent) = if field == 0 {
        (mantissa, 1 - BIAS - 3)
    } else {
        (8 + mantissa, field - BIAS - 3)
    };
    // At most 4 significant bits and an exponent far inside f64's range: the
    // product is exact, and the cast rounds only where f32 cannot hold it.
    let magnitude = f64::from(significand) * pow2(exponent + i32::from(scale));
    let v = magnitude as f32;
    if code & 0x80 != 0 { -v } else { v }
}

/// The code of `x` in a tensor of scale `scale`: `x * 2^-scale` rounded to nearest,
/// ties to the even code; magnitudes beyond [`MAX`] (after rounding) and infinities
/// saturate to `±MAX`; NaN gives [`NAN`]; anything that rounds to zero gives `0x00`
/// (there is no negative zero).
pub fn encode(x: f32, scale: i8) -> u8 {
    if x.is_nan() {
        return NAN;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_infinite() {
        return sign | MAX_CODE;
    }
    // Exact: an f32 times a power of two well inside f64's range.
    let q = f64::from(x).abs() * pow2(-i32::from(scale));
    if q == 0.0 {
        return 0;
    }
    // The binade of `q`, no lower than the smallest normal's: below it the quantum
    // stays that of the subnormals. Above the largest binade every value saturates.
    // `q` is a normal f64 (an f32 scaled by at most 2^128), so its exponent field
    // is its binade.
    let exponent = ((q.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    let binade = exponent.clamp(1 - BIAS, 16 - BIAS);
    let quantum = pow2(binade - 3);
    // `q / quantum` is exact (a power of two); so is the rounding.
    // Far above the top binade only saturation is left to decide.
    let steps = (q / quantum).round_ties_even().min(32.0) as i32;
    // Consecutive codes are consecutive steps across binades: a carry into the next
    // binade (steps = 16) is its first code.
    let magnitude = (binade - (1 - BIAS)) * 8 + steps;
    if magnitude == 0 {
        return 0;
    }
    sign | magnitude.min(i32::from(MAX_CODE)) as u8
}

/// The scale for a tensor whose largest magnitude is `max_abs`: the smallest
/// exponent at which `max_abs * 2^-scale` is at most [`MAX`], so the largest value
/// lands in the top binade without saturating and the others keep as much
/// precision as the format gives. Clamped to `SCALE_MIN..=SCALE_MAX` (beyond
/// `240 * 2^31` the largest values saturate). A tensor of zeros, or a `max_abs`
/// that is not finite and positive, gets 0.
pub fn scale_for(max_abs: f32) -> i8 {
    if !(max_abs.is_finite() && max_abs > 0.0) {
        return 0;
    }
    let m = f64::from(max_abs);
    let fits = |s: i32| m * pow2(-s) <= f64::from(MAX);
    // A first guess from the logarithm, then corrected exactly both ways.
    let mut s = ((m / f64::from(MAX)).log2().ceil() as i32)
        .clamp(i32::from(SCALE_MIN), i32::from(SCALE_MAX));
    while s < i32::from(SCALE_MAX) && !fits(s) {
        s += 1;
    }
    while s > i32::from(SCALE_MIN) && fits(s - 1) {
        s -= 1;
    }
    s as i8
}

/// `2^e`, exact for every exponent the functions above use (|e| < 1000).
fn pow2(e: i32) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 256 values written out from the format's definition, independently of
    /// `decode`: every (sign, exponent field, mantissa) triple, value
    /// `(-1)^s * 2^(e - bias) * (1 + m/8)` or, for field 0, `2^(1 - bias) * m/8`.
    fn table() -> Vec<(u8, f64)> {
        let mut out = Vec::new();
        for s in 0..2u8 {
            for e in 0..16u8 {
                for m in 0..8u8 {
                    let code = (s << 7) | (e << 3) | m;
                    if code == NAN {
                        continue;
                    }
                    let frac = f64::from(m) / 8.0;
                    let v = if e == 0 {
                        2f64.powi(1 - 8) * frac
                    } else {
                        2f64.powi(i32::from(e) - 8) * (1.0 + frac)
                    };
                    out.push((code, if s == 1 { -v } else { v }));
                }
            }
        }
        out
    }

    #[test]
    fn decode_matches_the_definition_for_every_code() {
        let t = table();
        assert_eq!(t.len(), 255);
        for scale in [0i8, 1, -1, 7, -9, 31, -31] {
            for &(code, v) in &t {
                let want = v * 2f64.powi(i32::from(scale));
                let got = decode(code, scale);
                assert_eq!(f64::from(got), want, "code {code:#04x} scale {scale}");
                // No negative zero: 0x80 is NaN, so 0x00 is the only zero.
                if want == 0.0 {
                    assert!(got.is_sign_positive());
                }
            }
            assert!(decode(NAN, scale).is_nan());
        }
        assert_eq!(decode(MAX_CODE, 0), MAX);
        assert_eq!(decode(0xff, 0), -MAX);
        assert_eq!(decode(0x01, 0), 2f32.powi(-10));
        assert_eq!(decode(0x08, 0), 2f32.powi(-7));
    }

    #[test]
    fn every_code_round_trips() {
        for scale in [0i8, 3, -5, 31, -31] {
            for code in 0..=255u8 {
                if code == NAN {
                    continue;
                }
                assert_eq!(
                    encode(decode(code, scale), scale),
                    code,
                    "code {code:#04x} scale {scale}"
                );
            }
        }
        assert_eq!(encode(f32::NAN, 0), NAN);
        assert_eq!(encode(-f32::NAN, 4), NAN);
    }

    #[test]
    fn ties_round_to_the_even_code() {
        // Midway between 1 (0x40) and 1.125 (0x41): to 0x40; between 1.125 and
        // 1.25 (0x42): to 0x42.
        assert_eq!(encode(1.0625, 0), 0x40);
        assert_eq!(encode(1.1875, 0), 0x42);
        assert_eq!(encode(-1.1875, 0), 0xc2);
        // Just either side of a tie: to the nearer.
        assert_eq!(encode(1.0625f32.next_up(), 0), 0x41);
        assert_eq!(encode(1.0625f32.next_down(), 0), 0x40);
        // Subnormal ties: 2^-11 between 0 and 2^-10 goes to 0 (positive zero
        // for either sign); 3 * 2^-11 to 2 * 2^-10 (0x02).
        assert_eq!(encode(2f32.powi(-11), 0), 0x00);
        assert_eq!(encode(-(2f32.powi(-11)), 0), 0x00);
        assert_eq!(encode(3.0 * 2f32.powi(-11), 0), 0x02);
        // A carry into the next binade: 1.9375 is midway between 1.875 (0x47)
        // and 2 (0x48): to the even 0x48.
        assert_eq!(encode(1.9375, 0), 0x48);
        // The same ties at another scale.
        assert_eq!(encode(1.0625 * 64.0, 6), 0x40);
        assert_eq!(encode(1.1875 / 8.0, -3), 0x42);
        // Negative zero is zero.
        assert_eq!(encode(-0.0, 0), 0x00);
    }

    #[test]
    fn out_of_range_saturates() {
        assert_eq!(encode(240.0, 0), 0x7f);
        // 248 is midway between 240 and the 256 the format does not have.
        assert_eq!(encode(248.0, 0), 0x7f);
        assert_eq!(encode(1e30, 0), 0x7f);
        assert_eq!(encode(-1e30, 0), 0xff);
        assert_eq!(encode(f32::INFINITY, 0), 0x7f);
        assert_eq!(encode(f32::NEG_INFINITY, -31), 0xff);
        assert_eq!(encode(f32::MAX, 31), 0x7f);
        assert_eq!(encode(480.0, 1), 0x7f);
        assert_eq!(encode(500.0, 1), 0x7f);
        // Underflow: below half the smallest subnormal, zero.
        assert_eq!(encode(1e-30, 0), 0x00);
        assert_eq!(encode(f32::MIN_POSITIVE, 31), 0x00);
    }

    #[test]
    fn scale_puts_the_largest_magnitude_in_range() {
        assert_eq!(scale_for(240.0), 0);
        assert_eq!(scale_for(240.1), 1);
        assert_eq!(scale_for(120.0), -1);
        assert_eq!(scale_for(120.5), 0);
        assert_eq!(scale_for(1.0), -7);
        assert_eq!(scale_for(0.0), 0);
        assert_eq!(scale_for(f32::NAN), 0);
        assert_eq!(scale_for(f32::INFINITY), 0);
        assert_eq!(scale_for(1e30), SCALE_MAX);
        assert_eq!(scale_for(1e-30), SCALE_MIN);
        // The largest value never saturates, and is in the top binade
        // ([128, 240]) when the scale is not clamped.
        let mut x = 1.3e-7f32;
        while x < 1e11 {
            let s = scale_for(x);
            let back = decode(encode(x, s), s);
            assert!((back - x).abs() <= x / 16.0, "{x}: scale {s} gives {back}");
            let q = f64::from(x) * 2f64.powi(-i32::from(s));
            assert!((120.0..=240.0).contains(&q), "{x}: scale {s}, {q}");
            x *= 1.37;
        }
    }
}

//! FP8 weights as the tile sees them: a tensor quantized to F143 codes with one
//! power-of-two scale (`tessera_machine::fp8`), then widened to f16 by the
//! `fp8_to_f16` kernel. The reference applies the same rounding to its f32
//! weights so that a run with FP8 weights is compared with what it can compute.

use half::f16;
use tessera_machine::fp8;

/// The largest finite magnitude of `values` (0 when there is none).
fn max_finite_abs(values: &[f32]) -> f32 {
    values
        .iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()))
}

/// `values` as FP8 codes and the scale chosen for them: `fp8::scale_for` of the
/// largest finite magnitude (so that nothing finite saturates unless the scale
/// range runs out), each value rounded to nearest even; NaN gives the NaN code,
/// infinities saturate.
pub fn quantize_fp8(values: &[f32]) -> (Vec<u8>, i8) {
    let scale = fp8::scale_for(max_finite_abs(values));
    let codes = values.iter().map(|&v| fp8::encode(v, scale)).collect();
    (codes, scale)
}

/// Rounds `values` in place to what a tile computes with after `fp8_to_f16`:
/// quantized as [`quantize_fp8`] does, decoded, and rounded to f16 (which only
/// matters where a small scale takes a value below f16's normal range).
pub fn fp8_round(values: &mut [f32]) {
    let (codes, scale) = quantize_fp8(values);
    for (v, c) in values.iter_mut().zip(codes) {
        *v = f16::from_f32(fp8::decode(c, scale)).to_f32();
    }
}

/// How a parameter is stored as FP8: the weight times `factor` (a folded
/// constant, such as the attention's scale), packed in f16, then encoded at the
/// power-of-two `scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fp8Weight {
    pub scale: i8,
    pub factor: f32,
}

impl Fp8Weight {
    /// The graph's view of the stored weight: decoded and divided by the factor.
    pub fn round(&self, values: &mut [f32]) {
        for v in values {
            let stored = f16::from_f32(*v * self.factor).to_f32();
            *v = fp8::decode(fp8::encode(stored, self.scale), self.scale) / self.factor;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantize_picks_the_scale_of_the_largest_value() {
        let (codes, scale) = quantize_fp8(&[1.0, -0.5, 0.0, 3.75]);
        // 3.75 * 2^-scale must be in (120, 240]: scale -6 gives 240.
        assert_eq!(scale, -6);
        assert_eq!(codes[3], 0x7f);
        assert_eq!(fp8::decode(codes[0], scale), 1.0);
        assert_eq!(fp8::decode(codes[1], scale), -0.5);
        assert_eq!(codes[2], 0);
        assert_eq!(quantize_fp8(&[]), (vec![], 0));
        // Non-finite values neither choose the scale nor break it.
        let (codes, scale) = quantize_fp8(&[f32::NAN, 2.0, f32::INFINITY]);
        assert_eq!(scale, fp8::scale_for(2.0));
        assert_eq!(codes[0], fp8::NAN);
        assert_eq!(codes[2], fp8::MAX_CODE);
    }

    #[test]
    fn rounding_is_idempotent_and_close() {
        let mut v: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.37).sin() * 0.05)
            .collect();
        let orig = v.clone();
        fp8_round(&mut v);
        let once = v.clone();
        fp8_round(&mut v);
        assert_eq!(once, v, "rounding twice changes nothing");
        let max = orig.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = fp8::scale_for(max);
        let step = 2f32.powi(i32::from(scale) - 10);
        for (x, r) in orig.iter().zip(&once) {
            assert!(
                (x - r).abs() <= (x.abs() / 16.0).max(step / 2.0),
                "{x} -> {r}"
            );
        }
    }

    #[test]
    fn rounding_matches_the_tile_below_f16_range() {
        // A scale of -31 puts the small codes below f16's subnormals: the tile
        // sees them rounded to f16.
        let mut v = vec![240.0 * 2f32.powi(-31), 2f32.powi(-40)];
        fp8_round(&mut v);
        assert_eq!(v[0], f16::from_f32(240.0 * 2f32.powi(-31)).to_f32());
        assert_eq!(v[1], 0.0);
    }
}

//! Images into the vision tower's input, as transformers'
//! `SiglipImageProcessor` (its Pillow backend) prepares them: converted to RGB,
//! resized to the model's square with Pillow's bicubic filter, rescaled by
//! 1/255, normalised with mean 0.5 and std 0.5, `[batch, C, H, W]`; then cut
//! into Tessera's `patches` input.
//!
//! The `image` crate decodes; the resize is written here because the `image`
//! crate's filters do not give Pillow's values. Pillow resamples an 8-bit image
//! in two separable passes (horizontal, then vertical), each a convolution
//! whose support widens by the downscale factor, with coefficients normalised to
//! sum to one and held as fixed-point integers of 22 fractional bits, and each
//! pass rounds and clamps to 8 bits; so does this.

use std::path::Path;

use image::ImageReader;
use tessera_graph::HostTensor;

use crate::{ImportError, VisionConfig};

/// The largest image side decoded: far beyond a photograph, small enough that
/// a hostile header cannot make the decoder allocate without bound.
pub const MAX_SIDE: u32 = 1 << 14;

/// `pixel_values` `[images, num_channels, image_size, image_size]` for the
/// images at `paths`, in order, as `SiglipImageProcessor` computes them.
pub fn preprocess<P: AsRef<Path>>(
    paths: &[P],
    cfg: &VisionConfig,
) -> Result<HostTensor, ImportError> {
    if paths.is_empty() {
        return Err(ImportError::NoImages);
    }
    if cfg.num_channels != 3 {
        // The processor converts every image to RGB.
        return Err(ImportError::ConfigField {
            origin: "the model's config".into(),
            field: "num_channels",
            value: cfg.num_channels.to_string(),
            reason: "images are RGB: a model that takes images has 3 channels".into(),
        });
    }
    let side = cfg.image_size;
    let mut data = Vec::with_capacity(paths.len() * 3 * side * side);
    for path in paths {
        let path = path.as_ref();
        let (rgb, w, h) = decode_rgb(path)?;
        let resized = resize_bicubic(&rgb, w, h, 3, side, side);
        for ch in 0..3 {
            data.extend(resized.iter().skip(ch).step_by(3).map(|&u| normalise(u)));
        }
    }
    Ok(HostTensor::new(vec![paths.len(), 3, side, side], data)?)
}

/// An 8-bit code as the processor leaves it: `u / 255` in f32 (the rescale),
/// then `(v - 0.5) / 0.5` (the normalisation), each rounded as f32 arithmetic
/// rounds it.
fn normalise(u: u8) -> f32 {
    let v = f32::from(u) / 255.0;
    (v - 0.5) / 0.5
}

/// The image at `path` as 8-bit RGB, row-major, with its width and height.
/// Alpha is dropped and grey is repeated over the three channels, as Pillow's
/// `convert("RGB")` does.
pub fn decode_rgb(path: &Path) -> Result<(Vec<u8>, usize, usize), ImportError> {
    let decode = |source| ImportError::Image {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = ImageReader::open(path)
        .map_err(|source| ImportError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .with_guessed_format()
        .map_err(|source| ImportError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    reader.limits(limits);
    let img = reader.decode().map_err(decode)?;
    let (w, h) = (img.width(), img.height());
    if w == 0 || h == 0 {
        return Err(ImportError::ImageSize {
            path: path.to_path_buf(),
            width: w,
            height: h,
            max: MAX_SIDE,
        });
    }
    Ok((img.to_rgb8().into_raw(), w as usize, h as usize))
}

/// Fractional bits of Pillow's fixed-point coefficients for 8-bit images.
const PRECISION_BITS: u32 = 22;

/// Pillow's bicubic kernel (Keys' cubic with a = -0.5), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output position along an axis of `in_size` samples resized to
/// `out_size`: the first input sample it reads and its fixed-point weights.
fn coefficients(in_size: usize, out_size: usize) -> Vec<(usize, Vec<i64>)> {
    let scale = in_size as f64 / out_size as f64;
    // Downscaling widens the kernel by the factor so that it averages every input
    // sample (antialiasing); upscaling keeps it at its own support.
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    (0..out_size)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // Truncation toward zero, as a C cast of the rounded bound.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let w: Vec<f64> = (xmin..xmax)
                .map(|x| bicubic((x as f64 - center + 0.5) / filterscale))
                .collect();
            let sum: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if sum != 0.0 { k / sum } else { k };
                    let s = k * f64::from(1u32 << PRECISION_BITS);
                    // Rounded half away from zero, as Pillow rounds them.
                    (if s < 0.0 { s - 0.5 } else { s + 0.5 }) as i64
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

/// One weighted sum back to 8 bits: the half added before the shift rounds,
/// the clamp keeps the cubic's overshoot in range.
fn clip8(acc: i64) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes an 8-bit image of `channels` interleaved channels from `w` x `h` to
/// `out_w` x `out_h` with Pillow's bicubic resampling: horizontal pass, rounded
/// to 8 bits, then vertical pass. A pass whose size does not change is skipped,
/// as Pillow skips it.
pub fn resize_bicubic(
    src: &[u8],
    w: usize,
    h: usize,
    channels: usize,
    out_w: usize,
    out_h: usize,
) -> Vec<u8> {
    let half = 1i64 << (PRECISION_BITS - 1);
    let mut cur = src.to_vec();
    let mut cur_w = w;
    if out_w != w {
        let coeffs = coefficients(w, out_w);
        let mut next = vec![0u8; out_w * h * channels];
        for y in 0..h {
            let row = &cur[y * w * channels..(y + 1) * w * channels];
            for (xx, (xmin, k)) in coeffs.iter().enumerate() {
                for ch in 0..channels {
                    let acc = k.iter().enumerate().fold(half, |acc, (i, &k)| {
                        acc + i64::from(row[(xmin + i) * channels + ch]) * k
                    });
                    next[(y * out_w + xx) * channels + ch] = clip8(acc);
                }
            }
        }
        cur = next;
        cur_w = out_w;
    }
    if out_h != h {
        let coeffs = coefficients(h, out_h);
        let stride = cur_w * channels;
        let mut next = vec![0u8; out_h * stride];
        for (yy, (ymin, k)) in coeffs.iter().enumerate() {
            for x in 0..stride {
                let acc = k.iter().enumerate().fold(half, |acc, (i, &k)| {
                    acc + i64::from(cur[(ymin + i) * stride + x]) * k
                });
                next[yy * stride + x] = clip8(acc);
            }
        }
        cur = next;
    }
    cur
}

/// `pixel_values` `[batch, C, H, W]` as Tessera's `patches` input
/// `[batch * tokens, patch * patch * C]`: one row per patch in raster order, the
/// values of a patch in (row, column, channel) order, the order the patch
/// projection's rows were converted to from the Conv weight. Pixels past the
/// last whole patch (an `image_size` not a multiple of `patch_size`) are
/// dropped, as the Conv's stride drops them.
pub fn patches(pixel_values: &HostTensor, cfg: &VisionConfig) -> Result<HostTensor, ImportError> {
    let (c, side, p) = (cfg.num_channels, cfg.image_size, cfg.patch_size);
    let dims = &pixel_values.shape().0;
    if dims.len() != 4 || dims[1] != c || dims[2] != side || dims[3] != side {
        return Err(ImportError::OutputShape {
            name: "pixel_values",
            expected: "[batch, num_channels, image_size, image_size]",
            found: dims.clone(),
        });
    }
    let batch = dims[0];
    let per = side / p;
    let src = pixel_values.data();
    let mut out = Vec::with_capacity(src.len());
    for b in 0..batch {
        for py in 0..per {
            for px in 0..per {
                for r in 0..p {
                    for col in 0..p {
                        let (y, x) = (py * p + r, px * p + col);
                        for ch in 0..c {
                            out.push(src[((b * c + ch) * side + y) * side + x]);
                        }
                    }
                }
            }
        }
    }
    Ok(HostTensor::new(vec![batch * per * per, p * p * c], out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_is_identity_and_constant_stays_constant() {
        let img: Vec<u8> = (0..5 * 4 * 3).map(|v| (v * 7 % 256) as u8).collect();
        assert_eq!(resize_bicubic(&img, 5, 4, 3, 5, 4), img);
        let flat = vec![200u8; 9 * 7 * 3];
        assert!(
            resize_bicubic(&flat, 9, 7, 3, 4, 11)
                .iter()
                .all(|&v| v == 200)
        );
    }

    #[test]
    fn weights_sum_to_one_in_fixed_point() {
        for (i, o) in [(50, 32), (37, 32), (7, 32), (1000, 3)] {
            for (_, k) in coefficients(i, o) {
                let s: i64 = k.iter().sum();
                assert!(
                    (s - (1 << PRECISION_BITS)).abs() <= k.len() as i64,
                    "{i}->{o}"
                );
            }
        }
    }
}

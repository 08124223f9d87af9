//! A run's embeddings into a file a user's tools read: NumPy's `.npy` or
//! safetensors, f32 little-endian.

use std::path::Path;

use tessera_graph::HostTensor;

use crate::ImportError;

/// Writes the outputs to `path`, chosen by its extension:
/// - `.npy`: `pooled` `[batch, width]` (without the pooling head, `tokens`
///   `[batch, tokens, width]`, the model's only output), NumPy format 1.0;
/// - `.safetensors`: `pooled` and, when given, `tokens`.
///
/// Any other extension is refused, as are outputs of another rank.
pub fn write_output(
    path: &Path,
    pooled: Option<&HostTensor>,
    tokens: Option<&HostTensor>,
) -> Result<(), ImportError> {
    check_rank(pooled, "pooled", 2, "[batch, width]")?;
    check_rank(tokens, "tokens", 3, "[batch, tokens, width]")?;
    let bytes = match path.extension().and_then(|e| e.to_str()) {
        Some("npy") => match pooled.or(tokens) {
            Some(t) => npy(t),
            None => {
                return Err(ImportError::OutputShape {
                    name: "pooled",
                    expected: "an output to write",
                    found: vec![],
                });
            }
        },
        Some("safetensors") => {
            let mut named = Vec::new();
            if let Some(p) = pooled {
                named.push(("pooled", p));
            }
            if let Some(t) = tokens {
                named.push(("tokens", t));
            }
            safetensors_bytes(&named).map_err(|reason| ImportError::Safetensors {
                path: path.to_path_buf(),
                reason,
            })?
        }
        _ => {
            return Err(ImportError::OutputExtension {
                path: path.to_path_buf(),
            });
        }
    };
    std::fs::write(path, bytes).map_err(|source| ImportError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn check_rank(
    t: Option<&HostTensor>,
    name: &'static str,
    rank: usize,
    expected: &'static str,
) -> Result<(), ImportError> {
    match t {
        Some(t) if t.shape().0.len() != rank => Err(ImportError::OutputShape {
            name,
            expected,
            found: t.shape().0.clone(),
        }),
        _ => Ok(()),
    }
}

/// NumPy format 1.0: magic, version, a little-endian u16 header length, a
/// Python-literal header padded with spaces to a newline that ends on a 64-byte
/// boundary (what NumPy writes, so the data is aligned), then the data.
fn npy(t: &HostTensor) -> Vec<u8> {
    let dims = &t.shape().0;
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}");
    let prefix = 10;
    let unpadded = prefix + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(prefix + header.len() + 4 * t.data().len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    // Headers of a few dozen bytes: far below format 1.0's 65,535.
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in t.data() {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

fn safetensors_bytes(named: &[(&str, &HostTensor)]) -> Result<Vec<u8>, String> {
    let encoded: Vec<(&str, Vec<u8>, Vec<usize>)> = named
        .iter()
        .map(|(n, t)| {
            (
                *n,
                t.data().iter().flat_map(|v| v.to_le_bytes()).collect(),
                t.shape().0.clone(),
            )
        })
        .collect();
    let views = encoded
        .iter()
        .map(|(n, bytes, shape)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (*n, v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn npy_header_is_aligned_and_literal() {
        let t = HostTensor::new(vec![2, 3], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let b = npy(&t);
        let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        let header = std::str::from_utf8(&b[10..10 + hlen]).unwrap();
        assert!(header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"));
        assert!(header.ends_with('\n'));
        assert_eq!(b.len(), 10 + hlen + 24);
        assert_eq!(&b[10 + hlen + 4..10 + hlen + 8], &1.0f32.to_le_bytes());
    }
}

//! `TensorMap::from_safetensors` (the bytes behind `TensorMap::load`); an accepted
//! file must survive `to_safetensors` and a second read with the same shapes and
//! bits. The generator writes headers from scratch: dtypes the reader does and does
//! not take, shapes at the edges, offsets right or wrong, the header length right or
//! not.

use crate::mutate::interesting;
use crate::{Rng, Seed, Target, corpus};
use rand::Rng as _;
use tessera_graph::{DType, TensorMap};

pub struct SafetensorsTarget;

const DTYPES: [(&str, u64); 9] = [
    ("F32", 4),
    ("F16", 2),
    ("BF16", 2),
    ("F64", 8),
    ("I8", 1),
    ("U8", 1),
    ("BOOL", 1),
    ("I64", 8),
    ("Q4", 1),
];

impl Target for SafetensorsTarget {
    fn name(&self) -> &'static str {
        "safetensors"
    }
    fn about(&self) -> &'static str {
        "TensorMap::from_safetensors, then the to_safetensors (f32) round trip"
    }
    fn corpus(&self) -> &'static [Seed] {
        corpus::SAFETENSORS
    }
    fn generate(&self, rng: &mut Rng) -> Vec<u8> {
        let n = rng.random_range(0..4);
        let mut entries = Vec::new();
        let mut offset = 0u64;
        for i in 0..n {
            let (dtype, width) = DTYPES[if rng.random_bool(0.7) {
                rng.random_range(0..3)
            } else {
                rng.random_range(0..DTYPES.len())
            }];
            let rank = rng.random_range(0..4);
            let shape: Vec<u64> = (0..rank)
                .map(|_| {
                    if rng.random_bool(0.1) {
                        interesting(rng)
                    } else {
                        rng.random_range(0..5)
                    }
                })
                .collect();
            let bytes = shape
                .iter()
                .try_fold(width, |a, &d| a.checked_mul(d))
                .filter(|&b| b <= 4096)
                .unwrap_or(rng.random_range(0..64));
            let (start, end) = if rng.random_bool(0.85) {
                (offset, offset + bytes)
            } else {
                (interesting(rng), interesting(rng))
            };
            offset += bytes;
            let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
            entries.push(format!(
                "\"{}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{start},{end}]}}",
                ["w", "b", "fc1.weight", "w"][i % 4],
                dims.join(",")
            ));
        }
        if rng.random_bool(0.2) {
            entries.push("\"__metadata__\":{\"format\":\"pt\"}".into());
        }
        let mut header = format!("{{{}}}", entries.join(","));
        while rng.random_bool(0.3) {
            header.push(' ');
        }
        let len = if rng.random_bool(0.9) {
            header.len() as u64
        } else {
            interesting(rng)
        };
        let mut out = len.to_le_bytes().to_vec();
        out.extend_from_slice(header.as_bytes());
        let data = offset.min(1 << 16) as usize;
        out.extend((0..data).map(|_| rng.random::<u8>()));
        out
    }
    fn execute(&self, input: &[u8]) -> Result<String, String> {
        let map = TensorMap::from_safetensors(input).map_err(|e| format!("read: {e}"))?;
        let bytes = map
            .to_safetensors(DType::F32)
            .map_err(|e| format!("write: {e}"))?;
        let again = TensorMap::from_safetensors(&bytes);
        let same = again.as_ref().is_ok_and(|a| {
            a.len() == map.len()
                && a.iter().zip(map.iter()).all(|((n1, t1), (n2, t2))| {
                    n1 == n2
                        && t1.shape() == t2.shape()
                        && t1
                            .data()
                            .iter()
                            .zip(t2.data())
                            .all(|(x, y)| x.to_bits() == y.to_bits())
                })
        });
        assert!(
            same,
            "an accepted file does not survive to_safetensors and a read: {again:?}"
        );
        Ok(format!("{} tensors", map.len().min(2)))
    }
}

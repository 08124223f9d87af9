//! Reading the file: the protobuf, the opset, and each tensor's values, inline or
//! in external data files beside the model.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use prost::Message;

use crate::error::OnnxError;
use crate::proto::{ModelProto, TensorProto, tensor_proto::DataLocation, tensor_proto::DataType};
use crate::value::{Dim, Tensor, Val, numel};
use crate::{OPSET_MAX, OPSET_MIN};

pub fn decode(bytes: &[u8], path: &Path) -> Result<ModelProto, OnnxError> {
    ModelProto::decode(bytes).map_err(|source| OnnxError::Decode {
        path: path.to_owned(),
        source,
    })
}

/// The default domain's opset; other domains are allowed to be declared (the
/// nodes that use them are refused as unmapped).
pub fn check_opset(model: &ModelProto, path: &Path) -> Result<i64, OnnxError> {
    let version = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        // ONNX's rule for a model that declares none is opset 1, out of range.
        .unwrap_or(1);
    if !(OPSET_MIN..=OPSET_MAX).contains(&version) {
        return Err(OnnxError::Opset {
            path: path.to_owned(),
            version,
        });
    }
    Ok(version)
}

fn data_err(tensor: &str, reason: impl Into<String>) -> OnnxError {
    OnnxError::TensorData {
        tensor: tensor.to_owned(),
        reason: reason.into(),
    }
}

fn elem_size(dtype: i32) -> Option<usize> {
    match DataType::try_from(dtype).ok()? {
        DataType::Float | DataType::Int32 => Some(4),
        DataType::Int64 => Some(8),
        DataType::Bool => Some(1),
        _ => None,
    }
}

/// The values of a tensor, resolving external data relative to `dir`.
pub fn tensor_val(t: &TensorProto, dir: &Path) -> Result<Val, OnnxError> {
    let name = t.name.as_str();
    let size = elem_size(t.data_type).ok_or(OnnxError::Dtype {
        tensor: name.to_owned(),
        dtype: t.data_type,
    })?;
    let shape: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| data_err(name, format!("negative dimension {d}"))))
        .collect::<Result<_, _>>()?;
    let count = numel(&shape).ok_or_else(|| data_err(name, "element count overflows"))?;
    let external = t.data_location == DataLocation::External as i32;
    let raw = if external {
        Some(read_external(t, dir, count, size)?)
    } else if !t.raw_data.is_empty() || (count == 0 && t.float_data.is_empty()) {
        Some(t.raw_data.clone())
    } else {
        None
    };
    let mismatch = |found: usize| {
        data_err(
            name,
            format!("{found} values for shape {shape:?} ({count} elements)"),
        )
    };
    let dtype = DataType::try_from(t.data_type).ok();
    if let Some(raw) = raw {
        if count.checked_mul(size) != Some(raw.len()) {
            return Err(mismatch(raw.len() / size));
        }
        return Ok(match dtype {
            Some(DataType::Float) => {
                let data = raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                Val::F(Arc::new(Tensor { shape, data }))
            }
            Some(DataType::Int64) => ints(
                shape,
                raw.chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
            ),
            Some(DataType::Int32) => ints(
                shape,
                raw.chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64),
            ),
            _ => ints(shape, raw.iter().map(|&b| (b != 0) as i64)),
        });
    }
    match dtype {
        Some(DataType::Float) => {
            if t.float_data.len() != count {
                return Err(mismatch(t.float_data.len()));
            }
            Ok(Val::F(Arc::new(Tensor {
                shape,
                data: t.float_data.clone(),
            })))
        }
        Some(DataType::Int64) => {
            if t.int64_data.len() != count {
                return Err(mismatch(t.int64_data.len()));
            }
            Ok(ints(shape, t.int64_data.iter().copied()))
        }
        _ => {
            // int32 and bool are both stored in `int32_data`.
            if t.int32_data.len() != count {
                return Err(mismatch(t.int32_data.len()));
            }
            let bool_ = dtype == Some(DataType::Bool);
            Ok(ints(
                shape,
                t.int32_data
                    .iter()
                    .map(|&v| if bool_ { (v != 0) as i64 } else { v as i64 }),
            ))
        }
    }
}

fn ints(shape: Vec<usize>, data: impl Iterator<Item = i64>) -> Val {
    Val::I(Arc::new(Tensor {
        shape,
        data: data.map(Dim::int).collect(),
    }))
}

/// A location names a file inside the model's directory: no absolute path, no
/// `..`, and (after links are followed) still inside it.
fn external_path(tensor: &str, location: &str, dir: &Path) -> Result<PathBuf, OnnxError> {
    let escapes = || OnnxError::ExternalEscapes {
        tensor: tensor.to_owned(),
        location: location.to_owned(),
    };
    let rel = Path::new(location);
    if location.is_empty()
        || !rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(escapes());
    }
    Ok(dir.join(rel))
}

fn read_external(
    t: &TensorProto,
    dir: &Path,
    count: usize,
    size: usize,
) -> Result<Vec<u8>, OnnxError> {
    let name = t.name.as_str();
    let entry = |key: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    };
    let number = |key: &str| -> Result<Option<u64>, OnnxError> {
        match entry(key) {
            None => Ok(None),
            Some(v) => v
                .parse::<u64>()
                .map(Some)
                .map_err(|_| OnnxError::ExternalKey {
                    tensor: name.to_owned(),
                    key: key.to_owned(),
                    value: v.to_owned(),
                }),
        }
    };
    let location = entry("location").ok_or_else(|| OnnxError::ExternalKey {
        tensor: name.to_owned(),
        key: "location".into(),
        value: String::new(),
    })?;
    let path = external_path(name, location, dir)?;
    let missing = |source| OnnxError::ExternalMissing {
        tensor: name.to_owned(),
        path: path.clone(),
        source,
    };
    let mut file = File::open(&path).map_err(missing)?;
    let inside = match (path.canonicalize(), dir.canonicalize()) {
        (Ok(p), Ok(d)) => p.starts_with(d),
        _ => false,
    };
    if !inside {
        return Err(OnnxError::ExternalEscapes {
            tensor: name.to_owned(),
            location: location.to_owned(),
        });
    }
    let file_len = file.metadata().map_err(missing)?.len();
    let offset = number("offset")?.unwrap_or(0);
    let want = (count as u64).checked_mul(size as u64);
    let length = number("length")?.or(want).unwrap_or(u64::MAX);
    let range_err = || OnnxError::ExternalRange {
        tensor: name.to_owned(),
        path: path.clone(),
        offset,
        length,
        file_len,
    };
    if offset.checked_add(length).is_none_or(|end| end > file_len) {
        return Err(range_err());
    }
    if want != Some(length) {
        return Err(data_err(
            name,
            format!("external length {length} bytes for {count} elements of {size} bytes"),
        ));
    }
    let mut buf = vec![0u8; usize::try_from(length).map_err(|_| range_err())?];
    file.seek(SeekFrom::Start(offset)).map_err(missing)?;
    file.read_exact(&mut buf).map_err(missing)?;
    Ok(buf)
}

//! Where Hugging Face tensors come from: a checkpoint directory as
//! `save_pretrained` writes it (memory-mapped safetensors, one file or shards),
//! or tensors already in memory (what the ONNX importer hands over).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use tessera_graph::{HostTensor, TensorMap};

use crate::ImportError;
use crate::config::{VisionConfig, parse_config};

/// Tensors of a SigLIP vision model by their Hugging Face names, as a
/// `SiglipVisionModel`'s state dict names them (`embeddings.*`,
/// `encoder.layers.N.*`, `post_layernorm.*`, `head.*`: no `vision_model.`
/// prefix) and in its layouts (a Linear's weight `[out, in]`, the patch
/// Conv's `[width, channels, patch, patch]`, the position embedding
/// `[tokens, width]`, the head's `attention.in_proj_weight` `[3 width, width]`),
/// widened to f32.
pub trait TensorSource {
    /// Tensor `name`, or `None` when the source has no such tensor.
    fn tensor(&self, name: &str) -> Result<Option<HostTensor>, ImportError>;
    /// Every tensor name the source holds, sorted.
    fn names(&self) -> Vec<String>;
    /// What errors call the source (a directory, a file).
    fn origin(&self) -> String {
        "the tensors".to_string()
    }
}

/// Tensors in memory already in Hugging Face names and layouts: the ONNX
/// importer's initializers renamed to the vision model's names.
impl TensorSource for TensorMap {
    fn tensor(&self, name: &str) -> Result<Option<HostTensor>, ImportError> {
        Ok(self.get(name).cloned())
    }
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.names().map(str::to_string).collect();
        v.sort();
        v
    }
}

/// One memory-mapped safetensors file and its parsed header.
struct Mapped {
    path: PathBuf,
    map: Mmap,
    /// Bytes before the tensor data: the length word and the JSON header.
    data_start: usize,
    meta: Metadata,
}

impl Mapped {
    fn open(path: &Path) -> Result<Mapped, ImportError> {
        let read = |source| ImportError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(read)?;
        // SAFETY: the map is read-only and private to this process. A file
        // changed by another process while it is mapped could change the values
        // read (as with any mapped checkpoint loader); every offset is checked
        // against the map's length below, so no read goes outside it.
        let map = unsafe { Mmap::map(&file) }.map_err(read)?;
        let (n, meta) = SafeTensors::read_metadata(&map).map_err(|e| ImportError::Safetensors {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(Mapped {
            path: path.to_path_buf(),
            map,
            data_start: 8 + n,
            meta,
        })
    }

    fn bytes(&self, name: &str) -> Option<(Dtype, &[usize], &[u8])> {
        let info = self.meta.info(name)?;
        let (s, e) = info.data_offsets;
        let bytes = self
            .map
            .get(self.data_start.checked_add(s)?..self.data_start.checked_add(e)?)?;
        Some((info.dtype, &info.shape, bytes))
    }
}

/// A Hugging Face model directory: `config.json` and `model.safetensors`, or
/// `model.safetensors.index.json` and the shards it names. Each safetensors file
/// is memory-mapped, never read whole: a tensor is converted to f32 when asked
/// for, straight from the map.
pub struct Checkpoint {
    dir: PathBuf,
    config: VisionConfig,
    files: Vec<Mapped>,
    /// Vision tensor name (prefix removed) -> (file, name in the file).
    tensors: BTreeMap<String, (usize, String)>,
}

/// The prefix of the vision tower's tensors in a whole `SiglipModel`.
pub const VISION_PREFIX: &str = "vision_model.";

impl Checkpoint {
    /// Opens `dir`: reads and validates its `config.json`, maps its safetensors
    /// file(s), checks a shard index against the shards. A whole `SiglipModel`'s
    /// vision tensors (`vision_model.*`) are offered without the prefix, and its
    /// other tensors (the text tower) are not offered at all.
    pub fn open(dir: impl AsRef<Path>) -> Result<Checkpoint, ImportError> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(ImportError::NotACheckpoint {
                dir,
                what: "config.json",
            });
        }
        let text = std::fs::read_to_string(&config_path).map_err(|source| ImportError::Read {
            path: config_path.clone(),
            source,
        })?;
        let config = parse_config(&text, &config_path.display().to_string())?;

        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let mut files = Vec::new();
        // Every tensor name of the checkpoint -> (file, name).
        let mut all: BTreeMap<String, usize> = BTreeMap::new();
        if index.is_file() {
            let shards = read_index(&index)?;
            // Shards open in name order; each once, however many tensors it holds.
            let names: std::collections::BTreeSet<&str> =
                shards.values().map(String::as_str).collect();
            let slot_of: BTreeMap<&str, usize> =
                names.iter().enumerate().map(|(i, f)| (*f, i)).collect();
            for file in &names {
                files.push(Mapped::open(&dir.join(file))?);
            }
            for (name, file) in &shards {
                let slot = slot_of[file.as_str()];
                if files[slot].meta.info(name).is_none() {
                    return Err(ImportError::Index {
                        path: index.clone(),
                        reason: format!("tensor `{name}` is not in its shard {file}"),
                    });
                }
                all.insert(name.clone(), slot);
            }
        } else if single.is_file() {
            files.push(Mapped::open(&single)?);
            for name in files[0].meta.offset_keys() {
                all.insert(name, 0);
            }
        } else {
            return Err(ImportError::NotACheckpoint {
                dir,
                what: "model.safetensors or model.safetensors.index.json",
            });
        }

        // transformers 5 saves a SiglipVisionModel's tensors without a prefix and
        // a SiglipModel's vision tower under `vision_model.`.
        let whole = all.keys().any(|n| n.starts_with(VISION_PREFIX));
        let tensors = all
            .into_iter()
            .filter_map(|(name, slot)| {
                if whole {
                    let short = name.strip_prefix(VISION_PREFIX)?.to_string();
                    Some((short, (slot, name)))
                } else {
                    Some((name.clone(), (slot, name)))
                }
            })
            .collect();
        Ok(Checkpoint {
            dir,
            config,
            files,
            tensors,
        })
    }

    /// The vision config read from `config.json`.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The directory it was opened from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// `weight_map` of a shard index: tensor name -> shard file name. A shard must
/// be a plain file name beside the index (no directories, no `..`).
fn read_index(path: &Path) -> Result<BTreeMap<String, String>, ImportError> {
    let bad = |reason: String| ImportError::Index {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| ImportError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let Some(Value::Object(map)) = v.get("weight_map") else {
        return Err(bad("no `weight_map` object".into()));
    };
    let mut out = BTreeMap::new();
    for (name, file) in map {
        let Value::String(file) = file else {
            return Err(bad(format!("`{name}` maps to {file}, not a file name")));
        };
        let plain = Path::new(file)
            .file_name()
            .is_some_and(|f| f == file.as_str())
            && file != ".."
            && file.ends_with(".safetensors");
        if !plain {
            return Err(bad(format!(
                "`{name}` maps to `{file}`, not a .safetensors file beside the index"
            )));
        }
        out.insert(name.clone(), file.clone());
    }
    if out.is_empty() {
        return Err(bad("`weight_map` is empty".into()));
    }
    Ok(out)
}

impl TensorSource for Checkpoint {
    fn tensor(&self, name: &str) -> Result<Option<HostTensor>, ImportError> {
        let Some((slot, full)) = self.tensors.get(name) else {
            return Ok(None);
        };
        let file = &self.files[*slot];
        let Some((dtype, shape, bytes)) = file.bytes(full) else {
            // The header was validated against the map's length when opened.
            return Err(ImportError::Safetensors {
                path: file.path.clone(),
                reason: format!("tensor `{full}` lies outside the file"),
            });
        };
        let data = decode(bytes, dtype).ok_or_else(|| ImportError::TensorDtype {
            name: full.clone(),
            origin: file.path.display().to_string(),
            dtype: format!("{dtype:?}"),
        })?;
        Ok(Some(HostTensor::new(shape.to_vec(), data)?))
    }

    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn origin(&self) -> String {
        self.dir.display().to_string()
    }
}

/// Little-endian F32, F16 or BF16 bytes widened to f32; `None` for another dtype.
/// The bytes of a mapped file need not be aligned, hence the byte-wise reads.
fn decode(bytes: &[u8], dtype: Dtype) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => return None,
    })
}

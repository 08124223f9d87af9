//! Host-side tensor values: weights, inputs and outputs as f32 arrays, their seeded
//! generation and their `.safetensors` form.

use crate::ir::{DType, Graph, Init, Shape};
use half::f16;
use indexmap::IndexMap;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};
use std::path::Path;

/// Problems with tensor values: lengths, names, files.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("tensor data has {found} elements but shape {shape} needs {expected}")]
    Length {
        shape: Shape,
        expected: usize,
        found: usize,
    },
    #[error("missing {what} `{name}` (the graph expects {dtype}{shape})")]
    Missing {
        what: &'static str,
        name: String,
        shape: Shape,
        dtype: DType,
    },
    #[error("{what} `{name}` has shape {found}, the graph expects {expected}")]
    WrongShape {
        what: &'static str,
        name: String,
        expected: Shape,
        found: Shape,
    },
    #[error("safetensors tensor `{name}` has unsupported dtype {dtype} (f32, f16 and bf16 load)")]
    UnsupportedDType { name: String, dtype: String },
    #[error("invalid safetensors data: {0}")]
    Safetensors(String),
    // The OS error is the source only, so that a printed chain shows it once.
    #[error("cannot access {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// A dense row-major f32 array with its shape. Values of f16 tensors are held as the
/// f32 they widen to.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    shape: Shape,
    data: Vec<f32>,
}

impl HostTensor {
    pub fn new(shape: impl Into<Shape>, data: Vec<f32>) -> Result<Self, TensorError> {
        let shape = shape.into();
        if shape.numel() != data.len() {
            return Err(TensorError::Length {
                expected: shape.numel(),
                found: data.len(),
                shape,
            });
        }
        Ok(HostTensor { shape, data })
    }
    pub fn zeros(shape: impl Into<Shape>) -> Self {
        let shape = shape.into();
        let data = vec![0.0; shape.numel()];
        HostTensor { shape, data }
    }
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    pub fn data(&self) -> &[f32] {
        &self.data
    }
    pub fn data_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
    pub fn into_data(self) -> Vec<f32> {
        self.data
    }
    /// Same elements under a new shape with the same element count.
    pub fn reshaped(self, shape: impl Into<Shape>) -> Result<Self, TensorError> {
        HostTensor::new(shape, self.data)
    }
    /// Rounds every element to the nearest f16 (ties to even) and back.
    pub fn round_to_f16(&mut self) {
        round_to_f16(&mut self.data);
    }
}

/// Rounds each value to the nearest f16 (ties to even), kept as f32.
pub fn round_to_f16(values: &mut [f32]) {
    for v in values {
        *v = f16::from_f32(*v).to_f32();
    }
}

/// Named tensors in a stable order. Used for weights, inputs and outputs alike.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TensorMap {
    tensors: IndexMap<String, HostTensor>,
}

/// Parameter values by parameter name.
pub type Weights = TensorMap;
/// Host input values by input name.
pub type Inputs = TensorMap;
/// Graph results by output name.
pub type Outputs = TensorMap;

impl TensorMap {
    pub fn new() -> Self {
        Self::default()
    }
    /// Inserts or replaces `name`.
    pub fn insert(&mut self, name: impl Into<String>, tensor: HostTensor) {
        self.tensors.insert(name.into(), tensor);
    }
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }
    pub fn get_mut(&mut self, name: &str) -> Option<&mut HostTensor> {
        self.tensors.get_mut(name)
    }
    pub fn remove(&mut self, name: &str) -> Option<HostTensor> {
        self.tensors.shift_remove(name)
    }
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&str, &HostTensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Checks that every parameter of `graph` is present with its declared shape.
    /// Extra entries are allowed (a checkpoint may hold more than one graph uses).
    pub fn check_params(&self, graph: &Graph) -> Result<(), TensorError> {
        for (name, shape, dtype, _) in graph.param_specs() {
            self.check_one("parameter", name, shape, dtype)?;
        }
        Ok(())
    }

    /// Checks that every host input of `graph` is present with its declared shape.
    pub fn check_inputs(&self, graph: &Graph) -> Result<(), TensorError> {
        for (name, shape, dtype) in graph.input_specs() {
            self.check_one("input", name, shape, dtype)?;
        }
        Ok(())
    }

    fn check_one(
        &self,
        what: &'static str,
        name: &str,
        shape: &Shape,
        dtype: DType,
    ) -> Result<(), TensorError> {
        match self.get(name) {
            None => Err(TensorError::Missing {
                what,
                name: name.to_string(),
                shape: shape.clone(),
                dtype,
            }),
            Some(t) if t.shape() != shape => Err(TensorError::WrongShape {
                what,
                name: name.to_string(),
                expected: shape.clone(),
                found: t.shape().clone(),
            }),
            Some(_) => Ok(()),
        }
    }

    /// Serialises every tensor, stored as `dtype` (f16 rounds to nearest even).
    /// safetensors orders the file by name, so the bytes depend only on the contents.
    pub fn to_safetensors(&self, dtype: DType) -> Result<Vec<u8>, TensorError> {
        let encoded: Vec<(&str, Vec<u8>, &Shape)> = self
            .tensors
            .iter()
            .map(|(name, t)| (name.as_str(), encode(t.data(), dtype), t.shape()))
            .collect();
        let st_dtype = match dtype {
            DType::F16 => safetensors::Dtype::F16,
            DType::F32 => safetensors::Dtype::F32,
        };
        let views = encoded
            .iter()
            .map(|(name, bytes, shape)| {
                safetensors::tensor::TensorView::new(st_dtype, shape.0.clone(), bytes)
                    .map(|v| (*name, v))
                    .map_err(|e| TensorError::Safetensors(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        safetensors::serialize(views, None).map_err(|e| TensorError::Safetensors(e.to_string()))
    }

    /// Reads f32, f16 or bf16 tensors, widening to f32. Entries are sorted by name so
    /// the result does not depend on the file's header order.
    pub fn from_safetensors(bytes: &[u8]) -> Result<Self, TensorError> {
        let st = safetensors::SafeTensors::deserialize(bytes)
            .map_err(|e| TensorError::Safetensors(e.to_string()))?;
        let mut names: Vec<&str> = st.names();
        names.sort_unstable();
        let mut map = TensorMap::new();
        for name in names {
            let view = st
                .tensor(name)
                .map_err(|e| TensorError::Safetensors(e.to_string()))?;
            let data = decode(name, view.dtype(), view.data())?;
            map.insert(name, HostTensor::new(view.shape().to_vec(), data)?);
        }
        Ok(map)
    }

    pub fn save(&self, path: impl AsRef<Path>, dtype: DType) -> Result<(), TensorError> {
        let bytes = self.to_safetensors(dtype)?;
        std::fs::write(path.as_ref(), bytes).map_err(|source| TensorError::Io {
            path: path.as_ref().display().to_string(),
            source,
        })
    }

    pub fn load(path: impl AsRef<Path>) -> Result<Self, TensorError> {
        let bytes = std::fs::read(path.as_ref()).map_err(|source| TensorError::Io {
            path: path.as_ref().display().to_string(),
            source,
        })?;
        Self::from_safetensors(&bytes)
    }
}

fn encode(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        DType::F16 => values
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect(),
    }
}

fn decode(name: &str, dtype: safetensors::Dtype, bytes: &[u8]) -> Result<Vec<f32>, TensorError> {
    use safetensors::Dtype as D;
    Ok(match dtype {
        D::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        D::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        D::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(TensorError::UnsupportedDType {
                name: name.to_string(),
                dtype: format!("{other:?}"),
            });
        }
    })
}

/// 64-bit FNV-1a: a fixed, documented hash so that each tensor's random stream
/// depends only on its name, never on declaration order or the std hasher.
fn fnv1a(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The generator for the tensor `name`: ChaCha8 seeded with `seed`, on stream
/// `fnv1a(domain + ":" + name)`. Streams make tensors independent of each other, so
/// adding a parameter never changes the values of the others.
fn stream_rng(seed: u64, domain: &str, name: &str) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(fnv1a(&format!("{domain}:{name}")));
    rng
}

fn sample(rng: &mut ChaCha8Rng, n: usize, init: Init) -> Vec<f32> {
    match init {
        Init::Constant(c) => vec![c; n],
        Init::Normal { mean, std } => (0..n)
            .map(|_| {
                let z: f32 = StandardNormal.sample(rng);
                mean + std * z
            })
            .collect(),
    }
}

/// Deterministic weights for every parameter of `graph`, drawn from the
/// initialiser each parameter declares. The same `(seed, name, shape, init)` always
/// gives the same values. Values of f16 parameters are rounded to f16 so that a
/// checkpoint saved as f16 reloads bit-identically.
pub fn init_weights(graph: &Graph, seed: u64) -> Weights {
    let mut w = TensorMap::new();
    for (name, shape, dtype, init) in graph.param_specs() {
        let mut rng = stream_rng(seed, "param", name);
        let mut t = HostTensor {
            shape: shape.clone(),
            data: sample(&mut rng, shape.numel(), init),
        };
        if dtype == DType::F16 {
            t.round_to_f16();
        }
        w.insert(name, t);
    }
    w
}

/// Deterministic standard-normal values for every host input of `graph` (rounded to
/// f16 for f16 inputs, as for weights).
pub fn random_inputs(graph: &Graph, seed: u64) -> Inputs {
    let mut m = TensorMap::new();
    for (name, shape, dtype) in graph.input_specs() {
        let mut rng = stream_rng(seed, "input", name);
        let mut t = HostTensor {
            shape: shape.clone(),
            data: sample(
                &mut rng,
                shape.numel(),
                Init::Normal {
                    mean: 0.0,
                    std: 1.0,
                },
            ),
        };
        if dtype == DType::F16 {
            t.round_to_f16();
        }
        m.insert(name, t);
    }
    m
}

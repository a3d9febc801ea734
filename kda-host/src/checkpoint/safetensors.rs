//! Safetensors files: parsing a header from bytes, typed access to tensors (in place when the
//! bytes are aligned, copied otherwise), memory mapping, and writing.
//!
//! The header is parsed and validated by the `safetensors` crate (offsets contiguous and
//! covering the data exactly, sizes consistent with shapes and dtypes); this module adds the
//! file name to every error and the checks the KDA loader needs on top.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::Path;

use half::{bf16, f16};
use kda_core::Data;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

use crate::error::{HostError, Result};

/// Bytes of a file: memory-mapped, or held in memory (tests, fuzzing, small files).
#[derive(Debug)]
pub enum Buffer {
    /// A read-only memory map of the whole file.
    Mapped(memmap2::Mmap),
    /// Bytes owned in memory.
    Owned(Vec<u8>),
}

impl Deref for Buffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Buffer::Mapped(m) => m,
            Buffer::Owned(v) => v,
        }
    }
}

impl Buffer {
    /// Memory-maps `path` read-only.
    #[allow(unsafe_code)]
    pub fn map(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| HostError::io(path, e))?;
        let len = file.metadata().map_err(|e| HostError::io(path, e))?.len();
        if len == 0 {
            // Mapping an empty file fails on some platforms; an empty buffer says the same.
            return Ok(Buffer::Owned(Vec::new()));
        }
        // SAFETY: the map is read-only and private to this process. It stays valid while the
        // `Mmap` lives (it keeps its own reference to the mapping, not to `file`). What it
        // cannot guard against is another process truncating or rewriting the file while it is
        // mapped: that is undefined behaviour for any memory-mapped reader, and checkpoint files
        // are treated as immutable while loaded (as every mmap-based loader does).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| HostError::io(path, e))?;
        Ok(Buffer::Mapped(map))
    }

    /// Reads `path` into memory.
    pub fn read(path: &Path) -> Result<Self> {
        std::fs::read(path)
            .map(Buffer::Owned)
            .map_err(|e| HostError::io(path, e))
    }
}

/// One tensor of a safetensors header.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// Stored dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Byte range in the whole file (header included).
    pub range: Range<usize>,
}

impl TensorEntry {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        // Validated by the header check: the product fits (it equals the byte size / dtype size).
        self.shape.iter().product()
    }
}

/// A parsed safetensors header.
#[derive(Debug, Clone, Default)]
pub struct Header {
    /// Tensors by name.
    pub tensors: HashMap<String, TensorEntry>,
    /// The `__metadata__` strings.
    pub metadata: HashMap<String, String>,
}

/// Parses and validates the header of a whole safetensors file held in `bytes`; `file` names
/// it in errors.
pub fn parse_header(bytes: &[u8], file: &str) -> Result<Header> {
    let bad = |reason: String| HostError::Safetensors {
        file: file.to_string(),
        reason,
    };
    if bytes.len() < 8 {
        return Err(bad(format!(
            "file is {} bytes long, shorter than the 8-byte header length (truncated?)",
            bytes.len()
        )));
    }
    let (n, meta) = SafeTensors::read_metadata(bytes).map_err(|e| {
        let detail = match e {
            safetensors::SafeTensorError::MetadataIncompleteBuffer => {
                "the tensor data does not end where the file ends (truncated or padded)".to_string()
            }
            safetensors::SafeTensorError::InvalidHeaderLength => format!(
                "header length {} runs past the end of the file ({} bytes; truncated?)",
                u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])),
                bytes.len()
            ),
            e => e.to_string(),
        };
        bad(one_line(&detail))
    })?;
    let base = 8 + n;
    let mut tensors = HashMap::new();
    for (name, info) in meta.tensors() {
        let (s, e) = info.data_offsets;
        let range = base
            .checked_add(s)
            .zip(base.checked_add(e))
            .map(|(a, b)| a..b)
            .filter(|r| r.start <= r.end && r.end <= bytes.len())
            .ok_or_else(|| bad(format!("tensor `{name}` has offsets outside the file")))?;
        tensors.insert(
            name,
            TensorEntry {
                dtype: info.dtype,
                shape: info.shape.clone(),
                range,
            },
        );
    }
    let metadata = meta.metadata().clone().unwrap_or_default();
    Ok(Header { tensors, metadata })
}

/// Collapses an error text to one line.
pub(crate) fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A safetensors file: its bytes and its parsed header.
#[derive(Debug)]
pub struct SafetensorsFile {
    /// Name used in messages (a path).
    pub name: String,
    /// The bytes.
    pub buffer: Buffer,
    /// The parsed header.
    pub header: Header,
}

impl SafetensorsFile {
    /// Parses `buffer` as a safetensors file named `name`.
    pub fn parse(name: impl Into<String>, buffer: Buffer) -> Result<Self> {
        let name = name.into();
        let header = parse_header(&buffer, &name)?;
        Ok(SafetensorsFile {
            name,
            buffer,
            header,
        })
    }

    /// Memory-maps and parses `path`.
    pub fn map(path: &Path) -> Result<Self> {
        Self::parse(path.display().to_string(), Buffer::map(path)?)
    }

    /// Reads and parses `path` (for small files).
    pub fn read(path: &Path) -> Result<Self> {
        Self::parse(path.display().to_string(), Buffer::read(path)?)
    }

    /// The entry of tensor `name`, if present.
    pub fn get(&self, name: &str) -> Option<&TensorEntry> {
        self.header.tensors.get(name)
    }

    /// The entry of tensor `name`, or an error naming it and this file.
    pub fn entry(&self, name: &str) -> Result<&TensorEntry> {
        self.get(name).ok_or_else(|| HostError::MissingTensor {
            file: self.name.clone(),
            tensor: name.to_string(),
            note: String::new(),
        })
    }

    /// The raw bytes of a tensor.
    pub fn bytes(&self, entry: &TensorEntry) -> &[u8] {
        self.buffer.get(entry.range.clone()).unwrap_or(&[])
    }

    /// Tensor `name` as f32 values (F32, BF16 or F16 stored), checked against `shape` when
    /// given. Copies.
    pub fn f32_tensor(
        &self,
        name: &str,
        shape: Option<&[usize]>,
        f32_only: bool,
    ) -> Result<Vec<f32>> {
        let e = self.entry(name)?;
        if let Some(s) = shape {
            if e.shape != s {
                return Err(HostError::tensor(
                    &self.name,
                    name,
                    format!("has shape {:?}, expected {s:?}", e.shape),
                ));
            }
        }
        let raw = self.bytes(e);
        match e.dtype {
            Dtype::F32 => Ok(raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()),
            Dtype::BF16 if !f32_only => Ok(raw
                .chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect()),
            Dtype::F16 if !f32_only => Ok(raw
                .chunks_exact(2)
                .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
                .collect()),
            d => Err(HostError::tensor(
                &self.name,
                name,
                format!(
                    "has dtype {d:?}, expected {}",
                    if f32_only { "F32" } else { "F32 or BF16" }
                ),
            )),
        }
    }

    /// Tensor `name` as integers (I64 or I32 stored). Copies.
    pub fn int_tensor(&self, name: &str) -> Result<Vec<i64>> {
        let e = self.entry(name)?;
        let raw = self.bytes(e);
        match e.dtype {
            Dtype::I64 => Ok(raw
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect()),
            Dtype::I32 => Ok(raw
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                .collect()),
            d => Err(HostError::tensor(
                &self.name,
                name,
                format!("has dtype {d:?}, expected I64 or I32"),
            )),
        }
    }
}

/// Storage format of a weight tensor the layer can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloatDtype {
    /// IEEE f32.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE f16.
    F16,
}

impl FloatDtype {
    /// The float format of a safetensors dtype, if it is one the layer accepts.
    pub fn from_dtype(d: Dtype) -> Option<Self> {
        match d {
            Dtype::F32 => Some(FloatDtype::F32),
            Dtype::BF16 => Some(FloatDtype::Bf16),
            Dtype::F16 => Some(FloatDtype::F16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::Bf16 | FloatDtype::F16 => 2,
        }
    }

    /// The safetensors name (`F32`, `BF16`, `F16`).
    pub fn name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "F32",
            FloatDtype::Bf16 => "BF16",
            FloatDtype::F16 => "F16",
        }
    }
}

/// Float values copied out of a file (when they are not aligned for in-place use).
#[derive(Debug, Clone, PartialEq)]
pub enum FloatVec {
    /// f32.
    F32(Vec<f32>),
    /// bf16.
    Bf16(Vec<bf16>),
    /// f16.
    F16(Vec<f16>),
}

impl FloatVec {
    /// Decodes little-endian `raw` as `dtype`.
    pub fn decode(raw: &[u8], dtype: FloatDtype) -> Self {
        let u16s = || {
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
        };
        match dtype {
            FloatDtype::F32 => FloatVec::F32(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            FloatDtype::Bf16 => FloatVec::Bf16(u16s().map(bf16::from_bits).collect()),
            FloatDtype::F16 => FloatVec::F16(u16s().map(f16::from_bits).collect()),
        }
    }

    /// A borrowed view.
    pub fn view(&self) -> Data<'_> {
        match self {
            FloatVec::F32(v) => Data::F32(v),
            FloatVec::Bf16(v) => Data::Bf16(v),
            FloatVec::F16(v) => Data::F16(v),
        }
    }
}

/// `raw` (little-endian `dtype` values) viewed in place, or `None` when it is not aligned for
/// the element type (or the target is big-endian, where the bytes must be swapped).
pub fn view_in_place(raw: &[u8], dtype: FloatDtype) -> Option<Data<'_>> {
    if cfg!(target_endian = "big") {
        return None;
    }
    match dtype {
        FloatDtype::F32 => bytemuck::try_cast_slice::<u8, f32>(raw).ok().map(Data::F32),
        FloatDtype::Bf16 => bytemuck::try_cast_slice::<u8, bf16>(raw)
            .ok()
            .map(Data::Bf16),
        FloatDtype::F16 => bytemuck::try_cast_slice::<u8, f16>(raw).ok().map(Data::F16),
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One tensor to write: name, dtype, shape, little-endian bytes.
#[derive(Debug, Clone)]
pub struct OutTensor {
    /// Name.
    pub name: String,
    /// Dtype.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian bytes (`numel · size`).
    pub bytes: Vec<u8>,
}

impl OutTensor {
    /// An F32 tensor.
    pub fn f32(name: impl Into<String>, shape: Vec<usize>, v: &[f32]) -> Self {
        OutTensor {
            name: name.into(),
            dtype: Dtype::F32,
            shape,
            bytes: f32_bytes(v),
        }
    }

    /// An I64 tensor.
    pub fn i64(name: impl Into<String>, v: &[i64]) -> Self {
        OutTensor {
            name: name.into(),
            dtype: Dtype::I64,
            shape: vec![v.len()],
            bytes: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

/// Serialises tensors (and `__metadata__` strings) to safetensors bytes; `file` names the
/// destination in errors.
pub fn serialize(
    tensors: &[OutTensor],
    metadata: &BTreeMap<String, String>,
    file: &str,
) -> Result<Vec<u8>> {
    let views = tensors
        .iter()
        .map(|t| {
            TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .map(|v| (t.name.as_str(), v))
                .map_err(|e| HostError::tensor(file, &t.name, one_line(&e.to_string())))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect::<HashMap<_, _>>()
    });
    safetensors::serialize(views, meta).map_err(|e| HostError::file(file, one_line(&e.to_string())))
}

/// Serialises and writes to `path`.
pub fn write_file(
    path: &Path,
    tensors: &[OutTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = serialize(tensors, metadata, &path.display().to_string())?;
    std::fs::write(path, bytes).map_err(|e| HostError::io(path, e))
}

//! Safetensors files: parsing a header from bytes, typed access to tensors (in place when the
//! bytes are aligned, copied otherwise), memory mapping, and writing.
//!
//! The header is parsed and validated by the `safetensors` crate (offsets contiguous and
//! covering the data exactly, sizes consistent with shapes and dtypes); this module adds the
//! file name to every error and the checks the KDA loader needs on top.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::ops::{Deref, Range};
use std::path::Path;

use half::{bf16, f16};
use kda_core::Data;
use safetensors::tensor::{Dtype, SafeTensors};

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
        let (file, len) = crate::fsio::open_regular(path)?;
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

    /// A copy of `bytes` (allocated fallibly; `file` names them in the error).
    pub fn copy_of(bytes: &[u8], file: &str) -> Result<Self> {
        let mut v = crate::fsio::try_buffer(bytes.len() as u64, || format!("a copy of {file}"))?;
        v.extend_from_slice(bytes);
        Ok(Buffer::Owned(v))
    }

    /// Reads `path` (a regular file) into memory.
    pub fn read(path: &Path) -> Result<Self> {
        crate::fsio::read_regular(path).map(Buffer::Owned)
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
    header_from(&meta, &bytes[8..8 + n], bytes.len(), file)
}

/// The 8-byte length and the JSON header at the start of the file `file` of `file_len` bytes,
/// read from `r` (so a large file's tensors can be read one by one, never all in memory).
pub fn read_header_prefix(r: &mut dyn Read, file_len: u64, file: &str) -> Result<Vec<u8>> {
    let bad = |reason: String| HostError::Safetensors {
        file: file.to_string(),
        reason,
    };
    let io = |e: std::io::Error| HostError::file(file, format!("cannot read: {e}"));
    if file_len < 8 {
        return Err(bad(format!(
            "file is {file_len} bytes long, shorter than the 8-byte header length (truncated?)"
        )));
    }
    let mut len = [0u8; 8];
    r.read_exact(&mut len).map_err(io)?;
    let n = u64::from_le_bytes(len);
    if n > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "header length {n} is more than the {MAX_HEADER_BYTES} bytes allowed"
        )));
    }
    if 8 + n > file_len {
        return Err(bad(format!(
            "header length {n} runs past the end of the file ({file_len} bytes; truncated?)"
        )));
    }
    let mut head = len.to_vec();
    head.resize(8 + n as usize, 0);
    r.read_exact(&mut head[8..]).map_err(io)?;
    Ok(head)
}

/// Parses and validates a header given as its first bytes `head` ([`read_header_prefix`]) and
/// the length of the whole file: the same checks as [`parse_header`].
pub fn parse_header_prefix(head: &[u8], file_len: usize, file: &str) -> Result<Header> {
    let bad = |reason: String| HostError::Safetensors {
        file: file.to_string(),
        reason,
    };
    let json = head.get(8..).unwrap_or(&[]);
    let meta: safetensors::tensor::Metadata =
        serde_json::from_slice(json).map_err(|e| bad(one_line(&format!("invalid header: {e}"))))?;
    let end = meta
        .tensors()
        .values()
        .map(|t| t.data_offsets.1)
        .max()
        .unwrap_or(0);
    if head.len().checked_add(end) != Some(file_len) {
        return Err(bad(
            "the tensor data does not end where the file ends (truncated or padded)".into(),
        ));
    }
    header_from(&meta, json, file_len, file)
}

/// Bytes a safetensors header may have (the `safetensors` crate's limit).
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The [`Header`] of validated metadata `meta` (JSON text `json`) of a file of `file_len`
/// bytes; refuses repeated tensor names.
fn header_from(
    meta: &safetensors::tensor::Metadata,
    json: &[u8],
    file_len: usize,
    file: &str,
) -> Result<Header> {
    let bad = |reason: String| HostError::Safetensors {
        file: file.to_string(),
        reason,
    };
    if let Some(name) = duplicate_name(json) {
        return Err(bad(format!(
            "tensor `{name}` is listed more than once in the header"
        )));
    }
    let base = 8 + json.len();
    let mut tensors = HashMap::new();
    for (name, info) in meta.tensors() {
        let (s, e) = info.data_offsets;
        let range = base
            .checked_add(s)
            .zip(base.checked_add(e))
            .map(|(a, b)| a..b)
            .filter(|r| r.start <= r.end && r.end <= file_len)
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

/// The first top-level key of the header JSON that appears twice, if any (the JSON parser
/// behind the `safetensors` crate silently keeps the last).
fn duplicate_name(header: &[u8]) -> Option<String> {
    struct Keys(Option<String>);
    impl<'de> serde::de::Visitor<'de> for &mut Keys {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = m.next_key::<String>()? {
                m.next_value::<serde::de::IgnoredAny>()?;
                if self.0.is_none() && !seen.insert(k.clone()) {
                    self.0 = Some(k);
                }
            }
            Ok(())
        }
    }
    let mut keys = Keys(None);
    let mut de = serde_json::Deserializer::from_slice(header);
    serde::Deserializer::deserialize_map(&mut de, &mut keys).ok()?;
    keys.0
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
    /// The bytes of a weight file whose tensors another reader has indexed (a GGUF file of a
    /// [`Model`](crate::Model)): no safetensors tensors, no metadata.
    pub fn bytes_only(name: impl Into<String>, buffer: Buffer) -> Self {
        SafetensorsFile {
            name: name.into(),
            buffer,
            header: Header::default(),
        }
    }

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
        let what = || format!("tensor `{name}` of {} as f32", self.name);
        match e.dtype {
            Dtype::F32 => try_collect(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                what,
            ),
            Dtype::BF16 if !f32_only => try_collect(
                raw.chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
                what,
            ),
            Dtype::F16 if !f32_only => try_collect(
                raw.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32()),
                what,
            ),
            d => Err(HostError::tensor(
                &self.name,
                name,
                format!(
                    "has dtype {d:?}, expected {}",
                    if f32_only { "F32" } else { "F32, BF16 or F16" }
                ),
            )),
        }
    }

    /// Tensor `name` as integers (I64 or I32 stored). Copies.
    pub fn int_tensor(&self, name: &str) -> Result<Vec<i64>> {
        let e = self.entry(name)?;
        let raw = self.bytes(e);
        let what = || format!("tensor `{name}` of {} as integers", self.name);
        match e.dtype {
            Dtype::I64 => try_collect(
                raw.chunks_exact(8)
                    .map(|c| i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
                what,
            ),
            Dtype::I32 => try_collect(
                raw.chunks_exact(4)
                    .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64),
                what,
            ),
            d => Err(HostError::tensor(
                &self.name,
                name,
                format!("has dtype {d:?}, expected I64 or I32"),
            )),
        }
    }
}

/// Collects `it` into a `Vec` allocated fallibly: an error naming `what` instead of an abort.
pub fn try_collect<T>(
    it: impl ExactSizeIterator<Item = T>,
    what: impl FnOnce() -> String,
) -> Result<Vec<T>> {
    let n = it.len();
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| HostError::Alloc {
        what: what(),
        bytes: n as u128 * std::mem::size_of::<T>() as u128,
    })?;
    v.extend(it);
    Ok(v)
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
    /// Decodes little-endian `raw` as `dtype`; `what` names the values in the error when the
    /// copy cannot be allocated.
    pub fn decode(raw: &[u8], dtype: FloatDtype, what: impl FnOnce() -> String) -> Result<Self> {
        let u16s = || {
            raw.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
        };
        Ok(match dtype {
            FloatDtype::F32 => FloatVec::F32(try_collect(
                raw.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                what,
            )?),
            FloatDtype::Bf16 => FloatVec::Bf16(try_collect(u16s().map(bf16::from_bits), what)?),
            FloatDtype::F16 => FloatVec::F16(try_collect(u16s().map(f16::from_bits), what)?),
        })
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

    /// A borrowed view, for the writers.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            data: TensorData::Bytes(&self.bytes),
        }
    }
}

/// The values of a tensor to write, borrowed; converted to little-endian bytes piece by piece
/// as they are written.
#[derive(Debug, Clone, Copy)]
pub enum TensorData<'a> {
    /// Little-endian bytes as stored.
    Bytes(&'a [u8]),
    /// f32 values.
    F32(&'a [f32]),
    /// i64 values.
    I64(&'a [i64]),
}

impl TensorData<'_> {
    fn byte_len(&self) -> Option<usize> {
        match self {
            TensorData::Bytes(b) => Some(b.len()),
            TensorData::F32(v) => v.len().checked_mul(4),
            TensorData::I64(v) => v.len().checked_mul(8),
        }
    }

    /// Writes the little-endian bytes through a small buffer.
    fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        match self {
            TensorData::Bytes(b) => w.write_all(b),
            // Little-endian targets write the values' own bytes, without a copy.
            TensorData::F32(v) if cfg!(target_endian = "little") => {
                w.write_all(bytemuck::cast_slice(v))
            }
            TensorData::I64(v) if cfg!(target_endian = "little") => {
                w.write_all(bytemuck::cast_slice(v))
            }
            TensorData::F32(v) => write_le(v, w, f32::to_le_bytes),
            TensorData::I64(v) => write_le(v, w, i64::to_le_bytes),
        }
    }
}

/// Writes `v` as little-endian bytes through a small buffer (the portable path).
fn write_le<T: Copy, const N: usize>(
    v: &[T],
    w: &mut dyn Write,
    le: impl Fn(T) -> [u8; N],
) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1 << 16);
    for piece in v.chunks((1 << 16) / N) {
        buf.clear();
        buf.extend(piece.iter().flat_map(|&x| le(x)));
        w.write_all(&buf)?;
    }
    Ok(())
}

/// One tensor to write, its values borrowed.
#[derive(Debug, Clone)]
pub struct TensorRef<'a> {
    /// Name.
    pub name: String,
    /// Dtype stored.
    pub dtype: Dtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Values (`numel` of them, in `dtype`'s size).
    pub data: TensorData<'a>,
}

impl<'a> TensorRef<'a> {
    /// An F32 tensor of `shape` over `v`.
    pub fn f32(name: impl Into<String>, shape: Vec<usize>, v: &'a [f32]) -> Self {
        TensorRef {
            name: name.into(),
            dtype: Dtype::F32,
            shape,
            data: TensorData::F32(v),
        }
    }

    /// A 1-D I64 tensor over `v`.
    pub fn i64(name: impl Into<String>, v: &'a [i64]) -> Self {
        TensorRef {
            name: name.into(),
            dtype: Dtype::I64,
            shape: vec![v.len()],
            data: TensorData::I64(v),
        }
    }
}

/// A safetensors file laid out for writing: the header bytes (length prefix included) and the
/// tensors in file order. Tensors are ordered by alignment (largest element first), then name,
/// so every tensor of a file is aligned for its element type, as the `safetensors` crate does.
#[derive(Debug)]
pub struct FileLayout<'a> {
    /// The 8-byte length, the JSON header, space padding to a multiple of 8.
    pub header: Vec<u8>,
    /// The tensors, in file order.
    pub tensors: Vec<TensorRef<'a>>,
}

impl FileLayout<'_> {
    /// Total file size.
    pub fn file_len(&self) -> usize {
        self.header.len()
            + self
                .tensors
                .iter()
                .map(|t| t.data.byte_len().unwrap_or(0))
                .sum::<usize>()
    }

    /// Writes the header, then each tensor's bytes.
    pub fn write_to(&self, w: &mut dyn Write) -> std::io::Result<()> {
        w.write_all(&self.header)?;
        self.tensors.iter().try_for_each(|t| t.data.write_to(w))
    }
}

/// Lays out `tensors` and `__metadata__` strings as a safetensors file; `file` names the
/// destination in errors. Checks names (distinct, not `__metadata__`) and that each tensor's
/// bytes match its shape and dtype.
pub fn layout<'a>(
    mut tensors: Vec<TensorRef<'a>>,
    metadata: &BTreeMap<String, String>,
    file: &str,
) -> Result<FileLayout<'a>> {
    tensors.sort_by(|a, b| {
        b.dtype
            .bitsize()
            .cmp(&a.dtype.bitsize())
            .then_with(|| a.name.cmp(&b.name))
    });
    fn json<T: serde::Serialize + ?Sized>(v: &T, file: &str) -> Result<String> {
        serde_json::to_string(v).map_err(|e| HostError::file(file, e.to_string()))
    }
    let mut h = String::from("{");
    if !metadata.is_empty() {
        h.push_str(&format!("\"__metadata__\":{}", json(metadata, file)?));
    }
    let mut seen = std::collections::HashSet::new();
    let mut offset = 0usize;
    for t in &tensors {
        if t.name == "__metadata__" || !seen.insert(t.name.as_str()) {
            return Err(HostError::tensor(
                file,
                &t.name,
                "is a reserved or repeated tensor name",
            ));
        }
        let want = t
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|n| n.checked_mul(t.dtype.bitsize()))
            .filter(|bits| bits % 8 == 0)
            .map(|bits| bits / 8);
        let len = t.data.byte_len();
        if want.is_none() || want != len {
            return Err(HostError::tensor(
                file,
                &t.name,
                format!(
                    "shape {:?} of {:?} does not match its {} bytes",
                    t.shape,
                    t.dtype,
                    len.unwrap_or(usize::MAX)
                ),
            ));
        }
        let end = offset
            .checked_add(len.unwrap_or(0))
            .ok_or_else(|| HostError::file(file, "the tensors' total size overflows"))?;
        if h.len() > 1 {
            h.push(',');
        }
        h.push_str(&format!(
            "{}:{{\"dtype\":{},\"shape\":{},\"data_offsets\":[{offset},{end}]}}",
            json(&t.name, file)?,
            json(&t.dtype, file)?,
            json(&t.shape, file)?
        ));
        offset = end;
    }
    h.push('}');
    while h.len() % 8 != 0 {
        h.push(' ');
    }
    let mut header = (h.len() as u64).to_le_bytes().to_vec();
    header.extend_from_slice(h.as_bytes());
    Ok(FileLayout { header, tensors })
}

/// Serialises tensors (and `__metadata__` strings) to safetensors bytes in memory; `file`
/// names the destination in errors. Files are written with [`write_file`] or
/// [`write_tensors`], which stream instead.
pub fn serialize(
    tensors: &[OutTensor],
    metadata: &BTreeMap<String, String>,
    file: &str,
) -> Result<Vec<u8>> {
    let l = layout(
        tensors.iter().map(OutTensor::view).collect(),
        metadata,
        file,
    )?;
    let mut out = crate::fsio::try_buffer(l.file_len() as u64, || format!("the bytes of {file}"))?;
    l.write_to(&mut out)
        .map_err(|e| HostError::file(file, e.to_string()))?;
    Ok(out)
}

/// Writes tensors to a temporary file beside `path` (header first, then each tensor's bytes,
/// never the whole file in memory), ready to be renamed into place ([`crate::fsio`]).
pub fn stage_tensors(
    path: &Path,
    tensors: Vec<TensorRef<'_>>,
    metadata: &BTreeMap<String, String>,
) -> Result<crate::fsio::Staged> {
    let l = layout(tensors, metadata, &path.display().to_string())?;
    crate::fsio::stage(path, |w| l.write_to(w))
}

/// Replaces `path` atomically with a safetensors file of `tensors`, streamed.
pub fn write_tensors(
    path: &Path,
    tensors: Vec<TensorRef<'_>>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    stage_tensors(path, tensors, metadata)?.commit()
}

/// Replaces `path` atomically with a safetensors file of `tensors`.
pub fn write_file(
    path: &Path,
    tensors: &[OutTensor],
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    write_tensors(
        path,
        tensors.iter().map(OutTensor::view).collect(),
        metadata,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<OutTensor> {
        vec![
            OutTensor::f32("b", vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            OutTensor {
                name: "a".into(),
                dtype: Dtype::BF16,
                shape: vec![3],
                bytes: vec![1, 2, 3, 4, 5, 6],
            },
            OutTensor::i64("c\"quoted\\name", &[7, -8]),
        ]
    }

    #[test]
    fn written_files_parse_with_the_reference_crate() {
        let meta = BTreeMap::from([("format".to_string(), "pt \"x\"".to_string())]);
        let b = serialize(&sample(), &meta, "f").unwrap();
        let st = SafeTensors::deserialize(&b).unwrap();
        for t in sample() {
            let v = st.tensor(&t.name).unwrap();
            assert_eq!(
                (v.dtype(), v.shape(), v.data()),
                (t.dtype, &t.shape[..], &t.bytes[..])
            );
            // Every tensor is aligned for its element type (the header is padded to 8 bytes).
            let off = v.data().as_ptr() as usize - b.as_ptr() as usize;
            assert_eq!(off % (t.dtype.bitsize() / 8), 0, "{}", t.name);
        }
        let (_, m) = SafeTensors::read_metadata(&b).unwrap();
        assert_eq!(m.metadata().as_ref().unwrap()["format"], "pt \"x\"");
        let h = parse_header(&b, "f").unwrap();
        assert_eq!(h.tensors.len(), 3);
    }

    #[test]
    fn writer_and_parser_reject_bad_names_and_sizes() {
        let mut t = sample();
        t.push(OutTensor::f32("b", vec![1], &[0.0]));
        let e = serialize(&t, &BTreeMap::new(), "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`b`") && e.contains("repeated"), "{e}");
        let mut t = sample();
        t[0].shape = vec![2, 2];
        let e = serialize(&t, &BTreeMap::new(), "f")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`b`") && e.contains("does not match"), "{e}");
        // A header naming a tensor twice: the last would win silently.
        let h = r#"{"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"y":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},"x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        let mut b = (h.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&[1, 2]);
        let e = parse_header(&b, "d.st").unwrap_err().to_string();
        assert!(
            e.contains("d.st") && e.contains("`x`") && e.contains("more than once"),
            "{e}"
        );
    }

    #[test]
    fn portable_and_in_place_writes_agree() {
        let v: Vec<f32> = (0..40_000).map(|i| i as f32 * 0.37 - 5.0).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write_le(&v, &mut a, f32::to_le_bytes).unwrap();
        TensorData::F32(&v).write_to(&mut b).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, f32_bytes(&v));
        let i: Vec<i64> = (0..20_000).map(|i| i * 1_000_003 - 7).collect();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        write_le(&i, &mut a, i64::to_le_bytes).unwrap();
        TensorData::I64(&i).write_to(&mut b).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn misaligned_copy_failure_is_an_error() {
        let e = try_collect(0..usize::MAX, || "everything".into()).unwrap_err();
        assert!(e.to_string().contains("everything"), "{e}");
        let v = FloatVec::decode(&[0, 0x80, 0x3f, 0], FloatDtype::F32, String::new).unwrap();
        assert_eq!(
            v,
            FloatVec::F32(vec![f32::from_le_bytes([0, 0x80, 0x3f, 0])])
        );
    }
}

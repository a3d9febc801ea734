//! Parsing and checking a GGUF header from the bytes of a whole file: [`GgufHeader::parse`].
//!
//! Every rule llama.cpp's reader (`gguf_init_from_reader`) and model loader apply is applied
//! here, in the same order where it matters, plus UTF-8 for keys and tensor names (gguf-py's
//! rule). Every count and length read from the file is checked against the bytes that remain
//! before it is used, so nothing is allocated or indexed from an unchecked size: a metadata
//! array is read in place, and a string array is walked (each string's length checked) without
//! copying it.

use std::collections::HashMap;
use std::ops::Range;

use super::types::{GgmlType, ValueType};
use super::value::{decode_scalar, shown, KvTable, Metadata, Stored, Value};
use crate::error::{HostError, Result};

/// The magic bytes at the start of every GGUF file.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// The version the writer writes (2 is read too: same layout).
pub const VERSION: u32 = 3;
/// Longest string (key, value, tensor name) accepted: 1 GiB, as in llama.cpp.
pub const MAX_STRING: u64 = 1 << 30;
/// Most elements an array may have: 2^30, as in llama.cpp.
pub const MAX_ARRAY: u64 = 1 << 30;
/// Longest tensor name, in bytes (`GGML_MAX_NAME` - 1).
pub const MAX_NAME: usize = 63;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// Alignment of the data section and of each tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u32 = 32;
/// The key that sets the alignment (a `UINT32`, a power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Fewest bytes a key/value pair takes: key length, a 1-byte key, type, a 1-byte value.
const MIN_KV_BYTES: u128 = 8 + 1 + 4 + 1;
/// Fewest bytes a tensor info takes: name length, dimension count, type, offset.
const MIN_INFO_BYTES: u128 = 8 + 4 + 4 + 8;

/// Why a file is invalid, before the file name is added.
pub(crate) type Reason = String;

/// A tensor of a GGUF file: where its bytes are and how to read them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Its name (UTF-8, at most [`MAX_NAME`] bytes).
    pub name: String,
    n_dims: usize,
    ne: [u64; MAX_DIMS],
    /// How its elements are stored.
    pub ggml_type: GgmlType,
    /// Its offset in the data section, as stored.
    pub offset: u64,
    /// Its bytes in the whole file.
    pub range: Range<usize>,
}

impl TensorInfo {
    /// Its dimensions as stored, `ne[0]` the contiguous one (numpy's shape reversed); empty for
    /// a scalar.
    pub fn ne(&self) -> &[u64] {
        &self.ne[..self.n_dims]
    }

    /// Its byte size.
    pub fn nbytes(&self) -> usize {
        self.range.len()
    }

    /// Its element count.
    pub fn n_elements(&self) -> u64 {
        // Checked when parsed: the product fits in an i64.
        self.ne().iter().product()
    }
}

/// The parsed, checked header of a GGUF file: its metadata (values stored as ranges of the
/// file, read with [`GgufHeader::metadata`]) and its tensors.
#[derive(Debug, Clone)]
pub struct GgufHeader {
    /// The file's name, for messages.
    pub file: String,
    /// The format version (2 or 3).
    pub version: u32,
    /// The alignment of the data section and of each tensor.
    pub alignment: u32,
    /// The file offset where the data section starts.
    pub data_start: usize,
    /// The tensors, in file order.
    pub tensors: Vec<TensorInfo>,
    kv: KvTable,
    index: HashMap<String, usize>,
}

impl GgufHeader {
    /// Parses and checks the whole GGUF file held in `bytes`; `file` names it in errors.
    pub fn parse(bytes: &[u8], file: &str) -> Result<Self> {
        parse_all(bytes, file).map_err(|reason| HostError::gguf(file, reason))
    }

    /// The metadata, read from `bytes`, which must be the bytes this header was parsed from
    /// (other bytes give empty strings and arrays, never a panic).
    pub fn metadata<'a>(&'a self, bytes: &'a [u8]) -> Metadata<'a> {
        Metadata::new(&self.file, &self.kv, bytes)
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }
}

/// Reads forward through a file's bytes; every read is checked against what remains.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// The next `n` bytes; `what` names them in the error.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], Reason> {
        if n > self.remaining() {
            return Err(format!(
                "truncated at 0x{:x}: {} needs {n} bytes, {} remain",
                self.pos,
                what(),
                self.remaining()
            ));
        }
        let (start, end) = (self.pos, self.pos + n as usize);
        self.pos = end;
        Ok(&self.bytes[start..end])
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, Reason> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, Reason> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes(b.try_into().unwrap_or_default()))
    }

    /// A string (u64 length, bytes); returns its byte range.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<Range<usize>, Reason> {
        let len = self.u64(&|| format!("the length of {}", what()))?;
        if len > MAX_STRING {
            return Err(format!(
                "{} is {len} bytes long, more than the {MAX_STRING} allowed",
                what()
            ));
        }
        let start = self.pos;
        self.take(len, what)?;
        Ok(start..self.pos)
    }

    fn bytes(&self, r: Range<usize>) -> &'a [u8] {
        self.bytes.get(r).unwrap_or_default()
    }
}

/// `x` rounded up to a multiple of `align` (a power of two), if that fits.
pub(crate) fn pad(x: u64, align: u32) -> Option<u64> {
    let a = u64::from(align);
    x.checked_add(a - 1).map(|v| v / a * a)
}

fn parse_all(bytes: &[u8], file: &str) -> Result<GgufHeader, Reason> {
    let mut c = Cursor::new(bytes);
    let version = read_preamble(&mut c)?;
    let n_tensors = count(&mut c, "the tensor count")?;
    let n_kv = count(&mut c, "the metadata key count")?;
    let need = u128::from(n_kv) * MIN_KV_BYTES + u128::from(n_tensors) * MIN_INFO_BYTES;
    if need > u128::from(c.remaining()) {
        return Err(format!(
            "the header declares {n_kv} metadata keys and {n_tensors} tensors, which need at \
             least {need} bytes, but only {} follow (truncated or corrupt)",
            c.remaining()
        ));
    }
    let kv = read_kvs(&mut c, n_kv)?;
    let alignment = alignment(&kv, bytes)?;
    let (mut tensors, nbytes, index) = read_infos(&mut c, n_tensors)?;
    let data_start = data_start(&c, n_tensors, alignment)?;
    place(&mut tensors, &nbytes, data_start, alignment, bytes.len())?;
    Ok(GgufHeader {
        file: file.to_string(),
        version,
        alignment,
        data_start,
        tensors,
        kv,
        index,
    })
}

/// The magic and the version.
fn read_preamble(c: &mut Cursor) -> Result<u32, Reason> {
    let magic = c.take(4, &|| "the magic \"GGUF\"".into())?;
    if magic != MAGIC {
        return Err(format!(
            "the file starts with {:?} ({magic:02x?}), not the magic \"GGUF\"",
            String::from_utf8_lossy(magic)
        ));
    }
    let v = c.u32(&|| "the version".into())?;
    match v {
        0 => Err("version 0 is not a GGUF version".into()),
        _ if v & 0xFFFF == 0 => Err(format!(
            "version 0x{v:08x} reads as byte-swapped: a big-endian GGUF file, which is not \
             supported"
        )),
        1 => Err("version 1 is no longer supported (2 and 3 are)".into()),
        v if v > VERSION => Err(format!(
            "version {v} is newer than the versions supported (2 and 3)"
        )),
        v => Ok(v),
    }
}

/// A u64 count, which llama.cpp reads as an int64 and must not be negative.
fn count(c: &mut Cursor, what: &str) -> Result<u64, Reason> {
    let n = c.u64(&|| what.to_string())?;
    if n > i64::MAX as u64 {
        return Err(format!("{what} is {n}, more than an int64 holds"));
    }
    Ok(n)
}

fn read_kvs(c: &mut Cursor, n_kv: u64) -> Result<KvTable, Reason> {
    let mut kv = KvTable::default();
    for i in 0..n_kv {
        let key = c.string(&|| format!("key {i}"))?;
        let key = c.bytes(key);
        let key = std::str::from_utf8(key).map_err(|_| {
            format!(
                "key {i} ({:?}) is not valid UTF-8",
                String::from_utf8_lossy(key)
            )
        })?;
        check_key(key, i)?;
        if kv.contains(key) {
            return Err(format!("key `{}` appears twice", shown(key)));
        }
        let ty = c.u32(&|| format!("the type of key `{}`", shown(key)))?;
        let value = read_value(c, ty, key)?;
        kv.insert(key, value);
    }
    Ok(kv)
}

/// The rules for a key: not empty (its length and UTF-8 are checked as it is read).
pub(crate) fn check_key(key: &str, i: u64) -> Result<(), Reason> {
    if key.is_empty() {
        return Err(format!("key {i} is empty"));
    }
    Ok(())
}

fn unknown_type(key: &str, id: u32) -> Reason {
    format!("key `{}` has unknown value type {id}", shown(key))
}

fn read_value(c: &mut Cursor, ty: u32, key: &str) -> Result<Stored, Reason> {
    let ty = ValueType::from_id(ty).ok_or_else(|| unknown_type(key, ty))?;
    let what = || format!("the value of key `{}`", shown(key));
    match ty {
        ValueType::Array => read_array(c, key),
        ValueType::Str => Ok(Stored::Str(c.string(&what)?)),
        t => {
            let b = c.take(t.fixed_size().unwrap_or(0) as u64, &what)?;
            Ok(Stored::Scalar(decode_scalar(t, b)))
        }
    }
}

fn read_array(c: &mut Cursor, key: &str) -> Result<Stored, Reason> {
    let elem = c.u32(&|| format!("the element type of key `{}`", shown(key)))?;
    let elem = ValueType::from_id(elem).ok_or_else(|| unknown_type(key, elem))?;
    let n = c.u64(&|| format!("the element count of key `{}`", shown(key)))?;
    let start = c.pos();
    scan_array(c, elem, n, key)?;
    Ok(Stored::Array(elem, n as usize, start..c.pos()))
}

/// Reads past the `n` elements of an array of `elem` (checking each string's length), after the
/// checks on the array itself: no nested arrays, at most [`MAX_ARRAY`] elements, and at least
/// the bytes the elements need left in the file (checked before anything is read).
pub(crate) fn scan_array(c: &mut Cursor, elem: ValueType, n: u64, key: &str) -> Result<(), Reason> {
    let key = shown(key);
    if elem == ValueType::Array {
        return Err(format!(
            "key `{key}` is an array of arrays, which llama.cpp does not accept"
        ));
    }
    if n > MAX_ARRAY {
        return Err(format!(
            "key `{key}` is an array of {n} elements, more than the {MAX_ARRAY} allowed"
        ));
    }
    let min = n * elem.fixed_size().unwrap_or(8) as u64;
    if min > c.remaining() {
        return Err(format!(
            "truncated at 0x{:x}: key `{key}` is an array of {n} {}, which needs at least {min} \
             bytes, but {} remain",
            c.pos(),
            elem.name(),
            c.remaining()
        ));
    }
    match elem.fixed_size() {
        Some(_) => c
            .take(min, &|| format!("the elements of key `{key}`"))
            .map(drop),
        None => {
            (0..n).try_for_each(|i| c.string(&|| format!("string {i} of key `{key}`")).map(drop))
        }
    }
}

/// The alignment `general.alignment` sets (a `UINT32`, a power of two), or the default.
fn alignment(kv: &KvTable, bytes: &[u8]) -> Result<u32, Reason> {
    match kv.stored(ALIGNMENT_KEY) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Stored::Scalar(Value::U32(a))) => check_alignment(*a),
        Some(_) => {
            let v = Metadata::new("", kv, bytes).get(ALIGNMENT_KEY);
            let ty = v.map(|v| v.type_name()).unwrap_or_default();
            Err(format!(
                "key `{ALIGNMENT_KEY}` has type {ty}, expected UINT32"
            ))
        }
    }
}

/// `a` when it is a power of two.
pub(crate) fn check_alignment(a: u32) -> Result<u32, Reason> {
    if a.is_power_of_two() {
        Ok(a)
    } else {
        Err(format!("key `{ALIGNMENT_KEY}` is {a}, not a power of two"))
    }
}

type Infos = (Vec<TensorInfo>, Vec<u64>, HashMap<String, usize>);

fn read_infos(c: &mut Cursor, n: u64) -> Result<Infos, Reason> {
    // Not reserved from `n`: each info is pushed only once its bytes have been read.
    let (mut infos, mut sizes, mut index) = (Vec::new(), Vec::new(), HashMap::new());
    for i in 0..n {
        let (info, nbytes) = read_info(c, i)?;
        if index.insert(info.name.clone(), infos.len()).is_some() {
            return Err(format!("tensor `{}` appears twice", shown(&info.name)));
        }
        infos.push(info);
        sizes.push(nbytes);
    }
    Ok((infos, sizes, index))
}

/// One tensor info and its byte size; its range is set by [`place`].
fn read_info(c: &mut Cursor, i: u64) -> Result<(TensorInfo, u64), Reason> {
    let raw = c.string(&|| format!("the name of tensor {i}"))?;
    let raw = c.bytes(raw);
    let name = std::str::from_utf8(raw).map_err(|_| {
        format!(
            "the name of tensor {i} ({:?}) is not valid UTF-8",
            String::from_utf8_lossy(raw)
        )
    })?;
    check_name(name)?;
    let n_dims = c.u32(&|| format!("the dimension count of tensor `{}`", shown(name)))? as usize;
    check_dims(name, n_dims)?;
    let mut ne = [1u64; MAX_DIMS];
    for (d, n) in ne.iter_mut().enumerate().take(n_dims) {
        *n = c.u64(&|| format!("dimension {d} of tensor `{}`", shown(name)))?;
    }
    let id = c.u32(&|| format!("the type of tensor `{}`", shown(name)))?;
    let (ggml_type, nbytes) = tensor_type(name, id, &ne[..n_dims])?;
    let offset = c.u64(&|| format!("the offset of tensor `{}`", shown(name)))?;
    let info = TensorInfo {
        name: name.to_string(),
        n_dims,
        ne,
        ggml_type,
        offset,
        range: 0..0,
    };
    Ok((info, nbytes))
}

/// The rules for a tensor name: at most [`MAX_NAME`] bytes (UTF-8 is checked as it is read).
pub(crate) fn check_name(name: &str) -> Result<(), Reason> {
    if name.len() > MAX_NAME {
        return Err(format!(
            "tensor name `{}` is {} bytes long; at most {MAX_NAME} are allowed",
            shown(name),
            name.len()
        ));
    }
    Ok(())
}

/// At most [`MAX_DIMS`] dimensions.
pub(crate) fn check_dims(name: &str, n_dims: usize) -> Result<(), Reason> {
    if n_dims > MAX_DIMS {
        return Err(format!(
            "tensor `{}` has {n_dims} dimensions; at most {MAX_DIMS} are allowed",
            shown(name)
        ));
    }
    Ok(())
}

/// The type of id `id` and the byte size of a tensor of it with dimensions `ne`.
pub(crate) fn tensor_type(name: &str, id: u32, ne: &[u64]) -> Result<(GgmlType, u64), Reason> {
    let t = GgmlType::from_id(id).map_err(|e| format!("tensor `{}`: {e}", shown(name)))?;
    let n = t
        .tensor_bytes(ne)
        .map_err(|e| format!("tensor `{}`: {e}", shown(name)))?;
    Ok((t, n))
}

/// Where the data section starts: after the tensor infos, padded to the alignment (llama.cpp
/// pads only when there are tensors).
fn data_start(c: &Cursor, n_tensors: u64, alignment: u32) -> Result<usize, Reason> {
    let end = c.pos() as u64;
    if n_tensors == 0 {
        return Ok(c.pos());
    }
    let start = pad(end, alignment).unwrap_or(u64::MAX);
    if start > c.bytes.len() as u64 {
        return Err(format!(
            "the data section would start at 0x{start:x} (the end of the tensor infos, 0x{end:x}, \
             padded to {alignment}), past the end of the file (0x{:x} bytes)",
            c.bytes.len()
        ));
    }
    Ok(start as usize)
}

/// Checks each tensor's offset (the running sum of the padded sizes before it, llama.cpp's
/// rule) and that its bytes lie in the file; sets its range.
fn place(
    infos: &mut [TensorInfo],
    nbytes: &[u64],
    data_start: usize,
    alignment: u32,
    file_len: usize,
) -> Result<(), Reason> {
    let mut expected = 0u64;
    for (t, &n) in infos.iter_mut().zip(nbytes) {
        if t.offset != expected {
            return Err(format!(
                "tensor `{}` has offset {}, expected {expected} (offsets must be the running sum of \
                 the padded sizes, in order)",
                shown(&t.name),
                t.offset
            ));
        }
        t.range = data_range(
            &t.name,
            data_start as u128 + u128::from(t.offset),
            n,
            file_len,
        )?;
        expected = pad(n, alignment)
            .and_then(|p| expected.checked_add(p))
            .ok_or_else(|| {
                format!(
                    "tensor `{}`: the data section's size overflows",
                    shown(&t.name)
                )
            })?;
    }
    Ok(())
}

/// `start..start + n` when it lies within a file of `file_len` bytes.
fn data_range(name: &str, start: u128, n: u64, file_len: usize) -> Result<Range<usize>, Reason> {
    let end = start + u128::from(n);
    if end > file_len as u128 {
        return Err(format!(
            "tensor `{}`: data 0x{start:x}..0x{end:x} runs past the end of the file \
             (0x{file_len:x} bytes)",
            shown(name)
        ));
    }
    Ok(start as usize..end as usize)
}

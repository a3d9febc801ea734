//! Writing GGUF v3 files: [`GgufWriter`].
//!
//! The writer checks what it is given with the parser's own rules as it is given (keys, value
//! limits, `general.alignment`, tensor names, dimensions, types, sizes), so a file it writes is
//! one [`GgufHeader::parse`](super::GgufHeader::parse) accepts. The layout is gguf-py's: the
//! header, zero padding to the alignment, then each tensor at the running sum of the padded
//! sizes, followed by zero padding. Files go through [`crate::fsio::write_atomic`]; any
//! [`Write`] can be the sink instead (memory, for tests and fuzzing).

use std::collections::HashSet;
use std::io::{self, Read as _, Write};
use std::path::Path;

use super::file::GgufFile;
use super::parse::{
    check_alignment, check_dims, check_key, check_name, pad, scan_array, tensor_type, Cursor,
    Reason, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, MAX_STRING, VERSION,
};
use super::types::GgmlType;
use super::value::{shown, Scalar, Value};
use crate::error::{HostError, Result};

/// A function writing a tensor's bytes to the file.
pub type WriteFn<'a> = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + 'a>;

/// Where a tensor's bytes come from.
pub enum Source<'a> {
    /// Bytes in memory.
    Bytes(&'a [u8]),
    /// A function writing exactly the tensor's bytes (checked: another count is an error).
    Stream(WriteFn<'a>),
}

impl std::fmt::Debug for Source<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            Source::Stream(_) => f.write_str("Stream"),
        }
    }
}

/// A tensor waiting to be written.
#[derive(Debug)]
struct OutTensor<'a> {
    name: String,
    ne: Vec<u64>,
    ggml_type: GgmlType,
    nbytes: u64,
    source: Source<'a>,
}

/// Builds a GGUF v3 file: metadata in the order added, then tensors in the order added.
#[derive(Debug)]
pub struct GgufWriter<'a> {
    file: String,
    alignment: u32,
    kv: Vec<(String, Value<'a>)>,
    keys: HashSet<String>,
    tensors: Vec<OutTensor<'a>>,
    names: HashSet<String>,
    data_len: u64,
}

impl<'a> GgufWriter<'a> {
    /// An empty file; `file` names it in errors (the path it will be written to).
    pub fn new(file: impl Into<String>) -> Self {
        GgufWriter {
            file: file.into(),
            alignment: DEFAULT_ALIGNMENT,
            kv: Vec::new(),
            keys: HashSet::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            data_len: 0,
        }
    }

    fn check<T>(&self, r: Result<T, Reason>) -> Result<T> {
        r.map_err(|reason| HostError::gguf(&self.file, reason))
    }

    /// A writer holding every key and tensor of `file`, in its order (to copy it, or to change
    /// it before writing).
    pub fn copy_of(file: &'a GgufFile, name: impl Into<String>) -> Result<Self> {
        let mut w = GgufWriter::new(name);
        for (key, value) in file.metadata().iter() {
            w.add(key, value)?;
        }
        for t in file.tensors() {
            let bytes = Source::Bytes(file.bytes_of(t));
            w.add_tensor(&t.name, t.ne(), t.ggml_type, bytes)?;
        }
        Ok(w)
    }

    /// Adds the key `key` with `value`. Refused: an empty or repeated key, a string or array
    /// past the parser's limits, a `general.alignment` that is not a `UINT32` power of two.
    pub fn add(&mut self, key: &str, value: impl Into<Value<'a>>) -> Result<()> {
        let value = value.into();
        self.check(check_key(key, self.kv.len() as u64))?;
        self.check(check_value(key, &value))?;
        if self.keys.contains(key) {
            return self.check(Err(format!("key `{}` appears twice", shown(key))));
        }
        if key == ALIGNMENT_KEY {
            self.set_alignment(&value)?;
        }
        self.keys.insert(key.to_string());
        self.kv.push((key.to_string(), value));
        Ok(())
    }

    /// Adds a tensor of type `ggml_type` with dimensions `ne` (`ne[0]` the contiguous one, at
    /// most 4), whose bytes come from `source`. Refused: a name longer than 63 bytes or
    /// repeated, too many dimensions, a row that is not a whole number of blocks, a size that
    /// overflows, bytes of another length than the shape needs.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ne: &[u64],
        ggml_type: GgmlType,
        source: Source<'a>,
    ) -> Result<()> {
        self.check(check_name(name))?;
        self.check(check_dims(name, ne.len()))?;
        let (_, nbytes) = self.check(tensor_type(name, ggml_type.id(), ne))?;
        if self.names.contains(name) {
            return self.check(Err(format!("tensor `{}` appears twice", shown(name))));
        }
        if let Source::Bytes(b) = &source {
            if b.len() as u64 != nbytes {
                return self.check(Err(format!(
                    "tensor `{}`: {} bytes given, its shape {ne:?} of type {} needs {nbytes}",
                    shown(name),
                    b.len(),
                    ggml_type.name()
                )));
            }
        }
        self.grow_data_len(name, nbytes)?;
        self.names.insert(name.to_string());
        self.tensors.push(OutTensor {
            name: name.to_string(),
            ne: ne.to_vec(),
            ggml_type,
            nbytes,
            source,
        });
        Ok(())
    }

    /// The alignment the file will have.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Takes the alignment `general.alignment` sets (kept as it was when refused).
    fn set_alignment(&mut self, value: &Value) -> Result<()> {
        let Value::U32(a) = *value else {
            let ty = value.type_name();
            return self.check(Err(format!(
                "key `{ALIGNMENT_KEY}` has type {ty}, expected UINT32"
            )));
        };
        let a = self.check(check_alignment(a))?;
        let old = std::mem::replace(&mut self.alignment, a);
        self.check_data_len().inspect_err(|_| self.alignment = old)
    }

    /// Recomputes the size of the data section (padded sizes), refusing one past `i64::MAX`.
    fn check_data_len(&mut self) -> Result<()> {
        let total = self.tensors.iter().try_fold(0u64, |acc, t| {
            pad(t.nbytes, self.alignment)
                .and_then(|p| acc.checked_add(p))
                .filter(|&t| t <= i64::MAX as u64)
        });
        self.data_len = self.check(total.ok_or_else(|| {
            "the tensors' padded sizes add up to more than an int64 offset holds".to_string()
        }))?;
        Ok(())
    }

    /// Adds a tensor of `nbytes` to the size of the data section.
    fn grow_data_len(&mut self, name: &str, nbytes: u64) -> Result<()> {
        let total = pad(nbytes, self.alignment)
            .and_then(|p| self.data_len.checked_add(p))
            .filter(|&t| t <= i64::MAX as u64);
        self.data_len = self.check(total.ok_or_else(|| {
            format!(
                "tensor `{}`: the padded sizes add up to more than an int64 offset holds",
                shown(name)
            )
        }))?;
        Ok(())
    }

    /// Writes the file to `out` (a file, memory, …).
    pub fn write_to(self, out: &mut dyn Write) -> Result<()> {
        let file = self.file.clone();
        self.stream(out)
            .map_err(|e| HostError::io(Path::new(&file), e))
    }

    /// The file's bytes, in memory.
    pub fn to_bytes(self) -> Result<Vec<u8>> {
        let mut v = Vec::new();
        self.write_to(&mut v)?;
        Ok(v)
    }

    /// Writes the file to `path` atomically (a temporary in the same folder, `fsync`ed, renamed).
    pub fn write_file(self, path: &Path) -> Result<()> {
        crate::fsio::write_atomic(path, |w| self.stream(w))
    }

    fn stream(self, out: &mut dyn Write) -> io::Result<()> {
        let mut w = Counted { inner: out, n: 0 };
        write_header(&mut w, &self.kv, &self.tensors, self.alignment)?;
        zeros(&mut w, self.alignment)?;
        for t in self.tensors {
            let start = w.n;
            match t.source {
                Source::Bytes(b) => w.write_all(b)?,
                Source::Stream(f) => f(&mut w)?,
            }
            if w.n - start != t.nbytes {
                return Err(io::Error::other(format!(
                    "tensor `{}`: its source wrote {} bytes, its shape needs {}",
                    shown(&t.name),
                    w.n - start,
                    t.nbytes
                )));
            }
            zeros(&mut w, self.alignment)?;
        }
        w.flush()
    }
}

/// The limits the parser puts on a value: string lengths, array sizes, no nested arrays.
fn check_value(key: &str, v: &Value) -> Result<(), Reason> {
    if key.len() as u64 > MAX_STRING {
        return Err(format!(
            "key of {} bytes is longer than {MAX_STRING}",
            key.len()
        ));
    }
    match v {
        Value::Str(s) if s.len() as u64 > MAX_STRING => Err(format!(
            "key `{}`: string of {} bytes is longer than {MAX_STRING}",
            shown(key),
            s.len()
        )),
        Value::Array(a) => {
            let mut c = Cursor::new(a.raw());
            scan_array(&mut c, a.elem_type(), a.len() as u64, key)
        }
        _ => Ok(()),
    }
}

/// Counts what goes through it.
struct Counted<'w> {
    inner: &'w mut dyn Write,
    n: u64,
}

impl Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Zero bytes up to the next multiple of `alignment` of what was written.
fn zeros(w: &mut Counted, alignment: u32) -> io::Result<()> {
    let to = pad(w.n, alignment).unwrap_or(w.n);
    io::copy(&mut io::repeat(0).take(to - w.n), w).map(drop)
}

fn put_u32(w: &mut dyn Write, v: u32) -> io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_u64(w: &mut dyn Write, v: u64) -> io::Result<()> {
    w.write_all(&v.to_le_bytes())
}

fn put_str(w: &mut dyn Write, s: &[u8]) -> io::Result<()> {
    put_u64(w, s.len() as u64)?;
    w.write_all(s)
}

fn write_header(
    w: &mut dyn Write,
    kv: &[(String, Value)],
    tensors: &[OutTensor],
    alignment: u32,
) -> io::Result<()> {
    w.write_all(MAGIC)?;
    put_u32(w, VERSION)?;
    put_u64(w, tensors.len() as u64)?;
    put_u64(w, kv.len() as u64)?;
    for (key, value) in kv {
        put_str(w, key.as_bytes())?;
        put_u32(w, value.value_type().id())?;
        put_value(w, value)?;
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(w, t.name.as_bytes())?;
        put_u32(w, t.ne.len() as u32)?;
        t.ne.iter().try_for_each(|&n| put_u64(w, n))?;
        put_u32(w, t.ggml_type.id())?;
        put_u64(w, offset)?;
        // Checked as the tensors were added: the sum fits.
        offset += pad(t.nbytes, alignment).unwrap_or(0);
    }
    Ok(())
}

fn put_value(w: &mut dyn Write, v: &Value) -> io::Result<()> {
    let mut b = Vec::new();
    match *v {
        Value::U8(x) => x.encode(&mut b),
        Value::I8(x) => x.encode(&mut b),
        Value::U16(x) => x.encode(&mut b),
        Value::I16(x) => x.encode(&mut b),
        Value::U32(x) => x.encode(&mut b),
        Value::I32(x) => x.encode(&mut b),
        Value::F32(x) => x.encode(&mut b),
        Value::Bool(x) => x.encode(&mut b),
        Value::U64(x) => x.encode(&mut b),
        Value::I64(x) => x.encode(&mut b),
        Value::F64(x) => x.encode(&mut b),
        Value::Str(s) => return put_str(w, s),
        Value::Array(a) => {
            put_u32(w, a.elem_type().id())?;
            put_u64(w, a.len() as u64)?;
            return w.write_all(a.raw());
        }
    }
    w.write_all(&b)
}

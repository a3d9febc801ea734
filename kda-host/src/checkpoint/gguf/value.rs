//! GGUF metadata values: [`Value`] (borrowed from the file's bytes), [`Array`] (elements read in
//! place, never copied), [`ArrayBuf`] (an owned array to write), and [`Metadata`], the ordered
//! key → value table with typed getters whose errors name the key and both types.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::types::ValueType;
use crate::error::{HostError, Result};

/// `s` for messages: control characters escaped (so a message stays one line), cut to 80
/// characters.
pub(crate) fn shown(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars().take(80) {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    if s.chars().nth(80).is_some() {
        out.push('…');
    }
    out
}

/// A metadata value. Strings and arrays borrow the file's bytes.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// A bool (any non-zero byte reads as true, as in llama.cpp).
    Bool(bool),
    /// A string's bytes (UTF-8 is checked when read as `&str`, not when parsed).
    Str(&'a [u8]),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
    /// An array.
    Array(Array<'a>),
}

impl Value<'_> {
    /// Its type.
    pub fn value_type(&self) -> ValueType {
        use Value::*;
        match self {
            U8(_) => ValueType::U8,
            I8(_) => ValueType::I8,
            U16(_) => ValueType::U16,
            I16(_) => ValueType::I16,
            U32(_) => ValueType::U32,
            I32(_) => ValueType::I32,
            F32(_) => ValueType::F32,
            Bool(_) => ValueType::Bool,
            Str(_) => ValueType::Str,
            U64(_) => ValueType::U64,
            I64(_) => ValueType::I64,
            F64(_) => ValueType::F64,
            Array(_) => ValueType::Array,
        }
    }

    /// Its type for messages: `UINT32`, `ARRAY of INT32`.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("ARRAY of {}", a.elem_type().name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as a signed integer, for the integer types.
    pub fn as_integer(&self) -> Option<i128> {
        use Value::*;
        Some(match *self {
            U8(v) => v.into(),
            I8(v) => v.into(),
            U16(v) => v.into(),
            I16(v) => v.into(),
            U32(v) => v.into(),
            I32(v) => v.into(),
            U64(v) => v.into(),
            I64(v) => v.into(),
            _ => return None,
        })
    }

    /// The bits of a scalar (floats bit for bit), for comparisons.
    fn scalar_bits(&self) -> Option<u64> {
        match *self {
            Value::F32(v) => Some(v.to_bits().into()),
            Value::F64(v) => Some(v.to_bits()),
            Value::Bool(v) => Some(v.into()),
            ref v => v.as_integer().map(|i| i as u64),
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $vt:ident),*) => {$(
        impl From<$t> for Value<'_> {
            fn from(v: $t) -> Self {
                Value::$vt(v)
            }
        }
    )*};
}

value_from!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, u64 => U64, i64 => I64, f64 => F64);

impl<'a> From<&'a str> for Value<'a> {
    fn from(s: &'a str) -> Self {
        Value::Str(s.as_bytes())
    }
}

impl<'a> From<Array<'a>> for Value<'a> {
    fn from(a: Array<'a>) -> Self {
        Value::Array(a)
    }
}

/// Values are equal when their types are and their contents are, bit for bit (so a NaN equals
/// itself).
impl PartialEq for Value<'_> {
    fn eq(&self, other: &Self) -> bool {
        if self.value_type() != other.value_type() {
            return false;
        }
        match (self, other) {
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::Array(a), Value::Array(b)) => a == b,
            (a, b) => a.scalar_bits() == b.scalar_bits(),
        }
    }
}

/// An array value: its element type, count and packed little-endian payload, checked when it
/// was made (by the parser or by [`ArrayBuf`]), so reading it cannot fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Array<'a> {
    elem: ValueType,
    len: usize,
    raw: &'a [u8],
}

impl<'a> Array<'a> {
    /// An array whose payload `raw` was checked to hold `len` elements of `elem`.
    pub(crate) fn checked(elem: ValueType, len: usize, raw: &'a [u8]) -> Self {
        Array { elem, len, raw }
    }

    /// The element type (never [`ValueType::Array`]).
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The payload as stored (elements packed; strings each with their u64 length).
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The elements, read in place, when they are of type `T` exactly.
    pub fn values<T: Scalar>(&self) -> Option<Scalars<'a, T>> {
        (self.elem == T::TYPE).then(|| Scalars {
            chunks: self.raw.chunks_exact(T::SIZE),
            _t: std::marker::PhantomData,
        })
    }

    /// The strings' bytes, read in place, when the elements are strings.
    pub fn strings(&self) -> Option<Strings<'a>> {
        (self.elem == ValueType::Str).then_some(Strings {
            raw: self.raw,
            left: self.len,
        })
    }

    /// Every element as a [`Value`].
    pub fn iter(&self) -> Items<'a> {
        Items {
            elem: self.elem,
            raw: self.raw,
            left: self.len,
        }
    }
}

/// The scalar of type `elem` in `bytes` (its exact size).
pub(crate) fn decode_scalar<'x>(elem: ValueType, b: &[u8]) -> Value<'x> {
    use ValueType as T;
    match elem {
        T::U8 => Value::U8(u8::decode(b)),
        T::I8 => Value::I8(i8::decode(b)),
        T::U16 => Value::U16(u16::decode(b)),
        T::I16 => Value::I16(i16::decode(b)),
        T::U32 => Value::U32(u32::decode(b)),
        T::I32 => Value::I32(i32::decode(b)),
        T::F32 => Value::F32(f32::decode(b)),
        T::Bool => Value::Bool(bool::decode(b)),
        T::U64 => Value::U64(u64::decode(b)),
        T::I64 => Value::I64(i64::decode(b)),
        T::F64 => Value::F64(f64::decode(b)),
        // Not scalars; never asked for.
        T::Str | T::Array => Value::Str(&[]),
    }
}

/// A number type that array elements can be read as.
pub trait Scalar: Copy {
    /// Its GGUF type.
    const TYPE: ValueType;
    /// Its size in bytes.
    const SIZE: usize;
    /// The value in `b`, little-endian (`b` has [`Self::SIZE`] bytes).
    fn decode(b: &[u8]) -> Self;
    /// Appends its little-endian bytes to `out`.
    fn encode(self, out: &mut Vec<u8>);
}

macro_rules! scalars {
    ($($t:ty => $vt:ident),*) => {$(
        impl Scalar for $t {
            const TYPE: ValueType = ValueType::$vt;
            const SIZE: usize = std::mem::size_of::<$t>();
            fn decode(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().unwrap_or_default())
            }
            fn encode(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

scalars!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    u64 => U64, i64 => I64, f64 => F64);

impl Scalar for bool {
    const TYPE: ValueType = ValueType::Bool;
    const SIZE: usize = 1;
    fn decode(b: &[u8]) -> Self {
        b.first().is_some_and(|&x| x != 0)
    }
    fn encode(self, out: &mut Vec<u8>) {
        out.push(self.into());
    }
}

/// The elements of an [`Array`] of `T`, read in place.
#[derive(Debug, Clone)]
pub struct Scalars<'a, T> {
    chunks: std::slice::ChunksExact<'a, u8>,
    _t: std::marker::PhantomData<T>,
}

impl<T: Scalar> Iterator for Scalars<'_, T> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        self.chunks.next().map(T::decode)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.chunks.size_hint()
    }
}

impl<T: Scalar> ExactSizeIterator for Scalars<'_, T> {}

/// The strings of an [`Array`], as bytes, read in place.
#[derive(Debug, Clone)]
pub struct Strings<'a> {
    raw: &'a [u8],
    left: usize,
}

impl<'a> Iterator for Strings<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        self.left = self.left.checked_sub(1)?;
        next_string(&mut self.raw)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// The string at the start of `raw` (u64 length, bytes), moving `raw` past it. The payload was
/// checked when its array was made; the checks here only keep a malformed one (which cannot be
/// built) from panicking.
fn next_string<'a>(raw: &mut &'a [u8]) -> Option<&'a [u8]> {
    let (len, rest) = raw.split_first_chunk::<8>()?;
    let len = usize::try_from(u64::from_le_bytes(*len)).ok()?;
    let (s, rest) = rest.split_at_checked(len)?;
    *raw = rest;
    Some(s)
}

/// The elements of an [`Array`] as [`Value`]s, read in place.
#[derive(Debug, Clone)]
pub struct Items<'a> {
    elem: ValueType,
    raw: &'a [u8],
    left: usize,
}

impl<'a> Iterator for Items<'a> {
    type Item = Value<'a>;
    fn next(&mut self) -> Option<Value<'a>> {
        self.left = self.left.checked_sub(1)?;
        let Some(size) = self.elem.fixed_size() else {
            return next_string(&mut self.raw).map(Value::Str);
        };
        let (b, rest) = self.raw.split_at_checked(size)?;
        self.raw = rest;
        Some(decode_scalar(self.elem, b))
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (0, Some(self.left))
    }
}

/// An owned array to write: build it from numbers or strings, then hand
/// [`ArrayBuf::as_array`] to the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayBuf {
    elem: ValueType,
    len: usize,
    raw: Vec<u8>,
}

impl ArrayBuf {
    /// An array of the numbers (or bools) `values`.
    pub fn of<T: Scalar>(values: &[T]) -> Self {
        let mut raw = Vec::with_capacity(values.len() * T::SIZE);
        values.iter().for_each(|v| v.encode(&mut raw));
        ArrayBuf {
            elem: T::TYPE,
            len: values.len(),
            raw,
        }
    }

    /// An array of the strings `values` (bytes, UTF-8 by convention).
    pub fn of_strings<S: AsRef<[u8]>>(values: &[S]) -> Self {
        let mut raw = Vec::new();
        for s in values {
            let s = s.as_ref();
            raw.extend_from_slice(&(s.len() as u64).to_le_bytes());
            raw.extend_from_slice(s);
        }
        ArrayBuf {
            elem: ValueType::Str,
            len: values.len(),
            raw,
        }
    }

    /// The array, borrowed.
    pub fn as_array(&self) -> Array<'_> {
        Array::checked(self.elem, self.len, &self.raw)
    }

    /// The array as a [`Value`].
    pub fn value(&self) -> Value<'_> {
        Value::Array(self.as_array())
    }
}

/// How the parser stores a value: scalars decoded, strings and arrays as byte ranges of the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stored {
    /// A scalar (never `Str` or `Array`).
    Scalar(Value<'static>),
    /// A string's bytes.
    Str(Range<usize>),
    /// An array's element type, count and payload.
    Array(ValueType, usize, Range<usize>),
}

impl Stored {
    /// The value, reading strings and arrays from `bytes` (the parsed file's; any other bytes
    /// give empty strings and arrays rather than a panic).
    fn load<'a>(&self, bytes: &'a [u8]) -> Value<'a> {
        match self {
            Stored::Scalar(v) => *v,
            Stored::Str(r) => Value::Str(bytes.get(r.clone()).unwrap_or_default()),
            Stored::Array(elem, len, r) => match bytes.get(r.clone()) {
                Some(raw) => Value::Array(Array::checked(*elem, *len, raw)),
                None => Value::Array(Array::checked(*elem, 0, &[])),
            },
        }
    }
}

/// The metadata of a parsed file, without its bytes: keys in file order and an index.
#[derive(Debug, Clone, Default)]
pub(crate) struct KvTable {
    entries: Vec<(Arc<str>, Stored)>,
    index: HashMap<Arc<str>, usize>,
}

impl KvTable {
    /// Adds `key` (false, and nothing added, when it is already there). The key is held once.
    pub(crate) fn insert(&mut self, key: &str, value: Stored) -> bool {
        if self.index.contains_key(key) {
            return false;
        }
        let key: Arc<str> = Arc::from(key);
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// True when `key` is present.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The stored value of `key`.
    pub(crate) fn stored(&self, key: &str) -> Option<&Stored> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }
}

/// The metadata of a GGUF file: keys in file order, values borrowed from the file's bytes, and
/// typed getters. Getters are strict about types, as llama.cpp is (a `UINT16` key is not read
/// as `u32`), except the integer-array getters, which take any integer element type whose
/// values fit.
#[derive(Debug, Clone, Copy)]
pub struct Metadata<'a> {
    file: &'a str,
    table: &'a KvTable,
    bytes: &'a [u8],
}

impl<'a> Metadata<'a> {
    /// The view of `table`, parsed from `bytes` of the file `file`.
    pub(crate) fn new(file: &'a str, table: &'a KvTable, bytes: &'a [u8]) -> Self {
        Metadata { file, table, bytes }
    }

    /// The number of keys.
    pub fn len(&self) -> usize {
        self.table.entries.len()
    }

    /// True when there are no keys.
    pub fn is_empty(&self) -> bool {
        self.table.entries.is_empty()
    }

    /// Every key and value, in file order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&'a str, Value<'a>)> + 'a {
        let bytes = self.bytes;
        self.table
            .entries
            .iter()
            .map(move |(k, v)| (&**k, v.load(bytes)))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<Value<'a>> {
        self.table.stored(key).map(|v| v.load(self.bytes))
    }

    /// True when `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.table.index.contains_key(key)
    }

    fn error(&self, key: &str, reason: impl std::fmt::Display) -> HostError {
        HostError::gguf(self.file, format!("key `{}` {reason}", shown(key)))
    }

    /// The value of `key` as `T`, or `None` when absent; an error naming the key and both types
    /// when it has another type.
    pub fn opt<T: FromValue<'a>>(&self, key: &str) -> Result<Option<T>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        T::from_value(v)
            .map(Some)
            .map_err(|why| self.error(key, why))
    }

    /// The value of `key` as `T`; an error naming the key when it is absent or of another type.
    pub fn value<T: FromValue<'a>>(&self, key: &str) -> Result<T> {
        self.opt(key)?
            .ok_or_else(|| HostError::gguf(self.file, format!("missing key `{}`", shown(key))))
    }

    /// A `UINT16` value.
    pub fn get_u16(&self, key: &str) -> Result<u16> {
        self.value(key)
    }

    /// A `UINT32` value.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.value(key)
    }

    /// An `INT32` value.
    pub fn get_i32(&self, key: &str) -> Result<i32> {
        self.value(key)
    }

    /// A `UINT64` value.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.value(key)
    }

    /// A `FLOAT32` value.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.value(key)
    }

    /// A `BOOL` value.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.value(key)
    }

    /// A `STRING` value that is valid UTF-8.
    pub fn get_str(&self, key: &str) -> Result<&'a str> {
        self.value(key)
    }

    /// An `ARRAY` value, read in place.
    pub fn get_array(&self, key: &str) -> Result<Array<'a>> {
        self.value(key)
    }

    /// An array of integers (any integer type, or bool as llama.cpp allows for per-layer
    /// values) whose values all fit in `i32`; copied (such arrays have one value per layer).
    pub fn get_array_i32(&self, key: &str) -> Result<Vec<i32>> {
        self.int_array(key)
    }

    /// As [`Self::get_array_i32`], for values that fit in `u32`.
    pub fn get_array_u32(&self, key: &str) -> Result<Vec<u32>> {
        self.int_array(key)
    }

    fn int_array<T: TryFrom<i128>>(&self, key: &str) -> Result<Vec<T>> {
        let a = self.get_array(key)?;
        let elem = a.elem_type();
        if !elem.is_integer() && elem != ValueType::Bool {
            let want = std::any::type_name::<T>();
            return Err(self.error(
                key,
                format!(
                    "has type ARRAY of {}, expected an array of integers ({want})",
                    elem.name()
                ),
            ));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(a.len())
            .map_err(|_| HostError::Alloc {
                what: format!("key `{}` of {}", shown(key), self.file),
                bytes: a.len() as u128 * std::mem::size_of::<T>() as u128,
            })?;
        for (i, v) in a.iter().enumerate() {
            let n = match v {
                Value::Bool(b) => i128::from(b),
                v => v.as_integer().unwrap_or_default(),
            };
            let t = T::try_from(n).map_err(|_| {
                let want = std::any::type_name::<T>();
                self.error(
                    key,
                    format!("element {i} is {n}, which does not fit in {want}"),
                )
            })?;
            out.push(t);
        }
        Ok(out)
    }
}

/// A Rust type a metadata value can be read as.
pub trait FromValue<'a>: Sized {
    /// The value as `Self`, or why not (for example `has type INT32, expected UINT32`).
    fn from_value(v: Value<'a>) -> std::result::Result<Self, String>;
}

fn wrong_type(v: &Value, expected: &str) -> String {
    format!("has type {}, expected {expected}", v.type_name())
}

macro_rules! from_scalar {
    ($($t:ty => $vt:ident),*) => {$(
        impl FromValue<'_> for $t {
            fn from_value(v: Value) -> std::result::Result<Self, String> {
                match v {
                    Value::$vt(x) => Ok(x),
                    v => Err(wrong_type(&v, ValueType::$vt.name())),
                }
            }
        }
    )*};
}

from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, u64 => U64, i64 => I64, f64 => F64);

impl<'a> FromValue<'a> for &'a str {
    fn from_value(v: Value<'a>) -> std::result::Result<Self, String> {
        match v {
            Value::Str(s) => std::str::from_utf8(s)
                .map_err(|e| format!("is not valid UTF-8 (at byte {})", e.valid_up_to())),
            v => Err(wrong_type(&v, "STRING")),
        }
    }
}

impl<'a> FromValue<'a> for Array<'a> {
    fn from_value(v: Value<'a>) -> std::result::Result<Self, String> {
        match v {
            Value::Array(a) => Ok(a),
            v => Err(wrong_type(&v, "ARRAY")),
        }
    }
}

impl<'a> FromValue<'a> for Value<'a> {
    fn from_value(v: Value<'a>) -> std::result::Result<Self, String> {
        Ok(v)
    }
}

//! GGUF files: the container llama.cpp reads and writes, parsed in place over a memory map.
//!
//! # The format
//!
//! Everything is little-endian. A file starts with the magic `GGUF`, a u32 version (3; 2 has
//! the same layout), a u64 tensor count and a u64 metadata count. Then come the metadata pairs:
//! a key (a string: u64 byte length, then the bytes), a u32 value type, the value (numbers,
//! bool, string, or an array: element type, u64 count, the elements packed). Then one info per
//! tensor: name (a string of at most 63 bytes), u32 dimension count (at most 4), that many u64
//! dimensions with `ne[0]` the contiguous one (numpy's shape reversed), the u32 ggml type, and a
//! u64 offset into the data section. The data section starts after the infos, padded with zeros
//! to the alignment (`general.alignment`, a u32 power of two, 32 when absent); each tensor's
//! offset is the sum of the padded sizes of the tensors before it. Large models come as split
//! sets, `NAME-00001-of-00003.gguf` …, each file a complete GGUF file whose offsets are its own;
//! the keys `split.no`, `split.count` and `split.tensors.count` tie them together ([`split`]).
//!
//! # The code
//!
//! * [`types`]: ggml tensor types (block sizes, bytes per block, removed ids) and value types;
//! * [`parse`]: [`GgufHeader::parse`], every check llama.cpp applies when it reads a file;
//! * [`value`]: metadata values read in place, typed getters;
//! * [`write`](mod@write): [`GgufWriter`], which cannot write what the parser refuses;
//! * [`split`]: [`GgufSet`], a split set opened from any of its files;
//! * [`file`](mod@file): [`GgufFile`], a memory-mapped file and its header;
//! * [`kimi_names`]: the KDA tensors of llama.cpp's `kimi-linear` files (names, shapes,
//!   transforms), for writing and reading them;
//! * [`index`](mod@index): the tensors of an opened file or set by name, and how a path is
//!   recognised as GGUF;
//! * [`load`]: a `kimi-linear` file or split set opened as a
//!   [`Checkpoint`](crate::checkpoint::Checkpoint) ([`Model::open`](crate::Model::open) on a
//!   `.gguf` path).
//!
//! # Why a parser of our own
//!
//! The crates examined (gguf-rs, ggus, gguf, gguf-rs-lib, candle's `gguf_file`) either pull in
//! large dependencies (a CLI and table printer, or all of candle), are unmaintained, or are not
//! fuzzed; none documents which files it refuses. kda needs exactly llama.cpp's checks (strict
//! offsets, name limits, duplicate keys and names, removed types), split sets, errors naming the
//! file and the key or tensor, and zero-copy views of mapped bytes. This parser is small, has no
//! dependencies, and is fuzzed (`fuzz/fuzz_targets/gguf.rs`).

pub mod file;
pub mod index;
pub mod kimi_names;
pub mod load;
pub mod parse;
pub mod split;
pub mod types;
pub mod value;
pub mod write;

#[cfg(test)]
mod tests;

pub use self::file::GgufFile;
pub use self::parse::{GgufHeader, TensorInfo};
pub use self::split::GgufSet;
pub use self::types::{GgmlType, ValueType};
pub use self::value::{Array, ArrayBuf, Metadata, Value};
pub use self::write::{GgufWriter, Source};

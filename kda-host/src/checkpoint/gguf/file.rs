//! One GGUF file: [`GgufFile`], its bytes (memory-mapped through the safetensors reader's
//! [`Buffer`], or in memory) and its parsed header.

use std::path::Path;

use super::parse::{GgufHeader, TensorInfo};
use super::value::Metadata;
use crate::checkpoint::safetensors::Buffer;
use crate::error::{HostError, Result};

/// A GGUF file: its bytes (memory-mapped, or in memory) and its parsed header.
#[derive(Debug)]
pub struct GgufFile {
    /// Name used in messages (a path).
    pub name: String,
    /// The bytes.
    pub buffer: Buffer,
    /// The parsed header.
    pub header: GgufHeader,
}

impl GgufFile {
    /// Parses `buffer` as a GGUF file named `name`.
    pub fn parse(name: impl Into<String>, buffer: Buffer) -> Result<Self> {
        let name = name.into();
        let header = GgufHeader::parse(&buffer, &name)?;
        Ok(GgufFile {
            name,
            buffer,
            header,
        })
    }

    /// Memory-maps and parses `path`.
    pub fn open(path: &Path) -> Result<Self> {
        Self::parse(path.display().to_string(), Buffer::map(path)?)
    }

    /// The metadata.
    pub fn metadata(&self) -> Metadata<'_> {
        self.header.metadata(&self.buffer)
    }

    /// The tensors, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor `name`, or an error naming it and this file.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.header
            .tensor(name)
            .ok_or_else(|| HostError::MissingTensor {
                file: self.name.clone(),
                tensor: name.to_string(),
                note: String::new(),
            })
    }

    /// The bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        self.tensor(name).map(|t| self.bytes_of(t))
    }

    /// The bytes of `info` (a tensor of this file; checked to lie in it when parsed).
    pub fn bytes_of(&self, info: &TensorInfo) -> &[u8] {
        self.buffer.get(info.range.clone()).unwrap_or_default()
    }
}

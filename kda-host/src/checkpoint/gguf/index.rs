//! The tensors of an opened GGUF file or split set, by name ([`GgufIndex`]), and how a path
//! is recognised as a GGUF file ([`is_gguf`]).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use super::parse::TensorInfo;
use super::GgufFile;
use crate::error::{HostError, Result};

/// The magic a GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";

/// The tensors of an opened GGUF file or split set, by name, and the KDA layers it holds.
#[derive(Debug)]
pub struct GgufIndex {
    tensors: HashMap<String, (usize, TensorInfo)>,
    /// The KDA layers (0-based, ascending) the files hold.
    held: Vec<usize>,
    /// The first file's name, where missing tensors are reported.
    first: String,
    /// The number of files.
    count: usize,
}

impl GgufIndex {
    /// The KDA layers (0-based, ascending) the files hold.
    pub fn held(&self) -> &[usize] {
        &self.held
    }
}

/// True when `path` (a regular file) is a GGUF file: its name ends in `.gguf`, or it starts
/// with the magic `GGUF`.
pub fn is_gguf(path: &Path) -> Result<bool> {
    let named = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    if named {
        return Ok(true);
    }
    let mut head = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|e| HostError::io(path, e))?;
    match f.read_exact(&mut head) {
        Ok(()) => Ok(&head == MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(HostError::io(path, e)),
    }
}

impl GgufIndex {
    /// The number of files.
    pub fn files(&self) -> usize {
        self.count
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when the files hold no tensor.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The index of `files` (one file, or a split set in order) holding the KDA layers `held`.
    pub fn new(files: &[GgufFile], held: Vec<usize>) -> Self {
        let mut tensors = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for t in f.tensors() {
                tensors.insert(t.name.clone(), (i, t.clone()));
            }
        }
        GgufIndex {
            tensors,
            held,
            first: files[0].name.clone(),
            count: files.len(),
        }
    }

    /// The file number and info of tensor `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&(usize, TensorInfo)> {
        self.tensors
            .get(name)
            .ok_or_else(|| HostError::MissingTensor {
                file: self.first.clone(),
                tensor: name.to_string(),
                note: match self.count {
                    1 => String::new(),
                    n => format!(" (nor in the other {} files of its split set)", n - 1),
                },
            })
    }
}

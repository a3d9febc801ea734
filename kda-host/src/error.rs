//! The host crate's error type. Every message is one line and names the file, tensor, field or
//! option at fault, so the `kda` tool can print it as is after `error: `.

use std::path::{Path, PathBuf};

use kda_core::KdaError;

/// Errors of the host crate.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The core rejected an argument.
    #[error(transparent)]
    Core(#[from] KdaError),
    /// A tensor is missing.
    #[error("missing tensor `{0}`")]
    Missing(String),
    /// A file could not be read, mapped or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A file is not a valid safetensors file (truncated, corrupt header, bad offsets).
    #[error("{file}: not a valid safetensors file: {reason}")]
    Safetensors {
        /// The file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A file is not a valid GGUF file (truncated, corrupt header, bad offsets, wrong key
    /// types); the reason names the key or tensor at fault.
    #[error("{file}: not a valid GGUF file: {reason}")]
    Gguf {
        /// The file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration file (or the shard index) is not valid JSON or lacks a field.
    #[error("{file}: {reason}")]
    Config {
        /// The file (`config.json`, `model.safetensors.index.json`).
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor is absent from the checkpoint.
    #[error("{file}: missing tensor `{tensor}`{note}")]
    MissingTensor {
        /// The file or checkpoint folder that should hold it.
        file: String,
        /// Its full name.
        tensor: String,
        /// Extra context (empty, or starting with a space).
        note: String,
    },
    /// A tensor is present but unusable (wrong shape, dtype, or contents).
    #[error("{file}: tensor `{tensor}`: {reason}")]
    Tensor {
        /// The file holding it.
        file: String,
        /// Its full name.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tensor is stored in a form kda does not read (a quantisation outside the supported
    /// ones, or one without the config that describes it); the reason says which forms it reads.
    #[error("{file}: tensor `{tensor}`: {reason}")]
    Unsupported {
        /// The file holding it.
        file: String,
        /// Its full name.
        tensor: String,
        /// What it is.
        reason: String,
    },
    /// The requested model layer is not a KDA layer of the checkpoint.
    #[error("layer {layer} is not a KDA layer: {reason}")]
    NotKda {
        /// 0-based model layer.
        layer: usize,
        /// Why (out of range, full attention, …), with the KDA layers listed.
        reason: String,
    },
    /// An input, output or state file does not match the model or the contract.
    #[error("{file}: {reason}")]
    File {
        /// The file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A buffer could not be allocated.
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc {
        /// What was being allocated.
        what: String,
        /// How much.
        bytes: u128,
    },
    /// An argument is out of range.
    #[error("{0}")]
    Invalid(String),
    /// Another error, with what was being done when it happened (an option, a layer).
    #[error("{context}: {source}")]
    Context {
        /// What was being done.
        context: String,
        /// The error.
        source: Box<HostError>,
    },
}

/// Adds context to an error: `result.context(|| format!("--layer {n}"))` reads
/// "--layer 3: …".
pub trait Context<T> {
    /// The error, prefixed with `what()`.
    fn context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<HostError>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| HostError::Context {
            context: what(),
            source: Box::new(e.into()),
        })
    }
}

impl HostError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        HostError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A problem with the file `file`.
    pub fn file(file: impl Into<String>, reason: impl Into<String>) -> Self {
        HostError::File {
            file: file.into(),
            reason: reason.into(),
        }
    }

    /// A GGUF file `file` that breaks the format: `reason` names the key or tensor.
    pub fn gguf(file: impl Into<String>, reason: impl Into<String>) -> Self {
        HostError::Gguf {
            file: file.into(),
            reason: reason.into(),
        }
    }

    /// A problem with tensor `tensor` of `file`.
    pub fn tensor(
        file: impl Into<String>,
        tensor: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        HostError::Tensor {
            file: file.into(),
            tensor: tensor.into(),
            reason: reason.into(),
        }
    }
}

/// `Result` with [`HostError`].
pub type Result<T, E = HostError> = std::result::Result<T, E>;

/// A zero-filled `Vec` of `len` elements, or an error naming `what` when it cannot be allocated
/// (sizes come from files, so they must not abort the process).
pub fn try_zeroed<T: Clone + Default>(len: usize, what: &str) -> Result<Vec<T>> {
    let mut v = Vec::new();
    let bytes = len as u128 * std::mem::size_of::<T>() as u128;
    if bytes > isize::MAX as u128 {
        return Err(HostError::Alloc {
            what: what.to_string(),
            bytes,
        });
    }
    v.try_reserve_exact(len).map_err(|_| HostError::Alloc {
        what: what.to_string(),
        bytes,
    })?;
    v.resize(len, T::default());
    Ok(v)
}

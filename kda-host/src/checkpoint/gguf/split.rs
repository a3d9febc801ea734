//! Split GGUF sets: `PREFIX-00001-of-00003.gguf`, `PREFIX-00002-of-00003.gguf`, … (llama.cpp's
//! `%s-%05d-of-%05d.gguf`, numbered from 1), each a complete GGUF file with its own offsets.
//!
//! Each file carries `split.no` (`UINT16`, its 0-based place), `split.count` (`UINT16`, the
//! number of files) and the first also `split.tensors.count` (`INT32`, the tensors of all
//! files). The model's metadata is in the first file. As llama.cpp does, a set is refused when
//! a file's `split.no` is not its place, a tensor name appears in two files, or the tensors do
//! not add up to `split.tensors.count`; it is refused too when the files disagree on
//! `split.count`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::file::GgufFile;
use super::parse::TensorInfo;
use super::value::{shown, Metadata};
use crate::error::{HostError, Result};

/// The key holding a file's 0-based place in its set.
pub const SPLIT_NO: &str = "split.no";
/// The key holding the number of files of the set.
pub const SPLIT_COUNT: &str = "split.count";
/// The key holding the number of tensors of the whole set.
pub const SPLIT_TENSORS: &str = "split.tensors.count";

/// The name of file `no` (0-based) of a set of `count` files named after `prefix`.
pub fn split_name(prefix: &str, no: u16, count: u16) -> String {
    format!("{prefix}-{:05}-of-{count:05}.gguf", u32::from(no) + 1)
}

/// The prefix of `name` when it is the name of file `no` (0-based) of a set of `count`.
pub fn split_prefix(name: &str, no: u16, count: u16) -> Option<&str> {
    let suffix = split_name("", no, count);
    name.strip_suffix(&suffix).filter(|p| !p.is_empty())
}

/// One GGUF file, or every file of a split set, with an index of their tensors.
#[derive(Debug)]
pub struct GgufSet {
    files: Vec<GgufFile>,
    index: HashMap<String, (usize, usize)>,
}

fn split_count(meta: &Metadata) -> Result<u16> {
    Ok(meta.opt::<u16>(SPLIT_COUNT)?.unwrap_or(0))
}

impl GgufSet {
    /// Opens `path`; when it belongs to a split set (`split.count` > 1), finds and opens every
    /// file of the set by the naming rule, whichever file `path` names.
    pub fn open(path: &Path) -> Result<Self> {
        let given = GgufFile::open(path)?;
        let count = split_count(&given.metadata())?;
        if count <= 1 {
            return Self::from_files(vec![given]);
        }
        let no = given.metadata().get_u16(SPLIT_NO)?;
        let paths = set_paths(path, &given, no, count)?;
        let mut files = Vec::with_capacity(paths.len());
        let mut given = Some(given);
        for (i, p) in paths.iter().enumerate() {
            match given.take_if(|_| i == usize::from(no)) {
                Some(f) => files.push(f),
                None => files.push(open_split(p, i, count, path)?),
            }
        }
        Self::from_files(files)
    }

    /// The set made of `files`, in order: one file, or every file of a split set (checked as
    /// [`GgufSet::open`] checks them).
    pub fn from_files(files: Vec<GgufFile>) -> Result<Self> {
        let first = files
            .first()
            .ok_or_else(|| HostError::Invalid("a GGUF set needs at least one file".into()))?;
        let count = split_count(&first.metadata())?;
        if count > 1 || files.len() > 1 {
            check_split(&files, count)?;
        }
        let index = index(&files)?;
        if count > 1 {
            check_total(&files[0], index.len())?;
        }
        Ok(GgufSet { files, index })
    }

    /// The files, in order.
    pub fn files(&self) -> &[GgufFile] {
        &self.files
    }

    /// The files, in order, given up (their tensors are then looked up by name in each
    /// file's header).
    pub fn into_files(self) -> Vec<GgufFile> {
        self.files
    }

    /// The model's metadata (the first file's).
    pub fn metadata(&self) -> Metadata<'_> {
        self.files[0].metadata()
    }

    /// Every tensor of the set and the file holding it, file by file in file order.
    pub fn tensors(&self) -> impl Iterator<Item = (&GgufFile, &TensorInfo)> {
        self.files
            .iter()
            .flat_map(|f| f.tensors().iter().map(move |t| (f, t)))
    }

    /// The number of tensors.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// True when the set holds no tensors.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The tensor `name` and the file holding it, or an error naming it.
    pub fn tensor(&self, name: &str) -> Result<(&GgufFile, &TensorInfo)> {
        match self.index.get(name) {
            Some(&(f, t)) => Ok((&self.files[f], &self.files[f].tensors()[t])),
            None => Err(HostError::MissingTensor {
                file: self.files[0].name.clone(),
                tensor: shown(name),
                note: match self.files.len() {
                    1 => String::new(),
                    n => format!(" (nor in the other {} files of its split set)", n - 1),
                },
            }),
        }
    }

    /// The bytes of tensor `name`, from whichever file holds it.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        self.tensor(name).map(|(f, t)| f.bytes_of(t))
    }
}

/// The paths of every file of the set `given` (at `path`, file `no` of `count`) belongs to.
fn set_paths(path: &Path, given: &GgufFile, no: u16, count: u16) -> Result<Vec<PathBuf>> {
    if no >= count {
        return Err(HostError::gguf(
            &given.name,
            format!("key `{SPLIT_NO}` is {no}, but `{SPLIT_COUNT}` is {count}"),
        ));
    }
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let prefix = split_prefix(name, no, count).ok_or_else(|| {
        HostError::gguf(
            &given.name,
            format!(
                "as file {} of a split set of {count} its name must end in `{}`",
                u32::from(no) + 1,
                split_name("", no, count)
            ),
        )
    })?;
    let dir = path.parent().unwrap_or(Path::new(""));
    Ok((0..count)
        .map(|i| dir.join(split_name(prefix, i, count)))
        .collect())
}

/// Opens file `i` of a set of `count`, with an error naming it when it is missing.
fn open_split(p: &Path, i: usize, count: u16, opened_from: &Path) -> Result<GgufFile> {
    if let Err(e) = std::fs::metadata(p) {
        if e.kind() == std::io::ErrorKind::NotFound {
            return Err(HostError::file(
                p.display().to_string(),
                format!(
                    "is missing: it is file {} of the split set of {count} that {} belongs to",
                    i + 1,
                    opened_from.display()
                ),
            ));
        }
    }
    GgufFile::open(p)
}

/// Each file's `split.no` is its place and its `split.count` is `count`, which is the number
/// of files.
fn check_split(files: &[GgufFile], count: u16) -> Result<()> {
    if usize::from(count) != files.len() {
        return Err(HostError::gguf(
            &files[0].name,
            format!(
                "key `{SPLIT_COUNT}` is {count}, but the set has {} files",
                files.len()
            ),
        ));
    }
    for (i, f) in files.iter().enumerate() {
        let meta = f.metadata();
        let no = meta.get_u16(SPLIT_NO)?;
        if usize::from(no) != i {
            return Err(HostError::gguf(
                &f.name,
                format!(
                    "key `{SPLIT_NO}` is {no}, but the file is number {i} (0-based) of its set"
                ),
            ));
        }
        let c = meta.get_u16(SPLIT_COUNT)?;
        if c != count {
            return Err(HostError::gguf(
                &f.name,
                format!(
                    "key `{SPLIT_COUNT}` is {c}, but {} says {count}",
                    files[0].name
                ),
            ));
        }
    }
    Ok(())
}

/// Every tensor name → (file, tensor); a name in two files is an error.
fn index(files: &[GgufFile]) -> Result<HashMap<String, (usize, usize)>> {
    let mut index = HashMap::new();
    for (fi, f) in files.iter().enumerate() {
        for (ti, t) in f.tensors().iter().enumerate() {
            if let Some((other, _)) = index.insert(t.name.clone(), (fi, ti)) {
                return Err(HostError::gguf(
                    &f.name,
                    format!(
                        "tensor `{}` is also in {}",
                        shown(&t.name),
                        files[other].name
                    ),
                ));
            }
        }
    }
    Ok(index)
}

/// The set's tensor count is the first file's `split.tensors.count`.
fn check_total(first: &GgufFile, n: usize) -> Result<()> {
    let total = first.metadata().get_i32(SPLIT_TENSORS)?;
    if usize::try_from(total).ok() != Some(n) {
        return Err(HostError::gguf(
            &first.name,
            format!("key `{SPLIT_TENSORS}` is {total}, but the files of the set hold {n} tensors"),
        ));
    }
    Ok(())
}

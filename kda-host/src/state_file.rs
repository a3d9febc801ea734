//! State files: the caches of `N` sequences as safetensors, for one layer (`kda forward
//! --state-in/--state-out`) or for every layer of a model ([`ModelCache`]).
//!
//! One layer's state:
//!
//! | tensor | dtype | shape | layout |
//! |---|---|---|---|
//! | `recurrent_state` | F32 | `[N, H, K, V]` | K-first |
//! | `conv_state_q`, `conv_state_k`, `conv_state_v` | F32 | `[N, H·K, W−1]` | channel-major, oldest first, zeros where the history is shorter |
//!
//! A model cache holds the same tensors per KDA layer under `layers.{i}.` (0-based model
//! layer), with `__metadata__` `format = kda-model-cache`.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use kda_core::KdaConfig;

use crate::cache::SequenceCaches;
use crate::checkpoint::safetensors::{
    layout, parse_header_prefix, read_header_prefix, stage_tensors, Buffer, FileLayout, Header,
    SafetensorsFile, TensorRef,
};
use crate::error::try_zeroed;
use crate::error::{HostError, Result};
use crate::fsio::Staged;
use crate::model::{Model, ModelCache};

/// Name of the recurrent state.
pub const RECURRENT_STATE: &str = "recurrent_state";
/// Names of the q, k, v conv states.
pub const CONV_STATES: [&str; 3] = ["conv_state_q", "conv_state_k", "conv_state_v"];
/// `__metadata__` `format` of a model cache file.
pub const MODEL_CACHE_FORMAT: &str = "kda-model-cache";

fn shapes(cfg: &KdaConfig, n: usize) -> (Vec<usize>, Vec<usize>) {
    (
        vec![n, cfg.heads, cfg.head_dim, cfg.head_dim],
        vec![n, cfg.proj_dim(), cfg.conv_width.saturating_sub(1)],
    )
}

/// The tensors of one layer's state, names prefixed with `prefix` (borrowing the caches).
pub fn state_tensors<'a>(
    prefix: &str,
    cfg: &KdaConfig,
    c: &'a SequenceCaches,
) -> Vec<TensorRef<'a>> {
    let (rs, cs) = shapes(cfg, c.sequences);
    vec![
        TensorRef::f32(format!("{prefix}{RECURRENT_STATE}"), rs, &c.recurrent),
        TensorRef::f32(format!("{prefix}{}", CONV_STATES[0]), cs.clone(), &c.conv_q),
        TensorRef::f32(format!("{prefix}{}", CONV_STATES[1]), cs.clone(), &c.conv_k),
        TensorRef::f32(format!("{prefix}{}", CONV_STATES[2]), cs, &c.conv_v),
    ]
}

/// The bytes of a one-layer state file (in memory; files are streamed by [`write_state`]).
pub fn state_bytes(cfg: &KdaConfig, c: &SequenceCaches) -> Result<Vec<u8>> {
    let l = layout(state_tensors("", cfg, c), &BTreeMap::new(), "state")?;
    let mut out = crate::fsio::try_buffer(l.file_len() as u64, || "a state file".into())?;
    l.write_to(&mut out)
        .map_err(|e| HostError::file("state", e.to_string()))?;
    Ok(out)
}

/// Writes a one-layer state file to a temporary beside `path`, streamed (the header, then
/// each tensor), ready to be renamed into place.
pub fn stage_state(path: &Path, cfg: &KdaConfig, c: &SequenceCaches) -> Result<Staged> {
    stage_tensors(path, state_tensors("", cfg, c), &BTreeMap::new())
}

/// Name of the snapshots' sequence indices.
pub const SNAPSHOT_SEQ: &str = "snapshot_seq";
/// Name of the snapshots' positions (tokens of the sequence consumed).
pub const SNAPSHOT_POS: &str = "snapshot_pos";

/// Writes a snapshot file to a temporary beside `path`, streamed: `snapshot_seq` and
/// `snapshot_pos` (I64 `[M]`) and the `M` snapshots' states as in a state file.
pub fn stage_snapshots(
    path: &Path,
    cfg: &KdaConfig,
    at: &[kda_core::SnapshotPos],
    snaps: &SequenceCaches,
) -> Result<Staged> {
    let to_i64 = |v: usize| i64::try_from(v).unwrap_or(i64::MAX);
    let seq: Vec<i64> = at.iter().map(|p| to_i64(p.seq)).collect();
    let pos: Vec<i64> = at.iter().map(|p| to_i64(p.pos)).collect();
    let mut tensors = state_tensors("", cfg, snaps);
    tensors.push(TensorRef::i64(SNAPSHOT_SEQ, &seq));
    tensors.push(TensorRef::i64(SNAPSHOT_POS, &pos));
    stage_tensors(path, tensors, &BTreeMap::new())
}

/// Replaces `path` atomically with a one-layer state file, streamed.
pub fn write_state(path: &Path, cfg: &KdaConfig, c: &SequenceCaches) -> Result<()> {
    stage_state(path, cfg, c)?.commit()
}

/// Reads one layer's state (names prefixed with `prefix`) from `f`. `sequences`: the `N` the
/// caller needs (from `cu_seqlens`), or `None` to take it from the file.
pub fn read_layer_state(
    f: &SafetensorsFile,
    prefix: &str,
    cfg: &KdaConfig,
    sequences: Option<usize>,
) -> Result<SequenceCaches> {
    read_layer(&mut Source::Memory(f), prefix, cfg, sequences)
}

/// Where a state's tensors come from: a file held whole, or a file read tensor by tensor.
enum Source<'a> {
    Memory(&'a SafetensorsFile),
    Streamed {
        name: String,
        file: std::fs::File,
        header: Header,
    },
}

impl Source<'_> {
    fn name(&self) -> &str {
        match self {
            Source::Memory(f) => &f.name,
            Source::Streamed { name, .. } => name,
        }
    }

    /// The shape of tensor `tensor`, or an error naming it and the file.
    fn shape(&self, tensor: &str) -> Result<Vec<usize>> {
        match self {
            Source::Memory(f) => Ok(f.entry(tensor)?.shape.clone()),
            Source::Streamed { name, header, .. } => header
                .tensors
                .get(tensor)
                .map(|e| e.shape.clone())
                .ok_or_else(|| HostError::MissingTensor {
                    file: name.clone(),
                    tensor: tensor.to_string(),
                    note: String::new(),
                }),
        }
    }

    /// Tensor `tensor` (F32, of `shape`) as values; a streamed file reads it straight into
    /// the returned buffer.
    fn f32s(&mut self, tensor: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (name, file, header) = match self {
            Source::Memory(f) => return f.f32_tensor(tensor, Some(shape), true),
            Source::Streamed { name, file, header } => (name, file, header),
        };
        let e = header
            .tensors
            .get(tensor)
            .ok_or_else(|| HostError::MissingTensor {
                file: name.clone(),
                tensor: tensor.to_string(),
                note: String::new(),
            })?;
        if e.shape != shape {
            let why = format!("has shape {:?}, expected {shape:?}", e.shape);
            return Err(HostError::tensor(name.as_str(), tensor, why));
        }
        if e.dtype != safetensors::Dtype::F32 {
            let why = format!("has dtype {:?}, expected F32", e.dtype);
            return Err(HostError::tensor(name.as_str(), tensor, why));
        }
        let mut v = try_zeroed::<f32>(e.numel(), &format!("tensor `{tensor}` of {name}"))?;
        let io = |e: std::io::Error| HostError::file(name.as_str(), format!("cannot read: {e}"));
        file.seek(SeekFrom::Start(e.range.start as u64))
            .map_err(io)?;
        file.read_exact(bytemuck::cast_slice_mut(&mut v))
            .map_err(io)?;
        if cfg!(target_endian = "big") {
            v.iter_mut()
                .for_each(|x| *x = f32::from_bits(u32::from_le(x.to_bits())));
        }
        Ok(v)
    }
}

fn read_layer(
    f: &mut Source,
    prefix: &str,
    cfg: &KdaConfig,
    sequences: Option<usize>,
) -> Result<SequenceCaches> {
    let rname = format!("{prefix}{RECURRENT_STATE}");
    let rshape = f.shape(&rname)?;
    let n = match (rshape.first(), sequences) {
        (Some(&got), Some(want)) if rshape.len() == 4 && got != want => {
            return Err(HostError::tensor(
                f.name(),
                &rname,
                format!(
                    "holds {got} sequences (shape {rshape:?}), but the input has {want} (from `cu_seqlens`)"
                ),
            ))
        }
        (Some(&got), _) => got,
        (None, _) => {
            return Err(HostError::tensor(
                f.name(),
                &rname,
                "is a scalar, expected [N, H, K, V]",
            ))
        }
    };
    let (rs, cs) = shapes(cfg, n);
    let mut c = SequenceCaches::try_new(cfg, 0)?;
    c.sequences = n;
    c.recurrent = f.f32s(&rname, &rs)?;
    let mut conv = Vec::with_capacity(3);
    for name in CONV_STATES {
        let full = format!("{prefix}{name}");
        let shape = f.shape(&full)?;
        if shape.first() != Some(&n) && shape.len() == 3 {
            return Err(HostError::tensor(
                f.name(),
                &full,
                format!(
                    "holds {} sequences (shape {shape:?}), but `{rname}` holds {n}",
                    shape[0]
                ),
            ));
        }
        conv.push(f.f32s(&full, &cs)?);
    }
    c.conv_v = conv.pop().unwrap_or_default();
    c.conv_k = conv.pop().unwrap_or_default();
    c.conv_q = conv.pop().unwrap_or_default();
    Ok(c)
}

/// Parses a one-layer state file's bytes for `cfg`; `file` names it in errors.
pub fn parse_state(
    bytes: &[u8],
    file: &str,
    cfg: &KdaConfig,
    sequences: Option<usize>,
) -> Result<SequenceCaches> {
    let f = SafetensorsFile::parse(file, Buffer::copy_of(bytes, file)?)?;
    read_layer_state(&f, "", cfg, sequences)
}

/// Reads a one-layer state file: the header, then each tensor straight into the caches (the
/// file is never held whole in memory).
pub fn read_state(
    path: &Path,
    cfg: &KdaConfig,
    sequences: Option<usize>,
) -> Result<SequenceCaches> {
    let name = path.display().to_string();
    let (mut file, len) = crate::fsio::open_regular(path)?;
    let head = read_header_prefix(&mut file, len, &name)?;
    let file_len = usize::try_from(len).map_err(|_| HostError::file(&name, "is too large"))?;
    let header = parse_header_prefix(&head, file_len, &name)?;
    let mut src = Source::Streamed { name, file, header };
    read_layer(&mut src, "", cfg, sequences)
}

fn layer_prefix(layer: usize) -> String {
    format!("layers.{layer}.")
}

impl ModelCache {
    fn file_layout(&self, model: &Model, file: &str) -> Result<FileLayout<'_>> {
        let mut t = Vec::new();
        for (i, c) in &self.layers {
            let cfg = &model.layer(*i)?.cfg;
            t.extend(state_tensors(&layer_prefix(*i), cfg, c));
        }
        let meta = BTreeMap::from([
            ("format".to_string(), MODEL_CACHE_FORMAT.to_string()),
            ("sequences".to_string(), self.sequences.to_string()),
        ]);
        layout(t, &meta, file)
    }

    /// The bytes of a model cache file.
    pub fn to_bytes(&self, model: &Model) -> Result<Vec<u8>> {
        let l = self.file_layout(model, "model cache")?;
        let mut out = crate::fsio::try_buffer(l.file_len() as u64, || "a model cache".into())?;
        l.write_to(&mut out)
            .map_err(|e| HostError::file("model cache", e.to_string()))?;
        Ok(out)
    }

    /// Saves to `path`: replaced atomically, streamed.
    pub fn save(&self, path: &Path, model: &Model) -> Result<()> {
        let l = self.file_layout(model, &path.display().to_string())?;
        crate::fsio::write_atomic(path, |w| l.write_to(w))
    }

    /// Parses a model cache file's bytes for `model` (it must hold every loaded layer, all with
    /// the same `N`); `file` names it in errors.
    pub fn from_bytes(bytes: &[u8], file: &str, model: &Model) -> Result<Self> {
        Self::from_file(
            &SafetensorsFile::parse(file, Buffer::copy_of(bytes, file)?)?,
            model,
        )
    }

    /// Restores from `path`.
    pub fn load(path: &Path, model: &Model) -> Result<Self> {
        Self::from_file(&SafetensorsFile::read(path)?, model)
    }

    fn from_file(f: &SafetensorsFile, model: &Model) -> Result<Self> {
        if f.header.metadata.get("format").map(String::as_str) != Some(MODEL_CACHE_FORMAT) {
            return Err(HostError::file(
                &f.name,
                format!("not a model cache (metadata `format` is not `{MODEL_CACHE_FORMAT}`)"),
            ));
        }
        let mut sequences = None;
        let mut layers = Vec::new();
        for l in model.layers() {
            let c = read_layer_state(f, &layer_prefix(l.index), &l.cfg, sequences)?;
            sequences = Some(c.sequences);
            layers.push((l.index, c));
        }
        Ok(ModelCache {
            sequences: sequences.unwrap_or(0),
            layers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_mismatch() {
        let cfg = KdaConfig::kimi_k3(8, 2, 4);
        let mut c = SequenceCaches::new(&cfg, 2).unwrap();
        for (i, v) in c.recurrent.iter_mut().enumerate() {
            *v = i as f32;
        }
        c.conv_k[3] = 7.0;
        let b = state_bytes(&cfg, &c).unwrap();
        assert_eq!(parse_state(&b, "s", &cfg, Some(2)).unwrap(), c);
        assert_eq!(parse_state(&b, "s", &cfg, None).unwrap(), c);
        let e = parse_state(&b, "s.st", &cfg, Some(3))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("s.st") && e.contains("recurrent_state") && e.contains("2 sequences"),
            "{e}"
        );
        let other = KdaConfig::kimi_k3(8, 2, 2);
        let e = parse_state(&b, "s.st", &other, Some(2))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("recurrent_state") && e.contains("expected [2, 2, 2, 2]"),
            "{e}"
        );
    }
}

#[cfg(test)]
mod streamed_tests {
    use super::*;

    /// The streamed reader of files and the parser of bytes agree: same caches for a valid
    /// file, an error for every damaged one.
    #[test]
    fn streamed_reader_agrees_with_the_parser() {
        let cfg = KdaConfig::kimi_k3(8, 2, 4);
        let mut c = SequenceCaches::new(&cfg, 3).unwrap();
        for (i, v) in c.recurrent.iter_mut().enumerate() {
            *v = i as f32 * 0.5 - 3.0;
        }
        c.conv_v[5] = -2.0;
        let good = state_bytes(&cfg, &c).unwrap();
        let dir = std::env::temp_dir().join(format!("kda-state-stream-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("s.st");
        let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
        let mut cases: Vec<Vec<u8>> = vec![
            good.clone(),
            good[..good.len() - 1].to_vec(),
            [&good[..], &[0]].concat(),
            good[..7].to_vec(),
            good[..8 + n].to_vec(),
        ];
        let mut huge = good.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        cases.push(huge);
        let mut bad_json = good.clone();
        bad_json[9] = b'!';
        cases.push(bad_json);
        for (i, b) in cases.iter().enumerate() {
            crate::fsio::write_bytes(&p, b).unwrap();
            let streamed = read_state(&p, &cfg, Some(3));
            let parsed = parse_state(b, &p.display().to_string(), &cfg, Some(3));
            match (&streamed, &parsed) {
                (Ok(a), Ok(b)) => assert_eq!(a, b),
                (Err(a), Err(_)) => assert!(a.to_string().contains("s.st"), "{a}"),
                _ => panic!("case {i}: streamed {streamed:?} vs parsed {parsed:?}"),
            }
            assert_eq!(streamed.is_ok(), i == 0, "case {i}: {streamed:?}");
        }
        assert!(read_state(&p, &cfg, None).is_err());
        crate::fsio::write_bytes(&p, &good).unwrap();
        assert_eq!(read_state(&p, &cfg, None).unwrap(), c);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

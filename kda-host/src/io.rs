//! The input and output files of `kda forward` (safetensors).
//!
//! * Input: `hidden_states` `[T, hidden]` F32 or BF16; optional `cu_seqlens` `[N+1]` I64 or
//!   I32 (absent: one sequence of all `T` tokens).
//! * Output: `output` `[T, hidden]` F32.

use std::collections::BTreeMap;
use std::path::Path;

use crate::checkpoint::safetensors::{
    layout, stage_tensors, write_tensors, Buffer, SafetensorsFile, TensorRef,
};
use crate::error::{HostError, Result};
use crate::fsio::Staged;

/// Name of the input rows.
pub const HIDDEN_STATES: &str = "hidden_states";
/// Name of the sequence offsets.
pub const CU_SEQLENS: &str = "cu_seqlens";
/// Name of the output rows.
pub const OUTPUT: &str = "output";

/// A parsed input file.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// `[T, hidden]` rows, widened to f32 (from F32, BF16 or F16).
    pub hidden_states: Vec<f32>,
    /// `T`.
    pub tokens: usize,
    /// `[N+1]` offsets, validated.
    pub cu_seqlens: Vec<usize>,
}

impl Input {
    /// Number of sequences `N`.
    pub fn sequences(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Parses an input file's bytes for a model of width `hidden`; `file` names it in errors.
    pub fn parse(bytes: &[u8], file: &str, hidden: usize) -> Result<Self> {
        Self::from_file(
            &SafetensorsFile::parse(file, Buffer::copy_of(bytes, file)?)?,
            hidden,
        )
    }

    /// Reads the input file `path` for a model of width `hidden`.
    pub fn read(path: &Path, hidden: usize) -> Result<Self> {
        Self::from_file(&SafetensorsFile::read(path)?, hidden)
    }

    fn from_file(f: &SafetensorsFile, hidden: usize) -> Result<Self> {
        let e = f.entry(HIDDEN_STATES)?;
        let tokens = match e.shape.as_slice() {
            [t, w] if *w == hidden => *t,
            [_, w] => {
                return Err(HostError::tensor(
                    &f.name,
                    HIDDEN_STATES,
                    format!("has width {w}, but the model's hidden size is {hidden}"),
                ))
            }
            s => {
                return Err(HostError::tensor(
                    &f.name,
                    HIDDEN_STATES,
                    format!("has shape {s:?}, expected [T, {hidden}]"),
                ))
            }
        };
        let hidden_states = f.f32_tensor(HIDDEN_STATES, None, false)?;
        let cu_seqlens = match f.get(CU_SEQLENS) {
            None => vec![0, tokens],
            Some(c) => {
                if c.shape.len() != 1 {
                    return Err(HostError::tensor(
                        &f.name,
                        CU_SEQLENS,
                        format!("has shape {:?}, expected [N+1]", c.shape),
                    ));
                }
                let raw = f.int_tensor(CU_SEQLENS)?;
                validate_cu_seqlens(&raw, tokens)
                    .map_err(|r| HostError::tensor(&f.name, CU_SEQLENS, r))?
            }
        };
        Ok(Input {
            hidden_states,
            tokens,
            cu_seqlens,
        })
    }
}

/// Checks raw offsets: at least `[0, T]`, starting at 0, non-decreasing, ending at `tokens`.
/// Returns them as `usize`, or the reason they are refused.
pub fn validate_cu_seqlens(raw: &[i64], tokens: usize) -> Result<Vec<usize>, String> {
    if raw.is_empty() {
        return Err(format!("is empty; it needs at least [0, {tokens}]"));
    }
    if raw.len() < 2 {
        return Err(format!("has one entry; it needs at least [0, {tokens}]"));
    }
    if raw[0] != 0 {
        return Err(format!("starts at {}, must start at 0", raw[0]));
    }
    if let Some(i) = raw.windows(2).position(|p| p[1] < p[0]) {
        return Err(format!(
            "decreases at entry {} ({} after {}); it must be non-decreasing",
            i + 1,
            raw[i + 1],
            raw[i]
        ));
    }
    let last = raw[raw.len() - 1];
    if usize::try_from(last).ok() != Some(tokens) {
        return Err(format!(
            "ends at {last}, but `{HIDDEN_STATES}` has {tokens} rows (T); it must end at T"
        ));
    }
    // Non-decreasing from 0 to T ≤ usize::MAX: every entry fits.
    crate::checkpoint::safetensors::try_collect(raw.iter().map(|&v| v as usize), || {
        "the sequence offsets".into()
    })
    .map_err(|e| e.to_string())
}

fn input_tensors<'a>(x: &'a [f32], hidden: usize, cu: Option<&'a [i64]>) -> Vec<TensorRef<'a>> {
    let mut t = vec![TensorRef::f32(
        HIDDEN_STATES,
        vec![x.len() / hidden.max(1), hidden],
        x,
    )];
    t.extend(cu.map(|v| TensorRef::i64(CU_SEQLENS, v)));
    t
}

fn cu_i64(cu_seqlens: Option<&[usize]>) -> Option<Vec<i64>> {
    cu_seqlens.map(|cu| cu.iter().map(|&c| c as i64).collect())
}

/// The bytes of an input file (`hidden_states` F32, and `cu_seqlens` I64 when given).
pub fn input_bytes(x: &[f32], hidden: usize, cu_seqlens: Option<&[usize]>) -> Result<Vec<u8>> {
    let cu = cu_i64(cu_seqlens);
    let l = layout(
        input_tensors(x, hidden, cu.as_deref()),
        &BTreeMap::new(),
        "input",
    )?;
    let mut out = crate::fsio::try_buffer(l.file_len() as u64, || "an input file".into())?;
    l.write_to(&mut out)
        .map_err(|e| HostError::file("input", e.to_string()))?;
    Ok(out)
}

/// Writes an input file (replaced atomically, streamed).
pub fn write_input(
    path: &Path,
    x: &[f32],
    hidden: usize,
    cu_seqlens: Option<&[usize]>,
) -> Result<()> {
    let cu = cu_i64(cu_seqlens);
    write_tensors(
        path,
        input_tensors(x, hidden, cu.as_deref()),
        &BTreeMap::new(),
    )
}

/// Writes an output file (`output` `[T, hidden]` F32) to a temporary beside `path`, streamed,
/// ready to be renamed into place.
pub fn stage_output(path: &Path, out: &[f32], hidden: usize) -> Result<Staged> {
    let t = TensorRef::f32(OUTPUT, vec![out.len() / hidden.max(1), hidden], out);
    stage_tensors(path, vec![t], &BTreeMap::new())
}

/// Writes an output file: `output` `[T, hidden]` F32 (replaced atomically, streamed).
pub fn write_output(path: &Path, out: &[f32], hidden: usize) -> Result<()> {
    stage_output(path, out, hidden)?.commit()
}

/// Reads an output file: the `output` rows and their shape.
pub fn read_output(path: &Path) -> Result<(Vec<f32>, Vec<usize>)> {
    let f = SafetensorsFile::read(path)?;
    let shape = f.entry(OUTPUT)?.shape.clone();
    Ok((f.f32_tensor(OUTPUT, None, true)?, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cu_seqlens_rules() {
        assert_eq!(validate_cu_seqlens(&[0, 3, 3, 5], 5), Ok(vec![0, 3, 3, 5]));
        for (raw, want) in [
            (&[][..], "is empty"),
            (&[0][..], "one entry"),
            (&[1, 5][..], "start at 0"),
            (&[0, 4, 2, 5][..], "decreases at entry 2"),
            (&[0, 4][..], "must end at T"),
            (&[0, -1][..], "decreases"),
        ] {
            let e = validate_cu_seqlens(raw, 5).unwrap_err();
            assert!(e.contains(want), "{raw:?}: {e}");
        }
    }

    #[test]
    fn input_round_trip_and_errors() {
        let x: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let b = input_bytes(&x, 4, Some(&[0, 1, 3])).unwrap();
        let i = Input::parse(&b, "in", 4).unwrap();
        assert_eq!(i.hidden_states, x);
        assert_eq!(i.cu_seqlens, vec![0, 1, 3]);
        let b = input_bytes(&x, 4, None).unwrap();
        assert_eq!(Input::parse(&b, "in", 4).unwrap().cu_seqlens, vec![0, 3]);
        let e = Input::parse(&b, "in.st", 6).unwrap_err().to_string();
        assert!(
            e.contains("in.st") && e.contains("hidden_states") && e.contains("width 4"),
            "{e}"
        );
        let e = Input::parse(&b[..b.len() - 1], "in.st", 4)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("in.st: not a valid safetensors file"), "{e}");
    }
}

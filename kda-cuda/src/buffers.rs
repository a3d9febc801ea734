//! Device buffers: activation rows, the per-sequence caches, and the workspace. Each buffer
//! remembers which backend made it; a call with another backend's buffer is an error (its work
//! would run on an unordered stream).

use cudarc::driver::CudaSlice;
use kda_core::{bf16, CachesMut, KdaConfig, KdaError};

use crate::error::CudaError;
use crate::handle::CudaBackend;
use crate::plan::Dtype;

/// Allocation length for `len` logical elements (never 0: cudarc/CUDA want a real allocation).
fn alloc_len(len: usize) -> usize {
    len.max(1)
}

fn length(arg: &'static str, expected: usize, actual: usize) -> CudaError {
    CudaError::Core(KdaError::Length {
        arg,
        expected,
        actual,
    })
}

#[derive(Debug)]
enum Rows {
    F32(CudaSlice<f32>),
    Bf16(CudaSlice<u16>),
}

/// Rows of activations on the device (`[T, hidden]` inputs or outputs), f32 or bf16.
#[derive(Debug)]
pub struct DeviceRows {
    data: Rows,
    len: usize,
    owner: u64,
}

impl DeviceRows {
    /// `len` zeros in format `dtype`.
    pub fn zeros(be: &CudaBackend, dtype: Dtype, len: usize) -> Result<Self, CudaError> {
        let s = &be.dev.stream;
        let data = match dtype {
            Dtype::F32 => Rows::F32(s.alloc_zeros::<f32>(alloc_len(len))?),
            Dtype::Bf16 => Rows::Bf16(s.alloc_zeros::<u16>(alloc_len(len))?),
        };
        Ok(DeviceRows {
            data,
            len,
            owner: be.dev.id,
        })
    }

    /// A copy of `host`, stored as `dtype` (rounded to nearest even for bf16).
    pub fn from_f32(be: &CudaBackend, host: &[f32], dtype: Dtype) -> Result<Self, CudaError> {
        let mut r = Self::zeros(be, dtype, host.len())?;
        r.upload_f32(be, host)?;
        Ok(r)
    }

    /// A bf16 copy of `host`.
    pub fn from_bf16(be: &CudaBackend, host: &[bf16]) -> Result<Self, CudaError> {
        let mut r = Self::zeros(be, Dtype::Bf16, host.len())?;
        if !host.is_empty() {
            let bits: Vec<u16> = host.iter().map(|v| v.to_bits()).collect();
            if let Rows::Bf16(s) = &mut r.data {
                be.dev.stream.memcpy_htod(&bits, s)?;
            }
        }
        Ok(r)
    }

    /// Overwrites the rows with `host` (same length), converting to the buffer's format.
    pub fn upload_f32(&mut self, be: &CudaBackend, host: &[f32]) -> Result<(), CudaError> {
        be.check_owner(self.owner, "rows")?;
        if host.len() != self.len {
            return Err(length("rows upload", self.len, host.len()));
        }
        if host.is_empty() {
            return Ok(());
        }
        let s = &be.dev.stream;
        match &mut self.data {
            Rows::F32(d) => s.memcpy_htod(host, d)?,
            Rows::Bf16(d) => {
                let bits: Vec<u16> = host.iter().map(|&v| bf16::from_f32(v).to_bits()).collect();
                s.memcpy_htod(&bits, d)?
            }
        }
        Ok(())
    }

    /// The rows as f32 on the host (widening bf16 exactly). Waits for queued work.
    pub fn to_f32(&self, be: &CudaBackend) -> Result<Vec<f32>, CudaError> {
        be.check_owner(self.owner, "rows")?;
        let s = &be.dev.stream;
        if self.len == 0 {
            return Ok(Vec::new());
        }
        let out = match &self.data {
            Rows::F32(d) => {
                let mut v = vec![0.0f32; self.len];
                s.memcpy_dtoh(&d.slice(..self.len), &mut v)?;
                v
            }
            Rows::Bf16(d) => {
                let mut v = vec![0u16; self.len];
                s.memcpy_dtoh(&d.slice(..self.len), &mut v)?;
                v.into_iter().map(|b| bf16::from_bits(b).to_f32()).collect()
            }
        };
        s.synchronize()?;
        Ok(out)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Storage format.
    pub fn dtype(&self) -> Dtype {
        match self.data {
            Rows::F32(_) => Dtype::F32,
            Rows::Bf16(_) => Dtype::Bf16,
        }
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }

    pub(crate) fn ptr(&self, be: &CudaBackend) -> u64 {
        match &self.data {
            Rows::F32(s) => be.dev.ptr(s),
            Rows::Bf16(s) => be.dev.ptr(s),
        }
    }
}

/// The caches of `N` sequences on the device, in the CPU cache's layouts (see
/// [`kda_core::cache`]): recurrent states `[N, H, K, V]` f32 K-first, and the q, k, v conv
/// states `[N, H·K, W−1]` f32, oldest first. Decode steps update them in place.
#[derive(Debug)]
pub struct DeviceCaches {
    sequences: usize,
    state_len: usize,
    conv_len: usize,
    pub(crate) recurrent: CudaSlice<f32>,
    pub(crate) conv_q: CudaSlice<f32>,
    pub(crate) conv_k: CudaSlice<f32>,
    pub(crate) conv_v: CudaSlice<f32>,
    owner: u64,
}

impl DeviceCaches {
    /// Zeroed caches (fresh sequences) for `sequences` sequences of layer `cfg`.
    pub fn zeros(be: &CudaBackend, cfg: &KdaConfig, sequences: usize) -> Result<Self, CudaError> {
        cfg.validate()?;
        let state_len = cfg.state_len()?;
        let conv_len = cfg.conv_state_len()?;
        let total = |per: usize| {
            per.checked_mul(sequences)
                .ok_or(CudaError::Core(KdaError::Overflow { what: "caches" }))
        };
        let (s, c) = (total(state_len)?, total(conv_len)?);
        let st = &be.dev.stream;
        Ok(DeviceCaches {
            sequences,
            state_len,
            conv_len,
            recurrent: st.alloc_zeros::<f32>(alloc_len(s))?,
            conv_q: st.alloc_zeros::<f32>(alloc_len(c))?,
            conv_k: st.alloc_zeros::<f32>(alloc_len(c))?,
            conv_v: st.alloc_zeros::<f32>(alloc_len(c))?,
            owner: be.dev.id,
        })
    }

    /// A device copy of host caches (`N` is inferred from the recurrent slice and checked).
    pub fn from_host(
        be: &CudaBackend,
        cfg: &KdaConfig,
        host: &CachesMut<'_>,
    ) -> Result<Self, CudaError> {
        cfg.validate()?;
        let n = host.recurrent.len() / cfg.state_len()?;
        host.validate(cfg, n)?;
        let mut c = Self::zeros(be, cfg, n)?;
        c.upload(be, host)?;
        Ok(c)
    }

    /// Overwrites the device caches with `host` (same number of sequences).
    pub fn upload(&mut self, be: &CudaBackend, host: &CachesMut<'_>) -> Result<(), CudaError> {
        be.check_owner(self.owner, "caches")?;
        self.check_host(host)?;
        let s = &be.dev.stream;
        for (src, dst) in [
            (&*host.recurrent, &mut self.recurrent),
            (&*host.conv_q, &mut self.conv_q),
            (&*host.conv_k, &mut self.conv_k),
            (&*host.conv_v, &mut self.conv_v),
        ] {
            if !src.is_empty() {
                s.memcpy_htod(src, dst)?;
            }
        }
        Ok(())
    }

    /// Copies the device caches into `host` (same number of sequences). Waits for queued work.
    pub fn download(&self, be: &CudaBackend, host: &mut CachesMut<'_>) -> Result<(), CudaError> {
        be.check_owner(self.owner, "caches")?;
        self.check_host(host)?;
        let s = &be.dev.stream;
        for (src, dst) in [
            (&self.recurrent, &mut *host.recurrent),
            (&self.conv_q, &mut *host.conv_q),
            (&self.conv_k, &mut *host.conv_k),
            (&self.conv_v, &mut *host.conv_v),
        ] {
            if !dst.is_empty() {
                s.memcpy_dtoh(&src.slice(..dst.len()), dst)?;
            }
        }
        s.synchronize()?;
        Ok(())
    }

    fn check_host(&self, host: &CachesMut<'_>) -> Result<(), CudaError> {
        let s = self.state_len * self.sequences;
        let c = self.conv_len * self.sequences;
        for (arg, want, got) in [
            ("recurrent state", s, host.recurrent.len()),
            ("conv_state_q", c, host.conv_q.len()),
            ("conv_state_k", c, host.conv_k.len()),
            ("conv_state_v", c, host.conv_v.len()),
        ] {
            if want != got {
                return Err(length(arg, want, got));
            }
        }
        Ok(())
    }

    /// Number of sequences.
    pub fn sequences(&self) -> usize {
        self.sequences
    }

    /// Zeroes every sequence's caches.
    pub fn reset(&mut self, be: &CudaBackend) -> Result<(), CudaError> {
        be.check_owner(self.owner, "caches")?;
        let s = &be.dev.stream;
        for buf in [
            &mut self.recurrent,
            &mut self.conv_q,
            &mut self.conv_k,
            &mut self.conv_v,
        ] {
            s.memset_zeros(buf)?;
        }
        Ok(())
    }

    /// Zeroes the caches of sequence `n` only (an error past the end).
    pub fn reset_sequence(&mut self, be: &CudaBackend, n: usize) -> Result<(), CudaError> {
        be.check_owner(self.owner, "caches")?;
        if n >= self.sequences {
            return Err(CudaError::Invalid(format!(
                "sequence {n} out of range ({} sequences)",
                self.sequences
            )));
        }
        let s = &be.dev.stream;
        for (buf, len) in [
            (&mut self.recurrent, self.state_len),
            (&mut self.conv_q, self.conv_len),
            (&mut self.conv_k, self.conv_len),
            (&mut self.conv_v, self.conv_len),
        ] {
            if len > 0 {
                let mut part = buf
                    .try_slice_mut(n * len..(n + 1) * len)
                    .ok_or_else(|| CudaError::Invalid("cache range".into()))?;
                s.memset_zeros(&mut part)?;
            }
        }
        Ok(())
    }

    /// Checks that these caches hold exactly `n` sequences of `cfg`.
    pub(crate) fn check(&self, cfg: &KdaConfig, n: usize) -> Result<(), CudaError> {
        if self.state_len != cfg.state_len()? || self.conv_len != cfg.conv_state_len()? {
            return Err(CudaError::Invalid(
                "the caches were made for another layer configuration".into(),
            ));
        }
        if self.sequences != n {
            return Err(length(
                "recurrent state",
                n * self.state_len,
                self.sequences * self.state_len,
            ));
        }
        Ok(())
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }
}

/// Scratch memory for one call, in f32 elements (the unit of
/// [`kda_core::KdaBackend::forward_workspace_len`]). Also holds a small index buffer (sequence
/// offsets and the chunk table) that grows on demand.
#[derive(Debug)]
pub struct DeviceWorkspace {
    pub(crate) buf: CudaSlice<f32>,
    len: usize,
    idx: Option<CudaSlice<i32>>,
    owner: u64,
}

impl DeviceWorkspace {
    /// A workspace of `len` f32 elements (uninitialised contents are never read).
    pub fn new(be: &CudaBackend, len: usize) -> Result<Self, CudaError> {
        Ok(DeviceWorkspace {
            buf: be.dev.stream.alloc_zeros::<f32>(alloc_len(len))?,
            len,
            idx: None,
            owner: be.dev.id,
        })
    }

    /// Size in f32 elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the workspace has no room at all.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` into the index buffer (growing it when needed); returns its address.
    pub(crate) fn upload_index(
        &mut self,
        be: &CudaBackend,
        data: &[i32],
    ) -> Result<u64, CudaError> {
        let s = &be.dev.stream;
        let need = alloc_len(data.len());
        if self.idx.as_ref().is_none_or(|b| b.len() < need) {
            self.idx = Some(s.alloc_zeros::<i32>(need.next_power_of_two())?);
        }
        let Some(idx) = self.idx.as_mut() else {
            return Err(CudaError::Invalid("index buffer".into()));
        };
        if !data.is_empty() {
            s.memcpy_htod(data, idx)?;
        }
        Ok(be.dev.ptr(idx))
    }

    pub(crate) fn owner(&self) -> u64 {
        self.owner
    }
}

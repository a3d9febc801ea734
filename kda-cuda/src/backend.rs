//! [`CudaBackend`]: the KDA layer on a CUDA device, behind [`kda_core::KdaBackend`].
//!
//! A forward (prefill) is, on one stream:
//! 1. one cuBLAS GEMM for every projection that reads `x` (fused `W_in`), plus the low-rank
//!    up-projections;
//! 2. `kda_conv_prefill` (conv + SiLU + q/k L2 norm) and `kda_conv_state_update`;
//! 3. `kda_gate` (decay gate, beta sigmoid);
//! 4. the delta rule: `kda_chunk_intra` + `kda_chunk_state` (chunked) or `kda_recurrent`;
//! 5. `kda_gated_norm`, then the `o_proj` GEMM.
//!
//! A decode step is the in-projection GEMMs, one fused `kda_decode` kernel (conv step, norms,
//! gate, delta rule on the device-resident state, gated norm), and the `o_proj` GEMM.
//!
//! Calls return once the work is queued; errors a kernel hits surface at the next
//! synchronising call ([`CudaBackend::synchronize`], or a download).

use kda_core::{InitialCaches, KdaBackend, KdaConfig, KdaError, Mode};

use crate::buffers::{DeviceCaches, DeviceRows, DeviceWorkspace};
use crate::error::CudaError;
use crate::gemm::{self, Act};
use crate::handle::CudaBackend;
use crate::launch::launch;
use crate::params::{
    CastParams, ChunkIntraParams, ChunkStateParams, ConvParams, DecodeParams, GateParams,
    NormParams, RecurrentParams,
};
use crate::plan::{
    self, choose_chunk, operand, result_path, to_i32, ChunkTable, Dtype, IndexData, LayerDims,
    Operand, Region, WorkspaceLayout, AUTO_CHUNK_MIN_TOKENS,
};
use crate::weights::DeviceWeights;

/// The buffers of one forward call: input rows, offsets, caches, output rows, workspace.
struct ForwardBuffers<'a> {
    x: &'a DeviceRows,
    cu: &'a [usize],
    caches: &'a mut DeviceCaches,
    out: &'a mut DeviceRows,
    ws: &'a mut DeviceWorkspace,
}

/// A `(device address, row stride)` pair of f32 logits.
#[derive(Debug, Clone, Copy)]
struct Strided {
    ptr: u64,
    ld: usize,
}

impl CudaBackend {
    /// Chunk size for a forward whose longest sequence has `longest` tokens (`None`: recurrent).
    fn chunk_for(&self, dims: &LayerDims, longest: usize) -> Result<Option<usize>, CudaError> {
        let pick = || choose_chunk(dims.k, self.dev.smem_optin, self.opts.chunk_size);
        match self.opts.mode {
            Mode::Recurrent => Ok(None),
            Mode::Chunked => pick().map(Some),
            Mode::Auto if longest < AUTO_CHUNK_MIN_TOKENS => Ok(None),
            // A head dim whose chunk buffers do not fit falls back to the recurrence.
            Mode::Auto => match pick() {
                Ok(c) => Ok(Some(c)),
                Err(CudaError::Unsupported(_)) if self.opts.chunk_size.is_none() => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    fn region(&self, ws: &DeviceWorkspace, r: Region) -> u64 {
        self.dev.ptr(&ws.buf) + 4 * r.off as u64
    }

    /// Converts `rows × cols` elements between f32 and bf16 (strided).
    fn cast(&self, src: Act, dst: Act, rows: usize, cols: usize) -> Result<(), CudaError> {
        let func = match (src.dtype, dst.dtype) {
            (Dtype::F32, Dtype::Bf16) => &self.dev.kernels.cast_to_bf16,
            (Dtype::Bf16, Dtype::F32) => &self.dev.kernels.cast_to_f32,
            _ => return Err(CudaError::Invalid("cast between equal formats".into())),
        };
        let Some(l) = plan::elementwise(rows.saturating_mul(cols)) else {
            return Ok(());
        };
        let p = CastParams {
            src: src.ptr,
            dst: dst.ptr,
            src_ld: src.ld as i64,
            dst_ld: dst.ld as i64,
            rows: rows as i64,
            cols: cols as i64,
        };
        // SAFETY: callers pass regions of `rows` rows with the given strides, sized by
        // WorkspaceLayout or checked buffer lengths; CastParams is the kernels' parameter.
        unsafe { launch(&self.dev, func, l, &p) }
    }

    /// The in-projection GEMM and the low-rank up-projections for `rows` rows of `x`.
    /// Returns where the decay logits and the output-gate logits are.
    fn project_in(
        &self,
        w: &DeviceWeights,
        x: &DeviceRows,
        rows: usize,
        lay: &WorkspaceLayout,
        ws: &DeviceWorkspace,
    ) -> Result<(Strided, Strided), CudaError> {
        let dims = &w.dims;
        let wd = w.dtype;
        let x_in = Act {
            ptr: x.ptr(self),
            dtype: x.dtype(),
            ld: dims.hidden,
        };
        let x_op = match operand(x.dtype(), wd) {
            Operand::Direct => x_in,
            Operand::Convert => {
                let dst = Act {
                    ptr: self.region(ws, lay.x_cast),
                    dtype: wd,
                    ld: dims.hidden,
                };
                self.cast(x_in, dst, rows, dims.hidden)?;
                dst
            }
        };
        let proj = self.region(ws, lay.proj);
        let proj_act = Act {
            ptr: proj,
            dtype: Dtype::F32,
            ld: dims.p,
        };
        // SAFETY: x (checked length rows·hidden, or its converted copy in x_cast) and proj
        // (rows·P) are live buffers of this device; W_in is [P, hidden].
        unsafe { gemm::linear(&self.dev.blas, rows, x_op, w.w_in.view(self), proj_act) }?;

        let col = |c: usize| proj + 4 * c as u64;
        let up = |m: Option<&crate::weights::DeviceMat>,
                  off: usize,
                  width: usize,
                  low_col: usize,
                  dst: Region|
         -> Result<Strided, CudaError> {
            let Some(m) = m else {
                return Ok(Strided {
                    ptr: col(off),
                    ld: dims.p,
                });
            };
            let src = Act {
                ptr: col(off),
                dtype: Dtype::F32,
                ld: dims.p,
            };
            let src = match operand(Dtype::F32, wd) {
                Operand::Direct => src,
                Operand::Convert => {
                    // bf16 bottleneck rows [rows, r_f + r_g]: this part at column `low_col`.
                    let ld = dims.rank_f + dims.rank_g;
                    let dst = Act {
                        ptr: self.region(ws, lay.low_cast) + (2 * low_col) as u64,
                        dtype: wd,
                        ld,
                    };
                    self.cast(src, dst, rows, width)?;
                    dst
                }
            };
            let out = Act {
                ptr: self.region(ws, dst),
                dtype: Dtype::F32,
                ld: dims.d,
            };
            // SAFETY: src is `rows` rows of `width` (= m.cols) bottleneck values inside proj or
            // low_cast; `dst` is a [rows, D] region; m is [D, width].
            unsafe { gemm::linear(&self.dev.blas, rows, src, m.view(self), out) }?;
            Ok(Strided {
                ptr: out.ptr,
                ld: dims.d,
            })
        };
        let f = up(w.f_up.as_ref(), dims.f_off, dims.f_width, 0, lay.f_up)?;
        let g = up(
            w.g_up.as_ref(),
            dims.g_off,
            dims.g_width,
            dims.rank_f,
            lay.g_up,
        )?;
        Ok((f, g))
    }

    /// `out = normed · o_projᵀ` for `rows` rows (`normed` in the weights' format).
    fn project_out(
        &self,
        w: &DeviceWeights,
        rows: usize,
        lay: &WorkspaceLayout,
        ws: &DeviceWorkspace,
        out: &mut DeviceRows,
    ) -> Result<(), CudaError> {
        let dims = &w.dims;
        let normed = Act {
            ptr: self.region(ws, lay.normed),
            dtype: w.dtype,
            ld: dims.heads * dims.v,
        };
        let dst = Act {
            ptr: out.ptr(self),
            dtype: out.dtype(),
            ld: dims.hidden,
        };
        match result_path(w.dtype, out.dtype()) {
            Operand::Direct => {
                // SAFETY: normed is [rows, H·V] in the workspace, out has rows·hidden elements
                // (checked), o_proj is [hidden, H·V].
                unsafe { gemm::linear(&self.dev.blas, rows, normed, w.o_proj.view(self), dst) }
            }
            Operand::Convert => {
                let stage = Act {
                    ptr: self.region(ws, lay.out_stage),
                    dtype: Dtype::F32,
                    ld: dims.hidden,
                };
                // SAFETY: as above, into the [rows, hidden] f32 staging region.
                unsafe { gemm::linear(&self.dev.blas, rows, normed, w.o_proj.view(self), stage) }?;
                self.cast(stage, dst, rows, dims.hidden)
            }
        }
    }

    fn run_forward(
        &mut self,
        cfg: &KdaConfig,
        w: &DeviceWeights,
        call: ForwardBuffers<'_>,
        init: InitialCaches,
    ) -> Result<(), CudaError> {
        let ForwardBuffers {
            x,
            cu,
            caches,
            out,
            ws,
        } = call;
        // Everything is checked before anything is queued.
        self.dev.bind()?;
        for (owner, what) in [
            (w.owner(), "weights"),
            (x.owner(), "input"),
            (out.owner(), "output"),
            (caches.owner(), "caches"),
            (ws.owner(), "workspace"),
        ] {
            self.check_owner(owner, what)?;
        }
        let dims = w.dims_for(cfg)?;
        let shape = plan::forward_shape(cfg, x.len(), out.len(), cu)?;
        let (t, n) = (shape.tokens, shape.seqs);
        caches.check(cfg, n)?;
        let (t_i, n_i) = (t as i32, n as i32);
        let longest = shape.longest;
        let chunk = self.chunk_for(&dims, longest)?;
        let lay = WorkspaceLayout::forward(&dims, t, chunk.is_some())?;
        if ws.len() < lay.total {
            return Err(KdaError::TooSmall {
                arg: "workspace",
                needed: lay.total,
                actual: ws.len(),
            }
            .into());
        }
        let table = chunk.map(|c| ChunkTable::new(cu, c)).transpose()?;
        let index = IndexData::new(cu, table.as_ref())?;

        if init == InitialCaches::Zero {
            caches.reset(self)?;
        }
        if t == 0 {
            return Ok(());
        }
        let idx = ws.upload_index(self, &index.data)?;
        let at = |r: Region| self.region(ws, r);
        let (h, k, v) = (dims.heads, dims.k, dims.v);
        let (h_i, k_i, v_i) = (h as i32, k as i32, v as i32);
        let dv = h * v;
        let proj = at(lay.proj);

        // 1. Projections.
        let (f, g_out) = self.project_in(w, x, t, &lay, ws)?;

        // 2. Conv + SiLU + q/k L2 norm, then the new conv states.
        let conv = ConvParams {
            src: proj,
            weight: self.dev.ptr(&w.conv),
            state_q: self.dev.ptr(&caches.conv_q),
            state_k: self.dev.ptr(&caches.conv_k),
            state_v: self.dev.ptr(&caches.conv_v),
            dst: at(lay.qkv),
            cu: idx,
            src_ld: dims.p as i64,
            dst_ld: (3 * dims.d) as i64,
            tokens: t_i,
            seqs: n_i,
            heads: h_i,
            head_dim: k_i,
            width: dims.width as i32,
            l2_eps: cfg.l2_eps,
        };
        let kern = &self.dev.kernels;
        // SAFETY: proj [T, P], qkv [T, 3D] are workspace regions sized by the layout; the conv
        // states hold N·D·(W−1) and the weights 3D·W floats (checked); cu is [N+1].
        unsafe {
            launch(
                &self.dev,
                &kern.conv_prefill,
                plan::conv_prefill(&dims, t)?,
                &conv,
            )
        }?;
        if dims.width > 1 {
            if let Some(l) = plan::elementwise(n * 3 * dims.d) {
                // SAFETY: as above; runs after kda_conv_prefill on the same stream.
                unsafe { launch(&self.dev, &kern.conv_state_update, l, &conv) }?;
            }
        }

        // 3. Decay gate and beta.
        let gate = GateParams {
            f: f.ptr,
            b: proj + 4 * dims.b_off as u64,
            g: at(lay.g),
            beta: at(lay.beta),
            gate: w.gate_params(self),
            f_ld: f.ld as i64,
            b_ld: dims.p as i64,
            tokens: t_i,
            heads: h_i,
            head_dim: k_i,
            pad_: 0,
        };
        if let Some(l) = plan::elementwise(t * dims.d + t * h) {
            // SAFETY: f holds T rows of D logits at stride f.ld, b T rows at stride P; g [T, D]
            // and beta [T, H] are workspace regions; A_log [H] and dt_bias [D] when non-null.
            unsafe { launch(&self.dev, &kern.gate, l, &gate) }?;
        }

        // 4. The delta rule, state in place, output into `o`.
        let state = self.dev.ptr(&caches.recurrent);
        match (chunk, table.as_ref()) {
            (Some(c), Some(table)) => {
                let chunks_ptr = idx + 4 * index.chunks_off as u64;
                let first_ptr = idx + 4 * index.first_off as u64;
                let intra = ChunkIntraParams {
                    qkv: at(lay.qkv),
                    g: at(lay.g),
                    beta: at(lay.beta),
                    chunks: chunks_ptr,
                    qg: at(lay.qg),
                    kg: at(lay.kg),
                    w: at(lay.w),
                    u: at(lay.u),
                    aqk: at(lay.aqk),
                    qkv_ld: (3 * dims.d) as i64,
                    n_chunks: to_i32("chunks", table.len())?,
                    heads: h_i,
                    head_dim: k_i,
                    value_dim: v_i,
                    chunk: c as i32,
                    scale: cfg.scale(),
                };
                // SAFETY: every per-token buffer is a [T, ·] workspace region (aqk sized for
                // C ≤ 64); chunks is the uploaded table; shared memory per plan::chunk_intra.
                unsafe {
                    launch(
                        &self.dev,
                        &kern.chunk_intra,
                        plan::chunk_intra(&dims, table.len(), c)?,
                        &intra,
                    )
                }?;
                let st = ChunkStateParams {
                    qg: at(lay.qg),
                    kg: at(lay.kg),
                    w: at(lay.w),
                    u: at(lay.u),
                    aqk: at(lay.aqk),
                    g: at(lay.g),
                    chunks: chunks_ptr,
                    chunk_first: first_ptr,
                    state,
                    o: at(lay.o),
                    o_ld: dv as i64,
                    seqs: n_i,
                    heads: h_i,
                    head_dim: k_i,
                    value_dim: v_i,
                    chunk: c as i32,
                    pad_: 0,
                };
                // SAFETY: as above; the state holds N·H·K·V floats (checked); o is [T, H·V].
                unsafe {
                    launch(
                        &self.dev,
                        &kern.chunk_state,
                        plan::chunk_state(&dims, n, c)?,
                        &st,
                    )
                }?;
            }
            _ => {
                let rec = RecurrentParams {
                    qkv: at(lay.qkv),
                    g: at(lay.g),
                    beta: at(lay.beta),
                    state,
                    o: at(lay.o),
                    cu: idx,
                    qkv_ld: (3 * dims.d) as i64,
                    o_ld: dv as i64,
                    seqs: n_i,
                    heads: h_i,
                    head_dim: k_i,
                    value_dim: v_i,
                    scale: cfg.scale(),
                    pad_: 0,
                };
                // SAFETY: workspace regions sized by the layout, the state by the cache check.
                unsafe { launch(&self.dev, &kern.recurrent, plan::recurrent(&dims, n)?, &rec) }?;
            }
        }

        // 5. Gated RMSNorm into the o_proj operand, then o_proj.
        let norm = NormParams {
            o: at(lay.o),
            gate: g_out.ptr,
            weight: self.dev.ptr(&w.o_norm),
            dst: at(lay.normed),
            o_ld: dv as i64,
            gate_ld: g_out.ld as i64,
            dst_ld: dv as i64,
            tokens: t_i,
            heads: h_i,
            head_dim: v_i,
            dst_bf16: (w.dtype == Dtype::Bf16) as i32,
            eps: cfg.rms_eps,
            pad_: 0,
        };
        // SAFETY: o and normed are [T, H·V] regions, the gate logits T rows at stride gate_ld,
        // the norm weight [V].
        unsafe {
            launch(
                &self.dev,
                &kern.gated_norm,
                plan::gated_norm(&dims, t)?,
                &norm,
            )
        }?;
        self.project_out(w, t, &lay, ws, out)
    }

    fn run_decode(
        &mut self,
        cfg: &KdaConfig,
        w: &DeviceWeights,
        x: &DeviceRows,
        caches: &mut DeviceCaches,
        out: &mut DeviceRows,
        ws: &mut DeviceWorkspace,
    ) -> Result<(), CudaError> {
        self.dev.bind()?;
        for (owner, what) in [
            (w.owner(), "weights"),
            (x.owner(), "input"),
            (out.owner(), "output"),
            (caches.owner(), "caches"),
            (ws.owner(), "workspace"),
        ] {
            self.check_owner(owner, what)?;
        }
        let dims = w.dims_for(cfg)?;
        let n = plan::decode_shape(cfg, x.len(), out.len())?.seqs;
        caches.check(cfg, n)?;
        let n_i = n as i32;
        let lay = WorkspaceLayout::decode(&dims, n)?;
        if ws.len() < lay.total {
            return Err(KdaError::TooSmall {
                arg: "workspace",
                needed: lay.total,
                actual: ws.len(),
            }
            .into());
        }
        if n == 0 {
            return Ok(());
        }
        let (f, g_out) = self.project_in(w, x, n, &lay, ws)?;
        let proj = self.region(ws, lay.proj);
        let dv = dims.heads * dims.v;
        let p = DecodeParams {
            proj,
            f: f.ptr,
            b: proj + 4 * dims.b_off as u64,
            gate: g_out.ptr,
            conv_w: self.dev.ptr(&w.conv),
            conv_q: self.dev.ptr(&caches.conv_q),
            conv_k: self.dev.ptr(&caches.conv_k),
            conv_v: self.dev.ptr(&caches.conv_v),
            state: self.dev.ptr(&caches.recurrent),
            norm_w: self.dev.ptr(&w.o_norm),
            dst: self.region(ws, lay.normed),
            gp: w.gate_params(self),
            proj_ld: dims.p as i64,
            f_ld: f.ld as i64,
            b_ld: dims.p as i64,
            gate_ld: g_out.ld as i64,
            dst_ld: dv as i64,
            seqs: n_i,
            heads: dims.heads as i32,
            head_dim: dims.k as i32,
            value_dim: dims.v as i32,
            width: dims.width as i32,
            dst_bf16: (w.dtype == Dtype::Bf16) as i32,
            scale: cfg.scale(),
            l2_eps: cfg.l2_eps,
            rms_eps: cfg.rms_eps,
            pad_: 0,
        };
        // SAFETY: proj [N, P] and normed [N, H·V] are workspace regions; f/gate logits N rows
        // at their strides; caches hold N sequences (checked); weights match cfg (checked).
        unsafe {
            launch(
                &self.dev,
                &self.dev.kernels.decode,
                plan::decode(&dims, n)?,
                &p,
            )
        }?;
        self.project_out(w, n, &lay, ws, out)
    }
}

impl KdaBackend for CudaBackend {
    type Error = CudaError;
    type Weights<'a> = DeviceWeights;
    type Input<'a> = &'a DeviceRows;
    type Output<'a> = &'a mut DeviceRows;
    type Caches<'a> = &'a mut DeviceCaches;
    type Workspace<'a> = &'a mut DeviceWorkspace;

    /// f32 elements of workspace for a forward over up to `tokens` tokens (any mode, any input,
    /// weight and output format).
    fn forward_workspace_len(&self, cfg: &KdaConfig, tokens: usize) -> Result<usize, CudaError> {
        plan::forward_workspace_len(cfg, tokens)
    }

    /// f32 elements of workspace for a decode step over `batch` sequences.
    fn decode_workspace_len(&self, cfg: &KdaConfig, batch: usize) -> Result<usize, CudaError> {
        plan::decode_workspace_len(cfg, batch)
    }

    fn forward(
        &mut self,
        cfg: &KdaConfig,
        weights: &DeviceWeights,
        x: &DeviceRows,
        cu_seqlens: &[usize],
        caches: &mut DeviceCaches,
        init: InitialCaches,
        out: &mut DeviceRows,
        workspace: &mut DeviceWorkspace,
    ) -> Result<(), CudaError> {
        let call = ForwardBuffers {
            x,
            cu: cu_seqlens,
            caches,
            out,
            ws: workspace,
        };
        self.run_forward(cfg, weights, call, init)
    }

    fn decode_step(
        &mut self,
        cfg: &KdaConfig,
        weights: &DeviceWeights,
        x: &DeviceRows,
        caches: &mut DeviceCaches,
        out: &mut DeviceRows,
        workspace: &mut DeviceWorkspace,
    ) -> Result<(), CudaError> {
        self.run_decode(cfg, weights, x, caches, out, workspace)
    }
}

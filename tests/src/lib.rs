//! Shared code for the conformance suite: fixture loading, comparison metrics, and the
//! per-backend harness the tests run every case through.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use half::bf16;
use kda_core::{
    Batch, Cpu, DecayGate, ForwardOptions, GateProj, InitialCaches, KdaBackend, KdaConfig, Mode,
};
use kda_host::layer::{OwnedData, OwnedGate, OwnedMat};
use kda_host::{OwnedLayer, SequenceCaches};
use safetensors::{Dtype, SafeTensors};

/// Directory of the committed fixtures, or `$KDA_FIXTURES_DIR` when set (prebuilt test
/// executables run on another machine: `kda-cuda/scripts/gpu-check.sh --prebuilt`).
pub fn fixtures_dir() -> PathBuf {
    match std::env::var_os("KDA_FIXTURES_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures"),
    }
}

/// Names of the layer fixtures (`layer_*.safetensors`), sorted.
pub fn layer_fixtures() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("layer_") && n.ends_with(".safetensors"))
        .collect();
    v.sort();
    v
}

/// One tensor read from a fixture (copied out, any alignment).
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Shape.
    pub shape: Vec<usize>,
    /// Values as stored.
    pub data: OwnedData,
}

impl Tensor {
    /// Values widened to f32.
    pub fn f32(&self) -> Vec<f32> {
        match &self.data {
            OwnedData::F32(v) => v.clone(),
            OwnedData::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
        }
    }
}

/// A fixture file: tensors and metadata.
#[derive(Debug)]
pub struct Fixture {
    /// File name.
    pub name: String,
    tensors: HashMap<String, Tensor>,
    ints: HashMap<String, Vec<i64>>,
    /// `__metadata__`.
    pub meta: HashMap<String, String>,
}

impl Fixture {
    /// Reads `fixtures/<name>`.
    pub fn open(name: &str) -> Fixture {
        let bytes = std::fs::read(fixtures_dir().join(name)).expect("read fixture");
        let (_, md) = SafeTensors::read_metadata(&bytes).expect("header");
        let st = SafeTensors::deserialize(&bytes).expect("parse fixture");
        let mut tensors = HashMap::new();
        let mut ints = HashMap::new();
        for (n, view) in st.tensors() {
            let raw = view.data();
            let shape = view.shape().to_vec();
            match view.dtype() {
                Dtype::F32 => {
                    let v = raw
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect();
                    tensors.insert(
                        n,
                        Tensor {
                            shape,
                            data: OwnedData::F32(v),
                        },
                    );
                }
                Dtype::BF16 => {
                    let v = raw
                        .chunks_exact(2)
                        .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                        .collect();
                    tensors.insert(
                        n,
                        Tensor {
                            shape,
                            data: OwnedData::Bf16(v),
                        },
                    );
                }
                Dtype::I64 => {
                    let v = raw
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    ints.insert(n, v);
                }
                d => panic!("{name}: unexpected dtype {d:?} for {n}"),
            }
        }
        Fixture {
            name: name.to_string(),
            tensors,
            ints,
            meta: md.metadata().clone().unwrap_or_default(),
        }
    }

    /// A tensor; panics (test failure) naming it when missing.
    pub fn t(&self, name: &str) -> &Tensor {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("{}: missing tensor {name}", self.name))
    }

    /// A tensor if present.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// A tensor as f32.
    pub fn f32(&self, name: &str) -> Vec<f32> {
        self.t(name).f32()
    }

    /// An integer tensor.
    pub fn i64(&self, name: &str) -> &[i64] {
        self.ints
            .get(name)
            .unwrap_or_else(|| panic!("{}: missing int tensor {name}", self.name))
    }

    fn meta_num<T: std::str::FromStr>(&self, key: &str) -> T {
        self.meta
            .get(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{}: bad metadata {key}", self.name))
    }

    /// The layer configuration recorded in the metadata.
    pub fn config(&self) -> KdaConfig {
        let k: usize = self.meta_num("head_dim");
        let decay_gate = match self.meta["decay_gate"].as_str() {
            "softplus" => DecayGate::Softplus,
            "lower_bound" => DecayGate::LowerBound(self.meta_num("lower_bound")),
            g => panic!("unknown gate {g}"),
        };
        let output_gate = match self.meta["output_gate"].as_str() {
            "low_rank" => GateProj::LowRank {
                rank: self.t("g_a_proj.weight").shape[0],
            },
            "full_rank" => GateProj::FullRank,
            g => panic!("unknown output gate {g}"),
        };
        KdaConfig {
            hidden: self.meta_num("hidden"),
            heads: self.meta_num("heads"),
            head_dim: k,
            conv_width: self.meta_num("conv_width"),
            decay_gate,
            decay_proj: GateProj::LowRank {
                rank: self.t("f_a_proj.weight").shape[0],
            },
            output_gate,
            rms_eps: self.meta_num("rms_eps"),
            l2_eps: self.meta_num("l2_eps"),
            scale: None,
        }
    }

    fn mat(&self, name: &str) -> OwnedMat {
        let t = self.t(name);
        OwnedMat {
            data: t.data.clone(),
            rows: t.shape[0],
            cols: t.shape[1..].iter().product(),
        }
    }

    /// The layer's weights, in their stored dtypes.
    pub fn layer(&self) -> OwnedLayer {
        let cfg = self.config();
        let gate = |full: &str, a: &str, b: &str| match self.get(full) {
            Some(_) => OwnedGate::FullRank(self.mat(full)),
            None => OwnedGate::LowRank(self.mat(a), self.mat(b)),
        };
        OwnedLayer {
            cfg,
            qkv: [
                self.mat("q_proj.weight"),
                self.mat("k_proj.weight"),
                self.mat("v_proj.weight"),
            ],
            conv: ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"]
                .map(|n| self.t(n).data.clone()),
            a_log: self.get("A_log").map(|t| t.data.clone()),
            dt_bias: self.get("dt_bias").map(|t| t.data.clone()),
            decay_proj: gate("f_proj.weight", "f_a_proj.weight", "f_b_proj.weight"),
            b_proj: self.mat("b_proj.weight"),
            output_gate: gate("g_proj.weight", "g_a_proj.weight", "g_b_proj.weight"),
            o_norm: self.t("o_norm.weight").data.clone(),
            o_proj: self.mat("o_proj.weight"),
        }
    }

    /// `cu_seqlens` as usize.
    pub fn cu_seqlens(&self) -> Vec<usize> {
        self.i64("cu_seqlens").iter().map(|&v| v as usize).collect()
    }

    /// The initial caches (zeros when the fixture has none) and whether it had any.
    pub fn initial_caches(&self) -> (SequenceCaches, InitialCaches) {
        let cfg = self.config();
        let n = self.cu_seqlens().len() - 1;
        let mut c = SequenceCaches::new(&cfg, n).unwrap();
        match self.get("initial_recurrent_state") {
            Some(s) => {
                c.recurrent = s.f32();
                c.conv_q = self.f32("initial_conv_state_q");
                c.conv_k = self.f32("initial_conv_state_k");
                c.conv_v = self.f32("initial_conv_state_v");
                (c, InitialCaches::Given)
            }
            None => (c, InitialCaches::Zero),
        }
    }
}

/// Caches of `n` sequences filled with seeded normals (σ = 0.5), as initial caches.
pub fn random_caches(cfg: &KdaConfig, n: usize, rng: &mut kda_host::rng::Rng) -> SequenceCaches {
    let mut c = SequenceCaches::new(cfg, n).unwrap();
    for v in [
        &mut c.recurrent,
        &mut c.conv_q,
        &mut c.conv_k,
        &mut c.conv_v,
    ] {
        let len = v.len();
        *v = rng.normals(len, 0.5);
    }
    c
}

/// Every cache of `c` as one flat vector: recurrent, then the q, k and v conv states.
pub fn flat_caches(c: &SequenceCaches) -> Vec<f32> {
    let mut v = c.recurrent.clone();
    for conv in [&c.conv_q, &c.conv_k, &c.conv_v] {
        v.extend_from_slice(conv);
    }
    v
}

/// `RMS(a − b) / RMS(b)` in f64 (0 when both are all zero).
pub fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// A backend as the conformance suite drives it: host data in, host data out.
pub trait Harness {
    /// Name for messages.
    fn name(&self) -> &'static str;
    /// Sequence forward.
    fn forward(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
    ) -> Result<Vec<f32>, String>;
    /// Decode step for every sequence of `caches`.
    fn decode(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        caches: &mut SequenceCaches,
    ) -> Result<Vec<f32>, String>;
}

/// The CPU backend through [`KdaBackend`], with a workspace of `block` tokens.
#[derive(Debug, Clone, Copy)]
pub struct CpuHarness {
    /// Tokens per block.
    pub block: usize,
    /// Options of forward calls.
    pub opts: ForwardOptions,
}

impl CpuHarness {
    /// Token-by-token recurrence, blocks of `block` tokens.
    pub fn recurrent(block: usize) -> Self {
        CpuHarness {
            block,
            opts: ForwardOptions::recurrent(),
        }
    }

    /// Chunked with chunk size `chunk`, blocks of `block` tokens.
    pub fn chunked(block: usize, chunk: usize) -> Self {
        CpuHarness {
            block,
            opts: ForwardOptions {
                mode: Mode::Chunked,
                chunk_size: chunk,
                isa: None,
                ..ForwardOptions::default()
            },
        }
    }
}

impl Harness for CpuHarness {
    fn name(&self) -> &'static str {
        match self.opts.mode {
            Mode::Recurrent => "cpu-rec",
            Mode::Chunked => match self.opts.chunk_size {
                16 => "cpu-chunk16",
                32 => "cpu-chunk32",
                64 => "cpu-chunk64",
                _ => "cpu-chunk",
            },
            Mode::Auto => "cpu-auto",
        }
    }

    fn forward(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
    ) -> Result<Vec<f32>, String> {
        let mut be = Cpu {
            opts: self.opts,
            exec: kda_core::Serial,
        };
        let w = layer.kda_layer(self.opts).map_err(|e| e.to_string())?;
        let mut ws = vec![
            0.0;
            be.forward_workspace_len(&layer.cfg, self.block)
                .map_err(|e| e.to_string())?
        ];
        let mut out = vec![0.0; x.len()];
        be.forward(
            &layer.cfg,
            &w,
            x,
            cu_seqlens,
            caches.as_mut(),
            init,
            &mut out,
            &mut ws,
        )
        .map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn decode(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        caches: &mut SequenceCaches,
    ) -> Result<Vec<f32>, String> {
        let mut be = Cpu {
            opts: self.opts,
            exec: kda_core::Serial,
        };
        let w = layer.kda_layer(self.opts).map_err(|e| e.to_string())?;
        let mut ws = vec![
            0.0;
            be.decode_workspace_len(&layer.cfg, self.block)
                .map_err(|e| e.to_string())?
        ];
        let mut out = vec![0.0; x.len()];
        be.decode_step(&layer.cfg, &w, x, caches.as_mut(), &mut out, &mut ws)
            .map_err(|e| e.to_string())?;
        Ok(out)
    }
}

/// The CUDA backend through its host-data helpers (upload, run, download per call).
pub struct CudaHarness(pub kda_cuda::CudaBackend);

impl Harness for CudaHarness {
    fn name(&self) -> &'static str {
        match self.0.opts.mode {
            Mode::Recurrent => "cuda-rec",
            Mode::Chunked => "cuda-chunk",
            Mode::Auto => "cuda-auto",
        }
    }

    fn forward(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        cu_seqlens: &[usize],
        caches: &mut SequenceCaches,
        init: InitialCaches,
    ) -> Result<Vec<f32>, String> {
        let w = layer.weights().map_err(|e| e.to_string())?;
        let mut out = vec![0.0; x.len()];
        let batch = Batch {
            x,
            cu_seqlens,
            out: &mut out,
        };
        self.0
            .forward_host(&layer.cfg, &w, batch, caches.as_mut(), init)
            .map_err(|e| e.to_string())?;
        Ok(out)
    }

    fn decode(
        &mut self,
        layer: &OwnedLayer,
        x: &[f32],
        caches: &mut SequenceCaches,
    ) -> Result<Vec<f32>, String> {
        let w = layer.weights().map_err(|e| e.to_string())?;
        let mut out = vec![0.0; x.len()];
        self.0
            .decode_host(&layer.cfg, &w, x, caches.as_mut(), &mut out)
            .map_err(|e| e.to_string())?;
        Ok(out)
    }
}

/// Every backend available on this machine. GPU backends that cannot run here are reported
/// with a visible `skipped: no CUDA device` line.
pub fn backends() -> Vec<Box<dyn Harness>> {
    let mut v: Vec<Box<dyn Harness>> = vec![
        Box::new(CpuHarness::recurrent(64)),
        Box::new(CpuHarness::chunked(256, 16)),
        Box::new(CpuHarness::chunked(256, 64)),
    ];
    match (
        kda_cuda::conformance_backend(),
        kda_cuda::conformance_backend(),
    ) {
        (Ok(mut rec), Ok(mut chunk)) => {
            rec.opts.mode = Mode::Recurrent;
            chunk.opts.mode = Mode::Chunked;
            v.push(Box::new(CudaHarness(rec)));
            v.push(Box::new(CudaHarness(chunk)));
        }
        (Err(e), _) | (_, Err(e)) => println!("skipped: no CUDA device ({e})"),
    }
    v
}

//! Random layers and inputs for the GPU tests (self-contained: no dependency on kda-host).
#![allow(dead_code)]

use kda_core::{
    bf16, Batch, CachesMut, Data, DecayGate, ForwardOptions, GateProj, GateWeights, InitialCaches,
    KdaConfig, KdaLayer, KdaWeights, MatRef, Serial,
};

/// A small deterministic generator (LCG), uniform in [-1, 1).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// An owned gate projection: one matrix, or down then up.
#[derive(Clone)]
pub enum Gate {
    Full(Vec<f32>),
    Low(Vec<f32>, Vec<f32>),
}

/// An owned f32 layer.
#[derive(Clone)]
pub struct Layer {
    pub cfg: KdaConfig,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub conv: [Vec<f32>; 3],
    pub a_log: Option<Vec<f32>>,
    pub dt_bias: Option<Vec<f32>>,
    pub decay: Gate,
    pub b: Vec<f32>,
    pub gate: Gate,
    pub o_norm: Vec<f32>,
    pub o_proj: Vec<f32>,
}

fn gate(cfg: &KdaConfig, form: GateProj, r: &mut Rng, scale_in: f32) -> Gate {
    let (hd, d) = (cfg.hidden, cfg.proj_dim());
    match form {
        GateProj::FullRank => Gate::Full(r.vec(d * hd, scale_in)),
        GateProj::LowRank { rank } => Gate::Low(
            r.vec(rank * hd, scale_in),
            r.vec(d * rank, 1.0 / (rank as f32).sqrt()),
        ),
    }
}

impl Layer {
    /// Random weights of a sensible scale (projections give O(1) values).
    pub fn random(cfg: KdaConfig, seed: u64) -> Layer {
        let mut r = Rng(seed);
        let (hd, d, h, w) = (cfg.hidden, cfg.proj_dim(), cfg.heads, cfg.conv_width);
        let s = 1.0 / (hd as f32).sqrt();
        let a_log = match cfg.decay_gate {
            DecayGate::Softplus => Some((0..h).map(|_| 0.5 + 0.5 * r.next()).collect()),
            DecayGate::LowerBound(_) => Some(r.vec(h, 0.5)),
        };
        Layer {
            cfg,
            q: r.vec(d * hd, s),
            k: r.vec(d * hd, s),
            v: r.vec(d * hd, s),
            conv: [r.vec(d * w, 0.7), r.vec(d * w, 0.7), r.vec(d * w, 0.7)],
            a_log,
            dt_bias: Some(r.vec(d, 0.5)),
            decay: gate(&cfg, cfg.decay_proj, &mut r, s),
            b: r.vec(h * hd, s),
            gate: gate(&cfg, cfg.output_gate, &mut r, s),
            o_norm: (0..cfg.head_dim).map(|_| 1.0 + 0.2 * r.next()).collect(),
            o_proj: r.vec(hd * d, 1.0 / (d as f32).sqrt()),
        }
    }

    /// The same layer with every matrix and input-side parameter rounded through bf16.
    pub fn rounded_bf16(&self) -> Layer {
        let rd = |v: &Vec<f32>| v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
        let rg = |g: &Gate| match g {
            Gate::Full(m) => Gate::Full(rd(m)),
            Gate::Low(a, b) => Gate::Low(rd(a), rd(b)),
        };
        Layer {
            cfg: self.cfg,
            q: rd(&self.q),
            k: rd(&self.k),
            v: rd(&self.v),
            conv: self.conv.clone(),
            a_log: self.a_log.clone(),
            dt_bias: self.dt_bias.clone(),
            decay: rg(&self.decay),
            b: rd(&self.b),
            gate: rg(&self.gate),
            o_norm: self.o_norm.clone(),
            o_proj: rd(&self.o_proj),
        }
    }

    pub fn weights<'a>(&'a self) -> KdaWeights<'a> {
        let cfg = &self.cfg;
        let (hd, d, h) = (cfg.hidden, cfg.proj_dim(), cfg.heads);
        fn m(data: &[f32], r: usize, c: usize) -> MatRef<'_> {
            MatRef::new("w", Data::F32(data), r, c).unwrap()
        }
        let g = |g: &'a Gate| match g {
            Gate::Full(x) => GateWeights::FullRank(m(x, d, hd)),
            Gate::Low(a, b) => {
                let rank = a.len() / hd;
                GateWeights::LowRank {
                    down: m(a, rank, hd),
                    up: m(b, d, rank),
                }
            }
        };
        KdaWeights {
            q_proj: m(&self.q, d, hd),
            k_proj: m(&self.k, d, hd),
            v_proj: m(&self.v, d, hd),
            q_conv: Data::F32(&self.conv[0]),
            k_conv: Data::F32(&self.conv[1]),
            v_conv: Data::F32(&self.conv[2]),
            a_log: self.a_log.as_deref().map(Data::F32),
            dt_bias: self.dt_bias.as_deref().map(Data::F32),
            decay_proj: g(&self.decay),
            b_proj: m(&self.b, h, hd),
            output_gate: g(&self.gate),
            o_norm: Data::F32(&self.o_norm),
            o_proj: m(&self.o_proj, hd, d),
        }
    }
}

/// Owned caches of N sequences.
#[derive(Clone, Debug, PartialEq)]
pub struct Caches {
    pub recurrent: Vec<f32>,
    pub conv: [Vec<f32>; 3],
}

impl Caches {
    pub fn zeros(cfg: &KdaConfig, n: usize) -> Caches {
        let (s, c) = (
            cfg.state_len().unwrap() * n,
            cfg.conv_state_len().unwrap() * n,
        );
        Caches {
            recurrent: vec![0.0; s],
            conv: [vec![0.0; c], vec![0.0; c], vec![0.0; c]],
        }
    }

    pub fn random(cfg: &KdaConfig, n: usize, seed: u64) -> Caches {
        let mut r = Rng(seed);
        let mut c = Caches::zeros(cfg, n);
        c.recurrent = r.vec(c.recurrent.len(), 0.5);
        for v in &mut c.conv {
            *v = r.vec(v.len(), 1.0);
        }
        c
    }

    pub fn as_mut(&mut self) -> CachesMut<'_> {
        let [q, k, v] = &mut self.conv;
        CachesMut {
            recurrent: &mut self.recurrent,
            conv_q: q,
            conv_k: k,
            conv_v: v,
        }
    }
}

/// The CPU reference: token-by-token recurrence, one thread.
pub fn cpu_forward(
    layer: &Layer,
    x: &[f32],
    cu: &[usize],
    caches: &mut Caches,
    init: InitialCaches,
) -> Vec<f32> {
    let cfg = &layer.cfg;
    let opts = ForwardOptions::recurrent();
    let t = x.len() / cfg.hidden;
    let mut ws = vec![0.0; kda_core::workspace_len(cfg, &opts, t.max(1), 1).unwrap()];
    let mut out = vec![0.0; x.len()];
    let batch = Batch {
        x,
        cu_seqlens: cu,
        out: &mut out,
    };
    KdaLayer::new(cfg, layer.weights(), opts)
        .unwrap()
        .forward(batch, caches.as_mut(), init, &mut ws, &Serial)
        .unwrap();
    out
}

/// The CPU reference decode step.
pub fn cpu_decode(layer: &Layer, x: &[f32], caches: &mut Caches) -> Vec<f32> {
    let cfg = &layer.cfg;
    let n = x.len() / cfg.hidden;
    let mut ws = vec![0.0; kda_core::decode_workspace_len(cfg, n.max(1)).unwrap()];
    let mut out = vec![0.0; x.len()];
    KdaLayer::new(cfg, layer.weights(), ForwardOptions::recurrent())
        .unwrap()
        .decode_step(x, &mut out, caches.as_mut(), &mut ws, &Serial)
        .unwrap();
    out
}

/// `RMS(a − b) / RMS(b)` in f64 (the absolute RMS when `b` is all zero).
pub fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
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

/// Worst rel-RMS over the output and every cache, with a label for messages.
pub fn compare(got_out: &[f32], got: &Caches, want_out: &[f32], want: &Caches) -> (f64, String) {
    let errs = [
        ("out", rel_rms(got_out, want_out)),
        ("state", rel_rms(&got.recurrent, &want.recurrent)),
        ("conv_q", rel_rms(&got.conv[0], &want.conv[0])),
        ("conv_k", rel_rms(&got.conv[1], &want.conv[1])),
        ("conv_v", rel_rms(&got.conv[2], &want.conv[2])),
    ];
    let worst = errs.iter().map(|e| e.1).fold(0.0, f64::max);
    let all_finite = got_out.iter().chain(&got.recurrent).all(|v| v.is_finite());
    let label = errs
        .iter()
        .map(|(n, e)| format!("{n} {e:.1e}"))
        .collect::<Vec<_>>()
        .join("  ");
    (if all_finite { worst } else { f64::INFINITY }, label)
}

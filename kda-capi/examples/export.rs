//! Writes seeded random layers as flat files for the C host example (`c/host_example.c`), and
//! the outputs the Rust API (kda-core, called directly) computes for them, in the text format
//! the C program prints. CI runs both and compares the text: bitwise equality.
//!
//! `cargo run -p kda-capi --example export -- <dir>` writes `<dir>/<variant>.kdal` and
//! `<dir>/<variant>.expected` for every variant.
//!
//! File format (little-endian), read by `c/kdal.h`:
//! `"KDAL"`, u32 version 1; config: u64 hidden, heads, head_dim, conv_width, u32 decay_gate,
//! f32 lower_bound, u64 decay_rank, output_gate_rank, f32 rms_eps, l2_eps, scale; options: u32
//! mode, u64 chunk_size, u32 isa; u32 path (0 float, 1 integer); 15 tensors in `KdaWeights`
//! order, each u32 dtype, u32 layout, u64 len, u64 scales_len, the elements, the scales (GGUF
//! blocks, dtype `KDA_DTYPE_GGUF_BASE + t`: `len` bytes; `KDA_DTYPE_GROUPS`: then u32 bits,
//! u32 scales dtype, u64 group size, rows, cols, packed words, scales, zero-point words, and
//! the packed words, scales and zero-point words); u64
//! prompt tokens T, u64 sequences N, N + 1 u64 offsets, T·hidden f32 prompt rows; u64 decode
//! steps, steps·N·hidden 4-byte decode inputs (f32, or Q15.16 i32 on the integer path).

use std::fmt::Write as _;
use std::io::Write as _;

use kda_core::fixed::{self, FixedCachesMut};
use kda_core::quant::{BlockFormat, Blocks, GroupFormat, GroupTensors, Groups, Scales};
use kda_core::{
    bf16, f16, Batch, CachesMut, Data, DecayGate, ForwardOptions, GateProj, GateWeights,
    InitialCaches, KdaConfig, KdaError, KdaLayer, KdaWeights, MatRef, Mode, Serial,
};

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [−a, a).
    fn uniform(&mut self, a: f32) -> f32 {
        ((self.next() >> 40) as f32 / 8_388_608.0 - 1.0) * a
    }

    fn vec(&mut self, n: usize, a: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(a)).collect()
    }
}

/// How a variant stores its weights.
#[derive(Clone, Copy, PartialEq)]
enum Store {
    /// f32, row-major.
    F32,
    /// Matrices bf16 in the panel layout, vectors and convs f16.
    Bf16Panels,
    /// Matrices and convs int8 (quantize_layer), vectors f32.
    I8,
    /// Matrices GGUF Q8_0 blocks (random quants and f16 scales), the rest f32.
    Q8_0,
    /// Matrices compressed-tensors int4 groups of 32, symmetric, bf16 scales (random).
    Int4G32,
    /// Matrices compressed-tensors int8 groups of 32 with zero points, f16 scales (random).
    Int8G32Asym,
}

/// The stored bytes of a layer's quantised matrices (random, in `KdaWeights` matrix order).
#[derive(Default)]
struct QBytes {
    blocks: Vec<Vec<u8>>,
    packed: Vec<Vec<u8>>,
    bf16: Vec<Vec<bf16>>,
    f16: Vec<Vec<f16>>,
    zeros: Vec<Vec<u8>>,
}

fn random_bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    (0..n).map(|_| (rng.next() >> 56) as u8).collect()
}

/// Random quantised versions of `o`'s matrices for `store`.
fn random_quantised(o: &Owned, store: Store, rng: &mut Rng) -> QBytes {
    let mut q = QBytes::default();
    for &(_, r, c) in &o.mats {
        let scale =
            |rng: &mut Rng, q: f32| (1.0 + 0.5 * rng.uniform(1.0)) / (q * (c as f32).sqrt());
        match store {
            Store::Q8_0 => {
                let mut b = Vec::new();
                for _ in 0..r * c / 32 {
                    b.extend_from_slice(&f16::from_f32(scale(rng, 127.0)).to_bits().to_le_bytes());
                    b.extend(random_bytes(rng, 32));
                }
                q.blocks.push(b);
            }
            Store::Int4G32 => {
                q.packed.push(random_bytes(rng, r * c / 2));
                q.bf16.push(
                    (0..r * c / 32)
                        .map(|_| bf16::from_f32(scale(rng, 8.0)))
                        .collect(),
                );
            }
            Store::Int8G32Asym => {
                q.packed.push(random_bytes(rng, r * c));
                q.f16.push(
                    (0..r * c / 32)
                        .map(|_| f16::from_f32(scale(rng, 128.0)))
                        .collect(),
                );
                q.zeros.push(random_bytes(rng, r.div_ceil(4) * 4 * c / 32));
            }
            _ => {}
        }
    }
    q
}

/// The [`Groups`] views of `q`'s group-quantised matrices.
fn groups<'a>(o: &Owned, q: &'a QBytes) -> Result<Vec<Groups<'a>>, KdaError> {
    let mut v = Vec::new();
    for (i, &(_, r, c)) in o.mats.iter().enumerate() {
        let (bits, scales, zeros) = match (q.bf16.get(i), q.f16.get(i)) {
            (Some(s), _) => (4, Scales::Bf16(s), None),
            (None, Some(s)) => (8, Scales::F16(s), q.zeros.get(i).map(|z| &z[..])),
            (None, None) => return Ok(v),
        };
        let t = GroupTensors {
            packed: &q.packed[i],
            scales,
            zeros,
        };
        v.push(Groups::new("w", GroupFormat { bits, group: 32 }, t, r, c)?);
    }
    Ok(v)
}

struct Variant {
    name: &'static str,
    cfg: KdaConfig,
    opts: ForwardOptions,
    store: Store,
    /// Integer path (decode steps only).
    fixed: bool,
    seq_lens: &'static [usize],
    steps: usize,
    seed: u64,
}

/// The owned f32 tensors of a layer, in `KdaWeights` order.
struct Owned {
    mats: Vec<(Vec<f32>, usize, usize)>,
    conv: [Vec<f32>; 3],
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    o_norm: Vec<f32>,
}

fn random_layer(cfg: &KdaConfig, rng: &mut Rng) -> Owned {
    let (hd, d, h, k) = (cfg.hidden, cfg.proj_dim(), cfg.heads, cfg.head_dim);
    let mut m = |r: usize, c: usize| (rng.vec(r * c, 1.0 / (c as f32).sqrt()), r, c);
    let mut mats = vec![m(d, hd), m(d, hd), m(d, hd)];
    for g in [cfg.decay_proj, cfg.output_gate] {
        match g {
            GateProj::FullRank => mats.push(m(d, hd)),
            GateProj::LowRank { rank } => {
                mats.push(m(rank, hd));
                mats.push(m(d, rank));
            }
        }
    }
    mats.push(m(hd, d));
    // b_proj goes after the decay projection: order q, k, v, decay.., b, gate.., o.
    let b = m(h, hd);
    let decay_n = if cfg.decay_proj == GateProj::FullRank {
        1
    } else {
        2
    };
    mats.insert(3 + decay_n, b);
    let w = cfg.conv_width;
    Owned {
        mats,
        conv: [
            rng.vec(d * w, 0.5),
            rng.vec(d * w, 0.5),
            rng.vec(d * w, 0.5),
        ],
        a_log: rng.vec(h, 1.0).iter().map(|v| v + 1.5).collect(),
        dt_bias: rng.vec(d, 1.0).iter().map(|v| v - 3.0).collect(),
        o_norm: rng.vec(k, 0.2).iter().map(|v| v + 1.0).collect(),
    }
}

/// Storage of the converted tensors (kept alive while the views are used).
#[derive(Default)]
struct Converted {
    bf16: Vec<Vec<bf16>>,
    f16: Vec<Vec<f16>>,
}

/// How a layer's matrices are stored: f32 in `Owned`, bf16 panels, or quantised.
#[derive(Clone, Copy)]
enum Mats<'a> {
    F32,
    Panels(&'a Converted),
    Blocks(&'a QBytes),
    Groups(&'a [Groups<'a>]),
}

fn views<'a>(cfg: &KdaConfig, o: &'a Owned, mats: Mats<'a>) -> Result<KdaWeights<'a>, KdaError> {
    let conv = match mats {
        Mats::Panels(cv) => Some(cv),
        _ => None,
    };
    let mats = o
        .mats
        .iter()
        .enumerate()
        .map(|(i, (v, r, c))| match mats {
            Mats::Panels(cv) => MatRef::new_panels("w", Data::Bf16(&cv.bf16[i]), *r, *c),
            Mats::F32 => MatRef::new("w", Data::F32(v), *r, *c),
            Mats::Blocks(q) => {
                let b = Blocks::new("w", BlockFormat::Q8_0, &q.blocks[i], r * c)?;
                MatRef::new("w", Data::Blocks(b), *r, *c)
            }
            Mats::Groups(g) => MatRef::new("w", Data::Groups(g[i].all_rows()), *r, *c),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut it = mats.into_iter();
    let mut next = || {
        it.next().ok_or(KdaError::Internal {
            what: "matrix count",
        })
    };
    let vecs: Vec<Data<'a>> = match conv {
        Some(cv) => cv.f16.iter().map(|v| Data::F16(v)).collect(),
        None => [
            &o.conv[0], &o.conv[1], &o.conv[2], &o.a_log, &o.dt_bias, &o.o_norm,
        ]
        .iter()
        .map(|v| Data::F32(v))
        .collect(),
    };
    let gate = |g: GateProj, next: &mut dyn FnMut() -> Result<MatRef<'a>, KdaError>| {
        Ok::<_, KdaError>(match g {
            GateProj::FullRank => GateWeights::FullRank(next()?),
            GateProj::LowRank { .. } => GateWeights::LowRank {
                down: next()?,
                up: next()?,
            },
        })
    };
    let (q, k, v) = (next()?, next()?, next()?);
    let decay_proj = gate(cfg.decay_proj, &mut next)?;
    let b_proj = next()?;
    let output_gate = gate(cfg.output_gate, &mut next)?;
    let o_proj = next()?;
    let w = KdaWeights {
        q_proj: q,
        k_proj: k,
        v_proj: v,
        q_conv: vecs[0],
        k_conv: vecs[1],
        v_conv: vecs[2],
        a_log: Some(vecs[3]),
        dt_bias: Some(vecs[4]),
        decay_proj,
        b_proj,
        output_gate,
        o_norm: vecs[5],
        o_proj,
    };
    w.validate(cfg)?;
    Ok(w)
}

fn convert(o: &Owned) -> Converted {
    let bf16 = o
        .mats
        .iter()
        .map(|(v, r, c)| {
            let rows: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            let m = MatRef::new("w", Data::Bf16(&rows), *r, *c).expect("shape");
            let mut p = vec![bf16::ZERO; kda_core::panels_len(*r, *c).expect("size")];
            kda_core::pack_panels(&m, &mut p).expect("pack");
            p
        })
        .collect();
    let f16 = [
        &o.conv[0], &o.conv[1], &o.conv[2], &o.a_log, &o.dt_bias, &o.o_norm,
    ]
    .iter()
    .map(|v| v.iter().map(|&x| f16::from_f32(x)).collect())
    .collect();
    Converted { bf16, f16 }
}

/// The flat file.
struct File(Vec<u8>);

impl File {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: usize) {
        self.0.extend_from_slice(&(v as u64).to_le_bytes());
    }
    fn f32(&mut self, v: f32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn config(&mut self, c: &KdaConfig, o: &ForwardOptions) {
        for v in [c.hidden, c.heads, c.head_dim, c.conv_width] {
            self.u64(v);
        }
        let (gate, lb) = match c.decay_gate {
            DecayGate::Softplus => (0, 0.0),
            DecayGate::LowerBound(lb) => (1, lb),
        };
        self.u32(gate);
        self.f32(lb);
        self.u64(c.decay_proj.rank());
        self.u64(c.output_gate.rank());
        self.f32(c.rms_eps);
        self.f32(c.l2_eps);
        self.f32(c.scale.unwrap_or(0.0));
        self.u32(match o.mode {
            Mode::Auto => 0,
            Mode::Recurrent => 1,
            Mode::Chunked => 2,
        });
        self.u64(o.chunk_size);
        self.u32(0); // KDA_ISA_AUTO: both sides pick the same path on the same machine.
    }

    fn tensor(&mut self, d: Option<Data<'_>>, panels: bool) {
        let Some(d) = d else {
            self.0.extend_from_slice(&[0; 24]);
            return;
        };
        let (dtype, bytes, scales): (u32, Vec<u8>, &[f32]) = match d {
            Data::F32(s) => (0, s.iter().flat_map(|v| v.to_le_bytes()).collect(), &[]),
            Data::Bf16(s) => (
                1,
                s.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                &[],
            ),
            Data::F16(s) => (
                2,
                s.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
                &[],
            ),
            Data::I8 { data, scales } => (3, data.iter().map(|&v| v as u8).collect(), scales),
            Data::Blocks(b) => {
                self.u32(kda_capi::KDA_DTYPE_GGUF_BASE + b.format().ggml_type());
                self.u32(0);
                self.u64(b.bytes().len());
                self.u64(0);
                self.0.extend_from_slice(b.bytes());
                return;
            }
            Data::Groups(g) => return self.groups(g.matrix()),
        };
        self.u32(dtype);
        self.u32(u32::from(panels));
        self.u64(d.len());
        self.u64(scales.len());
        self.0.extend_from_slice(&bytes);
        for &s in scales {
            self.f32(s);
        }
    }

    fn groups(&mut self, g: &Groups<'_>) {
        self.u32(kda_capi::KDA_DTYPE_GROUPS);
        self.u32(0);
        self.u64(g.rows() * g.cols());
        self.u64(0);
        let f = g.format();
        let (dtype, scales): (u32, Vec<u8>) = match g.scales() {
            Scales::F32(s) => (0, s.iter().flat_map(|v| v.to_le_bytes()).collect()),
            Scales::Bf16(s) => (
                1,
                s.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            ),
            Scales::F16(s) => (
                2,
                s.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect(),
            ),
        };
        let zeros = g.zeros().unwrap_or(&[]);
        self.u32(u32::from(f.bits));
        self.u32(dtype);
        for v in [f.group, g.rows(), g.cols(), g.packed().len() / 4] {
            self.u64(v);
        }
        self.u64(g.scales().len());
        self.u64(zeros.len() / 4);
        self.0.extend_from_slice(g.packed());
        self.0.extend_from_slice(&scales);
        self.0.extend_from_slice(zeros);
    }

    fn weights(&mut self, w: &KdaWeights<'_>) {
        let m = |f: &mut File, m: &MatRef<'_>| f.tensor(Some(m.data()), m.is_panels());
        m(self, &w.q_proj);
        m(self, &w.k_proj);
        m(self, &w.v_proj);
        for c in [w.q_conv, w.k_conv, w.v_conv] {
            self.tensor(Some(c), false);
        }
        self.tensor(w.a_log, false);
        self.tensor(w.dt_bias, false);
        for g in [&w.decay_proj, &w.output_gate] {
            match g {
                GateWeights::FullRank(x) => {
                    m(self, x);
                    self.tensor(None, false);
                }
                GateWeights::LowRank { down, up } => {
                    m(self, down);
                    m(self, up);
                }
            }
            if std::ptr::eq(g, &w.decay_proj) {
                m(self, &w.b_proj);
            }
        }
        self.tensor(Some(w.o_norm), false);
        m(self, &w.o_proj);
    }
}

fn hex_line(out: &mut String, label: &str, bits: impl Iterator<Item = u32>) {
    out.push_str(label);
    for b in bits {
        let _ = write!(out, " {b:08x}");
    }
    out.push('\n');
}

/// Runs the variant through kda-core directly; returns the expected text.
fn run_float(v: &Variant, w: KdaWeights<'_>, file: &mut File, rng: &mut Rng) -> String {
    let cfg = &v.cfg;
    let hd = cfg.hidden;
    let n = v.seq_lens.len();
    let mut cu = vec![0usize];
    for l in v.seq_lens {
        cu.push(cu.last().expect("non-empty") + l);
    }
    let t = *cu.last().expect("non-empty");
    let x = rng.vec(t * hd, 2.0);
    let dec = rng.vec(v.steps * n * hd, 2.0);
    file.u64(t);
    file.u64(n);
    for &c in &cu {
        file.u64(c);
    }
    x.iter().for_each(|&f| file.f32(f));
    file.u64(v.steps);
    dec.iter().for_each(|&f| file.f32(f));

    let layer = KdaLayer::new(cfg, w, v.opts).expect("valid layer");
    let (sl, cl) = (
        cfg.state_len().expect("ok"),
        cfg.conv_state_len().expect("ok"),
    );
    let mut state = vec![0f32; n * sl];
    let mut conv = vec![vec![0f32; n * cl]; 3];
    let longest = v.seq_lens.iter().copied().max().unwrap_or(1);
    let mut ws = vec![0f32; layer.workspace_len(longest, 1).expect("ws")];
    let mut out = vec![0f32; t * hd];
    let [cq, ck, cv] = &mut conv[..] else {
        unreachable!()
    };
    let mut caches = CachesMut {
        recurrent: &mut state,
        conv_q: cq,
        conv_k: ck,
        conv_v: cv,
    };
    let batch = Batch {
        x: &x,
        cu_seqlens: &cu,
        out: &mut out,
    };
    layer
        .forward(
            batch,
            caches.reborrow(),
            InitialCaches::Zero,
            &mut ws,
            &Serial,
        )
        .expect("forward");
    let mut text = String::new();
    for (i, row) in out.chunks_exact(hd).enumerate() {
        hex_line(
            &mut text,
            &format!("prefill {i}"),
            row.iter().map(|f| f.to_bits()),
        );
    }
    let mut dws = vec![0f32; layer.decode_workspace_len(n, 1).expect("ws")];
    let mut dout = vec![0f32; n * hd];
    for (s, xs) in dec.chunks_exact(n * hd).enumerate() {
        layer
            .decode_step(xs, &mut dout, caches.reborrow(), &mut dws, &Serial)
            .expect("decode");
        for (q, row) in dout.chunks_exact(hd).enumerate() {
            hex_line(
                &mut text,
                &format!("decode {s} {q}"),
                row.iter().map(|f| f.to_bits()),
            );
        }
    }
    let mut vf = vec![0f32; state.len()];
    kda_core::k_first_to_v_first(&state, &mut vf, cfg.head_dim, cfg.head_dim).expect("convert");
    hex_line(&mut text, "state_v_first", vf.iter().map(|f| f.to_bits()));
    text
}

fn run_fixed(v: &Variant, w: KdaWeights<'_>, file: &mut File, rng: &mut Rng) -> String {
    let cfg = &v.cfg;
    let (hd, n) = (cfg.hidden, v.seq_lens.len());
    let dec: Vec<i32> = rng
        .vec(v.steps * n * hd, 2.0)
        .iter()
        .map(|&f| fixed::to_q(f, fixed::ACT_FRAC))
        .collect();
    file.u64(0);
    file.u64(n);
    (0..=n).for_each(|_| file.u64(0));
    file.u64(v.steps);
    dec.iter().for_each(|&q| file.u32(q as u32));

    let mut params = vec![0i32; fixed::params_len(cfg).expect("len")];
    let fw = fixed::prepare(cfg, &w, &mut params).expect("prepare");
    let (sl, cl) = (
        cfg.state_len().expect("ok"),
        cfg.conv_state_len().expect("ok"),
    );
    let mut state = vec![0i32; n * sl];
    let mut conv = vec![vec![0i32; n * cl]; 3];
    let mut ws = vec![0i32; kda_core::fixed_workspace_len(cfg).expect("ws")];
    let mut out = vec![0i32; n * hd];
    let mut text = String::new();
    for (s, xs) in dec.chunks_exact(n * hd).enumerate() {
        let [cq, ck, cv] = &mut conv[..] else {
            unreachable!()
        };
        let caches = FixedCachesMut {
            recurrent: &mut state,
            conv_q: cq,
            conv_k: ck,
            conv_v: cv,
        };
        kda_core::decode_step_fixed(cfg, &fw, xs, caches, &mut out, &mut ws).expect("decode");
        for (q, row) in out.chunks_exact(hd).enumerate() {
            hex_line(
                &mut text,
                &format!("decode {s} {q}"),
                row.iter().map(|&i| i as u32),
            );
        }
    }
    hex_line(&mut text, "state", state.iter().map(|&i| i as u32));
    text
}

fn export(v: &Variant, dir: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let mut rng = Rng(v.seed);
    let owned = random_layer(&v.cfg, &mut rng);
    let conv = (v.store == Store::Bf16Panels).then(|| convert(&owned));
    let qbytes = random_quantised(&owned, v.store, &mut rng);
    let group_views = groups(&owned, &qbytes)?;
    let mats = match (v.store, conv.as_ref()) {
        (_, Some(cv)) => Mats::Panels(cv),
        (Store::Q8_0, _) => Mats::Blocks(&qbytes),
        (Store::Int4G32 | Store::Int8G32Asym, _) => Mats::Groups(&group_views),
        _ => Mats::F32,
    };
    let w = views(&v.cfg, &owned, mats)?;
    let q = kda_core::quantized_len(&v.cfg, true)?;
    let (mut qd, mut qs) = (vec![0i8; q.weights], vec![0f32; q.scales]);
    let w = if v.store == Store::I8 {
        kda_core::quantize_layer(&v.cfg, &w, &mut qd, &mut qs, true)?
    } else {
        w
    };
    let mut file = File(b"KDAL".to_vec());
    file.u32(1);
    file.config(&v.cfg, &v.opts);
    file.u32(u32::from(v.fixed));
    file.weights(&w);
    let text = if v.fixed {
        run_fixed(v, w, &mut file, &mut rng)
    } else {
        run_float(v, w, &mut file, &mut rng)
    };
    write_atomic(&dir.join(format!("{}.kdal", v.name)), &file.0)?;
    write_atomic(&dir.join(format!("{}.expected", v.name)), text.as_bytes())?;
    Ok(())
}

/// Temp file + fsync + rename.
fn write_atomic(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}

fn variants() -> Vec<Variant> {
    let mut k3 = KdaConfig::kimi_k3(40, 3, 8);
    k3.conv_width = 3;
    let mut fixed_cfg = KdaConfig::kimi_k3(32, 2, 8);
    fixed_cfg.decay_proj = GateProj::LowRank { rank: 8 };
    vec![
        Variant {
            name: "f32_kimi_linear",
            cfg: KdaConfig::kimi_linear(48, 2, 16),
            opts: ForwardOptions::default(),
            store: Store::F32,
            fixed: false,
            seq_lens: &[11, 5],
            steps: 3,
            seed: 1,
        },
        Variant {
            name: "bf16_panels_k3",
            cfg: k3,
            opts: ForwardOptions::default().with_mode(Mode::Chunked),
            store: Store::Bf16Panels,
            fixed: false,
            seq_lens: &[20],
            steps: 2,
            seed: 2,
        },
        Variant {
            name: "i8_kimi_linear",
            cfg: KdaConfig::kimi_linear(32, 2, 8),
            opts: ForwardOptions::recurrent(),
            store: Store::I8,
            fixed: false,
            seq_lens: &[4, 0, 6],
            steps: 2,
            seed: 3,
        },
        Variant {
            name: "q8_0_kimi_linear",
            cfg: KdaConfig::kimi_linear(64, 2, 32),
            opts: ForwardOptions::default(),
            store: Store::Q8_0,
            fixed: false,
            seq_lens: &[9, 3],
            steps: 2,
            seed: 5,
        },
        Variant {
            name: "int4_g32_kimi_linear",
            cfg: KdaConfig::kimi_linear(64, 2, 32),
            opts: ForwardOptions::default(),
            store: Store::Int4G32,
            fixed: false,
            seq_lens: &[7, 6],
            steps: 2,
            seed: 6,
        },
        Variant {
            name: "int8_g32_asym_k3",
            cfg: KdaConfig::kimi_k3(64, 2, 32),
            opts: ForwardOptions::default().with_mode(Mode::Chunked),
            store: Store::Int8G32Asym,
            fixed: false,
            seq_lens: &[10],
            steps: 2,
            seed: 7,
        },
        Variant {
            name: "i8_fixed_k3",
            cfg: fixed_cfg,
            opts: ForwardOptions::default(),
            store: Store::I8,
            fixed: true,
            seq_lens: &[0, 0],
            steps: 5,
            seed: 4,
        },
    ]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: export <dir>")?;
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir)?;
    for v in variants() {
        export(&v, dir)?;
        println!("{}", v.name);
    }
    Ok(())
}

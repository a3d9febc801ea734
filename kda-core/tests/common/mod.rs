//! Shared by the int8 / integer-path tests: a seeded synthetic layer, a minimal safetensors
//! reader for the fla fixtures (kda-core has no JSON dependency), and error metrics.
#![allow(dead_code)]

use std::collections::HashMap;

use kda_core::{Data, DecayGate, GateProj, GateWeights, KdaConfig, KdaWeights, MatRef};

/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [−1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / 8_388_608.0 - 1.0
    }

    /// Approximately standard normal.
    pub fn normal(&mut self) -> f32 {
        (self.uniform() + self.uniform() + self.uniform() + self.uniform()) * 0.866_025_4
    }

    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// A layer's tensors, owned, by checkpoint name (f32).
pub struct Layer {
    pub cfg: KdaConfig,
    pub t: HashMap<String, Vec<f32>>,
}

impl Layer {
    /// Seeded synthetic weights with fla's initialisation of `A_log` / `dt_bias`.
    pub fn synthetic(cfg: KdaConfig, seed: u64) -> Layer {
        let mut r = Rng(seed);
        let (hd, d, h, k, w) = (
            cfg.hidden,
            cfg.proj_dim(),
            cfg.heads,
            cfg.head_dim,
            cfg.conv_width,
        );
        let mut t = HashMap::new();
        let mut m = |t: &mut HashMap<String, Vec<f32>>, name: &str, rows: usize, cols: usize| {
            t.insert(
                name.to_string(),
                r.normals(rows * cols, 1.0 / (cols as f32).sqrt()),
            );
        };
        m(&mut t, "q_proj.weight", d, hd);
        m(&mut t, "k_proj.weight", d, hd);
        m(&mut t, "v_proj.weight", d, hd);
        match cfg.decay_proj {
            GateProj::FullRank => m(&mut t, "f_proj.weight", d, hd),
            GateProj::LowRank { rank } => {
                m(&mut t, "f_a_proj.weight", rank, hd);
                m(&mut t, "f_b_proj.weight", d, rank);
            }
        }
        m(&mut t, "b_proj.weight", h, hd);
        match cfg.output_gate {
            GateProj::FullRank => m(&mut t, "g_proj.weight", d, hd),
            GateProj::LowRank { rank } => {
                m(&mut t, "g_a_proj.weight", rank, hd);
                m(&mut t, "g_b_proj.weight", d, rank);
            }
        }
        m(&mut t, "o_proj.weight", hd, d);
        for c in ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"] {
            t.insert(c.into(), r.normals(d * w, 0.5));
        }
        t.insert(
            "A_log".into(),
            (0..h)
                .map(|_| (1.0 + 7.5 * (r.uniform() + 1.0)).ln())
                .collect(),
        );
        t.insert(
            "dt_bias".into(),
            (0..d)
                .map(|_| {
                    let u = (r.uniform() + 1.0) * 0.5;
                    let dt = (1e-3f32.ln() + u * (1e-1f32.ln() - 1e-3f32.ln())).exp();
                    dt.exp_m1().ln()
                })
                .collect(),
        );
        t.insert(
            "o_norm.weight".into(),
            (0..k).map(|_| 1.0 + 0.1 * r.normal()).collect(),
        );
        Layer { cfg, t }
    }

    fn d(&self, name: &str) -> Data<'_> {
        Data::F32(&self.t[name])
    }

    fn m(&self, name: &str, rows: usize, cols: usize) -> MatRef<'_> {
        MatRef::new("w", self.d(name), rows, cols).unwrap()
    }

    fn gate(&self, form: GateProj, full: &str, a: &str, b: &str) -> GateWeights<'_> {
        let (hd, d) = (self.cfg.hidden, self.cfg.proj_dim());
        match form {
            GateProj::FullRank => GateWeights::FullRank(self.m(full, d, hd)),
            GateProj::LowRank { rank } => GateWeights::LowRank {
                down: self.m(a, rank, hd),
                up: self.m(b, d, rank),
            },
        }
    }

    /// f32 views of every weight.
    pub fn weights(&self) -> KdaWeights<'_> {
        let (hd, d, h) = (self.cfg.hidden, self.cfg.proj_dim(), self.cfg.heads);
        KdaWeights {
            q_proj: self.m("q_proj.weight", d, hd),
            k_proj: self.m("k_proj.weight", d, hd),
            v_proj: self.m("v_proj.weight", d, hd),
            q_conv: self.d("q_conv1d.weight"),
            k_conv: self.d("k_conv1d.weight"),
            v_conv: self.d("v_conv1d.weight"),
            a_log: self.t.get("A_log").map(|v| Data::F32(v)),
            dt_bias: self.t.get("dt_bias").map(|v| Data::F32(v)),
            decay_proj: self.gate(
                self.cfg.decay_proj,
                "f_proj.weight",
                "f_a_proj.weight",
                "f_b_proj.weight",
            ),
            b_proj: self.m("b_proj.weight", h, hd),
            output_gate: self.gate(
                self.cfg.output_gate,
                "g_proj.weight",
                "g_a_proj.weight",
                "g_b_proj.weight",
            ),
            o_norm: self.d("o_norm.weight"),
            o_proj: self.m("o_proj.weight", hd, d),
        }
    }
}

/// Owned int8 buffers for `kda_core::quantize_layer`.
pub struct Quantised {
    pub q: Vec<i8>,
    pub s: Vec<f32>,
}

impl Quantised {
    pub fn for_cfg(cfg: &KdaConfig, conv: bool) -> Quantised {
        let n = kda_core::quantized_len(cfg, conv).unwrap();
        Quantised {
            q: vec![0; n.weights],
            s: vec![0.0; n.scales],
        }
    }
}

/// `RMS(a − b) / RMS(b)` in f64.
pub fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut n, mut d) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        n += (g as f64 - w as f64).powi(2);
        d += (w as f64).powi(2);
    }
    if d == 0.0 {
        n.sqrt()
    } else {
        (n / d).sqrt()
    }
}

// ---------------------------------------------------------------------------------------------
// Minimal safetensors / JSON reading (the header is a flat JSON object).

#[derive(Debug, Clone)]
pub enum Json {
    Str(String),
    Num(f64),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
    Other,
}

impl Json {
    pub fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(v) => v.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn str(&self) -> &str {
        match self {
            Json::Str(s) => s,
            _ => panic!("not a string: {self:?}"),
        }
    }

    pub fn nums(&self) -> Vec<usize> {
        match self {
            Json::Arr(v) => v
                .iter()
                .map(|x| match x {
                    Json::Num(n) => *n as usize,
                    _ => panic!("not a number"),
                })
                .collect(),
            _ => panic!("not an array"),
        }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn value(&mut self) -> Json {
        self.ws();
        match self.b[self.i] {
            b'{' => {
                self.i += 1;
                let mut v = Vec::new();
                loop {
                    self.ws();
                    if self.b[self.i] == b'}' {
                        self.i += 1;
                        return Json::Obj(v);
                    }
                    let Json::Str(k) = self.value() else {
                        panic!("key")
                    };
                    self.ws();
                    assert_eq!(self.b[self.i], b':');
                    self.i += 1;
                    let val = self.value();
                    v.push((k, val));
                    self.ws();
                    if self.b[self.i] == b',' {
                        self.i += 1;
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut v = Vec::new();
                loop {
                    self.ws();
                    if self.b[self.i] == b']' {
                        self.i += 1;
                        return Json::Arr(v);
                    }
                    v.push(self.value());
                    self.ws();
                    if self.b[self.i] == b',' {
                        self.i += 1;
                    }
                }
            }
            b'"' => {
                self.i += 1;
                let mut s = String::new();
                while self.b[self.i] != b'"' {
                    if self.b[self.i] == b'\\' {
                        self.i += 1;
                    }
                    s.push(self.b[self.i] as char);
                    self.i += 1;
                }
                self.i += 1;
                Json::Str(s)
            }
            c if c == b'-' || c.is_ascii_digit() => {
                let st = self.i;
                while self.i < self.b.len()
                    && matches!(
                        self.b[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                Json::Num(
                    std::str::from_utf8(&self.b[st..self.i])
                        .unwrap()
                        .parse()
                        .unwrap(),
                )
            }
            _ => {
                while self.i < self.b.len() && self.b[self.i].is_ascii_alphabetic() {
                    self.i += 1;
                }
                Json::Other
            }
        }
    }
}

/// One fixture file: f32 tensors (bf16 widened), i64, u8 and f64 tensors, metadata.
pub struct Fixture {
    pub name: String,
    pub f: HashMap<String, (Vec<usize>, Vec<f32>)>,
    pub i: HashMap<String, Vec<i64>>,
    pub u8: HashMap<String, (Vec<usize>, Vec<u8>)>,
    pub f64: HashMap<String, Vec<f64>>,
    pub meta: HashMap<String, String>,
}

/// The committed fixtures, or `$KDA_FIXTURES_DIR` when set (test binaries run away from the
/// source tree, e.g. under an emulator).
pub fn fixtures_dir() -> std::path::PathBuf {
    match std::env::var_os("KDA_FIXTURES_DIR") {
        Some(dir) => dir.into(),
        None => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures"),
    }
}

pub fn layer_fixtures() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(fixtures_dir())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("layer_") && n.ends_with(".safetensors"))
        .collect();
    v.sort();
    v
}

impl Fixture {
    pub fn open(name: &str) -> Fixture {
        let bytes = std::fs::read(fixtures_dir().join(name)).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = Parser {
            b: &bytes[8..8 + n],
            i: 0,
        }
        .value();
        let data = &bytes[8 + n..];
        let (mut f, mut i, mut meta) = (HashMap::new(), HashMap::new(), HashMap::new());
        let (mut u8s, mut f64s) = (HashMap::new(), HashMap::new());
        let Json::Obj(entries) = header else {
            panic!("header")
        };
        for (k, v) in entries {
            if k == "__metadata__" {
                if let Json::Obj(m) = v {
                    for (mk, mv) in m {
                        meta.insert(mk, mv.str().to_string());
                    }
                }
                continue;
            }
            let shape = v.get("shape").unwrap().nums();
            let off = v.get("data_offsets").unwrap().nums();
            let raw = &data[off[0]..off[1]];
            match v.get("dtype").unwrap().str() {
                "F32" => {
                    let x = raw
                        .chunks_exact(4)
                        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    f.insert(k, (shape, x));
                }
                "BF16" => {
                    let x = raw
                        .chunks_exact(2)
                        .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                        .collect();
                    f.insert(k, (shape, x));
                }
                "I64" => {
                    i.insert(
                        k,
                        raw.chunks_exact(8)
                            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                            .collect(),
                    );
                }
                "U8" => {
                    u8s.insert(k, (shape, raw.to_vec()));
                }
                "F64" => {
                    f64s.insert(
                        k,
                        raw.chunks_exact(8)
                            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                            .collect(),
                    );
                }
                d => panic!("{name}: dtype {d}"),
            }
        }
        Fixture {
            name: name.into(),
            f,
            i,
            u8: u8s,
            f64: f64s,
            meta,
        }
    }

    fn num<T: std::str::FromStr>(&self, k: &str) -> T {
        self.meta[k].parse().ok().unwrap()
    }

    pub fn config(&self) -> KdaConfig {
        let decay_gate = match self.meta["decay_gate"].as_str() {
            "softplus" => DecayGate::Softplus,
            _ => DecayGate::LowerBound(self.num("lower_bound")),
        };
        let output_gate = match self.meta["output_gate"].as_str() {
            "low_rank" => GateProj::LowRank {
                rank: self.f["g_a_proj.weight"].0[0],
            },
            _ => GateProj::FullRank,
        };
        KdaConfig {
            hidden: self.num("hidden"),
            heads: self.num("heads"),
            head_dim: self.num("head_dim"),
            conv_width: self.num("conv_width"),
            decay_gate,
            decay_proj: GateProj::LowRank {
                rank: self.f["f_a_proj.weight"].0[0],
            },
            output_gate,
            rms_eps: self.num("rms_eps"),
            l2_eps: self.num("l2_eps"),
            scale: None,
        }
    }

    /// The weights as a [`Layer`] (bf16 widened to f32, exactly).
    pub fn layer(&self) -> Layer {
        let mut t = HashMap::new();
        for (k, (_, v)) in &self.f {
            if !(k.starts_with("inter.")
                || k.starts_with("initial_")
                || k.starts_with("final_")
                || k == "output"
                || k == "hidden_states")
            {
                t.insert(k.clone(), v.clone());
            }
        }
        Layer {
            cfg: self.config(),
            t,
        }
    }

    pub fn f32(&self, k: &str) -> Vec<f32> {
        self.f[k].1.clone()
    }

    pub fn cu_seqlens(&self) -> Vec<usize> {
        self.i["cu_seqlens"].iter().map(|&v| v as usize).collect()
    }
}

//! Shared helpers of the integration tests: temp dirs, the `kda` binary, fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use half::bf16;
use kda_core::{DecayGate, GateProj, KdaConfig};
use kda_host::checkpoint::safetensors::{OutTensor, SafetensorsFile};
use kda_host::layer::{OwnedData, OwnedGate, OwnedMat};
use kda_host::OwnedLayer;
use safetensors::Dtype;

/// A fresh empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "kda-host-test-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the built `kda` binary.
pub fn kda(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kda"))
        .args(args)
        .env_remove("KDA_LOG")
        .output()
        .expect("run kda")
}

/// Runs `kda` and asserts success.
pub fn kda_ok(args: &[&str]) -> String {
    let o = kda(args);
    assert!(
        o.status.success(),
        "kda {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `kda`, asserts a non-zero exit with exactly one stderr line starting `error:` that
/// contains every `culprit`; returns the line.
pub fn kda_err(args: &[&str], culprits: &[&str]) -> String {
    let o = kda(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "kda {args:?} succeeded; stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "kda {args:?}: stderr is not one line:\n{err}"
    );
    let line = lines[0];
    assert!(line.starts_with("error: "), "{line}");
    assert!(
        !line.contains("internal:"),
        "reached the panic hook: {line}"
    );
    assert!(
        !line.contains("panicked") && !line.contains("backtrace"),
        "{line}"
    );
    for c in culprits {
        assert!(line.contains(c), "kda {args:?}: `{c}` not named in: {line}");
    }
    line.to_string()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The committed fla fixtures.
pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// A fixture file, read with the crate's own safetensors reader.
pub struct Fixture(pub SafetensorsFile);

impl Fixture {
    pub fn open(name: &str) -> Self {
        Fixture(SafetensorsFile::read(&fixture_path(name)).unwrap())
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.get(name).is_some()
    }

    pub fn shape(&self, name: &str) -> Vec<usize> {
        self.0.entry(name).unwrap().shape.clone()
    }

    pub fn f32(&self, name: &str) -> Vec<f32> {
        self.0.f32_tensor(name, None, false).unwrap()
    }

    pub fn data(&self, name: &str) -> OwnedData {
        let e = self.0.entry(name).unwrap();
        let raw = self.0.bytes(e);
        match e.dtype {
            Dtype::F32 => OwnedData::F32(self.f32(name)),
            Dtype::BF16 => OwnedData::Bf16(
                raw.chunks_exact(2)
                    .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            d => panic!("{name}: dtype {d:?}"),
        }
    }

    pub fn cu_seqlens(&self) -> Vec<usize> {
        self.0
            .int_tensor("cu_seqlens")
            .unwrap()
            .iter()
            .map(|&v| v as usize)
            .collect()
    }

    fn meta(&self, key: &str) -> String {
        self.0.header.metadata[key].clone()
    }

    fn num(&self, key: &str) -> usize {
        self.meta(key).parse().unwrap()
    }

    pub fn config(&self) -> KdaConfig {
        KdaConfig {
            hidden: self.num("hidden"),
            heads: self.num("heads"),
            head_dim: self.num("head_dim"),
            conv_width: self.num("conv_width"),
            decay_gate: match self.meta("decay_gate").as_str() {
                "softplus" => DecayGate::Softplus,
                _ => DecayGate::LowerBound(self.meta("lower_bound").parse().unwrap()),
            },
            decay_proj: GateProj::LowRank {
                rank: self.shape("f_a_proj.weight")[0],
            },
            output_gate: match self.meta("output_gate").as_str() {
                "low_rank" => GateProj::LowRank {
                    rank: self.shape("g_a_proj.weight")[0],
                },
                _ => GateProj::FullRank,
            },
            rms_eps: self.meta("rms_eps").parse().unwrap(),
            l2_eps: self.meta("l2_eps").parse().unwrap(),
            scale: None,
        }
    }

    fn mat(&self, name: &str) -> OwnedMat {
        let sh = self.shape(name);
        OwnedMat {
            data: self.data(name),
            rows: sh[0],
            cols: sh[1..].iter().product(),
        }
    }

    pub fn layer(&self) -> OwnedLayer {
        let gate = |full: &str, a: &str, b: &str| {
            if self.has(full) {
                OwnedGate::FullRank(self.mat(full))
            } else {
                OwnedGate::LowRank(self.mat(a), self.mat(b))
            }
        };
        OwnedLayer {
            cfg: self.config(),
            qkv: [
                self.mat("q_proj.weight"),
                self.mat("k_proj.weight"),
                self.mat("v_proj.weight"),
            ],
            conv: ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"].map(|n| self.data(n)),
            a_log: Some(self.data("A_log")),
            dt_bias: Some(self.data("dt_bias")),
            decay_proj: gate("f_proj.weight", "f_a_proj.weight", "f_b_proj.weight"),
            b_proj: self.mat("b_proj.weight"),
            output_gate: gate("g_proj.weight", "g_a_proj.weight", "g_b_proj.weight"),
            o_norm: self.data("o_norm.weight"),
            o_proj: self.mat("o_proj.weight"),
        }
    }

    /// Writes the fixture's initial states (all four tensors) as a state file.
    pub fn write_initial_state(&self, path: &Path) {
        let t: Vec<OutTensor> = [
            ("initial_recurrent_state", "recurrent_state"),
            ("initial_conv_state_q", "conv_state_q"),
            ("initial_conv_state_k", "conv_state_k"),
            ("initial_conv_state_v", "conv_state_v"),
        ]
        .iter()
        .map(|(from, to)| OutTensor::f32(*to, self.shape(from), &self.f32(from)))
        .collect();
        kda_host::checkpoint::safetensors::write_file(path, &t, &Default::default()).unwrap();
    }
}

/// `RMS(a − b) / RMS(b)` in f64.
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

/// Reads a state file's four tensors as f32 (recurrent, q, k, v).
pub fn read_state_tensors(path: &Path) -> [Vec<f32>; 4] {
    let f = SafetensorsFile::read(path).unwrap();
    [
        "recurrent_state",
        "conv_state_q",
        "conv_state_k",
        "conv_state_v",
    ]
    .map(|n| f.f32_tensor(n, None, true).unwrap())
}

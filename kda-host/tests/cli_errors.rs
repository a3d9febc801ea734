//! Bad input to `kda`: every case exits non-zero with one `error:` line on stderr that names
//! the file, tensor or option at fault (and never reaches the panic hook).

mod common;

use std::path::{Path, PathBuf};

use common::*;
use kda_core::KdaConfig;
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, ExportOptions};
use kda_host::checkpoint::safetensors::{write_file, OutTensor, SafetensorsFile};
use kda_host::io::write_input;
use kda_host::rng::Rng;
use kda_host::state_file::write_state;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};
use safetensors::Dtype;

const HIDDEN: usize = 8;
const Q: &str = "model.layers.0.self_attn.q_proj.weight";

/// A tiny Kimi Linear checkpoint (layer 0 KDA, layer 1 full attention), a valid input of
/// 2 sequences, and a valid state file for them.
struct Setup {
    dir: TempDir,
    cfg: KdaConfig,
}

impl Setup {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let cfg = KdaConfig::kimi_linear(HIDDEN, 2, 4);
        let l = OwnedLayer::random(cfg, WeightDtype::Bf16, 1).unwrap();
        export_dir(
            &dir.path("ckpt"),
            &[(0, &l)],
            &ExportOptions::published(Layout::KimiLinear, 2),
        )
        .unwrap();
        let x = Rng::new(2).normals(5 * HIDDEN, 1.0);
        write_input(&dir.path("in.st"), &x, HIDDEN, Some(&[0, 2, 5])).unwrap();
        write_state(
            &dir.path("state.st"),
            &cfg,
            &SequenceCaches::new(&cfg, 2).unwrap(),
        )
        .unwrap();
        Setup { dir, cfg }
    }

    fn ckpt(&self) -> PathBuf {
        self.dir.path("ckpt")
    }

    fn weights(&self) -> PathBuf {
        self.ckpt().join("model.safetensors")
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path(name)
    }

    /// `kda forward` on the checkpoint and `in.st`, plus `extra`; expects the error.
    fn fails(&self, extra: &[&str], culprits: &[&str]) -> String {
        self.fails_with_input(&self.p("in.st"), extra, culprits)
    }

    fn fails_with_input(&self, input: &Path, extra: &[&str], culprits: &[&str]) -> String {
        let (out, ckpt) = (self.p("out.st"), self.ckpt());
        let args = [
            &[
                "forward",
                "--model",
                s(&ckpt),
                "--input",
                s(input),
                "--output",
                s(&out),
            ][..],
            extra,
        ]
        .concat();
        let line = kda_err(&args, culprits);
        println!("{line}");
        line
    }

    fn succeeds(&self, extra: &[&str]) {
        let (out, ckpt, inp) = (self.p("out.st"), self.ckpt(), self.p("in.st"));
        kda_ok(
            &[
                &[
                    "forward",
                    "--model",
                    s(&ckpt),
                    "--input",
                    s(&inp),
                    "--output",
                    s(&out),
                ][..],
                extra,
            ]
            .concat(),
        );
    }
}

/// Reads every tensor of a safetensors file.
fn tensors(path: &Path) -> Vec<OutTensor> {
    let f = SafetensorsFile::read(path).unwrap();
    let mut v: Vec<OutTensor> = f
        .header
        .tensors
        .iter()
        .map(|(n, e)| OutTensor {
            name: n.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            bytes: f.bytes(e).to_vec(),
        })
        .collect();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Rewrites a safetensors file after `edit`.
fn rewrite(path: &Path, edit: impl FnOnce(&mut Vec<OutTensor>)) {
    let mut t = tensors(path);
    edit(&mut t);
    write_file(path, &t, &Default::default()).unwrap();
}

fn find<'a>(t: &'a mut [OutTensor], name: &str) -> &'a mut OutTensor {
    t.iter_mut().find(|x| x.name == name).unwrap()
}

#[test]
fn valid_setup_runs() {
    let st = Setup::new("ok");
    st.succeeds(&[]);
    st.succeeds(&[
        "--state-in",
        s(&st.p("state.st")),
        "--layer",
        "0",
        "--mode",
        "recurrent",
    ]);
}

/// `--precision bf16` runs on the default panel layout, and is refused up front with
/// `--layout rows`.
#[test]
fn bf16_precision_needs_panels() {
    let st = Setup::new("bf16");
    st.succeeds(&["--precision", "bf16"]);
    st.fails(
        &["--precision", "bf16", "--layout", "rows"],
        &["--precision bf16 needs --layout panels"],
    );
}

#[test]
fn truncated_and_corrupt_safetensors() {
    let st = Setup::new("trunc");
    let w = st.weights();
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    st.fails(
        &[],
        &[
            "model.safetensors",
            "not a valid safetensors file",
            "truncated",
        ],
    );
    std::fs::write(&w, &bytes[..5]).unwrap();
    st.fails(&[], &["model.safetensors", "truncated"]);
    std::fs::write(&w, b"").unwrap();
    st.fails(&[], &["model.safetensors", "not a valid safetensors file"]);
    // Garbage in the JSON header.
    let mut b = bytes.clone();
    for v in &mut b[8..40] {
        *v = b'#';
    }
    std::fs::write(&w, &b).unwrap();
    st.fails(&[], &["model.safetensors", "not a valid safetensors file"]);
    // A header length past the end of the file.
    let mut b = bytes.clone();
    b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    std::fs::write(&w, &b).unwrap();
    st.fails(&[], &["model.safetensors", "not a valid safetensors file"]);
    // Extra bytes after the data.
    let mut b = bytes;
    b.extend_from_slice(&[0; 3]);
    std::fs::write(&w, &b).unwrap();
    st.fails(
        &[],
        &["model.safetensors", "does not end where the file ends"],
    );
}

#[test]
fn missing_tensor() {
    let st = Setup::new("missing");
    rewrite(&st.weights(), |t| {
        t.retain(|x| !x.name.ends_with("o_proj.weight"))
    });
    st.fails(
        &[],
        &[
            "model.safetensors",
            "missing tensor",
            "model.layers.0.self_attn.o_proj.weight",
        ],
    );
}

#[test]
fn wrong_shape() {
    let st = Setup::new("shape");
    rewrite(&st.weights(), |t| {
        let q = find(t, Q);
        q.shape = vec![q.shape[0] * q.shape[1]];
    });
    st.fails(&[], &[Q, "shape [64]", "expected [8, 8]"]);
    let st = Setup::new("alog");
    rewrite(&st.weights(), |t| {
        let a = find(t, "model.layers.0.self_attn.A_log");
        a.shape = vec![1, 2, 1, 1];
    });
    st.fails(
        &[],
        &["model.layers.0.self_attn.A_log", "shape [1, 2, 1, 1]"],
    );
}

#[test]
fn wrong_dtype() {
    let st = Setup::new("dtype");
    rewrite(&st.weights(), |t| {
        let q = find(t, Q);
        q.dtype = Dtype::I16; // same size as BF16
    });
    st.fails(&[], &[Q, "dtype I16", "expected F32, BF16 or F16"]);
}

#[test]
fn quantised_tensor_outside_the_read_forms() {
    let st = Setup::new("quant");
    rewrite(&st.weights(), |t| {
        let q = find(t, Q);
        q.name = format!("{Q}_packed");
        q.dtype = Dtype::U8;
        q.shape = vec![q.shape[0], q.shape[1] * 2];
    });
    st.fails(
        &[],
        &["q_proj.weight_packed", "quantization_config", "quantised"],
    );
    let st = Setup::new("fp8");
    rewrite(&st.weights(), |t| {
        let q = find(t, Q);
        q.dtype = Dtype::F8_E4M3;
        q.bytes.truncate(q.bytes.len() / 2);
    });
    st.fails(&[], &[Q, "does not read", "F8_E4M3"]);
}

#[test]
fn bad_config() {
    let st = Setup::new("cfg");
    let c = st.ckpt().join("config.json");
    std::fs::write(&c, b"{not json").unwrap();
    st.fails(&[], &["config.json", "not valid JSON"]);
    std::fs::write(&c, br#"{"hidden_size": 8, "rms_norm_eps": 1e-5}"#).unwrap();
    st.fails(&[], &["config.json", "linear_attn_config"]);
    std::fs::write(&c, br#"{"text_config": {"hidden_size": 8}}"#).unwrap();
    st.fails(&[], &["config.json", "text_config.linear_attn_config"]);
    std::fs::write(
        &c,
        br#"{"hidden_size": 8, "rms_norm_eps": 1e-5, "linear_attn_config": {"num_heads": 2, "head_dim": 4, "kda_layers": [1]}}"#,
    )
    .unwrap();
    st.fails(&[], &["config.json", "short_conv_kernel_size"]);
    // A config whose dims disagree with the tensors: the tensor is named.
    std::fs::write(
        &c,
        br#"{"hidden_size": 8, "rms_norm_eps": 1e-5, "linear_attn_config": {"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4, "kda_layers": [1]}}"#,
    )
    .unwrap();
    st.fails(&[], &[Q, "shape"]);
    // The output-gate form disagrees with the tensors: the missing one is named, with a hint.
    std::fs::write(
        &c,
        br#"{"hidden_size": 8, "rms_norm_eps": 1e-5, "linear_attn_config": {"num_heads": 2, "head_dim": 4, "short_conv_kernel_size": 4, "kda_layers": [1], "use_full_rank_gate": true}}"#,
    )
    .unwrap();
    st.fails(&[], &["g_proj.weight", "use_full_rank_gate"]);
    std::fs::remove_file(&c).unwrap();
    st.fails(&[], &["config.json"]);
}

#[test]
fn missing_folder_and_files() {
    let st = Setup::new("files");
    let out = st.p("out.st");
    kda_err(
        &[
            "forward",
            "--model",
            s(&st.p("nope")),
            "--input",
            s(&st.p("in.st")),
            "--output",
            s(&out),
        ],
        &["nope", "no such directory"],
    );
    st.fails_with_input(&st.p("absent.st"), &[], &["absent.st"]);
    std::fs::remove_file(st.weights()).unwrap();
    st.fails(&[], &["ckpt", "model.safetensors"]);
}

#[test]
fn sharded_index_problems() {
    let st = Setup::new("shards");
    let fx = OwnedLayer::random(st.cfg, WeightDtype::F32, 3).unwrap();
    let ck = st.p("sharded");
    export_dir(
        &ck,
        &[(0, &fx)],
        &ExportOptions {
            shards: 3,
            ..ExportOptions::published(Layout::KimiK3, 1)
        },
    )
    .unwrap();
    let shard = "model-00002-of-00003.safetensors";
    let run = |culprits: &[&str]| {
        kda_err(
            &[
                "forward",
                "--model",
                s(&ck),
                "--input",
                s(&st.p("in.st")),
                "--output",
                s(&st.p("o")),
            ],
            culprits,
        )
    };
    let bytes = std::fs::read(ck.join(shard)).unwrap();
    // A shard listed in the index holds less than the index says.
    rewrite(&ck.join(shard), |t| {
        t.remove(0);
    });
    let line = run(&[shard, "missing tensor", "the index"]);
    println!("{line}");
    // A shard is gone.
    std::fs::remove_file(ck.join(shard)).unwrap();
    println!("{}", run(&[shard]));
    std::fs::write(ck.join(shard), bytes).unwrap();
    // The index is not JSON / points outside the folder.
    let ix = ck.join("model.safetensors.index.json");
    std::fs::write(&ix, b"[").unwrap();
    println!(
        "{}",
        run(&["model.safetensors.index.json", "not valid JSON"])
    );
    std::fs::write(&ix, br#"{"weight_map": {"a": "../x.safetensors"}}"#).unwrap();
    println!(
        "{}",
        run(&["model.safetensors.index.json", "../x.safetensors"])
    );
}

#[test]
fn non_kda_layer() {
    let st = Setup::new("layer");
    st.fails(
        &["--layer", "1"],
        &["--layer 1", "not a KDA layer", "full-attention"],
    );
    st.fails(
        &["--layer", "7"],
        &["--layer 7", "not a KDA layer", "2 layers"],
    );
    st.fails(&["--layer", "-1"], &["--layer"]);
}

#[test]
fn input_problems() {
    let st = Setup::new("input");
    let x = Rng::new(2).normals(5 * 6, 1.0);
    let bad = st.p("bad.st");
    write_input(&bad, &x, 6, None).unwrap();
    st.fails_with_input(
        &bad,
        &[],
        &["bad.st", "hidden_states", "width 6", "hidden size is 8"],
    );
    // Wrong rank.
    write_file(
        &bad,
        &[OutTensor::f32("hidden_states", vec![40], &[0.0; 40])],
        &Default::default(),
    )
    .unwrap();
    st.fails_with_input(&bad, &[], &["bad.st", "hidden_states", "shape [40]"]);
    // Missing rows.
    write_file(
        &bad,
        &[OutTensor::f32("x", vec![5, 8], &[0.0; 40])],
        &Default::default(),
    )
    .unwrap();
    st.fails_with_input(&bad, &[], &["bad.st", "missing tensor `hidden_states`"]);
    // Wrong dtype.
    write_file(
        &bad,
        &[OutTensor {
            name: "hidden_states".into(),
            dtype: Dtype::I32,
            shape: vec![5, 8],
            bytes: vec![0; 160],
        }],
        &Default::default(),
    )
    .unwrap();
    st.fails_with_input(&bad, &[], &["bad.st", "hidden_states", "dtype I32"]);
    // Not safetensors at all.
    std::fs::write(&bad, b"hello").unwrap();
    st.fails_with_input(&bad, &[], &["bad.st", "not a valid safetensors file"]);
}

#[test]
fn bad_cu_seqlens() {
    let st = Setup::new("cu");
    let x = Rng::new(2).normals(5 * HIDDEN, 1.0);
    let bad = st.p("cu.st");
    let write = |cu: &[i64], dtype: Dtype| {
        let mut t = vec![OutTensor::f32("hidden_states", vec![5, HIDDEN], &x)];
        let c = match dtype {
            Dtype::I64 => OutTensor::i64("cu_seqlens", cu),
            _ => OutTensor {
                name: "cu_seqlens".into(),
                dtype: Dtype::I32,
                shape: vec![cu.len()],
                bytes: cu.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect(),
            },
        };
        t.push(c);
        write_file(&bad, &t, &Default::default()).unwrap();
    };
    for (cu, why) in [
        (&[1, 5][..], "must start at 0"),
        (&[0, 4, 2, 5][..], "non-decreasing"),
        (&[0, 4][..], "must end at T"),
        (&[0, 2, 7][..], "must end at T"),
        (&[][..], "is empty"),
        (&[0][..], "one entry"),
        (&[0, -3, 5][..], "non-decreasing"),
    ] {
        for dt in [Dtype::I64, Dtype::I32] {
            write(cu, dt);
            st.fails_with_input(&bad, &[], &["cu.st", "cu_seqlens", why]);
        }
    }
    write_file(
        &bad,
        &[
            OutTensor::f32("hidden_states", vec![5, HIDDEN], &x),
            OutTensor::f32("cu_seqlens", vec![2], &[0.0, 5.0]),
        ],
        &Default::default(),
    )
    .unwrap();
    st.fails_with_input(
        &bad,
        &[],
        &["cu.st", "cu_seqlens", "dtype F32", "I64 or I32"],
    );
}

#[test]
fn bad_state_files() {
    let st = Setup::new("state");
    let bad = st.p("s.st");
    // N = 3, but the input has 2 sequences.
    write_state(&bad, &st.cfg, &SequenceCaches::new(&st.cfg, 3).unwrap()).unwrap();
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "recurrent_state", "3 sequences", "input has 2"],
    );
    // A state of another layer size.
    let other = KdaConfig::kimi_linear(HIDDEN, 2, 2);
    write_state(&bad, &other, &SequenceCaches::new(&other, 2).unwrap()).unwrap();
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "recurrent_state", "expected [2, 2, 4, 4]"],
    );
    // One conv state with the wrong shape, one with the wrong N.
    std::fs::copy(st.p("state.st"), &bad).unwrap();
    rewrite(&bad, |t| {
        let c = find(t, "conv_state_k");
        c.shape = vec![2, 3, 8];
    });
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "conv_state_k", "shape [2, 3, 8]"],
    );
    std::fs::copy(st.p("state.st"), &bad).unwrap();
    rewrite(&bad, |t| {
        let c = find(t, "conv_state_v");
        c.shape = vec![1, 8, 6];
    });
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "conv_state_v", "1 sequences"],
    );
    // Missing tensor; wrong dtype.
    std::fs::copy(st.p("state.st"), &bad).unwrap();
    rewrite(&bad, |t| t.retain(|x| x.name != "conv_state_q"));
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "missing tensor `conv_state_q`"],
    );
    std::fs::copy(st.p("state.st"), &bad).unwrap();
    rewrite(&bad, |t| {
        let r = find(t, "recurrent_state");
        r.dtype = Dtype::I32;
    });
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "recurrent_state", "dtype I32"],
    );
    // Truncated.
    let b = std::fs::read(st.p("state.st")).unwrap();
    std::fs::write(&bad, &b[..b.len() - 4]).unwrap();
    st.fails(
        &["--state-in", s(&bad)],
        &["s.st", "not a valid safetensors file"],
    );
    // Absent.
    st.fails(&["--state-in", s(&st.p("none.st"))], &["none.st"]);
}

#[test]
fn bad_options_and_outputs() {
    let st = Setup::new("opts");
    st.fails(&["--threads", "0"], &["--threads", "at least 1"]);
    st.fails(&["--threads", "many"], &["--threads"]);
    st.fails(&["--mode", "fast"], &["--mode", "fast"]);
    st.fails(&["--bogus"], &["--bogus"]);
    let nodir = st.p("no/such/dir/out.st");
    st.fails(&["--state-out", s(&nodir)], &["no/such/dir/out.st"]);
    let out = st.p("no/such/out.st");
    kda_err(
        &[
            "forward",
            "--model",
            s(&st.ckpt()),
            "--input",
            s(&st.p("in.st")),
            "--output",
            s(&out),
        ],
        &["no/such/out.st"],
    );
    kda_err(&["forward", "--input", "x"], &["--model"]);
    kda_err(&["inspect", s(&st.p("nothing"))], &["nothing"]);
    kda_err(&["bench", "--batch", "0"], &["--batch"]);
    kda_err(&["bench", "--preset", "huge"], &["--preset", "huge"]);
    kda_err(&["bench", "--prefill-runs", "0"], &["--prefill-runs", "0"]);
    kda_err(
        &["bench", "--prefill-runs", "101"],
        &["--prefill-runs", "101"],
    );
    kda_err(&[], &["command"]);
    kda_err(&["frobnicate"], &["frobnicate"]);
    kda_err(&["bench", "--isa", "sse9"], &["--isa", "sse9"]);
    // A path this CPU lacks is refused before anything is measured.
    let lacking = if cfg!(target_arch = "x86_64") {
        "neon"
    } else {
        "avx2"
    };
    kda_err(&["bench", "--isa", lacking], &["--isa", lacking, "lacks"]);
}

/// `kda bench --isa` runs the layer, the FMA peak and the read reference on the path asked for
/// (the portable one runs everywhere), and says so.
#[test]
fn bench_runs_on_the_isa_asked_for() {
    let bench = |extra: &[&str]| {
        let args = [
            "bench",
            "--isa",
            "portable",
            "--prompt",
            "8",
            "--steps",
            "2",
            "--prefill-runs",
            "1",
            "--threads",
            "1",
        ];
        kda_ok(&[&args[..], extra].concat())
    };
    let out = bench(&[]);
    let patterns = format!(
        "(best of {} patterns:",
        kda_host::bench::READ_PATTERNS.len()
    );
    for want in [
        "ISA portable,",
        &patterns,
        "GFLOP/s per core, portable f32 multiply-adds",
        "decode: 2 steps",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    // The bf16 mode's prefill is compared with the bf16 dot products' peak, not the f32 one.
    let out = bench(&["--precision", "bf16"]);
    let want = "prefill vs the bf16 dot-product peak measured now";
    assert!(out.contains(want), "no {want:?} in:\n{out}");
}

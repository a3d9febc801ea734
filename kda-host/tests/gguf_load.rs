//! `Model::open` on GGUF files: the file llama.cpp's converter made
//! (`tests/fixtures/gguf/kimi-linear-tiny-q8_0.gguf`) against fla's reference on the weights
//! gguf-py dequantises from it, the same weights dequantised to f32 here, split sets, the CLI,
//! and hostile variants of the file (each a one-line error naming the file and the tensor or
//! key).

mod common;

use std::path::{Path, PathBuf};

use common::{fixture_path, kda_err, kda_ok, read_state_tensors, rel_rms, s, Fixture, TempDir};
use kda_core::quant::BlockFormat;
use kda_core::{Data, ForwardOptions, InitialCaches, KdaWeights, MatRef, Mode};
use kda_host::checkpoint::gguf::split::{split_name, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS};
use kda_host::checkpoint::gguf::{GgmlType, GgufFile, GgufWriter, Source, Value};
use kda_host::checkpoint::safetensors::{write_file, OutTensor};
use kda_host::checkpoint::Checkpoint;
use kda_host::layer::{OwnedData, OwnedGate, OwnedMat};
use kda_host::{Model, OwnedLayer, Runner, SequenceCaches};

const GGUF: &str = "gguf/kimi-linear-tiny-q8_0.gguf";
const REFERENCE: &str = "gguf/kimi-linear-tiny-q8_0-layer0.safetensors";

fn gguf() -> PathBuf {
    fixture_path(GGUF)
}

/// The fixture's initial caches (two sequences).
fn initial(f: &Fixture, cfg: &kda_core::KdaConfig) -> SequenceCaches {
    let mut c = SequenceCaches::new(cfg, 2).unwrap();
    c.recurrent = f.f32("initial_recurrent_state");
    c.conv_q = f.f32("initial_conv_state_q");
    c.conv_k = f.f32("initial_conv_state_k");
    c.conv_v = f.f32("initial_conv_state_v");
    c
}

/// Runs `w` over the reference fixture's tokens from its initial states: output and caches.
fn run(w: KdaWeights<'_>, cfg: &kda_core::KdaConfig, mode: Mode) -> (Vec<f32>, SequenceCaches) {
    let f = Fixture::open(REFERENCE);
    let layer = kda_core::KdaLayer::new(cfg, w, ForwardOptions::default().with_mode(mode)).unwrap();
    let mut caches = initial(&f, cfg);
    let out = Runner::default()
        .forward(
            &layer,
            &f.f32("hidden_states"),
            &f.cu_seqlens(),
            &mut caches,
            InitialCaches::Given,
        )
        .unwrap();
    (out, caches)
}

fn states(c: &SequenceCaches) -> [&[f32]; 4] {
    [&c.recurrent, &c.conv_q, &c.conv_k, &c.conv_v]
}

#[test]
fn the_converter_file_loads_in_place() {
    let m = Model::open(&gguf()).unwrap();
    let c = m.config();
    assert_eq!(
        (c.hidden, c.heads, c.head_dim, c.conv_width),
        (256, 2, 32, 4)
    );
    assert_eq!(
        (c.kda_layers.as_slice(), c.full_attn_layers.as_slice()),
        (&[0][..], &[1][..])
    );
    assert_eq!(c.num_layers, Some(2));
    let f = GgufFile::open(&gguf()).unwrap();
    let eps = f
        .metadata()
        .get_f32("kimi-linear.attention.layer_norm_rms_epsilon")
        .unwrap();
    assert_eq!(m.layer(0).unwrap().cfg.rms_eps, eps);
    let all = m.layer(0).unwrap().tensors.all();
    assert_eq!(all.len(), 15);
    let copied: Vec<&str> = all
        .iter()
        .filter(|t| !t.in_place())
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(copied, ["blk.0.ssm_a"], "only A_log (from ssm_a) is a copy");
    let (_, w) = m.weights(0).unwrap();
    for mat in [w.q_proj, w.k_proj, w.v_proj, w.b_proj, w.o_proj] {
        let Data::Blocks(b) = mat.data() else {
            panic!("a matrix is not Q8_0 blocks")
        };
        assert_eq!(b.format(), BlockFormat::Q8_0);
        // In place: the view's bytes are the file's own.
        let mapped = m.files()[0].buffer.as_ptr_range();
        assert!(mapped.contains(&b.bytes().as_ptr()));
    }
    let e = Model::open_layers(&gguf(), &[1]).unwrap_err().to_string();
    assert!(
        e.contains("layer 1 is not a KDA layer") && e.contains("full-attention"),
        "{e}"
    );
}

/// The layer on the file's Q8_0 blocks against fla's reference on gguf-py's dequantisation of
/// them (both sequence paths, packed sequences, initial states).
#[test]
fn forward_matches_fla_on_the_dequantised_weights() {
    let m = Model::open(&gguf()).unwrap();
    let (cfg, w) = m.weights(0).unwrap();
    let f = Fixture::open(REFERENCE);
    let want = f.f32("output");
    let want_states = [
        "final_recurrent_state",
        "final_conv_state_q",
        "final_conv_state_k",
        "final_conv_state_v",
    ]
    .map(|n| f.f32(n));
    for mode in [Mode::Recurrent, Mode::Chunked] {
        let (out, caches) = run(w, cfg, mode);
        let r = rel_rms(&out, &want);
        println!("{mode:?}: output rel-RMS vs fla {r:.2e}");
        assert!(r <= 1e-5, "{mode:?}: output rel-RMS {r:e}");
        for (got, want) in states(&caches).iter().zip(&want_states) {
            let r = rel_rms(got, want);
            assert!(r <= 1e-5, "{mode:?}: state rel-RMS {r:e}");
        }
    }
}

/// The dequantised copy of a loaded matrix.
fn dequantised(m: MatRef<'_>) -> OwnedMat {
    let d = m.data();
    let v: Vec<f32> = (0..d.len()).map(|i| d.get(i).unwrap()).collect();
    OwnedMat {
        data: OwnedData::F32(v),
        rows: m.rows(),
        cols: m.cols(),
    }
}

fn floats(d: Data<'_>) -> OwnedData {
    OwnedData::F32((0..d.len()).map(|i| d.get(i).unwrap()).collect())
}

/// The products on the blocks against f32 products on the same values dequantised.
#[test]
fn blocks_equal_their_dequantised_f32_layer() {
    let m = Model::open(&gguf()).unwrap();
    let (cfg, w) = m.weights(0).unwrap();
    let gate = |g: &kda_core::GateWeights<'_>| match g {
        kda_core::GateWeights::LowRank { down, up } => {
            OwnedGate::LowRank(dequantised(*down), dequantised(*up))
        }
        kda_core::GateWeights::FullRank(f) => OwnedGate::FullRank(dequantised(*f)),
    };
    let owned = OwnedLayer {
        cfg: *cfg,
        qkv: [w.q_proj, w.k_proj, w.v_proj].map(dequantised),
        conv: [w.q_conv, w.k_conv, w.v_conv].map(floats),
        a_log: w.a_log.map(floats),
        dt_bias: w.dt_bias.map(floats),
        decay_proj: gate(&w.decay_proj),
        b_proj: dequantised(w.b_proj),
        output_gate: gate(&w.output_gate),
        o_norm: floats(w.o_norm),
        o_proj: dequantised(w.o_proj),
    };
    let (got, gs) = run(w, cfg, Mode::Auto);
    let (want, ws) = run(owned.weights().unwrap(), cfg, Mode::Auto);
    let r = rel_rms(&got, &want);
    println!("Q8_0 blocks vs their f32 values: output rel-RMS {r:.2e}");
    assert!(r <= 1e-6, "{r:e}");
    for (g, w) in states(&gs).iter().zip(states(&ws)) {
        assert!(rel_rms(g, w) <= 1e-6);
    }
}

/// The fixture's tensors, for rewriting.
struct Parts {
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

impl Parts {
    fn of_fixture() -> Parts {
        let f = GgufFile::open(&gguf()).unwrap();
        let tensors = f
            .tensors()
            .iter()
            .map(|t| {
                (
                    t.name.clone(),
                    t.ne().to_vec(),
                    t.ggml_type,
                    f.bytes_of(t).to_vec(),
                )
            })
            .collect();
        Parts { tensors }
    }

    fn tensor(&mut self, name: &str) -> &mut (String, Vec<u64>, GgmlType, Vec<u8>) {
        self.tensors.iter_mut().find(|t| t.0 == name).expect(name)
    }
}

/// Writes the fixture's keys (with `set` replacing or adding keys, `drop` removing them) and
/// `parts`' tensors to `path`.
fn write(path: &Path, parts: &Parts, set: &[(&str, Value<'_>)], drop: &[&str]) {
    let f = GgufFile::open(&gguf()).unwrap();
    let mut w = GgufWriter::new(s(path));
    for (k, v) in f.metadata().iter() {
        if drop.contains(&k) || set.iter().any(|(s, _)| *s == k) {
            continue;
        }
        w.add(k, v).unwrap();
    }
    for (k, v) in set {
        w.add(k, *v).unwrap();
    }
    for (name, ne, ty, bytes) in &parts.tensors {
        w.add_tensor(name, ne, *ty, Source::Bytes(bytes)).unwrap();
    }
    w.write_file(path).unwrap();
}

#[test]
fn a_split_set_loads_as_the_single_file() {
    let dir = TempDir::new("gguf-split");
    let parts = Parts::of_fixture();
    let f = GgufFile::open(&gguf()).unwrap();
    let total = parts.tensors.len() as i32;
    let chunks: Vec<&[_]> = parts
        .tensors
        .chunks(parts.tensors.len().div_ceil(3))
        .collect();
    let mut paths = Vec::new();
    for (no, chunk) in chunks.iter().enumerate() {
        let p = dir.path(&split_name("tiny", no as u16, 3));
        let mut w = GgufWriter::new(s(&p));
        if no == 0 {
            for (k, v) in f.metadata().iter() {
                w.add(k, v).unwrap();
            }
            w.add(SPLIT_TENSORS, Value::I32(total)).unwrap();
        }
        w.add(SPLIT_NO, Value::U16(no as u16)).unwrap();
        w.add(SPLIT_COUNT, Value::U16(3)).unwrap();
        for (name, ne, ty, bytes) in chunk.iter() {
            w.add_tensor(name, ne, *ty, Source::Bytes(bytes)).unwrap();
        }
        w.write_file(&p).unwrap();
        paths.push(p);
    }
    let single = Model::open(&gguf()).unwrap();
    let (cfg, w) = single.weights(0).unwrap();
    let (want, _) = run(w, cfg, Mode::Auto);
    for p in &paths {
        let ckpt = Checkpoint::open(p).unwrap();
        assert_eq!(ckpt.files_on_disk(), paths, "{}", p.display());
        let m = ckpt.load(None).unwrap();
        assert_eq!(m.files().len(), 3);
        let (cfg, w) = m.weights(0).unwrap();
        let (got, _) = run(w, cfg, Mode::Auto);
        assert_eq!(got, want, "split set opened at {}", p.display());
    }
    std::fs::remove_file(&paths[2]).unwrap();
    let e = Model::open(&paths[0]).unwrap_err().to_string();
    assert!(e.contains("tiny-00003-of-00003.gguf"), "{e}");
}

/// `kda inspect` and `kda forward` on the file; forward's output equals the library's.
#[test]
fn the_cli_reads_gguf_files() {
    let out = kda_ok(&["inspect", s(&gguf())]);
    assert!(out.contains("1 KDA, 1 full attention"), "{out}");
    assert!(out.contains("Q8_0  8.50 bits/weight"), "{out}");
    let dir = TempDir::new("gguf-cli");
    let f = Fixture::open(REFERENCE);
    let x = f.f32("hidden_states");
    let input = dir.path("x.safetensors");
    let cu: Vec<i64> = f.cu_seqlens().iter().map(|&c| c as i64).collect();
    let t = vec![
        OutTensor::f32("hidden_states", vec![x.len() / 256, 256], &x),
        OutTensor::i64("cu_seqlens", &cu),
    ];
    write_file(&input, &t, &Default::default()).unwrap();
    let output = dir.path("y.safetensors");
    let state = dir.path("s.safetensors");
    let forward = |layout: &str| {
        kda_ok(&[
            "forward",
            "--model",
            s(&gguf()),
            "--input",
            s(&input),
            "--output",
            s(&output),
            "--state-out",
            s(&state),
            "--layout",
            layout,
        ]);
        kda_host::checkpoint::safetensors::SafetensorsFile::read(&output)
            .unwrap()
            .f32_tensor("output", None, true)
            .unwrap()
    };
    let (got, panels) = (forward("rows"), forward("panels"));
    assert_eq!(got, panels, "the layouts agree (no bf16 matrix to repack)");
    let m = Model::open(&gguf()).unwrap();
    let (cfg, w) = m.weights(0).unwrap();
    let layer = kda_core::KdaLayer::new(cfg, w, ForwardOptions::default()).unwrap();
    let mut caches = SequenceCaches::new(cfg, 2).unwrap();
    let want = Runner::default()
        .forward(
            &layer,
            &x,
            &f.cu_seqlens(),
            &mut caches,
            InitialCaches::Zero,
        )
        .unwrap();
    assert_eq!(got, want);
    assert_eq!(read_state_tensors(&state)[0], caches.recurrent);
    kda_err(
        &[
            "forward",
            "--model",
            s(&gguf()),
            "--layer",
            "1",
            "--input",
            s(&input),
            "--output",
            s(&output),
        ],
        &["--layer 1", "full-attention"],
    );
    let bench = kda_ok(&[
        "bench",
        "--model",
        s(&gguf()),
        "--prompt",
        "8",
        "--steps",
        "2",
        "--prefill-runs",
        "1",
        "--threads",
        "1",
    ]);
    assert!(
        bench.contains("kimi-linear-tiny-q8_0.gguf layer 0"),
        "{bench}"
    );
    assert!(bench.contains("Q8_0 weights"), "{bench}");
    let q = dir.path("q.gguf");
    kda_err(
        &[
            "quantize",
            "--model",
            s(&gguf()),
            "--out",
            s(&q),
            "--type",
            "q8_0",
        ],
        &["is a GGUF file", "Hugging Face checkpoint folder"],
    );
    assert!(!q.exists());
}

fn ne_bytes(ne: &[u64], ty: GgmlType) -> Vec<u8> {
    vec![0u8; ty.tensor_bytes(ne).unwrap() as usize]
}

/// A change to the fixture's tensors.
type Edit = Box<dyn Fn(&mut Parts)>;

/// One hostile variant: its tag, the tensor edit, the keys set and dropped, and what the error
/// must say (nothing: it must load).
type Case = (
    &'static str,
    Edit,
    Vec<(&'static str, Value<'static>)>,
    Vec<&'static str>,
    Vec<&'static str>,
);

/// Each hostile variant of the fixture: opening or loading it is a one-line error naming the
/// file and what is wrong; nothing panics.
#[test]
fn hostile_files_are_refused_by_name() {
    let dir = TempDir::new("gguf-hostile");
    let none: Edit = Box::new(|_| {});
    let cases: Vec<Case> = vec![
        (
            "arch",
            none,
            vec![("general.architecture", Value::Str(b"llama"))],
            vec![],
            vec!["general.architecture` is `llama`", "kimi-linear"],
        ),
        (
            "no-head-dim",
            Box::new(|_| {}),
            vec![],
            vec!["kimi-linear.kda.head_dim"],
            vec!["missing key `kimi-linear.kda.head_dim`"],
        ),
        (
            "zero-conv",
            Box::new(|_| {}),
            vec![("kimi-linear.ssm.conv_kernel", Value::U32(0))],
            vec![],
            vec!["kimi-linear.ssm.conv_kernel` is 0"],
        ),
        (
            "ssm-a-positive",
            Box::new(|p| {
                let t = p.tensor("blk.0.ssm_a");
                t.3 = [0.5f32, -1.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect();
            }),
            vec![],
            vec![],
            vec!["blk.0.ssm_a", "holds 0.5 at 0", "must be negative"],
        ),
        (
            "q-transposed",
            Box::new(|p| {
                let t = p.tensor("blk.0.attn_q.weight");
                t.1 = vec![64, 256];
            }),
            vec![],
            vec![],
            vec![
                "blk.0.attn_q.weight",
                "has shape [256, 64], expected [64, 256]",
            ],
        ),
        (
            "norm-quantised",
            Box::new(|p| {
                let t = p.tensor("blk.0.ssm_norm.weight");
                t.2 = GgmlType::Q8_0;
                t.3 = ne_bytes(&t.1, GgmlType::Q8_0);
            }),
            vec![],
            vec![],
            vec![
                "blk.0.ssm_norm.weight",
                "has type Q8_0",
                "as F32, F16 or BF16",
            ],
        ),
        (
            "iq-type",
            Box::new(|p| {
                let t = p.tensor("blk.0.attn_k.weight");
                t.2 = GgmlType::IQ4_NL;
                t.3 = ne_bytes(&t.1, GgmlType::IQ4_NL);
            }),
            vec![],
            vec![],
            vec!["blk.0.attn_k.weight", "has type IQ4_NL", "does not read"],
        ),
        (
            "missing-beta",
            Box::new(|p| p.tensors.retain(|t| t.0 != "blk.0.ssm_beta.weight")),
            vec![],
            vec![],
            vec!["missing tensor `blk.0.ssm_beta.weight`"],
        ),
        (
            "scalar-norm",
            Box::new(|p| {
                let t = p.tensor("blk.0.ssm_norm.weight");
                t.1 = vec![];
                t.3 = 1.0f32.to_le_bytes().to_vec();
            }),
            vec![],
            vec![],
            vec!["blk.0.ssm_norm.weight", "has shape [], expected [32]"],
        ),
        (
            "huge-block-count",
            Box::new(|_| {}),
            vec![
                ("kimi-linear.block_count", Value::U32(4_000_000_000)),
                ("kimi-linear.attention.head_count_kv", Value::U32(0)),
            ],
            vec![],
            vec!["block_count` is 4000000000", "at most 4096 blocks"],
        ),
        (
            "kv-scalar",
            Box::new(|_| {}),
            vec![("kimi-linear.attention.head_count_kv", Value::U32(0))],
            vec![],
            vec![],
        ),
        (
            "three-heads",
            Box::new(|p| {
                let t = p.tensor("blk.0.ssm_a");
                t.1 = vec![1, 3, 1, 1];
                t.3 = [-1.0f32; 3].iter().flat_map(|x| x.to_le_bytes()).collect();
            }),
            vec![],
            vec![],
            vec!["blk.0.attn_q.weight", "expected [96, 256]"],
        ),
    ];
    for (tag, edit, set, drop, want) in cases {
        let mut parts = Parts::of_fixture();
        edit(&mut parts);
        let p = dir.path(&format!("{tag}.gguf"));
        write(&p, &parts, &set, &drop);
        let r = Checkpoint::open(&p).and_then(|c| c.load(None));
        if want.is_empty() {
            // A scalar `head_count_kv`: the KDA layers come from the `ssm_a` tensors.
            let m = r.unwrap_or_else(|e| panic!("{tag}: {e}"));
            assert_eq!(m.config().kda_layers, [0], "{tag}");
            continue;
        }
        let e = match r {
            Ok(_) => panic!("{tag}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.starts_with(s(&p)), "{tag}: {e}");
        assert!(!e.contains('\n'), "{tag}: {e}");
        for w in &want {
            assert!(e.contains(w), "{tag}: `{w}` not in: {e}");
        }
        // The CLI says the same in one line.
        kda_err(&["inspect", s(&p)], &want);
    }
    // Truncated: the header's tensors point past the end.
    let bytes = std::fs::read(gguf()).unwrap();
    let p = dir.path("truncated.gguf");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    kda_err(&["inspect", s(&p)], &[s(&p)]);
    // Not GGUF at all, though named so.
    let p = dir.path("text.gguf");
    std::fs::write(&p, b"hello").unwrap();
    kda_err(&["inspect", s(&p)], &[s(&p)]);
}

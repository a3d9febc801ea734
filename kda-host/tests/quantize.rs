//! `kda quantize`: the GGUF it writes (names, shapes, types, metadata, bytes), the layer output
//! of its weights against the bf16 layer, and its errors (which leave an existing OUT as it was).
//!
//! The GGUF is read back with `Model::open` (kda's loader) and, as a check on it, with a small
//! loader here that builds the layer's weights from the file's tensors (the inverse of the
//! converter's transforms: `A_log = ln(−ssm_a)`): both give the same output, bit for bit. Run
//! with `--nocapture` for the rel-RMS table.

mod common;

use std::collections::HashMap;
use std::path::Path;

use common::{kda, kda_ok, TempDir};
use half::f16;
use kda_core::quant::{BlockFormat, Blocks};
use kda_core::{Data, GateWeights, InitialCaches, KdaConfig, KdaWeights, MatRef};
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, ExportOptions};
use kda_host::checkpoint::gguf::kimi_names::{a_log_from_ssm_a, ssm_a_from_a_log, KdaTensor};
use kda_host::checkpoint::gguf::{GgmlType, GgufFile};
use kda_host::layer::{OwnedData, OwnedGate, OwnedMat};
use kda_host::quantize::mix::{choose, OutType, QuantType, Site};
use kda_host::quantize::{quantize, Output, QuantizeOptions};
use kda_host::rng::Rng;
use kda_host::{Model, OwnedLayer, Runner, SequenceCaches, WeightDtype};

const TYPES: [QuantType; 4] = [
    QuantType::Q8_0,
    QuantType::Q4K,
    QuantType::Q6K,
    QuantType::Q4KM,
];

/// A Kimi Linear checkpoint of three layers, 0 and 2 KDA (the same weights), 1 MLA.
fn checkpoint(dir: &TempDir, cfg: KdaConfig, seed: u64) -> (std::path::PathBuf, OwnedLayer) {
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, seed).unwrap();
    let ckpt = dir.path("ckpt");
    let opts = ExportOptions::published(Layout::KimiLinear, 3);
    export_dir(&ckpt, &[(0, &layer), (2, &layer)], &opts).unwrap();
    (ckpt, layer)
}

fn run(model: &Path, out: &Path, qtype: QuantType, layers: Option<Vec<usize>>) {
    let opts = QuantizeOptions {
        model: model.to_path_buf(),
        out: out.to_path_buf(),
        output: Output::Gguf(qtype),
        layers,
        progress: false,
    };
    quantize(&opts).unwrap();
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn values(d: &OwnedData) -> Vec<f32> {
    match d {
        OwnedData::F32(v) => v.clone(),
        OwnedData::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
    }
}

/// The source of each GGUF tensor of a layer: `(values, rows, cols)`.
fn sources(l: &OwnedLayer) -> HashMap<KdaTensor, (Vec<f32>, usize, usize)> {
    let m = |m: &OwnedMat| (values(&m.data), m.rows, m.cols);
    let low = |g: &OwnedGate| match g {
        OwnedGate::LowRank(a, b) => (m(a), m(b)),
        OwnedGate::FullRank(_) => panic!("low rank"),
    };
    let (p, w) = (l.cfg.proj_dim(), l.cfg.conv_width);
    let v = |d: &OwnedData| {
        let x = values(d);
        let n = x.len();
        (x, 1, n)
    };
    let (fa, fb) = low(&l.decay_proj);
    let (ga, gb) = low(&l.output_gate);
    HashMap::from([
        (KdaTensor::QProj, m(&l.qkv[0])),
        (KdaTensor::KProj, m(&l.qkv[1])),
        (KdaTensor::VProj, m(&l.qkv[2])),
        (KdaTensor::QConv, (values(&l.conv[0]), p, w)),
        (KdaTensor::KConv, (values(&l.conv[1]), p, w)),
        (KdaTensor::VConv, (values(&l.conv[2]), p, w)),
        (KdaTensor::ALog, v(l.a_log.as_ref().unwrap())),
        (KdaTensor::DtBias, v(l.dt_bias.as_ref().unwrap())),
        (KdaTensor::FA, fa),
        (KdaTensor::FB, fb),
        (KdaTensor::Beta, m(&l.b_proj)),
        (KdaTensor::GA, ga),
        (KdaTensor::GB, gb),
        (KdaTensor::ONorm, v(&l.o_norm)),
        (KdaTensor::OProj, m(&l.o_proj)),
    ])
}

/// Every tensor has llama.cpp's name and shape, llama-quantize's type, and the bytes kda-core's
/// encoders (bit-for-bit ggml's, kda-core/tests/quant_encode.rs) make of the bf16 values.
fn check_file(path: &Path, layer: &OwnedLayer, qt: QuantType, layers: &[usize]) {
    let f = GgufFile::open(path).unwrap();
    let md = f.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "kimi-linear");
    assert_eq!(md.get_u32("general.file_type").unwrap(), qt.file_type());
    let kv = md
        .get_array_i32("kimi-linear.attention.head_count_kv")
        .unwrap();
    assert_eq!(kv, [0, 1, 0]);
    let cfg = layer.cfg;
    assert_eq!(
        md.get_u32("kimi-linear.embedding_length").unwrap() as usize,
        cfg.hidden
    );
    assert_eq!(
        md.get_u32("kimi-linear.kda.head_dim").unwrap() as usize,
        cfg.head_dim
    );
    assert_eq!(
        md.get_u32("kimi-linear.ssm.conv_kernel").unwrap() as usize,
        cfg.conv_width
    );
    let listed = md.get_array_u32("kda.layers").unwrap();
    assert_eq!(
        listed.iter().map(|&l| l as usize).collect::<Vec<_>>(),
        layers
    );
    assert_eq!(f.tensors().len(), 15 * layers.len());
    let src = sources(layer);
    for info in f.tensors() {
        let (l, t) = KdaTensor::from_gguf_name(&info.name).expect(&info.name);
        let (x, rows, cols) = &src[&t];
        assert_eq!(info.ne(), t.gguf_ne(*rows, *cols, cfg.heads).as_slice());
        let rank = [0, 2].iter().position(|&k| k == l).unwrap();
        let site = Site {
            tensor: t,
            ne0: *cols,
            kda_rank: rank,
            n_kda: 2,
        };
        let want = choose(qt, site);
        assert_eq!(info.ggml_type, want.ggml_type(), "{}", info.name);
        let bytes = f.bytes_of(info);
        match want {
            OutType::Blocks(fmt) => {
                let mut q = vec![0u8; bytes.len()];
                fmt.quantize_row(x, &mut q).unwrap();
                assert!(q == bytes, "{}: bytes differ", info.name);
            }
            OutType::F32 if t == KdaTensor::ALog => {
                let want: Vec<f32> = x.iter().map(|&a| ssm_a_from_a_log(a)).collect();
                assert_eq!(f32s(bytes), want);
            }
            OutType::F32 => assert_eq!(&f32s(bytes), x, "{}", info.name),
            OutType::F16 => panic!("{}: no F16 fallback expected here", info.name),
        }
    }
}

#[test]
fn every_type_writes_llama_cpp_names_types_and_bytes() {
    // hidden 256 with head dim 32 (o_proj rows of 64: Q4_K falls back to Q5_0), and hidden
    // 512 with head dim 128 (P = 256: o_proj a K-quant, f_b / g_b rows of 128 fall back).
    for (cfg, tag) in [
        (KdaConfig::kimi_linear(256, 2, 32), "h256"),
        (KdaConfig::kimi_linear(512, 2, 128), "h512"),
    ] {
        let dir = TempDir::new(tag);
        let (ckpt, layer) = checkpoint(&dir, cfg, 7);
        for qt in TYPES {
            let out = dir.path(&format!("{}.gguf", qt.name()));
            run(&ckpt, &out, qt, None);
            check_file(&out, &layer, qt, &[0, 2]);
        }
        let out = dir.path("layer2.gguf");
        run(&ckpt, &out, QuantType::Q4KM, Some(vec![2]));
        check_file(&out, &layer, QuantType::Q4KM, &[2]);
        // A file of some layers (`kda.layers`) loads those; asking for another says so.
        let m = Model::open(&out).unwrap();
        assert_eq!(m.layers().len(), 1);
        assert_eq!(m.config().kda_layers, [0, 2]);
        let e = Model::open_layers(&out, &[0]).unwrap_err().to_string();
        assert!(
            e.contains("holds only KDA layers 2") && e.contains("not layer 0"),
            "{e}"
        );
    }
}

/// A matrix tensor of the file as a weight view (its bytes copied where the core needs
/// aligned floats).
enum Held {
    Blocks(BlockFormat, Vec<u8>),
    F16(Vec<f16>),
    F32(Vec<f32>),
}

impl Held {
    fn of(f: &GgufFile, name: &str) -> (Held, Vec<u64>) {
        let info = f.tensors().iter().find(|t| t.name == name).expect(name);
        let b = f.bytes_of(info);
        let held = match info.ggml_type {
            GgmlType::F32 => Held::F32(f32s(b)),
            GgmlType::F16 => Held::F16(
                b.chunks_exact(2)
                    .map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]])))
                    .collect(),
            ),
            t => Held::Blocks(BlockFormat::from_ggml_type(t.id()).unwrap(), b.to_vec()),
        };
        (held, info.ne().to_vec())
    }

    fn data(&self, n: usize) -> Data<'_> {
        match self {
            Held::Blocks(fmt, b) => Data::Blocks(Blocks::new("gguf", *fmt, b, n).unwrap()),
            Held::F16(v) => Data::F16(v),
            Held::F32(v) => Data::F32(v),
        }
    }
}

/// Layer `l` of the file: every tensor, by KDA role.
struct GgufLayer {
    t: HashMap<KdaTensor, (Held, Vec<u64>)>,
}

impl GgufLayer {
    fn open(f: &GgufFile, l: usize) -> GgufLayer {
        let mut t: HashMap<_, _> = KdaTensor::ALL
            .into_iter()
            .map(|k| (k, Held::of(f, &k.gguf_name(l))))
            .collect();
        let (Held::F32(a), ne) = t.remove(&KdaTensor::ALog).unwrap() else {
            panic!("ssm_a is F32")
        };
        let a_log = a.iter().map(|&v| a_log_from_ssm_a(v)).collect();
        t.insert(KdaTensor::ALog, (Held::F32(a_log), ne));
        GgufLayer { t }
    }

    fn mat(&self, k: KdaTensor, name: &'static str) -> MatRef<'_> {
        let (h, ne) = &self.t[&k];
        let (cols, rows) = (ne[0] as usize, ne[1] as usize);
        MatRef::new(name, h.data(rows * cols), rows, cols).unwrap()
    }

    fn vec(&self, k: KdaTensor) -> Data<'_> {
        let (h, ne) = &self.t[&k];
        h.data(ne.iter().product::<u64>() as usize)
    }

    fn weights(&self, cfg: &KdaConfig) -> KdaWeights<'_> {
        use KdaTensor as T;
        let w = KdaWeights {
            q_proj: self.mat(T::QProj, "q_proj.weight"),
            k_proj: self.mat(T::KProj, "k_proj.weight"),
            v_proj: self.mat(T::VProj, "v_proj.weight"),
            q_conv: self.vec(T::QConv),
            k_conv: self.vec(T::KConv),
            v_conv: self.vec(T::VConv),
            a_log: Some(self.vec(T::ALog)),
            dt_bias: Some(self.vec(T::DtBias)),
            decay_proj: GateWeights::LowRank {
                down: self.mat(T::FA, "f_a_proj.weight"),
                up: self.mat(T::FB, "f_b_proj.weight"),
            },
            b_proj: self.mat(T::Beta, "b_proj.weight"),
            output_gate: GateWeights::LowRank {
                down: self.mat(T::GA, "g_a_proj.weight"),
                up: self.mat(T::GB, "g_b_proj.weight"),
            },
            o_norm: self.vec(T::ONorm),
            o_proj: self.mat(T::OProj, "o_proj.weight"),
        };
        w.validate(cfg).unwrap();
        w
    }
}

fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    let (mut e, mut n) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        n += (w as f64).powi(2);
    }
    (e / n).sqrt()
}

fn forward(cfg: &KdaConfig, w: KdaWeights<'_>, x: &[f32]) -> Vec<f32> {
    let layer = kda_core::KdaLayer::new(cfg, w, kda_core::ForwardOptions::default()).unwrap();
    let mut caches = SequenceCaches::new(cfg, 1).unwrap();
    let t = x.len() / cfg.hidden;
    Runner::default()
        .forward(&layer, x, &[0, t], &mut caches, InitialCaches::Zero)
        .unwrap()
}

/// The layer output on the GGUF's weights against the same layer on the bf16 weights, per
/// type (64 tokens); each bound is about twice the error measured.
#[test]
fn layer_output_close_to_the_bf16_layer() {
    // Measured (seed 7): q8_0 1.2e-2 / 9.2e-3 (hidden 256 / 512), q6_k 3.4e-2 / 3.1e-2,
    // q4_k_m 1.3e-1 / 1.0e-1, q4_k 1.5e-1 / 1.2e-1; about twice the weights' own error
    // (kda-core/tests/quant_encode.rs), as for int8 rows (kda-core/tests/quant_fixtures.rs).
    let bounds = [
        (QuantType::Q8_0, 0.025),
        (QuantType::Q6K, 0.07),
        (QuantType::Q4KM, 0.27),
        (QuantType::Q4K, 0.3),
    ];
    for (cfg, tag) in [
        (KdaConfig::kimi_linear(256, 2, 32), "h256"),
        (KdaConfig::kimi_linear(512, 2, 128), "h512"),
    ] {
        let dir = TempDir::new(tag);
        let (ckpt, layer) = checkpoint(&dir, cfg, 7);
        let x = Rng::new(11).normals(64 * cfg.hidden, 1.0);
        let want = forward(&cfg, layer.weights().unwrap(), &x);
        for (qt, bound) in bounds {
            let out = dir.path(&format!("{}.gguf", qt.name()));
            run(&ckpt, &out, qt, None);
            // kda's loader, and the small reader above as a check on it: the same weights.
            let model = Model::open(&out).unwrap();
            assert_eq!(
                model.layers().iter().map(|l| l.index).collect::<Vec<_>>(),
                [0, 2]
            );
            let (lcfg, w) = model.weights(2).unwrap();
            let got = forward(lcfg, w, &x);
            let f = GgufFile::open(&out).unwrap();
            let g = GgufLayer::open(&f, 2);
            assert_eq!(
                got,
                forward(&cfg, g.weights(&cfg), &x),
                "{tag} {}",
                qt.name()
            );
            let r = rel_rms(&got, &want);
            println!(
                "{tag} {:<7} layer output rel-RMS vs bf16: {r:.3e}",
                qt.name()
            );
            assert!(r < bound, "{tag} {}: rel-RMS {r:e} over {bound}", qt.name());
        }
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every failure is one `error:` line, and an OUT that existed is left byte for byte.
#[test]
fn errors_leave_an_existing_out_untouched() {
    let dir = TempDir::new("errors");
    let cfg = KdaConfig::kimi_linear(256, 2, 32);
    let (ckpt, mut layer) = checkpoint(&dir, cfg, 3);
    let out = dir.path("out.gguf");
    std::fs::write(&out, b"previous contents").unwrap();
    let fail = |args: &[&str], want: &str| {
        let o = kda(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(
            err.starts_with("error: ") && err.lines().count() == 1,
            "{err}"
        );
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(std::fs::read(&out).unwrap(), b"previous contents");
    };
    let run_fail = |extra: &[&str], want: &str| {
        let mut args = vec!["quantize", "--model", s(&ckpt), "--out", s(&out)];
        args.extend_from_slice(extra);
        fail(&args, want);
    };
    run_fail(&["--type", "q5_k"], "invalid value 'q5_k'");
    run_fail(
        &["--type", "q4_k", "--layers", "1"],
        "layer 1 is not a KDA layer",
    );
    run_fail(
        &["--type", "q4_k", "--layers", "0,x"],
        "`x` is not a layer number",
    );
    run_fail(
        &["--type", "q4_k", "--layers", "9"],
        "layer 9 is not a KDA layer",
    );
    fail(
        &[
            "quantize",
            "--model",
            s(&dir.path("none")),
            "--out",
            s(&out),
            "--type",
            "q8_0",
        ],
        "no such directory",
    );
    let missing = dir.path("no/such/folder/out.gguf");
    let o = kda(&[
        "quantize",
        "--model",
        s(&ckpt),
        "--out",
        s(&missing),
        "--type",
        "q8_0",
    ]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot be written"));

    // A NaN weight: named, nothing written.
    if let OwnedData::Bf16(v) = &mut layer.qkv[1].data {
        v[77] = half::bf16::NAN;
    }
    let opts = ExportOptions::published(Layout::KimiLinear, 3);
    let bad = dir.path("bad");
    export_dir(&bad, &[(0, &layer)], &opts).unwrap();
    let bad_args = [
        "quantize",
        "--model",
        s(&bad),
        "--out",
        s(&out),
        "--type",
        "q4_k",
    ];
    fail(&bad_args, "k_proj.weight`: element 77 is not finite");

    // A Kimi K3 checkpoint: refused, naming what kimi-linear lacks.
    let k3 = OwnedLayer::random(KdaConfig::kimi_k3(256, 2, 32), WeightDtype::Bf16, 1).unwrap();
    let k3_dir = dir.path("k3");
    export_dir(
        &k3_dir,
        &[(0, &k3)],
        &ExportOptions::published(Layout::KimiK3, 1),
    )
    .unwrap();
    let k3_args = [
        "quantize",
        "--model",
        s(&k3_dir),
        "--out",
        s(&out),
        "--type",
        "q8_0",
    ];
    fail(&k3_args, "kimi-linear architecture");

    // The disk fills up half way: the temporary goes, OUT stays.
    kda_host::fsio::fail_writes_after(Some(20_000));
    let opts = QuantizeOptions {
        model: ckpt.clone(),
        out: out.clone(),
        output: Output::Gguf(QuantType::Q8_0),
        layers: None,
        progress: false,
    };
    let e = quantize(&opts).unwrap_err().to_string();
    kda_host::fsio::fail_writes_after(None);
    assert!(e.contains("No space left on device"), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"previous contents");
    let left: Vec<_> = std::fs::read_dir(&dir.0).unwrap().flatten().collect();
    assert!(
        left.iter()
            .all(|e| !e.file_name().to_string_lossy().contains("kda-tmp")),
        "a temporary was left behind"
    );

    // And a good run replaces it; piped, it prints one summary line and nothing on stderr.
    let o = kda(&[
        "quantize",
        "--model",
        s(&ckpt),
        "--out",
        s(&out),
        "--type",
        "q8_0",
    ]);
    assert!(o.status.success());
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let line = String::from_utf8_lossy(&o.stdout);
    assert!(
        line.contains("2 KDA layers (0,2), 30 tensors (18 Q8_0, 12 F32)"),
        "{line}"
    );
    assert!(GgufFile::open(&out).is_ok());
    let _ = kda_ok(&["quantize", "--help"]);
}

/// `--type int4-g32`: a compressed-tensors folder whose projections are kda-core's group
/// quantiser's bytes (bit for bit compressed-tensors', kda-core/tests/quant_groups.rs), read
/// back as `Groups` views; the layer output against the bf16 layer.
#[test]
fn int4_g32_folder_reads_back_and_runs() {
    use kda_core::quant::{quantize_groups, GroupFormat, GroupTensors, Groups, GroupsOut};
    use kda_core::quant::{Scales, ScalesMut};
    use kda_host::checkpoint::safetensors::SafetensorsFile;
    let cfg = KdaConfig::kimi_linear(256, 2, 32);
    let dir = TempDir::new("ct");
    let (ckpt, layer) = checkpoint(&dir, cfg, 7);
    let out = dir.path("int4");
    let args = [
        "quantize",
        "--model",
        s(&ckpt),
        "--out",
        s(&out),
        "--type",
        "int4-g32",
    ];
    let line = kda_ok(&args);
    assert!(line.contains("18 int4-g32"), "{line}");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    let q = &config["quantization_config"];
    assert_eq!(q["format"], "pack-quantized");
    assert_eq!(q["config_groups"]["group_0"]["weights"]["group_size"], 32);
    assert_eq!(config["hidden_size"], 256);
    let f = SafetensorsFile::read(&out.join("model.safetensors")).unwrap();
    let fmt = GroupFormat { bits: 4, group: 32 };
    let p = "model.layers.2.self_attn.";
    let bytes = |n: &str| f.bytes(f.entry(&format!("{p}{n}")).unwrap()).to_vec();
    let src = sources(&layer);
    // Every projection: the stored bytes are the quantiser's on the bf16 values.
    let projs = [
        (KdaTensor::QProj, "q_proj"),
        (KdaTensor::KProj, "k_proj"),
        (KdaTensor::VProj, "v_proj"),
        (KdaTensor::FA, "f_a_proj"),
        (KdaTensor::FB, "f_b_proj"),
        (KdaTensor::Beta, "b_proj"),
        (KdaTensor::GA, "g_a_proj"),
        (KdaTensor::GB, "g_b_proj"),
        (KdaTensor::OProj, "o_proj"),
    ];
    let mut held = HashMap::new();
    for (t, n) in projs {
        let (x, rows, cols) = &src[&t];
        let packed = bytes(&format!("{n}.weight_packed"));
        let scale_raw = bytes(&format!("{n}.weight_scale"));
        let scales: Vec<half::bf16> = scale_raw
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        let mut p2 = vec![0u8; packed.len()];
        let mut s2 = vec![half::bf16::ZERO; scales.len()];
        let o = GroupsOut {
            packed: &mut p2,
            scales: ScalesMut::Bf16(&mut s2),
            zeros: None,
        };
        quantize_groups(x, (*rows, *cols), fmt, o).unwrap();
        assert!(p2 == packed && s2 == scales, "{n}");
        held.insert(t, (packed, scales, *rows, *cols));
    }
    let groups: HashMap<KdaTensor, Groups<'_>> = held
        .iter()
        .map(|(t, (p, s, r, c))| {
            let gt = GroupTensors {
                packed: p,
                scales: Scales::Bf16(s),
                zeros: None,
            };
            (*t, Groups::new("ct", fmt, gt, *r, *c).unwrap())
        })
        .collect();
    let m = |t: KdaTensor, name: &'static str| {
        let g = &groups[&t];
        MatRef::new(name, Data::Groups(g.all_rows()), g.rows(), g.cols()).unwrap()
    };
    let vecs: HashMap<&str, Vec<f32>> = ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"]
        .into_iter()
        .chain(["A_log", "dt_bias", "o_norm.weight"])
        .map(|n| (n, f.f32_tensor(&format!("{p}{n}"), None, false).unwrap()))
        .collect();
    use KdaTensor as T;
    let w = KdaWeights {
        q_proj: m(T::QProj, "q_proj.weight"),
        k_proj: m(T::KProj, "k_proj.weight"),
        v_proj: m(T::VProj, "v_proj.weight"),
        q_conv: Data::F32(&vecs["q_conv1d.weight"]),
        k_conv: Data::F32(&vecs["k_conv1d.weight"]),
        v_conv: Data::F32(&vecs["v_conv1d.weight"]),
        a_log: Some(Data::F32(&vecs["A_log"])),
        dt_bias: Some(Data::F32(&vecs["dt_bias"])),
        decay_proj: GateWeights::LowRank {
            down: m(T::FA, "f_a_proj.weight"),
            up: m(T::FB, "f_b_proj.weight"),
        },
        b_proj: m(T::Beta, "b_proj.weight"),
        output_gate: GateWeights::LowRank {
            down: m(T::GA, "g_a_proj.weight"),
            up: m(T::GB, "g_b_proj.weight"),
        },
        o_norm: Data::F32(&vecs["o_norm.weight"]),
        o_proj: m(T::OProj, "o_proj.weight"),
    };
    let x = Rng::new(11).normals(64 * cfg.hidden, 1.0);
    let want = forward(&cfg, layer.weights().unwrap(), &x);
    let r = rel_rms(&forward(&cfg, w, &x), &want);
    println!("int4-g32 layer output rel-RMS vs bf16: {r:.3e}");
    // Measured 2.1e-1 (the weights alone: 9.5e-2; Q4_K gives 1.5e-1 here).
    assert!(r < 0.4, "rel-RMS {r:e}");
}

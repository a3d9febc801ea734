//! compressed-tensors `pack-quantized` checkpoints (tests/fixtures/ct/, made by
//! compressed-tensors' own compressor): the dequantised matrices equal compressed-tensors'
//! decompression bit for bit, a layer over the quantised folder computes what the same layer
//! over the decompressed f32 matrices does, and broken folders fail with one-line errors
//! naming the file and tensor.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use common::*;
use half::bf16;
use kda_core::{Data, ForwardOptions, GateWeights, InitialCaches, KdaLayer, KdaWeights, MatRef};
use kda_host::checkpoint::safetensors::SafetensorsFile;
use kda_host::rng::Rng;
use kda_host::{Model, Runner, SequenceCaches};
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

const PREFIX: &str = "model.layers.0.self_attn.";
const FOLDERS: [&str; 3] = ["int4-g32-sym", "int8-g32-asym", "int4-channel-asym"];

fn folder(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/ct")
        .join(name)
}

/// The layer's matrices by module suffix.
fn matrices<'a>(w: &KdaWeights<'a>) -> Vec<(&'static str, MatRef<'a>)> {
    let mut v = vec![
        ("q_proj", w.q_proj),
        ("k_proj", w.k_proj),
        ("v_proj", w.v_proj),
        ("b_proj", w.b_proj),
        ("o_proj", w.o_proj),
    ];
    for (g, names) in [
        (&w.decay_proj, ["f_proj", "f_a_proj", "f_b_proj"]),
        (&w.output_gate, ["g_proj", "g_a_proj", "g_b_proj"]),
    ] {
        match g {
            GateWeights::FullRank(m) => v.push((names[0], *m)),
            GateWeights::LowRank { down, up } => {
                v.push((names[1], *down));
                v.push((names[2], *up));
            }
        }
    }
    v
}

fn reference(name: &str) -> SafetensorsFile {
    SafetensorsFile::read(&folder(name).join("reference.safetensors")).unwrap()
}

#[test]
fn dequantised_matrices_equal_compressed_tensors_decompression_bitwise() {
    for name in FOLDERS {
        let model = Model::open(&folder(name)).unwrap();
        let refs = reference(name);
        let (_, w) = model.weights(0).unwrap();
        let mut quantised = 0;
        for (m, mat) in matrices(&w) {
            let full = format!("{PREFIX}{m}.weight");
            let Data::Groups(g) = mat.data() else {
                assert!(!refs.has(&full), "{name}: {m} is not quantised");
                assert_eq!(m, "b_proj", "{name}: only the ignored b_proj stays bf16");
                continue;
            };
            quantised += 1;
            let want = refs.f32_tensor(&full, None, true).unwrap();
            let g = g.matrix();
            let mut row = vec![0f32; g.cols()];
            let mut got = Vec::with_capacity(want.len());
            for r in 0..g.rows() {
                g.dequantize_row(r, &mut row).unwrap();
                got.extend_from_slice(&row);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{name}: {m}");
            // compressed-tensors' own result in the scales' dtype (bf16) is kda's exact value
            // rounded to bf16.
            let native = format!("{PREFIX}{m}.weight_bf16");
            if refs.has(&native) {
                let nat = refs.f32_tensor(&native, None, false).unwrap();
                let rounded: Vec<f32> = got.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
                assert_eq!(bits(&rounded), bits(&nat), "{name}: {m} (bf16)");
            }
        }
        assert_eq!(quantised, 8, "{name}");
    }
}

trait Has {
    fn has(&self, name: &str) -> bool;
}

impl Has for SafetensorsFile {
    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }
}

#[test]
fn layer_forward_equals_the_forward_over_decompressed_f32_matrices() {
    for name in FOLDERS {
        let model = Model::open(&folder(name)).unwrap();
        let refs = reference(name);
        let (cfg, w) = model.weights(0).unwrap();
        // The same weights with every quantised matrix replaced by its f32 decompression.
        let mut dense: HashMap<&str, Vec<f32>> = HashMap::new();
        for (m, mat) in matrices(&w) {
            if matches!(mat.data(), Data::Groups(_)) {
                let full = format!("{PREFIX}{m}.weight");
                dense.insert(m, refs.f32_tensor(&full, None, true).unwrap());
            }
        }
        let f = |m: &str, mat| swap(&dense, m, mat);
        let mut r = w;
        r.q_proj = f("q_proj", w.q_proj);
        r.k_proj = f("k_proj", w.k_proj);
        r.v_proj = f("v_proj", w.v_proj);
        r.o_proj = f("o_proj", w.o_proj);
        r.b_proj = f("b_proj", w.b_proj);
        r.decay_proj = swap_gate(&dense, w.decay_proj, ["f_a_proj", "f_b_proj"]);
        r.output_gate = swap_gate(&dense, w.output_gate, ["g_a_proj", "g_b_proj"]);
        let hd = cfg.hidden;
        let x = Rng::new(11).normals(12 * hd, 1.0);
        let cu = [0, 5, 12];
        let mut runner = Runner::default();
        let run = |w: KdaWeights<'_>, runner: &mut Runner| {
            let layer = KdaLayer::new(cfg, w, ForwardOptions::default()).unwrap();
            let mut c = SequenceCaches::new(cfg, 2).unwrap();
            runner
                .forward(&layer, &x, &cu, &mut c, InitialCaches::Zero)
                .unwrap()
        };
        let got = run(w, &mut runner);
        let want = run(r, &mut runner);
        let e = rel_rms(&got, &want);
        eprintln!("{name}: rel-RMS of the quantised layer's output vs the f32 one: {e:.3e}");
        assert!(e <= 1e-6, "{name}: rel-RMS {e}");
        assert!(got.iter().all(|v| v.is_finite()));
    }
}

/// `mat`, or its f32 decompression when `dense` has one for module `m`.
fn swap<'a>(dense: &'a HashMap<&str, Vec<f32>>, m: &str, mat: MatRef<'a>) -> MatRef<'a> {
    match dense.get(m) {
        Some(v) => MatRef::new("ref", Data::F32(v), mat.rows(), mat.cols()).unwrap(),
        None => mat,
    }
}

fn swap_gate<'a>(
    dense: &'a HashMap<&str, Vec<f32>>,
    g: GateWeights<'a>,
    [a, b]: [&str; 2],
) -> GateWeights<'a> {
    match g {
        GateWeights::LowRank { down, up } => GateWeights::LowRank {
            down: swap(dense, a, down),
            up: swap(dense, b, up),
        },
        other => other,
    }
}

// ---- hostile folders ----

/// A copy of fixture folder `name` in `dir` whose config and tensors `edit` may change.
struct Broken {
    dir: PathBuf,
    config: serde_json::Value,
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
}

impl Broken {
    fn new(dir: &TempDir, name: &str) -> Self {
        let src = folder(name);
        let config =
            serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
        let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<_> = st
            .tensors()
            .into_iter()
            .map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec()))
            .collect();
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        Broken {
            dir: dir.path(name),
            config,
            tensors,
        }
    }

    fn tensor(&mut self, suffix: &str) -> &mut (String, Dtype, Vec<usize>, Vec<u8>) {
        let name = format!("{PREFIX}{suffix}");
        self.tensors.iter_mut().find(|t| t.0 == name).unwrap()
    }

    fn weights_cfg(&mut self) -> &mut serde_json::Value {
        &mut self.config["quantization_config"]["config_groups"]["group_0"]["weights"]
    }

    /// Writes the folder and returns the error of opening it.
    fn open_err(&self) -> String {
        std::fs::create_dir_all(&self.dir).unwrap();
        std::fs::write(
            self.dir.join("config.json"),
            serde_json::to_vec(&self.config).unwrap(),
        )
        .unwrap();
        let views: Vec<_> = self
            .tensors
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = safetensors::serialize(views, None).unwrap();
        std::fs::write(self.dir.join("model.safetensors"), bytes).unwrap();
        let e = Model::open(&self.dir).unwrap_err().to_string();
        assert!(!e.contains('\n'), "more than one line: {e}");
        e
    }
}

/// Drops the last `n` columns of a 2-D 4-byte tensor.
fn drop_cols(t: &mut (String, Dtype, Vec<usize>, Vec<u8>), n: usize) {
    let (rows, cols) = (t.2[0], t.2[1]);
    let mut out = Vec::new();
    for r in 0..rows {
        out.extend_from_slice(&t.3[r * cols * 4..(r * cols + cols - n) * 4]);
    }
    t.2[1] = cols - n;
    t.3 = out;
}

fn expect(e: &str, parts: &[&str]) {
    for p in parts {
        assert!(e.contains(p), "`{p}` not in: {e}");
    }
}

#[test]
fn packed_tensor_too_short() {
    let dir = TempDir::new("ct-short");
    let mut b = Broken::new(&dir, "int4-g32-sym");
    drop_cols(b.tensor("k_proj.weight_packed"), 1);
    let e = b.open_err();
    expect(
        &e,
        &[
            "model.safetensors",
            "k_proj.weight_packed",
            "[32, 7]",
            "[32, 8]",
            "too short",
        ],
    );
}

#[test]
fn scale_count_mismatch() {
    let dir = TempDir::new("ct-scales");
    let mut b = Broken::new(&dir, "int8-g32-asym");
    drop_cols(b.tensor("v_proj.weight_scale"), 1);
    let e = b.open_err();
    expect(
        &e,
        &[
            "model.safetensors",
            "v_proj.weight_scale",
            "[32, 1]",
            "expected [32, 2]",
        ],
    );
}

#[test]
fn group_size_not_dividing_the_row() {
    let dir = TempDir::new("ct-group");
    let mut b = Broken::new(&dir, "int4-g32-sym");
    b.weights_cfg()["group_size"] = 48.into();
    let e = b.open_err();
    expect(
        &e,
        &[
            "q_proj.weight_scale",
            "group size 48 does not divide the row of 64",
        ],
    );
}

#[test]
fn unknown_format_string() {
    let dir = TempDir::new("ct-format");
    let mut b = Broken::new(&dir, "int4-g32-sym");
    b.config["quantization_config"]["format"] = "marlin-24".into();
    let e = b.open_err();
    expect(&e, &["config.json", "`marlin-24`", "pack-quantized"]);
}

#[test]
fn bits_other_than_4_or_8() {
    let dir = TempDir::new("ct-bits");
    let mut b = Broken::new(&dir, "int4-g32-sym");
    b.weights_cfg()["num_bits"] = 2.into();
    expect(
        &b.open_err(),
        &["config.json", "num_bits` is 2", "only 4 and 8"],
    );
    // 8 bits declared over 4-bit data: the packed rows are half as long as they must be.
    b.weights_cfg()["num_bits"] = 8.into();
    expect(
        &b.open_err(),
        &["q_proj.weight_packed", "expected [32, 16]", "too short"],
    );
}

#[test]
fn weight_shape_against_the_layer_and_missing_zero_points() {
    let dir = TempDir::new("ct-shape");
    let mut b = Broken::new(&dir, "int4-g32-sym");
    let t = b.tensor("o_proj.weight_shape");
    t.3 = [32i64, 64].iter().flat_map(|v| v.to_le_bytes()).collect();
    expect(
        &b.open_err(),
        &[
            "o_proj.weight_shape",
            "says has shape [32, 64], expected [64, 32]",
        ],
    );

    let dir = TempDir::new("ct-zeros");
    let mut b = Broken::new(&dir, "int8-g32-asym");
    let zp = format!("{PREFIX}q_proj.weight_zero_point");
    b.tensors.retain(|t| t.0 != zp);
    expect(&b.open_err(), &["q_proj.weight_zero_point", "asymmetric"]);
}

#[test]
fn quantised_matrix_the_config_does_not_target() {
    let dir = TempDir::new("ct-ignore");
    let mut b = Broken::new(&dir, "int4-g32-sym");
    b.config["quantization_config"]["ignore"] =
        serde_json::json!(["lm_head", "re:.*\\.b_proj$", "re:.*self_attn\\.q_proj"]);
    expect(&b.open_err(), &["q_proj.weight_packed", "no config group"]);
}

#[test]
fn inspect_prints_each_matrix_format_and_bits_per_weight() {
    let out = kda_ok(&["inspect", s(&folder("int4-g32-sym"))]);
    assert!(
        out.contains("q_proj   [32, 64]  int4 g32 sym bf16-scales  4.50 bits/weight"),
        "{out}"
    );
    assert!(
        out.contains("b_proj   [1, 64]  bf16  16.00 bits/weight"),
        "{out}"
    );
    let out = kda_ok(&["inspect", s(&folder("int8-g32-asym"))]);
    assert!(
        out.contains("o_proj   [64, 32]  int8 g32 asym f32-scales  9.25 bits/weight"),
        "{out}"
    );
}

#[test]
fn quantised_matrices_are_read_in_place_from_the_mapped_file() {
    let model = Model::open(&folder("int4-g32-sym")).unwrap();
    let file = &model.files()[0];
    let span = file.buffer.as_ptr_range();
    let (_, w) = model.weights(0).unwrap();
    let Data::Groups(g) = w.q_proj.data() else {
        panic!("q_proj is not quantised")
    };
    let bytes = g.matrix().stored_bytes();
    assert_eq!(bytes, 32 * 8 * 4 + 32 * 2 * 2);
    assert!(model.layers()[0].tensors.all().iter().all(|t| t.in_place()));
    let packed = g.matrix().packed().as_ptr_range();
    assert!(span.start <= packed.start && packed.end <= span.end);
}

//! The library API: a whole model, its cache (create, clone, reset, save, restore), in-place
//! and copied (misaligned) weights.

mod common;

use common::*;
use kda_core::{ForwardOptions, InitialCaches, KdaConfig};
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, export_files, ExportOptions};
use kda_host::rng::Rng;
use kda_host::{
    Checkpoint, Mode, Model, ModelCache, OwnedLayer, Runner, SequenceCaches, WeightDtype,
};

fn two_layer_model(dir: &TempDir, dtype: WeightDtype) -> (std::path::PathBuf, [OwnedLayer; 2]) {
    let cfg = KdaConfig::kimi_linear(24, 2, 8);
    let layers = [
        OwnedLayer::random(cfg, dtype, 1).unwrap(),
        OwnedLayer::random(cfg, dtype, 2).unwrap(),
    ];
    let ckpt = dir.path("ckpt");
    export_dir(
        &ckpt,
        &[(1, &layers[0]), (3, &layers[1])],
        &ExportOptions::published(Layout::KimiLinear, 4),
    )
    .unwrap();
    (ckpt, layers)
}

#[test]
fn model_loads_every_kda_layer_in_place_and_matches_owned_layers() {
    let dir = TempDir::new("model");
    let (ckpt, owned) = two_layer_model(&dir, WeightDtype::Bf16);
    let model = Model::open(&ckpt).unwrap();
    assert_eq!(
        model.layers().iter().map(|l| l.index).collect::<Vec<_>>(),
        vec![1, 3]
    );
    for l in model.layers() {
        assert!(
            l.tensors.all().iter().all(|t| t.in_place()),
            "layer {} copied",
            l.index
        );
    }
    assert_eq!(
        model.weight_bytes(),
        owned[0].weight_bytes() + owned[1].weight_bytes()
    );
    assert!(model
        .layer(2)
        .unwrap_err()
        .to_string()
        .contains("full-attention"));

    let hd = 24;
    let x = Rng::new(5).normals(9 * hd, 1.0);
    let cu = [0, 4, 9];
    let mut cache = model.new_cache(2).unwrap();
    let mut runner = Runner::default();
    for (i, l) in [(1, &owned[0]), (3, &owned[1])] {
        let y = model
            .forward(&mut runner, i, &x, &cu, &mut cache, Mode::Auto)
            .unwrap();
        let mut c = SequenceCaches::new(&l.cfg, 2).unwrap();
        let kda = l.kda_layer(ForwardOptions::default()).unwrap();
        let want = runner
            .forward(&kda, &x, &cu, &mut c, InitialCaches::Zero)
            .unwrap();
        assert_eq!(y, want, "layer {i}");
        assert_eq!(cache.layer(i).unwrap(), &c);
    }
}

#[test]
fn model_cache_clone_reset_save_restore() {
    let dir = TempDir::new("cache");
    let (ckpt, _) = two_layer_model(&dir, WeightDtype::F32);
    let model = Model::open(&ckpt).unwrap();
    let hd = 24;
    let mut rng = Rng::new(9);
    let mut runner = Runner::new(3);
    let mut cache = model.new_cache(1).unwrap();
    let prompt = rng.normals(5 * hd, 1.0);
    for i in [1, 3] {
        model
            .forward(&mut runner, i, &prompt, &[0, 5], &mut cache, Mode::Auto)
            .unwrap();
    }
    // Fork: the clone and the original continue identically.
    let mut fork = cache.clone();
    let path = dir.path("cache.safetensors");
    cache.save(&path, &model).unwrap();
    let restored = ModelCache::load(&path, &model).unwrap();
    assert_eq!(restored, cache);
    let x = rng.normals(hd, 1.0);
    let a = model.decode(&mut runner, 1, &x, &mut cache).unwrap();
    let b = model.decode(&mut runner, 1, &x, &mut fork).unwrap();
    assert_eq!(a, b);
    assert_eq!(cache, fork);
    assert_ne!(restored, cache);
    // A restored cache continues like the original did.
    let mut r2 = restored.clone();
    assert_eq!(model.decode(&mut runner, 1, &x, &mut r2).unwrap(), a);
    // Resetting one sequence leaves the others alone.
    let mut two = model.new_cache(2).unwrap();
    let p2 = rng.normals(4 * hd, 1.0);
    model
        .forward(&mut runner, 3, &p2, &[0, 2, 4], &mut two, Mode::Auto)
        .unwrap();
    let before = two.clone();
    two.reset_sequence(0, &model).unwrap();
    let (b, a) = (
        &before.layer(3).unwrap().recurrent,
        &two.layer(3).unwrap().recurrent,
    );
    let half = a.len() / 2;
    assert!(a[..half].iter().all(|&v| v == 0.0) && a[half..] == b[half..]);
    assert!(two.reset_sequence(2, &model).is_err());
    cache.reset();
    assert!(cache
        .layers
        .iter()
        .all(|(_, c)| c.recurrent.iter().all(|&v| v == 0.0)));
    assert_eq!(cache, model.new_cache(1).unwrap());
    // A cache file of another model is refused, naming the tensor.
    let other = TempDir::new("other");
    let cfg = KdaConfig::kimi_linear(24, 2, 4);
    let l = OwnedLayer::random(cfg, WeightDtype::F32, 3).unwrap();
    export_dir(
        &other.path("ckpt"),
        &[(1, &l)],
        &ExportOptions::published(Layout::KimiLinear, 2),
    )
    .unwrap();
    let m2 = Model::open(&other.path("ckpt")).unwrap();
    let e = ModelCache::load(&path, &m2).unwrap_err().to_string();
    assert!(
        e.contains("layers.1.recurrent_state") && e.contains("shape"),
        "{e}"
    );
}

/// Shifts the data of a safetensors file by one byte (a space appended to the header), so no
/// 2- or 4-byte tensor is aligned any more.
fn misalign(bytes: &[u8]) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut out = ((n + 1) as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&bytes[8..8 + n]);
    out.push(b' ');
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

#[test]
fn misaligned_weights_are_copied_and_give_the_same_result() {
    for dtype in [WeightDtype::F32, WeightDtype::Bf16] {
        let cfg = KdaConfig::kimi_k3(16, 2, 4);
        let l = OwnedLayer::random(cfg, dtype, 7).unwrap();
        let files = export_files(&[(0, &l)], &ExportOptions::published(Layout::KimiK3, 1)).unwrap();
        let get = |name: &str| files.iter().find(|(n, _)| n == name).unwrap().1.clone();
        let (config, weights) = (get("config.json"), get("model.safetensors"));
        let aligned = Checkpoint::from_memory(
            &config,
            None,
            vec![("model.safetensors".into(), weights.clone())],
        )
        .unwrap()
        .load(None)
        .unwrap();
        let shifted = Checkpoint::from_memory(
            &config,
            None,
            vec![("model.safetensors".into(), misalign(&weights))],
        )
        .unwrap()
        .load(None)
        .unwrap();
        assert!(shifted.layers()[0]
            .tensors
            .all()
            .iter()
            .all(|t| !t.in_place()));
        let x = Rng::new(1).normals(3 * 16, 1.0);
        let mut r = Runner::default();
        let run = |m: &Model, r: &mut Runner| {
            let mut c = m.new_cache(1).unwrap();
            m.forward(r, 0, &x, &[0, 3], &mut c, Mode::Auto).unwrap()
        };
        assert_eq!(run(&aligned, &mut r), run(&shifted, &mut r));

        // Through the tool, with the debug log saying what was copied.
        let dir = TempDir::new("misaligned");
        let ck = dir.path("ckpt");
        std::fs::create_dir_all(&ck).unwrap();
        std::fs::write(ck.join("config.json"), &config).unwrap();
        std::fs::write(ck.join("model.safetensors"), misalign(&weights)).unwrap();
        let (inp, out) = (dir.path("in"), dir.path("out"));
        kda_host::io::write_input(&inp, &x, 16, None).unwrap();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_kda"))
            .args([
                "forward",
                "--model",
                s(&ck),
                "--input",
                s(&inp),
                "--output",
                s(&out),
            ])
            .env("KDA_LOG", "debug")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(
            err.contains("not aligned for in-place use: copied"),
            "{err}"
        );
        assert!(err.contains("q_proj.weight"), "{err}");
        assert_eq!(
            kda_host::io::read_output(&out).unwrap().0,
            run(&aligned, &mut r)
        );
    }
}

#[test]
fn bf16_input_and_no_cu_seqlens() {
    use kda_host::checkpoint::safetensors::{write_file, OutTensor};
    let dir = TempDir::new("bf16in");
    let (ckpt, owned) = two_layer_model(&dir, WeightDtype::F32);
    let x: Vec<f32> = Rng::new(3)
        .normals(6 * 24, 1.0)
        .iter()
        .map(|v| half::bf16::from_f32(*v).to_f32())
        .collect();
    let t = OutTensor {
        name: "hidden_states".into(),
        dtype: safetensors::Dtype::BF16,
        shape: vec![6, 24],
        bytes: x
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect(),
    };
    let inp = dir.path("in");
    write_file(&inp, &[t], &Default::default()).unwrap();
    let out = dir.path("out");
    kda_ok(&[
        "forward",
        "--model",
        s(&ckpt),
        "--layer",
        "3",
        "--input",
        s(&inp),
        "--output",
        s(&out),
        "--mode",
        "chunked",
        "--threads",
        "2",
    ]);
    let mut c = SequenceCaches::new(&owned[1].cfg, 1).unwrap();
    let kda = owned[1]
        .kda_layer(ForwardOptions::default().with_mode(kda_host::Mode::Chunked))
        .unwrap();
    let want = Runner::default()
        .forward(&kda, &x, &[0, 6], &mut c, InitialCaches::Zero)
        .unwrap();
    assert_eq!(kda_host::io::read_output(&out).unwrap().0, want);
}

//! The fuzz corpus seeds (`fuzz/corpus/<target>/seed-*`): small valid inputs of each target.
//! The test checks that the committed seeds parse as expected; run with
//! `KDA_WRITE_FUZZ_SEEDS=1 cargo test -p kda-host --test fuzz_seeds` to (re)write them.

use std::path::PathBuf;

use kda_core::{KdaConfig, KdaError};
use kda_host::checkpoint::config::{Layout, ModelConfig};
use kda_host::checkpoint::export::{export_files, ALogShape, ExportOptions};
use kda_host::checkpoint::safetensors::{serialize, OutTensor};
use kda_host::checkpoint::{Checkpoint, ShardIndex};
use kda_host::io::{input_bytes, Input};
use kda_host::state_file::{parse_state, state_bytes};
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};
use safetensors::Dtype;

fn checkpoint_seed(
    cfg: KdaConfig,
    dtype: WeightDtype,
    opts: ExportOptions,
    layers: &[usize],
) -> Vec<u8> {
    let l = OwnedLayer::random(cfg, dtype, 3).unwrap();
    let ls: Vec<(usize, &OwnedLayer)> = layers.iter().map(|&i| (i, &l)).collect();
    let files = export_files(&ls, &opts).unwrap();
    let config: Vec<u8> =
        serde_json::to_vec(&serde_json::from_slice::<serde_json::Value>(&files[0].1).unwrap())
            .unwrap();
    let mut out = (config.len() as u16).to_le_bytes().to_vec();
    out.extend_from_slice(&config);
    out.extend_from_slice(&files[1].1);
    out
}

fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let small_k3 = || {
        let mut c = KdaConfig::kimi_k3(4, 2, 2);
        c.conv_width = 2;
        c
    };
    let mut v = vec![
        (
            "checkpoint",
            "kimi-linear-f32",
            checkpoint_seed(
                KdaConfig::kimi_linear(4, 1, 2),
                WeightDtype::F32,
                ExportOptions::published(Layout::KimiLinear, 2),
                &[1],
            ),
        ),
        (
            "checkpoint",
            "kimi-k3-bf16-padded",
            checkpoint_seed(
                small_k3(),
                WeightDtype::Bf16,
                ExportOptions {
                    a_log: ALogShape::Padded(4),
                    ..ExportOptions::published(Layout::KimiK3, 2)
                },
                &[0],
            ),
        ),
        (
            "checkpoint",
            "kimi-k3-two-layers-2d-conv",
            checkpoint_seed(
                small_k3(),
                WeightDtype::F32,
                ExportOptions {
                    a_log: ALogShape::Column,
                    conv_3d: false,
                    ..ExportOptions::published(Layout::KimiK3, 3)
                },
                &[0, 2],
            ),
        ),
    ];
    // The same checkpoint with its data one byte off alignment (every tensor copied).
    let mut shifted = v[0].2.clone();
    let n = u16::from_le_bytes([shifted[0], shifted[1]]) as usize;
    let st = shifted.split_off(2 + n);
    let h = u64::from_le_bytes(st[..8].try_into().unwrap()) as usize;
    shifted.extend_from_slice(&((h + 1) as u64).to_le_bytes());
    shifted.extend_from_slice(&st[8..8 + h]);
    shifted.push(b' ');
    shifted.extend_from_slice(&st[8 + h..]);
    v.push(("checkpoint", "kimi-linear-misaligned", shifted));
    let kl = br#"{"model_type":"kimi_linear","hidden_size":2304,"num_hidden_layers":27,"rms_norm_eps":1e-05,"linear_attn_config":{"full_attn_layers":[4,8,12,16,20,24,27],"kda_layers":[1,2,3,5,6,7,9,10,11,13,14,15,17,18,19,21,22,23,25,26],"num_heads":32,"head_dim":128,"short_conv_kernel_size":4}}"#;
    let k3 = br#"{"model_type":"kimi_k3","text_config":{"model_type":"kimi_linear","hidden_size":7168,"num_hidden_layers":93,"rms_norm_eps":1e-05,"linear_attn_config":{"head_dim":128,"num_heads":96,"short_conv_kernel_size":4,"gate_lower_bound":-5.0,"use_full_rank_gate":true,"kda_layers":[1,3,5,7,9,11],"full_attn_layers":[4,8,92,93]}}}"#;
    let ix = br#"{"metadata":{"total_size":10},"weight_map":{"model.layers.0.self_attn.q_proj.weight":"model-00001-of-00002.safetensors","model.layers.0.self_attn.A_log":"model-00002-of-00002.safetensors"}}"#;
    v.push(("config_json", "kimi-linear", kl.to_vec()));
    v.push(("config_json", "kimi-k3", k3.to_vec()));
    v.push(("config_json", "index", ix.to_vec()));

    let with_sel = |sel: u8, b: Vec<u8>| {
        let mut out = vec![sel];
        out.extend(b);
        out
    };
    let x: Vec<f32> = (0..12).map(|i| i as f32 / 4.0).collect();
    v.push((
        "tensor_files",
        "input-f32-cu",
        with_sel(0, input_bytes(&x, 4, Some(&[0, 1, 3])).unwrap()),
    ));
    let bf = serialize(
        &[
            OutTensor {
                name: "hidden_states".into(),
                dtype: Dtype::BF16,
                shape: vec![2, 4],
                bytes: [0x80, 0x3f].repeat(8),
            },
            OutTensor {
                name: "cu_seqlens".into(),
                dtype: Dtype::I32,
                shape: vec![2],
                bytes: [0i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        ],
        &Default::default(),
        "seed",
    )
    .unwrap();
    v.push(("tensor_files", "input-bf16-i32", with_sel(0, bf)));
    v.push((
        "tensor_files",
        "input-empty",
        with_sel(0, input_bytes(&[], 4, Some(&[0, 0])).unwrap()),
    ));
    v.push((
        "tensor_files",
        "input-no-cu",
        with_sel(0, input_bytes(&x[..4], 4, None).unwrap()),
    ));
    let mut cfg = KdaConfig::kimi_k3(4, 1, 2);
    cfg.conv_width = 3;
    let mut c = SequenceCaches::new(&cfg, 2).unwrap();
    c.recurrent[1] = 0.5;
    v.push((
        "tensor_files",
        "state-n2",
        with_sel(1, state_bytes(&cfg, &c).unwrap()),
    ));
    for (name, args) in [
        (
            "forward",
            &[
                "forward",
                "--model",
                "d",
                "--input",
                "i",
                "--output",
                "o",
                "--state-in",
                "s",
                "--state-out",
                "s",
                "--threads",
                "8",
                "--mode",
                "chunked",
                "--layout",
                "rows",
            ][..],
        ),
        (
            "bench",
            &[
                "bench", "--preset", "kimi-k3", "--prompt", "1024", "--batch", "16", "--steps", "3",
            ][..],
        ),
        (
            "demo",
            &["demo", "--prompt", "64", "--steps", "2", "--seed", "7"][..],
        ),
        ("inspect", &["inspect", "dir"][..]),
    ] {
        v.push(("cli_args", name, args.join("\0").into_bytes()));
    }
    // write_read: selector 0, two tensors (name, dtype index, rank, dims), then values;
    // selector 1, a state (heads, head dim, conv width, sequences) and values.
    let mut t = vec![0u8, 2, 1, b'a', 0, 2, 2, 3];
    t.extend([2, b'c', b'u', 3, 1, 3]);
    t.extend((0..40u8).map(|i| i.wrapping_mul(37)));
    v.push(("write_read", "two-tensors", t));
    let mut st = vec![1u8, 1, 2, 3, 2];
    st.extend((0..200u8).map(|i| i.wrapping_mul(11)));
    v.push(("write_read", "state", st));
    v
}

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

#[test]
fn fuzz_seeds_are_valid() -> Result<(), KdaError> {
    let write = std::env::var_os("KDA_WRITE_FUZZ_SEEDS").is_some();
    for (target, name, bytes) in seeds() {
        match target {
            "checkpoint" => {
                let n = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
                let ck = Checkpoint::from_memory(
                    &bytes[2..2 + n],
                    None,
                    vec![("model.safetensors".into(), bytes[2 + n..].to_vec())],
                )
                .unwrap();
                assert!(!ck.load(None).unwrap().layers().is_empty());
            }
            "config_json" if name == "index" => {
                ShardIndex::parse(&bytes, "ix").unwrap();
            }
            "config_json" => {
                ModelConfig::parse(&bytes, "c").unwrap();
            }
            "cli_args" => {
                let args = bytes
                    .split(|&b| b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned());
                let cli =
                    kda_host::cli::parse(std::iter::once("kda".to_string()).chain(args)).unwrap();
                cli.check().unwrap();
            }
            "write_read" => {}
            _ if bytes[0] == 0 => {
                Input::parse(&bytes[1..], "in", 4).unwrap();
            }
            _ => {
                let mut cfg = KdaConfig::kimi_k3(4, 1, 2);
                cfg.conv_width = 3;
                parse_state(&bytes[1..], "s", &cfg, None).unwrap();
            }
        }
        let p = corpus_dir(target).join(format!("seed-{name}"));
        if write {
            std::fs::create_dir_all(corpus_dir(target)).unwrap();
            std::fs::write(&p, &bytes).unwrap();
        }
    }
    Ok(())
}

//! End to end: fla fixtures written as checkpoints in both published layouts, run through
//! `kda forward`, compared with the fixtures' expected outputs and final states.

mod common;

use common::*;
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, ALogShape, ExportOptions};
use kda_host::io::{read_output, write_input};

const TOL: f64 = 1e-5;

struct Case {
    fixture: &'static str,
    layout: Layout,
    num_layers: usize,
    kda_layers: &'static [usize],
    run_layer: Option<usize>,
    shards: usize,
    a_log: ALogShape,
    conv_3d: bool,
}

/// Writes the checkpoint and the input; runs `kda forward` (with the fixture's initial states
/// when it has them); returns the worst rel-RMS over output and final states.
fn run_case(c: &Case) -> f64 {
    let fx = Fixture::open(c.fixture);
    let layer = fx.layer();
    let dir = TempDir::new(c.fixture);
    let ckpt = dir.path("ckpt");
    let layers: Vec<(usize, &kda_host::OwnedLayer)> =
        c.kda_layers.iter().map(|&i| (i, &layer)).collect();
    export_dir(
        &ckpt,
        &layers,
        &ExportOptions {
            layout: c.layout,
            num_layers: c.num_layers,
            shards: c.shards,
            a_log: c.a_log,
            conv_3d: c.conv_3d,
        },
    )
    .unwrap();
    if c.shards > 1 {
        assert!(ckpt.join("model.safetensors.index.json").is_file());
        assert!(!ckpt.join("model.safetensors").exists());
    }
    let cfg = layer.cfg;
    let input = dir.path("in.safetensors");
    let cu = fx.cu_seqlens();
    write_input(&input, &fx.f32("hidden_states"), cfg.hidden, Some(&cu)).unwrap();
    let (out, state_out, state_in) = (
        dir.path("out.safetensors"),
        dir.path("state_out.safetensors"),
        dir.path("state_in.safetensors"),
    );
    let mut args = vec![
        "forward",
        "--model",
        s(&ckpt),
        "--input",
        s(&input),
        "--output",
        s(&out),
        "--state-out",
        s(&state_out),
        "--threads",
        "1",
    ];
    let layer_arg;
    if let Some(l) = c.run_layer {
        layer_arg = l.to_string();
        args.extend(["--layer", &layer_arg]);
    }
    if fx.has("initial_recurrent_state") {
        fx.write_initial_state(&state_in);
        args.extend(["--state-in", s(&state_in)]);
    }
    kda_ok(&args);

    let (y, shape) = read_output(&out).unwrap();
    assert_eq!(shape, vec![cu[cu.len() - 1], cfg.hidden]);
    let mut worst = rel_rms(&y, &fx.f32("output"));
    println!("{}: output rel-RMS {worst:.3e}", c.fixture);
    let got = read_state_tensors(&state_out);
    for (g, name) in got.iter().zip([
        "final_recurrent_state",
        "final_conv_state_q",
        "final_conv_state_k",
        "final_conv_state_v",
    ]) {
        let r = rel_rms(g, &fx.f32(name));
        println!("{}: {name} rel-RMS {r:.3e}", c.fixture);
        worst = worst.max(r);
    }
    worst
}

#[test]
fn kimi_linear_layout_single_file() {
    // A_log stored [1,1,H,1]; model layers 0 and 2 are KDA, layer 1 is full attention.
    let r = run_case(&Case {
        fixture: "layer_sp_lr_f32_k16_h3_t37.safetensors",
        layout: Layout::KimiLinear,
        num_layers: 3,
        kda_layers: &[0, 2],
        run_layer: Some(2),
        shards: 1,
        a_log: ALogShape::KimiLinear,
        conv_3d: true,
    });
    assert!(r <= TOL, "rel-RMS {r:.3e}");
}

#[test]
fn kimi_k3_layout_sharded() {
    // text_config, language_model.* names, A_log F32 zero-padded to [128], three shards plus
    // an index; layers 0, 1 and 3 are full attention; the default layer is the first KDA one (2).
    let r = run_case(&Case {
        fixture: "layer_lb_full_f32_k32_h4_t200_packed.safetensors",
        layout: Layout::KimiK3,
        num_layers: 4,
        kda_layers: &[2],
        run_layer: None,
        shards: 3,
        a_log: ALogShape::Padded(128),
        conv_3d: true,
    });
    assert!(r <= TOL, "rel-RMS {r:.3e}");
}

#[test]
fn bf16_weights_two_dim_conv_and_column_a_log() {
    // BF16 matrices used in place; conv stored [P, W]; A_log [H, 1]; no initial states.
    let r = run_case(&Case {
        fixture: "layer_sp_lr_bf16_k32_h3_t200_packed.safetensors",
        layout: Layout::KimiLinear,
        num_layers: 2,
        kda_layers: &[1],
        run_layer: Some(1),
        shards: 2,
        a_log: ALogShape::Column,
        conv_3d: false,
    });
    assert!(r <= TOL, "rel-RMS {r:.3e}");
}

#[test]
fn conv_width_one_has_empty_conv_states() {
    let r = run_case(&Case {
        fixture: "layer_lb_full_f32_k16_h4_t5_w1.safetensors",
        layout: Layout::KimiK3,
        num_layers: 1,
        kda_layers: &[0],
        run_layer: Some(0),
        shards: 1,
        a_log: ALogShape::Flat,
        conv_3d: true,
    });
    assert!(r <= TOL, "rel-RMS {r:.3e}");
}

/// Runs `kda forward` on rows `parts[i]` of every sequence in turn, chaining the states, and
/// compares with one run over everything.
fn split_equals_single(fixture: &str, layout: Layout, first_part: &dyn Fn(usize) -> usize) {
    let fx = Fixture::open(fixture);
    let layer = fx.layer();
    let cfg = layer.cfg;
    let hd = cfg.hidden;
    let dir = TempDir::new("split");
    let ckpt = dir.path("ckpt");
    export_dir(&ckpt, &[(0, &layer)], &ExportOptions::published(layout, 1)).unwrap();
    let x = fx.f32("hidden_states");
    let cu = fx.cu_seqlens();
    let init = dir.path("init.safetensors");
    fx.write_initial_state(&init);

    // One run.
    let (inp, out, st) = (dir.path("in.st"), dir.path("out.st"), dir.path("st.st"));
    write_input(&inp, &x, hd, Some(&cu)).unwrap();
    let base = ["forward", "--model", s(&ckpt), "--threads", "1"];
    kda_ok(
        &[
            &base[..],
            &[
                "--input",
                s(&inp),
                "--output",
                s(&out),
                "--state-in",
                s(&init),
                "--state-out",
                s(&st),
            ],
        ]
        .concat(),
    );
    let (y_one, _) = read_output(&out).unwrap();
    let st_one = read_state_tensors(&st);

    // Two runs: the first `first_part(len)` rows of each sequence, then the rest.
    let mut parts: [(Vec<f32>, Vec<usize>); 2] = [(Vec::new(), vec![0]), (Vec::new(), vec![0])];
    let mut rows_of: [Vec<(usize, usize)>; 2] = [Vec::new(), Vec::new()];
    for w in cu.windows(2) {
        let (a, b) = (w[0], w[1]);
        let m = a + first_part(b - a);
        for (k, (r0, r1)) in [(a, m), (m, b)].into_iter().enumerate() {
            parts[k].0.extend_from_slice(&x[r0 * hd..r1 * hd]);
            let last = *parts[k].1.last().unwrap();
            parts[k].1.push(last + r1 - r0);
            rows_of[k].push((r0, r1));
        }
    }
    let mid = dir.path("mid.st");
    let mut y_two = vec![0.0f32; x.len()];
    for k in 0..2 {
        let (inp, out) = (
            dir.path(&format!("in{k}.st")),
            dir.path(&format!("out{k}.st")),
        );
        write_input(&inp, &parts[k].0, hd, Some(&parts[k].1)).unwrap();
        let (s_in, s_out) = if k == 0 { (&init, &mid) } else { (&mid, &st) };
        kda_ok(
            &[
                &base[..],
                &[
                    "--input",
                    s(&inp),
                    "--output",
                    s(&out),
                    "--state-in",
                    s(s_in),
                    "--state-out",
                    s(s_out),
                ],
            ]
            .concat(),
        );
        let (y, _) = read_output(&out).unwrap();
        let mut off = 0;
        for &(r0, r1) in &rows_of[k] {
            y_two[r0 * hd..r1 * hd].copy_from_slice(&y[off..off + (r1 - r0) * hd]);
            off += (r1 - r0) * hd;
        }
    }
    let st_two = read_state_tensors(&st);
    let r = rel_rms(&y_two, &y_one);
    println!(
        "{fixture}: split vs single output rel-RMS {r:.3e} (bitwise equal: {})",
        y_two == y_one
    );
    assert!(r <= 1e-6, "{r:.3e}");
    for (a, b) in st_two.iter().zip(&st_one) {
        assert!(rel_rms(a, b) <= 1e-6);
    }
    // And both match the fixture.
    assert!(rel_rms(&y_one, &fx.f32("output")) <= TOL);
}

#[test]
fn split_run_equals_single_run() {
    split_equals_single(
        "layer_sp_lr_f32_k16_h3_t37.safetensors",
        Layout::KimiLinear,
        &|n| n * 5 / 9,
    );
}

#[test]
fn split_run_equals_single_run_packed() {
    // Sequences of 1, 2 and 197 tokens; the first part holds 0, 1 and 98 of them (an empty
    // sequence in a packed batch included).
    split_equals_single(
        "layer_lb_full_f32_k32_h4_t200_packed.safetensors",
        Layout::KimiK3,
        &|n| n / 2,
    );
}

#[test]
fn inspect_lists_kda_layers() {
    let fx = Fixture::open("layer_sp_lr_f32_k16_h3_t37.safetensors");
    let layer = fx.layer();
    let dir = TempDir::new("inspect");
    let ckpt = dir.path("ckpt");
    export_dir(
        &ckpt,
        &[(0, &layer), (2, &layer)],
        &ExportOptions::published(Layout::KimiLinear, 3),
    )
    .unwrap();
    let out = kda_ok(&["inspect", s(&ckpt)]);
    println!("{out}");
    assert!(out.contains("Kimi Linear"), "{out}");
    assert!(
        out.contains("layer   0: KDA") && out.contains("layer   2: KDA"),
        "{out}"
    );
    assert!(!out.contains("layer   1: KDA"), "{out}");
    assert!(
        out.contains("3 heads x 16") && out.contains("softplus"),
        "{out}"
    );
    assert!(
        out.contains("low-rank 16 output gate") && out.contains("all F32"),
        "{out}"
    );

    let fx = Fixture::open("layer_lb_full_f32_k32_h4_t200_packed.safetensors");
    let layer = fx.layer();
    let ckpt = dir.path("k3");
    export_dir(
        &ckpt,
        &[(1, &layer)],
        &ExportOptions::published(Layout::KimiK3, 2),
    )
    .unwrap();
    let out = kda_ok(&["inspect", s(&ckpt)]);
    println!("{out}");
    assert!(
        out.contains("Kimi K3") && out.contains("layer   1: KDA"),
        "{out}"
    );
    assert!(
        out.contains("lower-bound -5") && out.contains("full-rank output gate"),
        "{out}"
    );
    assert!(out.contains("A_log[128](first 4 used)"), "{out}");
}

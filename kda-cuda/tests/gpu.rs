//! GPU conformance: every kernel path against kda-core's CPU recurrence on random layers.
//! Each test prints `skipped: no CUDA device (...)` and passes on machines without a GPU;
//! `scripts/gpu-check.sh` runs them on a GPU machine.
//!
//! Tolerances: f32 weights and rows, rel-RMS ≤ 1e-4 (output and every cache); bf16 weights
//! and rows (f32 state and internals) ≤ 5e-3 against the CPU on the same bf16-rounded weights.

mod common;

use common::{compare, cpu_decode, cpu_forward, Caches, Layer, Rng};
use kda_core::{Batch, InitialCaches, KdaBackend, KdaConfig, Mode};
use kda_cuda::{
    conformance_backend, CudaBackend, CudaError, CudaOptions, DeviceCaches, DeviceRows,
    DeviceWeights, DeviceWorkspace, Dtype, HostFormats, WeightFormat,
};

const F32_TOL: f64 = 1e-4;
const BF16_TOL: f64 = 5e-3;

fn backend() -> Option<CudaBackend> {
    match conformance_backend() {
        Ok(be) => {
            let d = be.device_info();
            eprintln!(
                "cuda: {} (sm_{}{})",
                d.name, d.compute_capability.0, d.compute_capability.1
            );
            Some(be)
        }
        Err(e) => {
            eprintln!("skipped: no CUDA device ({e})");
            None
        }
    }
}

/// A config with the given gate forms and sizes.
fn cfg(kind: &str, hidden: usize, heads: usize, k: usize, w: usize) -> KdaConfig {
    let mut c = match kind {
        "k3" => KdaConfig::kimi_k3(hidden, heads, k),
        _ => KdaConfig::kimi_linear(hidden, heads, k),
    };
    c.conv_width = w;
    c
}

/// Runs one forward on the GPU (host helpers) and on the CPU; returns the worst rel-RMS.
fn forward_case(
    be: &mut CudaBackend,
    layer: &Layer,
    cu: &[usize],
    init: InitialCaches,
    formats: HostFormats,
    seed: u64,
) -> (f64, String) {
    let cfg = &layer.cfg;
    let n = cu.len() - 1;
    let t = *cu.last().unwrap();
    let x = Rng(seed).vec(t * cfg.hidden, 1.0);
    let start = Caches::random(cfg, n, seed + 1);
    // The CPU reference sees what the GPU sees: bf16-rounded weights and rows in bf16 mode.
    let (ref_layer, ref_x) = if formats.io == Dtype::Bf16 {
        let rx: Vec<f32> = x
            .iter()
            .map(|&v| kda_core::bf16::from_f32(v).to_f32())
            .collect();
        (layer.rounded_bf16(), rx)
    } else {
        (layer.clone(), x.clone())
    };
    let mut want_c = start.clone();
    let want = cpu_forward(&ref_layer, &ref_x, cu, &mut want_c, init);
    let mut got_c = start.clone();
    let mut got = vec![0.0; x.len()];
    let batch = Batch {
        x: &x,
        cu_seqlens: cu,
        out: &mut got,
    };
    be.forward_host_with(cfg, &layer.weights(), batch, got_c.as_mut(), init, formats)
        .unwrap_or_else(|e| panic!("GPU forward failed: {e}"));
    compare(&got, &got_c, &want, &want_c)
}

fn check(what: &str, r: (f64, String), tol: f64) {
    println!("{what:<60} {}", r.1);
    assert!(
        r.0 <= tol,
        "{what}: worst rel-RMS {:.3e} > {tol:e} ({})",
        r.0,
        r.1
    );
}

#[test]
fn forward_matches_cpu_in_every_mode_and_shape() {
    let Some(mut be) = backend() else { return };
    let shapes = [
        ("linear", 64, 2, 32, 4, vec![0usize, 1, 5, 70, 70, 200]),
        ("k3", 96, 3, 128, 4, vec![0, 130, 131, 300]),
        ("linear", 40, 4, 16, 1, vec![0, 2, 5, 40]),
        ("k3", 48, 2, 64, 2, vec![0, 65]),
        ("linear", 64, 1, 256, 4, vec![0, 100, 190]),
    ];
    let modes = [
        (Mode::Recurrent, None),
        (Mode::Chunked, None),
        (Mode::Chunked, Some(16)),
        (Mode::Chunked, Some(37)),
        (Mode::Auto, None),
    ];
    for (i, (kind, hidden, h, k, w, cu)) in shapes.iter().enumerate() {
        let layer = Layer::random(cfg(kind, *hidden, *h, *k, *w), 100 + i as u64);
        for (mode, chunk) in modes {
            be.opts = CudaOptions {
                mode,
                chunk_size: chunk,
            };
            if mode == Mode::Chunked && be.chunk_size(&layer.cfg).is_err() {
                println!("{kind} K{k}: chunked unsupported on this device, skipped");
                continue;
            }
            for init in [InitialCaches::Given, InitialCaches::Zero] {
                let r = forward_case(&mut be, &layer, cu, init, HostFormats::F32, 7 + i as u64);
                check(
                    &format!("{kind} H{h} K{k} W{w} cu{cu:?} {mode:?}/{chunk:?} {init:?}"),
                    r,
                    F32_TOL,
                );
            }
        }
    }
}

#[test]
fn hard_resets_and_unbounded_gates_stay_finite() {
    let Some(mut be) = backend() else { return };
    let mut layer = Layer::random(cfg("linear", 64, 2, 64, 4), 5);
    // exp(A_log) ≈ 1100: g ≈ −1100·softplus(x), most gates far below −80 (hard resets), the
    // others (very negative x) near 0, so chunks see every spread.
    layer.a_log = Some(vec![7.0, 0.0]);
    if let Some(b) = layer.dt_bias.as_mut() {
        for (i, v) in b.iter_mut().enumerate() {
            *v = if i % 3 == 0 { -30.0 } else { 2.0 };
        }
    }
    for mode in [Mode::Recurrent, Mode::Chunked] {
        be.opts = CudaOptions {
            mode,
            chunk_size: None,
        };
        let r = forward_case(
            &mut be,
            &layer,
            &[0, 200, 333],
            InitialCaches::Given,
            HostFormats::F32,
            3,
        );
        check(&format!("−1000-scale gates, {mode:?}"), r, F32_TOL);
    }
}

#[test]
fn bf16_path_matches_cpu_on_rounded_weights() {
    let Some(mut be) = backend() else { return };
    for (i, (kind, k)) in [("linear", 128usize), ("k3", 64)].into_iter().enumerate() {
        let layer = Layer::random(cfg(kind, 128, 2, k, 4), 40 + i as u64);
        for mode in [Mode::Recurrent, Mode::Chunked] {
            be.opts = CudaOptions {
                mode,
                chunk_size: None,
            };
            let r = forward_case(
                &mut be,
                &layer,
                &[0, 3, 150, 300],
                InitialCaches::Given,
                HostFormats::BF16,
                9,
            );
            check(&format!("bf16 {kind} K{k} {mode:?}"), r, BF16_TOL);
        }
    }
}

#[test]
fn decode_steps_match_cpu() {
    let Some(mut be) = backend() else { return };
    for (i, (kind, h, k, w)) in [
        ("linear", 2usize, 32usize, 4usize),
        ("k3", 3, 128, 4),
        ("linear", 1, 256, 2),
        ("k3", 2, 16, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let layer = Layer::random(cfg(kind, 64, h, k, w), 60 + i as u64);
        let n = 3;
        let mut want_c = Caches::random(&layer.cfg, n, 61 + i as u64);
        let mut got_c = want_c.clone();
        let mut rng = Rng(62 + i as u64);
        for step in 0..5 {
            let x = rng.vec(n * layer.cfg.hidden, 1.0);
            let want = cpu_decode(&layer, &x, &mut want_c);
            let mut got = vec![0.0; x.len()];
            be.decode_host(&layer.cfg, &layer.weights(), &x, got_c.as_mut(), &mut got)
                .unwrap_or_else(|e| panic!("GPU decode failed: {e}"));
            check(
                &format!("decode {kind} H{h} K{k} W{w} step {step}"),
                compare(&got, &got_c, &want, &want_c),
                F32_TOL,
            );
        }
    }
}

#[test]
fn device_resident_prefill_then_decode_through_the_trait() {
    let Some(mut be) = backend() else { return };
    let layer = Layer::random(cfg("k3", 64, 2, 64, 4), 77);
    let cfg = layer.cfg;
    let cu = [0usize, 90, 91, 160];
    let n = cu.len() - 1;
    let mut rng = Rng(78);
    let x = rng.vec(160 * cfg.hidden, 1.0);
    let mut want_c = Caches::zeros(&cfg, n);
    let want = cpu_forward(&layer, &x, &cu, &mut want_c, InitialCaches::Zero);

    let w = DeviceWeights::upload(&be, &cfg, &layer.weights(), WeightFormat::F32).unwrap();
    let xd = DeviceRows::from_f32(&be, &x, Dtype::F32).unwrap();
    let mut od = DeviceRows::zeros(&be, Dtype::F32, x.len()).unwrap();
    let mut caches = DeviceCaches::zeros(&be, &cfg, n).unwrap();
    let mut ws = DeviceWorkspace::new(&be, be.forward_workspace_len(&cfg, 160).unwrap()).unwrap();
    be.opts.mode = Mode::Chunked;
    be.forward(
        &cfg,
        &w,
        &xd,
        &cu,
        &mut caches,
        InitialCaches::Zero,
        &mut od,
        &mut ws,
    )
    .unwrap();
    let mut got_c = Caches::zeros(&cfg, n);
    caches.download(&be, &mut got_c.as_mut()).unwrap();
    check(
        "trait forward (device buffers)",
        compare(&od.to_f32(&be).unwrap(), &got_c, &want, &want_c),
        F32_TOL,
    );

    // Decode three steps on the device-resident caches.
    let mut dws = DeviceWorkspace::new(&be, be.decode_workspace_len(&cfg, n).unwrap()).unwrap();
    for step in 0..3 {
        let xs = rng.vec(n * cfg.hidden, 1.0);
        let want = cpu_decode(&layer, &xs, &mut want_c);
        let xd = DeviceRows::from_f32(&be, &xs, Dtype::F32).unwrap();
        let mut od = DeviceRows::zeros(&be, Dtype::F32, xs.len()).unwrap();
        be.decode_step(&cfg, &w, &xd, &mut caches, &mut od, &mut dws)
            .unwrap();
        caches.download(&be, &mut got_c.as_mut()).unwrap();
        check(
            &format!("trait decode step {step}"),
            compare(&od.to_f32(&be).unwrap(), &got_c, &want, &want_c),
            F32_TOL,
        );
    }
}

#[test]
fn chunk_size_does_not_change_the_result() {
    let Some(mut be) = backend() else { return };
    let layer = Layer::random(cfg("linear", 64, 2, 64, 4), 90);
    let cu = [0usize, 257];
    let x = Rng(91).vec(257 * 64, 1.0);
    let mut results = Vec::new();
    for (mode, chunk) in [
        (Mode::Recurrent, None),
        (Mode::Chunked, Some(16)),
        (Mode::Chunked, Some(32)),
        (Mode::Chunked, Some(64)),
    ] {
        be.opts = CudaOptions {
            mode,
            chunk_size: chunk,
        };
        if be.chunk_size(&layer.cfg).is_err() && mode == Mode::Chunked {
            continue;
        }
        let mut c = Caches::zeros(&layer.cfg, 1);
        let mut out = vec![0.0; x.len()];
        let batch = Batch {
            x: &x,
            cu_seqlens: &cu,
            out: &mut out,
        };
        let w = layer.weights();
        be.forward_host(&layer.cfg, &w, batch, c.as_mut(), InitialCaches::Zero)
            .unwrap();
        results.push((format!("{mode:?}/{chunk:?}"), out, c));
    }
    for (name, out, c) in &results[1..] {
        check(
            &format!("GPU {name} vs GPU recurrent"),
            compare(out, c, &results[0].1, &results[0].2),
            1e-5,
        );
    }
}

#[test]
fn bad_arguments_are_errors_on_a_real_device() {
    let Some(mut be) = backend() else { return };
    let layer = Layer::random(cfg("linear", 32, 2, 16, 4), 1);
    let cfg = layer.cfg;
    let w = DeviceWeights::upload(&be, &cfg, &layer.weights(), WeightFormat::AsStored).unwrap();
    let xd = DeviceRows::zeros(&be, Dtype::F32, 10 * 32).unwrap();
    let mut od = DeviceRows::zeros(&be, Dtype::F32, 10 * 32).unwrap();
    let mut caches = DeviceCaches::zeros(&be, &cfg, 1).unwrap();
    let mut small = DeviceWorkspace::new(&be, 10).unwrap();
    let e = be.forward(
        &cfg,
        &w,
        &xd,
        &[0, 10],
        &mut caches,
        InitialCaches::Zero,
        &mut od,
        &mut small,
    );
    assert!(
        matches!(e, Err(CudaError::Core(kda_core::KdaError::TooSmall { .. }))),
        "{e:?}"
    );
    let mut ws = DeviceWorkspace::new(&be, be.forward_workspace_len(&cfg, 10).unwrap()).unwrap();
    let e = be.forward(
        &cfg,
        &w,
        &xd,
        &[0, 9],
        &mut caches,
        InitialCaches::Zero,
        &mut od,
        &mut ws,
    );
    assert!(
        matches!(e, Err(CudaError::Core(kda_core::KdaError::Offsets { .. }))),
        "{e:?}"
    );
    let e = be.forward(
        &cfg,
        &w,
        &xd,
        &[0, 5, 10],
        &mut caches,
        InitialCaches::Zero,
        &mut od,
        &mut ws,
    );
    assert!(e.is_err(), "caches hold 1 sequence, not 2");
    let mut other = cfg;
    other.rms_eps = 1e-3;
    let e = be.forward(
        &other,
        &w,
        &xd,
        &[0, 10],
        &mut caches,
        InitialCaches::Zero,
        &mut od,
        &mut ws,
    );
    assert!(matches!(e, Err(CudaError::Invalid(_))), "{e:?}");
    let mut be2 = conformance_backend().unwrap();
    let e = be2.forward(
        &cfg,
        &w,
        &xd,
        &[0, 10],
        &mut caches,
        InitialCaches::Zero,
        &mut od,
        &mut ws,
    );
    assert!(
        matches!(e, Err(CudaError::Invalid(_))),
        "buffers of another backend: {e:?}"
    );
    be.synchronize().unwrap();
}

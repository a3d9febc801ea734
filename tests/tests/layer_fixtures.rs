//! The whole layer against fla-core 0.6.0 fixtures, on every available backend.

use kda_conformance::{backends, layer_fixtures, rel_rms, CpuHarness, Fixture, Harness};

const TOL: f64 = 1e-5;

fn check_case(h: &mut dyn Harness, name: &str) -> f64 {
    let fx = Fixture::open(name);
    let layer = fx.layer();
    let x = fx.f32("hidden_states");
    let cu = fx.cu_seqlens();
    let (mut caches, init) = fx.initial_caches();
    let out = h
        .forward(&layer, &x, &cu, &mut caches, init)
        .unwrap_or_else(|e| panic!("{name} on {}: {e}", h.name()));
    let errs = [
        ("output", rel_rms(&out, &fx.f32("output"))),
        (
            "recurrent",
            rel_rms(&caches.recurrent, &fx.f32("final_recurrent_state")),
        ),
        (
            "conv_q",
            rel_rms(&caches.conv_q, &fx.f32("final_conv_state_q")),
        ),
        (
            "conv_k",
            rel_rms(&caches.conv_k, &fx.f32("final_conv_state_k")),
        ),
        (
            "conv_v",
            rel_rms(&caches.conv_v, &fx.f32("final_conv_state_v")),
        ),
    ];
    println!(
        "{:<6} {name:<48} {}",
        h.name(),
        errs.iter()
            .map(|(n, e)| format!("{n} {e:.1e}"))
            .collect::<Vec<_>>()
            .join("  ")
    );
    // GPU backends: f32 within 1e-4 of the reference (different summation orders); the CPU
    // paths within 1e-5.
    let tol = if h.name().starts_with("cuda") {
        1e-4
    } else {
        TOL
    };
    let mut worst: f64 = 0.0;
    for (what, e) in errs {
        assert!(
            e <= tol,
            "{name} on {}: {what} rel-RMS {e:.3e} > {tol:e}",
            h.name()
        );
        worst = worst.max(e);
    }
    worst
}

#[test]
fn every_layer_fixture_matches_reference_on_every_backend() {
    let cases = layer_fixtures();
    assert!(cases.len() >= 9, "fixtures missing: {cases:?}");
    for mut b in backends() {
        let worst = cases
            .iter()
            .map(|c| check_case(b.as_mut(), c))
            .fold(0.0, f64::max);
        println!(
            "{}: worst rel-RMS over {} cases: {worst:.2e}",
            b.name(),
            cases.len()
        );
    }
}

#[test]
fn block_size_does_not_change_the_result_bitwise() {
    for name in layer_fixtures() {
        let fx = Fixture::open(&name);
        let layer = fx.layer();
        let x = fx.f32("hidden_states");
        let cu = fx.cu_seqlens();
        let mut results = Vec::new();
        for block in [1, 3, 64, 1000] {
            let (mut caches, init) = fx.initial_caches();
            let out = CpuHarness::recurrent(block)
                .forward(&layer, &x, &cu, &mut caches, init)
                .unwrap();
            results.push((out, caches));
        }
        for r in &results[1..] {
            assert_eq!(r.0, results[0].0, "{name}: output depends on block size");
            assert_eq!(r.1, results[0].1, "{name}: caches depend on block size");
        }
    }
}

/// Decoding the fixture token by token (one sequence at a time) reproduces the reference.
#[test]
fn decode_steps_reproduce_the_fixture() {
    for name in layer_fixtures() {
        let fx = Fixture::open(&name);
        let layer = fx.layer();
        let hd = layer.cfg.hidden;
        let x = fx.f32("hidden_states");
        let cu = fx.cu_seqlens();
        let want = fx.f32("output");
        let (all, _) = fx.initial_caches();
        for n in 0..cu.len() - 1 {
            // A one-sequence cache holding sequence n's initial caches.
            let mut c = kda_host::SequenceCaches::new(&layer.cfg, 1).unwrap();
            let (s, cl) = (
                layer.cfg.state_len().unwrap(),
                layer.cfg.conv_state_len().unwrap(),
            );
            c.recurrent
                .copy_from_slice(&all.recurrent[n * s..(n + 1) * s]);
            c.conv_q.copy_from_slice(&all.conv_q[n * cl..(n + 1) * cl]);
            c.conv_k.copy_from_slice(&all.conv_k[n * cl..(n + 1) * cl]);
            c.conv_v.copy_from_slice(&all.conv_v[n * cl..(n + 1) * cl]);
            let mut got = Vec::new();
            for t in cu[n]..cu[n + 1] {
                got.extend(
                    CpuHarness::recurrent(1)
                        .decode(&layer, &x[t * hd..(t + 1) * hd], &mut c)
                        .unwrap(),
                );
            }
            let e = rel_rms(&got, &want[cu[n] * hd..cu[n + 1] * hd]);
            assert!(e <= TOL, "{name} seq {n}: decode rel-RMS {e:.2e}");
            let e = rel_rms(
                &c.recurrent,
                &fx.f32("final_recurrent_state")[n * s..(n + 1) * s],
            );
            assert!(
                e <= TOL,
                "{name} seq {n}: decode final state rel-RMS {e:.2e}"
            );
        }
    }
}

/// The intermediates the fixtures carry match the core's components, so a failure above can be
/// located: q/k after conv + L2 norm, the gate, beta and the recurrence output.
#[test]
fn components_inside_the_layer_match_the_intermediates() {
    use kda_core::ops::{conv, gate, linear, norm, recurrent};
    for name in layer_fixtures() {
        let fx = Fixture::open(&name);
        let layer = fx.layer();
        let cfg = layer.cfg;
        let w = layer.weights().unwrap();
        let x = fx.f32("hidden_states");
        let cu = fx.cu_seqlens();
        let (d, k, h) = (cfg.proj_dim(), cfg.head_dim, cfg.heads);
        let t_len = *cu.last().unwrap();
        // Gate and beta.
        let mut low = vec![0.0; t_len * k];
        let mut g = vec![0.0; t_len * d];
        if let kda_core::GateWeights::LowRank { down, up } = w.decay_proj {
            linear(&x, &down, &mut low).unwrap();
            linear(&low, &up, &mut g).unwrap();
        }
        gate::decay_gate(&mut g, cfg.decay_gate, w.a_log, w.dt_bias, h, k).unwrap();
        let e = rel_rms(&g, &fx.f32("inter.g"));
        assert!(e <= TOL, "{name}: g rel-RMS {e:.2e}");
        let mut beta = vec![0.0; t_len * h];
        linear(&x, &w.b_proj, &mut beta).unwrap();
        gate::beta_sigmoid(&mut beta);
        let e = rel_rms(&beta, &fx.f32("inter.beta"));
        assert!(e <= TOL, "{name}: beta rel-RMS {e:.2e}");
        // q/k/v through conv (+ norm) per sequence, then the recurrence.
        let (caches, _) = fx.initial_caches();
        let cl = cfg.conv_state_len().unwrap();
        let mut qkv = [
            vec![0.0; t_len * d],
            vec![0.0; t_len * d],
            vec![0.0; t_len * d],
        ];
        let mut states = [
            caches.conv_q.clone(),
            caches.conv_k.clone(),
            caches.conv_v.clone(),
        ];
        let mats = [w.q_proj, w.k_proj, w.v_proj];
        let convs = [w.q_conv, w.k_conv, w.v_conv];
        let mut scratch = vec![0.0; conv::short_conv_prefill_scratch(cfg.conv_width)];
        for i in 0..3 {
            linear(&x, &mats[i], &mut qkv[i]).unwrap();
            for n in 0..cu.len() - 1 {
                conv::short_conv_prefill(
                    &mut qkv[i][cu[n] * d..cu[n + 1] * d],
                    d,
                    convs[i],
                    &mut states[i][n * cl..(n + 1) * cl],
                    &mut scratch,
                )
                .unwrap();
            }
        }
        norm::l2_norm(&mut qkv[0], k, cfg.l2_eps).unwrap();
        norm::l2_norm(&mut qkv[1], k, cfg.l2_eps).unwrap();
        for (i, n) in ["inter.q", "inter.k", "inter.v"].iter().enumerate() {
            let e = rel_rms(&qkv[i], &fx.f32(n));
            assert!(e <= TOL, "{name}: {n} rel-RMS {e:.2e}");
        }
        let s = cfg.state_len().unwrap();
        let mut o = vec![0.0; t_len * d];
        let mut state = caches.recurrent.clone();
        let [q, kk, v] = &mut qkv;
        for n in 0..cu.len() - 1 {
            let r = cu[n] * d..cu[n + 1] * d;
            let br = cu[n] * h..cu[n + 1] * h;
            let rows = recurrent::SequenceRows {
                q: &q[r.clone()],
                k: &kk[r.clone()],
                v: &mut v[r.clone()],
                g: &g[r.clone()],
                beta: &beta[br],
                state: &mut state[n * s..(n + 1) * s],
            };
            recurrent::recurrent_sequence(rows, h, k, cfg.scale(), &mut o[r]).unwrap();
        }
        let e = rel_rms(&o, &fx.f32("inter.o"));
        assert!(e <= TOL, "{name}: recurrence output rel-RMS {e:.2e}");
    }
}

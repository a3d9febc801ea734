//! The chunked (WY/UT) kernel against the token-by-token recurrence, and against fla's
//! `naive_chunk_kda` fixture; the layer in chunked mode against the layer in recurrent mode.

use kda_conformance::random_caches;
use kda_conformance::{rel_rms, CpuHarness, Fixture, Harness};
use kda_core::ops::chunked::{chunked_head, chunked_scratch_len, Chunks};
use kda_core::ops::gate::decay_gate;
use kda_core::ops::norm::l2_norm;
use kda_core::ops::recurrent::{recurrent_head, recurrent_scratch_len};
use kda_core::ops::HeadRows;
use kda_core::{Data, DecayGate, GateProj, InitialCaches, Isa, KdaConfig};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};
use proptest::prelude::*;

const TOL: f64 = 1e-5;

struct Head {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    s0: Vec<f32>,
}

#[derive(Clone, Copy, Debug)]
enum Gate {
    /// Kimi K3: −5·sigmoid(·).
    LowerBound,
    /// Kimi Linear: unbounded −exp(A)·softplus(·), with large raw values.
    Softplus,
    /// Softplus plus hard resets of −1000 on ~2 % of the channels.
    Resets,
}

fn head(t: usize, k: usize, gate: Gate, seed: u64) -> Head {
    let mut r = Rng::new(seed);
    let mut q = r.normals(t * k, 1.0);
    let mut kk = r.normals(t * k, 1.0);
    l2_norm(&mut q, k, 1e-6).unwrap();
    l2_norm(&mut kk, k, 1e-6).unwrap();
    let mut g = r.normals(t * k, 3.0);
    let a_log = [1.5f32];
    let form = match gate {
        Gate::LowerBound => DecayGate::LowerBound(-5.0),
        _ => DecayGate::Softplus,
    };
    decay_gate(&mut g, form, Some(Data::F32(&a_log)), None, 1, k).unwrap();
    if let Gate::Resets = gate {
        for v in g.iter_mut() {
            if r.uniform() < 0.02 {
                *v = -1000.0;
            }
        }
    }
    let beta = (0..t).map(|_| 1.0 / (1.0 + (-r.normal()).exp())).collect();
    Head {
        q,
        k: kk,
        v: r.normals(t * k, 1.0),
        g,
        beta,
        s0: r.normals(k * k, 0.5),
    }
}

fn compare(h: &Head, k: usize, chunk: usize, isa: Isa) -> (f64, f64) {
    let scale = 1.0 / (k as f32).sqrt();
    let (mut vr, mut sr) = (h.v.clone(), h.s0.clone());
    let mut scr = vec![0.0; recurrent_scratch_len(k, k)];
    recurrent_head(
        Isa::Portable,
        HeadRows {
            q: &h.q,
            k: &h.k,
            g: &h.g,
            beta: &h.beta,
            v_o: &mut vr,
            state: &mut sr,
            scale,
        },
        &mut scr,
    )
    .unwrap();
    let (mut vc, mut sc) = (h.v.clone(), h.s0.clone());
    let mut scr = vec![0.0; chunked_scratch_len(chunk, k, k)];
    chunked_head(
        isa,
        HeadRows {
            q: &h.q,
            k: &h.k,
            g: &h.g,
            beta: &h.beta,
            v_o: &mut vc,
            state: &mut sc,
            scale,
        },
        Chunks {
            size: chunk,
            first: chunk,
        },
        &mut scr,
    )
    .unwrap();
    assert!(
        vc.iter().chain(&sc).all(|x| x.is_finite()),
        "non-finite chunked output"
    );
    (rel_rms(&vc, &vr), rel_rms(&sc, &sr))
}

#[test]
fn chunked_kernel_equals_recurrence_over_the_issue_grid() {
    let mut worst: f64 = 0.0;
    for &k in &[16usize, 32, 64, 128] {
        for &t in &[1usize, 15, 16, 17, 63, 64, 65, 200, 1000, 4096] {
            for gate in [Gate::LowerBound, Gate::Softplus, Gate::Resets] {
                let h = head(t, k, gate, (t * 1009 + k) as u64);
                let chunks: &[usize] = if t <= 200 { &[16, 32, 64] } else { &[64] };
                for &c in chunks {
                    for isa in Isa::all_supported() {
                        let (eo, es) = compare(&h, k, c, isa);
                        assert!(
                            eo <= TOL && es <= TOL,
                            "K{k} T{t} {gate:?} C{c} {isa:?}: o {eo:.2e}, S {es:.2e}"
                        );
                        worst = worst.max(eo).max(es);
                    }
                }
            }
        }
    }
    println!("chunked vs recurrent, worst rel-RMS over the grid: {worst:.2e}");
}

#[test]
fn chunked_kernel_matches_naive_chunk_fixture() {
    let f = Fixture::open("components.safetensors");
    let q = f.t("chunk.q");
    let (t, h, k) = (q.shape[1], q.shape[2], q.shape[3]);
    let pick = |name: &str, head: usize, width: usize| -> Vec<f32> {
        let all = f.f32(name);
        (0..t)
            .flat_map(|i| all[(i * h + head) * width..(i * h + head + 1) * width].to_vec())
            .collect()
    };
    let h0 = f.f32("chunk.h0");
    let (want_o, want_s) = (f.f32("chunk.o"), f.f32("chunk.ht"));
    for isa in Isa::all_supported() {
        for chunk in [16usize, 64] {
            let mut o = vec![0.0; want_o.len()];
            let mut s = h0.clone();
            for head in 0..h {
                let mut v = pick("chunk.v", head, k);
                let beta: Vec<f32> = (0..t).map(|i| f.f32("chunk.beta")[i * h + head]).collect();
                let mut scr = vec![0.0; chunked_scratch_len(chunk, k, k)];
                chunked_head(
                    isa,
                    HeadRows {
                        q: &pick("chunk.q", head, k),
                        k: &pick("chunk.k", head, k),
                        g: &pick("chunk.g", head, k),
                        beta: &beta,
                        v_o: &mut v,
                        state: &mut s[head * k * k..(head + 1) * k * k],
                        scale: 1.0 / (k as f32).sqrt(),
                    },
                    Chunks {
                        size: chunk,
                        first: chunk,
                    },
                    &mut scr,
                )
                .unwrap();
                for i in 0..t {
                    o[(i * h + head) * k..(i * h + head + 1) * k]
                        .copy_from_slice(&v[i * k..(i + 1) * k]);
                }
            }
            let (eo, es) = (rel_rms(&o, &want_o), rel_rms(&s, &want_s));
            println!("naive_chunk_kda fixture, {isa:?} C{chunk}: o {eo:.2e}, S {es:.2e}");
            assert!(eo <= TOL && es <= TOL);
        }
    }
}

fn cfg_strategy() -> impl Strategy<Value = KdaConfig> {
    (
        1usize..24,
        1usize..4,
        prop::sample::select(vec![4usize, 8, 16, 32]),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(hidden, heads, k, lb, full)| KdaConfig {
            decay_gate: if lb {
                DecayGate::LowerBound(-5.0)
            } else {
                DecayGate::Softplus
            },
            output_gate: if full {
                GateProj::FullRank
            } else {
                GateProj::LowRank { rank: k }
            },
            ..KdaConfig::kimi_linear(hidden, heads, k)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]

    /// The layer in chunked mode equals the layer in recurrent mode on packed batches with
    /// initial caches, for several chunk sizes and block sizes.
    #[test]
    fn chunked_layer_equals_recurrent_layer(cfg in cfg_strategy(), lens in prop::collection::vec(0usize..90, 1..4),
                                            chunk in prop::sample::select(vec![1usize, 5, 16, 32, 64]), block in 1usize..200, seed in any::<u64>()) {
        let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, seed).unwrap();
        let mut r = Rng::new(seed ^ 7);
        let mut cu = vec![0];
        for n in &lens { cu.push(cu.last().unwrap() + n); }
        let x = r.normals(cu.last().unwrap() * cfg.hidden, 1.0);
        let c0 = random_caches(&cfg, lens.len(), &mut r);
        let (mut a, mut b) = (c0.clone(), c0);
        let want = CpuHarness::recurrent(64).forward(&layer, &x, &cu, &mut a, InitialCaches::Given).unwrap();
        let got = CpuHarness::chunked(block, chunk).forward(&layer, &x, &cu, &mut b, InitialCaches::Given).unwrap();
        prop_assert!(rel_rms(&got, &want) <= TOL, "output {:.2e}", rel_rms(&got, &want));
        prop_assert!(rel_rms(&b.recurrent, &a.recurrent) <= TOL);
        prop_assert_eq!(&b.conv_q, &a.conv_q);
    }

    /// Two chunked calls handing the caches over equal one call.
    #[test]
    fn chunked_state_handoff(cfg in cfg_strategy(), t in 1usize..150, cut in 0usize..150, seed in any::<u64>()) {
        let cut = cut % (t + 1);
        let layer = OwnedLayer::random(cfg, WeightDtype::F32, seed).unwrap();
        let x = Rng::new(seed ^ 9).normals(t * cfg.hidden, 1.0);
        let h = CpuHarness::chunked(256, 32);
        let mut a = SequenceCaches::new(&cfg, 1).unwrap();
        let whole = h.clone().forward(&layer, &x, &[0, t], &mut a, InitialCaches::Zero).unwrap();
        let mut b = SequenceCaches::new(&cfg, 1).unwrap();
        let (x1, x2) = x.split_at(cut * cfg.hidden);
        let mut parts = h.clone().forward(&layer, x1, &[0, cut], &mut b, InitialCaches::Zero).unwrap();
        parts.extend(h.clone().forward(&layer, x2, &[0, t - cut], &mut b, InitialCaches::Given).unwrap());
        prop_assert!(rel_rms(&parts, &whole) <= TOL);
        prop_assert!(rel_rms(&b.recurrent, &a.recurrent) <= TOL);
    }
}

/// In chunked mode, any block of at least one chunk gives bitwise the same result.
#[test]
fn chunked_block_size_invariance() {
    let cfg = KdaConfig::kimi_k3(40, 2, 16);
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, 3).unwrap();
    let cu = [0usize, 70, 71, 200];
    let x = Rng::new(4).normals(200 * cfg.hidden, 1.0);
    let mut first = None;
    for block in [16usize, 17, 33, 64, 100, 500] {
        let mut c = SequenceCaches::new(&cfg, 3).unwrap();
        let y = CpuHarness::chunked(block, 16)
            .forward(&layer, &x, &cu, &mut c, InitialCaches::Zero)
            .unwrap();
        match &first {
            None => first = Some((y, c)),
            Some((y0, c0)) => {
                assert_eq!(&y, y0, "block {block}");
                assert_eq!(&c, c0, "block {block}");
            }
        }
    }
}

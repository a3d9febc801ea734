//! States on demand (issue 14), one thread:
//! * chunk-boundary snapshots every 64 tokens of a T = 4096 prefill against the same prefill
//!   without them (a layer with 4 heads × 128, so the per-head work snapshots add to is large
//!   beside the projections: the overhead ratio is an upper bound for bigger layers);
//! * a speculative verify of D = 4 and 8 drafts plus a commit of all of them against D plain
//!   decode steps, at Kimi Linear size;
//! * the rollback record's size beside D full states at Kimi K3 size (printed).

use criterion::{criterion_group, criterion_main, Criterion};
use kda_core::{
    commit_workspace_len, rollback_len, snapshot_count, snapshot_positions, Batch, ForwardOptions,
    InitialCaches, KdaConfig, Rollback, Serial, SnapshotPos, Snapshots,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};

fn snapshots(c: &mut Criterion) {
    println!("ISA: {}", kda_core::Isa::detect().name());
    let cfg = KdaConfig::kimi_linear(512, 4, 128);
    let owned = OwnedLayer::random(cfg, WeightDtype::Bf16, 1).unwrap();
    let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
    let t = 4096;
    let x = Rng::new(2).normals(t * cfg.hidden, 1.0);
    let cu = [0usize, t];
    let mut out = vec![0.0; x.len()];
    let mut caches = SequenceCaches::new(&cfg, 1).unwrap();
    let mut ws = vec![0.0; layer.workspace_len(256, 1).unwrap()];
    let m = snapshot_count(&cu, 64).unwrap();
    let mut at = vec![SnapshotPos { seq: 0, pos: 0 }; m];
    snapshot_positions(&cu, 64, &mut at).unwrap();
    let mut snaps = SequenceCaches::new(&cfg, m).unwrap();
    let mut g = c.benchmark_group("prefill_T4096_h512_4x128");
    g.sample_size(10);
    g.bench_function("no_snapshots", |b| {
        b.iter(|| {
            let batch = Batch {
                x: &x,
                cu_seqlens: &cu,
                out: &mut out,
            };
            layer
                .forward(
                    batch,
                    caches.as_mut(),
                    InitialCaches::Zero,
                    &mut ws,
                    &Serial,
                )
                .unwrap()
        })
    });
    g.bench_function("snapshot_every_64", |b| {
        b.iter(|| {
            let batch = Batch {
                x: &x,
                cu_seqlens: &cu,
                out: &mut out,
            };
            let s = Snapshots {
                at: &at,
                states: snaps.as_mut(),
            };
            let c = caches.as_mut();
            layer
                .forward_with_snapshots(batch, s, c, InitialCaches::Zero, &mut ws, &Serial)
                .unwrap()
        })
    });
    g.finish();
}

fn speculative(c: &mut Criterion) {
    let cfg = KdaConfig::kimi_linear(2304, 32, 128);
    let owned = OwnedLayer::random(cfg, WeightDtype::Bf16, 1).unwrap();
    let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
    let mut caches = SequenceCaches::new(&cfg, 1).unwrap();
    let mut g = c.benchmark_group("speculative_kimi_linear");
    g.sample_size(10);
    for d in [4usize, 8] {
        let x = Rng::new(3).normals(d * cfg.hidden, 1.0);
        let mut out = vec![0.0; x.len()];
        let mut ws = vec![0.0; layer.verify_workspace_len(1, d, 1).unwrap()];
        let mut record = vec![0.0; rollback_len(&cfg, 1, d).unwrap()];
        let mut cws = vec![0.0; commit_workspace_len(&cfg, 1).unwrap()];
        g.bench_function(format!("verify_commit_D{d}"), |b| {
            b.iter(|| {
                let rb = Rollback {
                    drafts: d,
                    data: &mut record,
                };
                layer
                    .verify(&x, &mut out, rb, caches.as_mut(), &mut ws, &Serial)
                    .unwrap();
                let rb = Rollback {
                    drafts: d,
                    data: &mut record,
                };
                layer
                    .commit(&rb, &[d], caches.as_mut(), &mut cws, &Serial)
                    .unwrap();
            })
        });
        let mut dws = vec![0.0; layer.decode_workspace_len(1, 1).unwrap()];
        let h = cfg.hidden;
        g.bench_function(format!("decode_steps_D{d}"), |b| {
            b.iter(|| {
                for t in 0..d {
                    let (xt, ot) = (&x[t * h..(t + 1) * h], &mut out[t * h..(t + 1) * h]);
                    layer
                        .decode_step(xt, ot, caches.as_mut(), &mut dws, &Serial)
                        .unwrap();
                }
            })
        });
    }
    g.finish();
    let k3 = KdaConfig::kimi_k3(7168, 96, 128);
    for d in [4usize, 8] {
        let record = rollback_len(&k3, 1, d).unwrap() * 4;
        let states = d * k3.state_len().unwrap() * 4;
        println!(
            "rollback memory per sequence, Kimi K3 (96 x 128), D = {d}: record {:.2} MiB vs {d} full states {:.1} MiB ({:.1}x smaller)",
            record as f64 / (1 << 20) as f64,
            states as f64 / (1 << 20) as f64,
            states as f64 / record as f64
        );
    }
}

criterion_group!(benches, snapshots, speculative);
criterion_main!(benches);

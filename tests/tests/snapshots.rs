//! Chunk-boundary snapshots (issue 14): each snapshot equals the final caches of a run over
//! exactly that prefix; resuming from a snapshot equals the full run; snapshots on the chunk
//! grid leave the outputs bitwise unchanged.

use kda_conformance::{flat_caches, random_caches};
use kda_core::{
    snapshot_count, snapshot_positions, Batch, CachesMut, ForwardOptions, InitialCaches, KdaConfig,
    KdaLayer, Mode, Serial, SnapshotPos, Snapshots,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};

/// Snapshot `m` of `snaps` as one flat vector, in the order of [`flat`].
fn snapshot(cfg: &KdaConfig, snaps: &SequenceCaches, m: usize) -> Vec<f32> {
    let (s, c) = (cfg.state_len().unwrap(), cfg.conv_state_len().unwrap());
    let mut v = snaps.recurrent[m * s..(m + 1) * s].to_vec();
    for conv in [&snaps.conv_q, &snaps.conv_k, &snaps.conv_v] {
        v.extend_from_slice(&conv[m * c..(m + 1) * c]);
    }
    v
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let n: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let d: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (n / d.max(1e-30)).sqrt()
}

struct Run {
    out: Vec<f32>,
    caches: SequenceCaches,
    snaps: SequenceCaches,
}

/// A forward of `layer` over `x` / `cu` from `init` caches, with `at` snapshots (or none), in
/// blocks of `block` tokens.
fn run(
    layer: &KdaLayer<'_>,
    x: &[f32],
    cu: &[usize],
    init: &SequenceCaches,
    at: Option<&[SnapshotPos]>,
    block: usize,
) -> Run {
    let cfg = layer.config();
    let mut caches = init.clone();
    let mut snaps = SequenceCaches::new(cfg, at.map_or(0, |a| a.len())).unwrap();
    let mut out = vec![0.0; x.len()];
    // In Auto mode, sizing for fewer than AUTO_CHUNK_MIN_TOKENS leaves out the chunk scratch.
    let mut ws = vec![0.0; layer.workspace_len(block.max(8), 1).unwrap()];
    let batch = Batch {
        x,
        cu_seqlens: cu,
        out: &mut out,
    };
    let given = InitialCaches::Given;
    match at {
        Some(at) => {
            let s = Snapshots {
                at,
                states: snaps.as_mut(),
            };
            let c = caches.as_mut();
            layer.forward_with_snapshots(batch, s, c, given, &mut ws, &Serial)
        }
        None => layer.forward(batch, caches.as_mut(), given, &mut ws, &Serial),
    }
    .unwrap();
    Run { out, caches, snaps }
}

fn random_positions(cu: &[usize], rng: &mut Rng) -> Vec<SnapshotPos> {
    let mut at = Vec::new();
    for (seq, p) in cu.windows(2).enumerate() {
        let len = p[1] - p[0];
        if len == 0 {
            continue;
        }
        let mut pos = 0;
        loop {
            pos += 1 + (rng.next_u64() % 23) as usize;
            if pos > len {
                break;
            }
            at.push(SnapshotPos { seq, pos });
        }
    }
    at
}

#[test]
fn snapshots_equal_prefix_runs_and_resuming_equals_the_full_run() {
    let mut rng = Rng::new(17);
    let lens = [37usize, 0, 70, 5, 129];
    let cu: Vec<usize> = std::iter::once(0)
        .chain(lens.iter().scan(0, |a, l| {
            *a += l;
            Some(*a)
        }))
        .collect();
    for cfg in [
        KdaConfig::kimi_linear(24, 2, 16),
        KdaConfig::kimi_k3(20, 3, 8),
    ] {
        let owned = OwnedLayer::random(cfg, WeightDtype::Bf16, 3).unwrap();
        let x = rng.normals(cu[lens.len()] * cfg.hidden, 1.0);
        let init = random_caches(&cfg, lens.len(), &mut rng);
        for (mode, chunk) in [
            (Mode::Recurrent, 16),
            (Mode::Chunked, 16),
            (Mode::Chunked, 8),
            (Mode::Auto, 16),
        ] {
            let opts = ForwardOptions {
                mode,
                chunk_size: chunk,
                ..ForwardOptions::default()
            };
            let layer = owned.kda_layer(opts).unwrap();
            let every = [
                {
                    let mut v = vec![
                        SnapshotPos { seq: 0, pos: 0 };
                        snapshot_count(&cu, 2 * chunk).unwrap()
                    ];
                    snapshot_positions(&cu, 2 * chunk, &mut v).unwrap();
                    v
                },
                random_positions(&cu, &mut rng),
            ];
            for (listed, at) in every.iter().enumerate() {
                for block in [7usize, 64, 1000] {
                    let with = run(&layer, &x, &cu, &init, Some(at), block);
                    let what = format!("{cfg:?} {mode:?} C{chunk} listed{listed} block{block}");
                    if listed == 0 || mode == Mode::Recurrent {
                        // On the chunk grid (or recurrent): bitwise the run without snapshots.
                        let plain = run(&layer, &x, &cu, &init, None, block);
                        assert_eq!(with.out, plain.out, "{what}: outputs");
                        assert_eq!(
                            flat_caches(&with.caches),
                            flat_caches(&plain.caches),
                            "{what}: caches"
                        );
                    }
                    for (m, p) in at.iter().enumerate() {
                        let (s0, s1) = (cu[p.seq], cu[p.seq] + p.pos);
                        let h = cfg.hidden;
                        // The prefix alone, from the same initial caches.
                        let start = init.sequence(p.seq).unwrap();
                        let prefix =
                            run(&layer, &x[s0 * h..s1 * h], &[0, p.pos], &start, None, block);
                        let got = snapshot(&cfg, &with.snaps, m);
                        let want = flat_caches(&prefix.caches);
                        // Bitwise in recurrent mode and on the chunk grid; elsewhere the grid
                        // restarts at earlier off-grid snapshots (and Auto may pick another
                        // form for the shorter prefix), so within rounding.
                        let exact =
                            mode == Mode::Recurrent || (mode == Mode::Chunked && listed == 0);
                        if exact {
                            assert_eq!(got, want, "{what}: snapshot {p:?}");
                        } else {
                            let e = rel(&got, &want);
                            assert!(e <= 1e-6, "{what} snapshot {p:?}: {e:.2e}");
                        }
                        // Resuming from the snapshot gives the rest of the full run.
                        let end = cu[p.seq + 1];
                        let resume = with.snaps.sequence(m).unwrap();
                        let rest = run(
                            &layer,
                            &x[s1 * h..end * h],
                            &[0, end - s1],
                            &resume,
                            None,
                            block,
                        );
                        let full_rest = &with.out[s1 * h..end * h];
                        let full_caches = flat_caches(&with.caches.sequence(p.seq).unwrap());
                        if !exact {
                            let e = rel(&rest.out, full_rest);
                            assert!(e <= 1e-5, "{what} resume {p:?}: {e:.2e}");
                        } else {
                            assert_eq!(rest.out, full_rest, "{what}: resumed outputs {p:?}");
                            assert_eq!(
                                flat_caches(&rest.caches),
                                full_caches,
                                "{what}: resumed caches {p:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn bad_snapshot_requests_are_errors() {
    let cfg = KdaConfig::kimi_linear(24, 2, 16);
    let owned = OwnedLayer::random(cfg, WeightDtype::F32, 1).unwrap();
    let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
    let x = vec![0.5f32; 10 * cfg.hidden];
    let cu = [0usize, 4, 10];
    let mut caches = SequenceCaches::new(&cfg, 2).unwrap();
    let mut ws = vec![0.0; layer.workspace_len(10, 1).unwrap()];
    let p = |seq, pos| SnapshotPos { seq, pos };
    for (at, what) in [
        (vec![p(2, 1)], "past the last sequence"),
        (vec![p(0, 5)], "between 1 and"),
        (vec![p(0, 0)], "between 1 and"),
        (vec![p(1, 3), p(0, 2)], "sorted"),
        (vec![p(0, 2), p(0, 2)], "sorted"),
    ] {
        let mut snaps = SequenceCaches::new(&cfg, at.len()).unwrap();
        let mut out = vec![0.0; x.len()];
        let batch = Batch {
            x: &x,
            cu_seqlens: &cu,
            out: &mut out,
        };
        let s = Snapshots {
            at: &at,
            states: snaps.as_mut(),
        };
        let e = layer
            .forward_with_snapshots(
                batch,
                s,
                caches.as_mut(),
                InitialCaches::Zero,
                &mut ws,
                &Serial,
            )
            .unwrap_err();
        assert!(e.to_string().contains(what), "{at:?}: {e}");
    }
    // Snapshot buffers for the wrong count.
    let at = [p(0, 2), p(1, 6)];
    let mut snaps = SequenceCaches::new(&cfg, 1).unwrap();
    let mut out = vec![0.0; x.len()];
    let batch = Batch {
        x: &x,
        cu_seqlens: &cu,
        out: &mut out,
    };
    let s = Snapshots {
        at: &at,
        states: CachesMut {
            recurrent: &mut snaps.recurrent,
            conv_q: &mut snaps.conv_q,
            conv_k: &mut snaps.conv_k,
            conv_v: &mut snaps.conv_v,
        },
    };
    let e = layer.forward_with_snapshots(
        batch,
        s,
        caches.as_mut(),
        InitialCaches::Zero,
        &mut ws,
        &Serial,
    );
    assert!(e.is_err());
}

//! Speculative verify / commit (issue 14): for every number of accepted tokens, verify +
//! commit(n) leaves the caches bitwise as n decode steps would, and the first n outputs of the
//! verify are those steps' outputs.

use kda_conformance::{flat_caches, random_caches};
use kda_core::{
    commit_workspace_len, rollback_len, ForwardOptions, KdaConfig, KdaLayer, Rollback, Serial,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};
use proptest::prelude::*;

/// `n` decode steps of one sequence from `caches`: the outputs.
fn decode(layer: &KdaLayer<'_>, x: &[f32], n: usize, caches: &mut SequenceCaches) -> Vec<f32> {
    let h = layer.config().hidden;
    let mut ws = vec![0.0; layer.decode_workspace_len(1, 1).unwrap()];
    let mut outs = Vec::new();
    for t in 0..n {
        let mut out = vec![0.0; h];
        layer
            .decode_step(
                &x[t * h..(t + 1) * h],
                &mut out,
                caches.as_mut(),
                &mut ws,
                &Serial,
            )
            .unwrap();
        outs.extend(out);
    }
    outs
}

/// Verifies `d` drafts per sequence from `caches`, checks the caches are untouched, commits
/// `accepted`, and checks outputs and caches against decoding each sequence directly.
fn verify_commit_matches_decode(
    layer: &KdaLayer<'_>,
    caches: &mut SequenceCaches,
    x: &[f32],
    d: usize,
    accepted: &[usize],
    block: usize,
) {
    let cfg = *layer.config();
    let (n, h) = (accepted.len(), cfg.hidden);
    let before = caches.clone();
    let mut record = vec![f32::NAN; rollback_len(&cfg, n, d).unwrap()];
    let mut out = vec![0.0; x.len()];
    let mut ws = vec![0.0; layer.verify_workspace_len(block, d, 1).unwrap()];
    let rollback = Rollback {
        drafts: d,
        data: &mut record,
    };
    layer
        .verify(x, &mut out, rollback, caches.as_mut(), &mut ws, &Serial)
        .unwrap();
    assert_eq!(
        flat_caches(caches),
        flat_caches(&before),
        "verify changed the caches"
    );
    let rollback = Rollback {
        drafts: d,
        data: &mut record,
    };
    let mut cws = vec![0.0; commit_workspace_len(&cfg, 1).unwrap()];
    layer
        .commit(&rollback, accepted, caches.as_mut(), &mut cws, &Serial)
        .unwrap();
    for (s, &acc) in accepted.iter().enumerate() {
        let mut want = before.sequence(s).unwrap();
        let xs = &x[s * d * h..(s + 1) * d * h];
        let outs = decode(layer, xs, acc, &mut want);
        assert_eq!(
            &out[s * d * h..(s * d + acc) * h],
            &outs[..],
            "outputs of seq {s}, n {acc}"
        );
        assert_eq!(
            flat_caches(&caches.sequence(s).unwrap()),
            flat_caches(&want),
            "caches of seq {s}, n {acc}, D {d}"
        );
    }
}

fn layers() -> Vec<(KdaConfig, OwnedLayer)> {
    [
        KdaConfig::kimi_linear(24, 2, 16),
        KdaConfig::kimi_k3(20, 3, 8),
    ]
    .into_iter()
    .map(|cfg| (cfg, OwnedLayer::random(cfg, WeightDtype::Bf16, 9).unwrap()))
    .collect()
}

#[test]
fn every_accepted_count_and_commit_after_commit() {
    let mut rng = Rng::new(5);
    for (cfg, owned) in layers() {
        let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
        for d in [1usize, 4, 8] {
            // Every n in 0..=D, three sequences at a time with different n.
            for n0 in 0..=d {
                let accepted = [n0, d - n0, (n0 * 7 + 1) % (d + 1)];
                let mut caches = random_caches(&cfg, 3, &mut rng);
                let x = rng.normals(3 * d * cfg.hidden, 1.0);
                verify_commit_matches_decode(&layer, &mut caches, &x, d, &accepted, 3);
                // Commit after a commit: a new verify from the committed caches.
                let x2 = rng.normals(3 * d * cfg.hidden, 1.0);
                let again = [d, n0, 0];
                verify_commit_matches_decode(&layer, &mut caches, &x2, d, &again, 1);
            }
        }
    }
}

#[test]
fn rollback_record_is_small_and_bad_commits_are_errors() {
    // Kimi K3 size: 96 heads × 128, conv width 4, D = 8.
    let k3 = KdaConfig::kimi_k3(7168, 96, 128);
    let record = rollback_len(&k3, 1, 8).unwrap();
    let states = 8 * k3.state_len().unwrap();
    assert!(
        states >= 20 * record,
        "record {record} floats vs 8 states {states}"
    );

    let (cfg, owned) = layers().remove(0);
    let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
    let mut caches = SequenceCaches::new(&cfg, 2).unwrap();
    let mut data = vec![0.0; rollback_len(&cfg, 2, 4).unwrap()];
    let mut cws = vec![0.0; commit_workspace_len(&cfg, 1).unwrap()];
    let rb = Rollback {
        drafts: 4,
        data: &mut data,
    };
    let e = layer.commit(&rb, &[5, 0], caches.as_mut(), &mut cws, &Serial);
    assert!(e
        .unwrap_err()
        .to_string()
        .contains("more tokens than were drafted"));
    let e = layer.commit(&rb, &[1], caches.as_mut(), &mut cws, &Serial);
    assert!(e.is_err(), "one accepted count for two sequences");
    let e = layer.commit(&rb, &[1, 1], caches.as_mut(), &mut cws[..1], &Serial);
    assert!(e.is_err(), "short workspace");
    let x = vec![0.0; 7 * cfg.hidden];
    let mut out = vec![0.0; x.len()];
    let mut ws = vec![0.0; layer.verify_workspace_len(2, 4, 1).unwrap()];
    let rb = Rollback {
        drafts: 4,
        data: &mut data,
    };
    let e = layer.verify(&x, &mut out, rb, caches.as_mut(), &mut ws, &Serial);
    assert!(e.is_err(), "7 rows are not whole sequences of 4 drafts");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]
    #[test]
    fn random_accepted_counts(d in 1usize..9, seed in 0u64..1000, n in 1usize..5) {
        let mut rng = Rng::new(seed);
        let (cfg, owned) = layers().remove((seed % 2) as usize);
        let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
        let accepted: Vec<usize> = (0..n).map(|_| (rng.next_u64() % (d as u64 + 1)) as usize).collect();
        let mut caches = random_caches(&cfg, n, &mut rng);
        let x = rng.normals(n * d * cfg.hidden, 1.0);
        verify_commit_matches_decode(&layer, &mut caches, &x, d, &accepted, 1 + (seed as usize % n));
    }
}

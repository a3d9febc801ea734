//! Snapshots and speculative verify / commit on a whole model (every KDA layer), through
//! `Model` and `ModelCache` (issue 14).

mod common;

use common::*;
use kda_core::{KdaConfig, SnapshotPos};
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, ExportOptions};
use kda_host::rng::Rng;
use kda_host::{Mode, Model, ModelRollback, ModelSnapshots, OwnedLayer, Runner, WeightDtype};

fn model(dir: &TempDir) -> Model {
    let cfg = KdaConfig::kimi_linear(24, 2, 8);
    let layers = [
        OwnedLayer::random(cfg, WeightDtype::Bf16, 1).unwrap(),
        OwnedLayer::random(cfg, WeightDtype::Bf16, 2).unwrap(),
    ];
    let ckpt = dir.path("ckpt");
    let opts = ExportOptions::published(Layout::KimiLinear, 4);
    export_dir(&ckpt, &[(1, &layers[0]), (3, &layers[1])], &opts).unwrap();
    Model::open(&ckpt).unwrap()
}

#[test]
fn model_snapshots_resume_to_the_full_run() {
    let dir = TempDir::new("model_snapshots");
    let model = model(&dir);
    let mut runner = Runner::default();
    let hd = 24;
    let (len0, len1) = (40usize, 33usize);
    let x = Rng::new(5).normals((len0 + len1) * hd, 1.0);
    let cu = [0, len0, len0 + len1];
    let at = vec![
        SnapshotPos { seq: 0, pos: 16 },
        SnapshotPos { seq: 0, pos: 32 },
        SnapshotPos { seq: 1, pos: 16 },
    ];
    let mut cache = model.new_cache(2).unwrap();
    let mut snaps = ModelSnapshots::new(at.clone());
    let mut outs = Vec::new();
    for index in [1, 3] {
        let y = model
            .forward_with_snapshots(
                &mut runner,
                index,
                (&x, &cu),
                &mut cache,
                Mode::Chunked,
                &mut snaps,
            )
            .unwrap();
        outs.push(y);
    }
    // Each snapshot resumes, layer by layer, to the rest of its sequence's run, bitwise (the
    // positions are on the chunk grid).
    for (m, p) in at.iter().enumerate() {
        let mut resume = snaps.cache(m).unwrap();
        let (start, end) = (cu[p.seq] + p.pos, cu[p.seq + 1]);
        for (li, index) in [1, 3].into_iter().enumerate() {
            let rest = model
                .forward(
                    &mut runner,
                    index,
                    &x[start * hd..end * hd],
                    &[0, end - start],
                    &mut resume,
                    Mode::Chunked,
                )
                .unwrap();
            assert_eq!(
                rest,
                outs[li][start * hd..end * hd],
                "layer {index}, snapshot {p:?}"
            );
            let full = cache.layer(index).unwrap().sequence(p.seq).unwrap();
            assert_eq!(
                *resume.layer(index).unwrap(),
                full,
                "layer {index} caches, {p:?}"
            );
        }
    }
    assert!(snaps.cache(3).is_err());
}

#[test]
fn model_verify_commit_equals_decoding_the_accepted_tokens() {
    let dir = TempDir::new("model_speculative");
    let model = model(&dir);
    let mut runner = Runner::default();
    let hd = 24;
    let prompt = Rng::new(6).normals(10 * hd, 1.0);
    let mut cache = model.new_cache(2).unwrap();
    for index in [1, 3] {
        model
            .forward(
                &mut runner,
                index,
                &prompt,
                &[0, 4, 10],
                &mut cache,
                Mode::Auto,
            )
            .unwrap();
    }
    let d = 4;
    let drafts = Rng::new(7).normals(2 * d * hd, 1.0);
    let accepted = [3usize, 1];
    // Direct: decode the accepted tokens of each sequence on a copy of its caches.
    let mut direct = Vec::new();
    for (s, &n) in accepted.iter().enumerate() {
        let mut c = kda_host::ModelCache {
            sequences: 1,
            layers: cache
                .layers
                .iter()
                .map(|(i, c)| (*i, c.sequence(s).unwrap()))
                .collect(),
        };
        let mut outs = Vec::new();
        for t in 0..n {
            let mut y = drafts[(s * d + t) * hd..(s * d + t + 1) * hd].to_vec();
            for index in [1, 3] {
                y = model.decode(&mut runner, index, &y, &mut c).unwrap();
            }
            outs.extend(y);
        }
        direct.push((c, outs));
    }
    // Speculative: verify every layer (each layer's outputs are the next one's inputs here),
    // then commit.
    let mut rollback = ModelRollback::new(d);
    let mut y = drafts.clone();
    for index in [1, 3] {
        y = model
            .verify(&mut runner, index, &y, &mut cache, &mut rollback)
            .unwrap();
    }
    assert!(rollback.bytes() > 0);
    model
        .commit(&mut runner, &mut rollback, &accepted, &mut cache)
        .unwrap();
    assert!(rollback.layers.is_empty(), "a record serves one commit");
    for (s, (c, outs)) in direct.iter().enumerate() {
        let n = accepted[s];
        assert_eq!(
            &y[s * d * hd..(s * d + n) * hd],
            &outs[..],
            "outputs of sequence {s}"
        );
        for index in [1, 3] {
            let got = cache.layer(index).unwrap().sequence(s).unwrap();
            assert_eq!(got, *c.layer(index).unwrap(), "layer {index}, sequence {s}");
        }
    }
}

//! The layer gives bitwise the same result for any number of threads, in every mode.

use kda_core::{ForwardOptions, InitialCaches, KdaConfig};
use kda_host::rng::Rng;
use kda_host::{Mode, OwnedLayer, Runner, SequenceCaches, WeightDtype};

fn run(
    threads: usize,
    layer: &OwnedLayer,
    x: &[f32],
    cu: &[usize],
    mode: Mode,
) -> (Vec<f32>, Vec<f32>, SequenceCaches) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let cfg = layer.cfg;
        let mut runner = Runner::new(48);
        let mut caches = SequenceCaches::new(&cfg, cu.len() - 1).unwrap();
        let kda = layer
            .kda_layer(ForwardOptions::default().with_mode(mode))
            .unwrap();
        let y = runner
            .forward(&kda, x, cu, &mut caches, InitialCaches::Zero)
            .unwrap();
        let step = Rng::new(3).normals((cu.len() - 1) * cfg.hidden, 1.0);
        let recurrent = layer.kda_layer(ForwardOptions::recurrent()).unwrap();
        let d = runner.decode(&recurrent, &step, &mut caches).unwrap();
        (y, d, caches)
    })
}

#[test]
fn any_thread_count_gives_bitwise_identical_results() {
    for (cfg, dtype) in [
        (KdaConfig::kimi_linear(72, 3, 16), WeightDtype::Bf16),
        (KdaConfig::kimi_k3(64, 4, 8), WeightDtype::F32),
    ] {
        let layer = OwnedLayer::random(cfg, dtype, 11).unwrap();
        let cu = [0usize, 5, 6, 130, 200];
        let x = Rng::new(2).normals(200 * cfg.hidden, 1.0);
        for mode in [Mode::Recurrent, Mode::Chunked, Mode::Auto] {
            let one = run(1, &layer, &x, &cu, mode);
            for threads in [2usize, 3, 4] {
                let many = run(threads, &layer, &x, &cu, mode);
                assert_eq!(one.0, many.0, "{mode:?}, {threads} threads: forward output");
                assert_eq!(one.1, many.1, "{mode:?}, {threads} threads: decode output");
                assert_eq!(one.2, many.2, "{mode:?}, {threads} threads: caches");
            }
        }
    }
}

//! Decode-step baseline at Kimi Linear size (hidden 2304, 32 heads × 128, bf16 weights), batch 1,
//! on one thread and on all cores. Reports bytes/s over the weight + state bytes one token must
//! stream (compare with `kda bench`, which also measures the machine's read bandwidth).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kda_core::{ForwardOptions, KdaConfig};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, Runner, SequenceCaches, WeightDtype};

fn decode(c: &mut Criterion) {
    println!("ISA: {}", kda_core::Isa::detect().name());
    let cfg = KdaConfig::kimi_linear(2304, 32, 128);
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, 1).unwrap();
    let mut caches = SequenceCaches::new(&cfg, 1).unwrap();
    let mut runner = Runner::default();
    let kda = layer.kda_layer(ForwardOptions::recurrent()).unwrap();
    let x = Rng::new(2).normals(cfg.hidden, 1.0);
    // Per token: every weight byte once, the recurrent state read and written once.
    let bytes = layer.weight_bytes() + 2 * 4 * caches.recurrent.len();
    let mut g = c.benchmark_group("decode_kimi_linear_bf16");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.sample_size(20);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for threads in [1, cores] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        g.bench_function(format!("batch1_{threads}thread"), |b| {
            pool.install(|| b.iter(|| runner.decode(&kda, &x, &mut caches).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);

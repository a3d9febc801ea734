//! A layer forward and a decode step allocate nothing: a counting global allocator watches a
//! whole call (weights, caches and workspace are created before counting starts).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kda_core::{
    workspace_len, Batch, ForwardOptions, InitialCaches, KdaConfig, KdaLayer, Mode, Serial,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn forward_and_decode_allocate_nothing() {
    for cfg in [
        KdaConfig::kimi_linear(40, 2, 16),
        KdaConfig::kimi_k3(48, 3, 8),
    ] {
        let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, 5).unwrap();
        let w = layer.weights().unwrap();
        let mut caches = SequenceCaches::new(&cfg, 2).unwrap();
        let x = Rng::new(1).normals(30 * cfg.hidden, 1.0);
        let mut out = vec![0.0; x.len()];
        let cu = [0usize, 11, 30];
        let modes = [Mode::Recurrent, Mode::Chunked, Mode::Auto];
        let opts = modes.map(|mode| ForwardOptions {
            mode,
            ..ForwardOptions::default()
        });
        let mut ws = vec![0.0; workspace_len(&cfg, &opts[1], 20, 1).unwrap()];

        let before = ALLOCS.load(Ordering::SeqCst);
        for o in &opts {
            let init = InitialCaches::Zero;
            let batch = Batch {
                x: &x,
                cu_seqlens: &cu,
                out: &mut out,
            };
            KdaLayer::new(&cfg, w, *o)
                .unwrap()
                .forward(batch, caches.as_mut(), init, &mut ws, &Serial)
                .unwrap();
        }
        KdaLayer::new(&cfg, w, ForwardOptions::recurrent())
            .unwrap()
            .decode_step(
                &x[..2 * cfg.hidden],
                &mut out[..2 * cfg.hidden],
                caches.as_mut(),
                &mut ws,
                &Serial,
            )
            .unwrap();
        let during = ALLOCS.load(Ordering::SeqCst) - before;
        assert_eq!(during, 0, "the layer allocated {during} times");
        assert!(out.iter().all(|v| v.is_finite()));
    }
}

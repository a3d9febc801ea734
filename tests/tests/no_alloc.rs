//! A layer forward and a decode step allocate nothing: a counting global allocator watches a
//! whole call (weights, caches and workspace are created before counting starts).
//!
//! Only the test's own thread is watched. The layer runs on it (`Serial`), and libtest's main
//! thread does its own bookkeeping (a map insert, a queue push, a channel wait) right after it
//! spawns the test; with setup this short, that used to land inside the window now and then
//! (seen as "allocated 4 times" on a loaded 2-core machine).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use kda_core::{
    commit_workspace_len, rollback_len, workspace_len, Batch, ForwardOptions, InitialCaches,
    KdaConfig, KdaLayer, Mode, Rollback, Serial, SnapshotPos, Snapshots,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Set on the thread under test; allocations elsewhere are not the layer's.
    static WATCHED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    // `try_with`: the allocator can run while thread-locals are being torn down.
    if WATCHED.try_with(Cell::get).unwrap_or(false) {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
    }
}

// SAFETY: forwards every call unchanged to the system allocator; only counts (a const-initialised
// thread-local without a destructor, which itself never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

// One test function: it keeps the watched thread obvious.
#[test]
fn nothing_allocates() {
    WATCHED.with(|w| w.set(true));
    forward_and_decode_allocate_nothing();
    snapshots_verify_and_commit_allocate_nothing();
}

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

fn snapshots_verify_and_commit_allocate_nothing() {
    let cfg = KdaConfig::kimi_linear(40, 2, 16);
    let owned = OwnedLayer::random(cfg, WeightDtype::Bf16, 5).unwrap();
    let layer = owned.kda_layer(ForwardOptions::default()).unwrap();
    let mut caches = SequenceCaches::new(&cfg, 2).unwrap();
    let x = Rng::new(1).normals(40 * cfg.hidden, 1.0);
    let mut out = vec![0.0; x.len()];
    let cu = [0usize, 17, 40];
    let at = [
        SnapshotPos { seq: 0, pos: 16 },
        SnapshotPos { seq: 1, pos: 5 },
        SnapshotPos { seq: 1, pos: 23 },
    ];
    let mut snaps = SequenceCaches::new(&cfg, at.len()).unwrap();
    let d = 4;
    let mut record = vec![0.0; rollback_len(&cfg, 2, d).unwrap()];
    let ws_len = layer
        .workspace_len(20, 1)
        .unwrap()
        .max(layer.verify_workspace_len(2, d, 1).unwrap())
        .max(commit_workspace_len(&cfg, 1).unwrap());
    let mut ws = vec![0.0; ws_len];

    let before = ALLOCS.load(Ordering::SeqCst);
    let batch = Batch {
        x: &x,
        cu_seqlens: &cu,
        out: &mut out,
    };
    let s = Snapshots {
        at: &at,
        states: snaps.as_mut(),
    };
    let init = InitialCaches::Zero;
    layer
        .forward_with_snapshots(batch, s, caches.as_mut(), init, &mut ws, &Serial)
        .unwrap();
    let drafts = &x[..2 * d * cfg.hidden];
    let rb = Rollback {
        drafts: d,
        data: &mut record,
    };
    let o = &mut out[..2 * d * cfg.hidden];
    layer
        .verify(drafts, o, rb, caches.as_mut(), &mut ws, &Serial)
        .unwrap();
    let rb = Rollback {
        drafts: d,
        data: &mut record,
    };
    layer
        .commit(&rb, &[3, 1], caches.as_mut(), &mut ws, &Serial)
        .unwrap();
    let during = ALLOCS.load(Ordering::SeqCst) - before;
    assert_eq!(during, 0, "allocated {during} times");
    assert!(snaps.recurrent.iter().all(|v| v.is_finite()));
}

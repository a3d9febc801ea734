//! The probe silences only its own (expected) panic and restores the caller's panic hook.
//!
//! Kept in its own test binary (one process, one test) because the panic hook is global and the
//! probe result is cached per process.

use std::sync::atomic::{AtomicUsize, Ordering};

static HOOK_CALLS: AtomicUsize = AtomicUsize::new(0);

#[test]
fn probe_keeps_the_callers_panic_hook() {
    std::panic::set_hook(Box::new(|_| {
        HOOK_CALLS.fetch_add(1, Ordering::SeqCst);
    }));

    let result = kda_cuda::probe();
    // Whether or not a device is present, the probe itself must not reach the caller's hook
    // (without a GPU, cudarc panics internally and the probe swallows that panic).
    assert_eq!(
        HOOK_CALLS.load(Ordering::SeqCst),
        0,
        "probe leaked a panic: {result:?}"
    );

    // After probing, the caller's hook is back in place.
    let joined = std::thread::spawn(|| panic!("deliberate")).join();
    assert!(joined.is_err());
    assert_eq!(HOOK_CALLS.load(Ordering::SeqCst), 1);

    let _ = std::panic::take_hook();
    match result {
        Ok(devices) => eprintln!("{} CUDA device(s)", devices.len()),
        Err(e) => eprintln!("skipped: no CUDA device ({e})"),
    }
}

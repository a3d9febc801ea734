//! Without a usable GPU every entry point is an error value, never a panic.

use kda_cuda::{conformance_backend, is_available, probe, CudaBackend, CudaError, CudaOptions};

#[test]
fn creating_a_backend_without_cuda_is_no_device() {
    if is_available() {
        eprintln!("a CUDA device is present: the no-device path is not exercised here");
        return;
    }
    let Err(e) = probe() else { unreachable!() };
    for r in [
        CudaBackend::new(0).map(|_| ()),
        CudaBackend::with_options(0, CudaOptions::default()).map(|_| ()),
        conformance_backend().map(|_| ()),
    ] {
        match r {
            Err(CudaError::NoDevice(why)) => assert!(!why.is_empty()),
            other => panic!("expected NoDevice, got {other:?}"),
        }
    }
    eprintln!("skipped: no CUDA device ({e})");
}

#[test]
fn an_ordinal_past_the_last_device_is_no_device() {
    match CudaBackend::new(usize::MAX) {
        Err(CudaError::NoDevice(_)) => {}
        Err(other) => panic!("expected NoDevice, got {other:?}"),
        Ok(_) => panic!("device usize::MAX cannot exist"),
    }
}

#[test]
fn repeated_and_concurrent_creation_never_panics() {
    let results: Vec<bool> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| s.spawn(|| CudaBackend::new(0).is_ok()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(results.iter().all(|&ok| ok == results[0]));
    assert_eq!(results[0], is_available() && CudaBackend::new(0).is_ok());
}

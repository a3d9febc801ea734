//! Device discovery must work, and never panic, with and without a CUDA device.

use kda_cuda::{is_available, probe, CudaError, CUDA_VERSION_FEATURE};

#[test]
fn probe_is_stable_and_never_panics() {
    let first = probe();
    let second = probe();
    assert_eq!(first, second, "the probe result is cached");
    match &first {
        Ok(devices) => assert!(!devices.is_empty(), "Ok(..) means at least one device"),
        Err(CudaError::NoDevice(reason)) => {
            assert!(!reason.is_empty());
            let shown = first.as_ref().unwrap_err().to_string();
            assert!(shown.starts_with("no CUDA device: "), "{shown}");
            eprintln!("{shown}");
        }
        Err(other) => panic!("unexpected probe error: {other:?}"),
    }
}

#[test]
fn is_available_agrees_with_probe() {
    assert_eq!(is_available(), probe().is_ok());
    assert_eq!(is_available(), is_available());
}

#[test]
fn probe_from_many_threads() {
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|_| s.spawn(probe)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &results {
        assert_eq!(r, &results[0]);
    }
}

#[test]
fn devices_are_sane() {
    match probe() {
        Ok(devices) => {
            for (i, d) in devices.iter().enumerate() {
                assert_eq!(d.ordinal, i);
                assert!(!d.name.trim().is_empty(), "device {i} has an empty name");
                assert!(
                    d.compute_capability >= (5, 0),
                    "device {i} ({}) has compute capability {:?}",
                    d.name,
                    d.compute_capability
                );
                assert!(d.total_memory_bytes > 0, "device {i} reports no memory");
                eprintln!("{d:?}");
            }
        }
        Err(e) => {
            assert!(matches!(e, CudaError::NoDevice(_)), "{e:?}");
            eprintln!("skipped: no CUDA device ({e})");
        }
    }
}

#[test]
fn version_feature_is_pinned() {
    assert_eq!(CUDA_VERSION_FEATURE, "cuda-13000");
}

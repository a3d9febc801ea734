//! The CUDA sources are embedded, self-contained, and define what the Rust side loads.

use kda_cuda::{kernels, nvrtc, CudaError};

#[test]
fn every_source_is_embedded_and_non_empty() {
    assert!(kernels::FILES.len() >= 7);
    for f in kernels::FILES {
        assert!(f.source.len() > 200, "{} is (nearly) empty", f.name);
        assert!(
            f.name.ends_with(".cu") || f.name.ends_with(".cuh"),
            "{}",
            f.name
        );
    }
    for name in ["decode.cu", "chunked.cu", "conv.cu", "norm.cu", "gate.cu"] {
        assert!(kernels::file(name).is_some(), "{name} missing");
    }
}

#[test]
fn sources_include_no_headers() {
    // NVRTC then needs no CUDA include directory (only libnvrtc itself).
    for f in kernels::FILES {
        for (i, line) in f.source.lines().enumerate() {
            assert!(
                !line.trim_start().starts_with("#include"),
                "{}:{}: {line}",
                f.name,
                i + 1
            );
        }
    }
}

#[test]
fn each_kernel_is_defined_once_as_extern_c() {
    let module = kernels::module_source();
    let names: Vec<&str> = kernels::all_kernels().collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "duplicate kernel names");
    for k in names {
        let pattern = format!(" {k}(const ");
        let defs = module
            .lines()
            .filter(|l| l.starts_with("extern \"C\" __global__") && l.contains(&pattern))
            .count();
        assert_eq!(
            defs, 1,
            "{k} should be defined exactly once as an extern \"C\" kernel"
        );
    }
}

#[test]
fn dependencies_come_first_and_programs_are_standalone() {
    for (i, f) in kernels::FILES.iter().enumerate() {
        for need in f.needs {
            let j = kernels::FILES
                .iter()
                .position(|g| g.name == *need)
                .unwrap_or_else(|| panic!("{} needs unknown {need}", f.name));
            assert!(j < i, "{} needs {need}, which comes later", f.name);
        }
        let prog = kernels::file_program(f.name).unwrap();
        assert!(prog.contains(f.source));
        for need in f.needs {
            assert!(prog.contains(kernels::file(need).unwrap().source));
        }
        // common.cuh appears exactly once in any program.
        assert_eq!(
            prog.matches("---- common.cuh ----").count(),
            1,
            "{}",
            f.name
        );
    }
    let module = kernels::module_source();
    for f in kernels::FILES {
        assert_eq!(module.matches(&format!("---- {} ----", f.name)).count(), 1);
    }
    assert!(kernels::file_program("nope.cu").is_none());
}

#[test]
fn compiling_is_an_error_value_with_or_without_nvrtc() {
    // Without libnvrtc on the loader path: Err(Nvrtc("...could not be loaded...")).
    // With it: a syntax error is Err(Nvrtc(log)). Never a panic.
    match nvrtc::compile("this is not CUDA", "bad.cu", "sm_80", &[]) {
        Err(CudaError::Nvrtc(msg)) => assert!(!msg.is_empty()),
        other => panic!("expected an NVRTC error, got {other:?}"),
    }
    match nvrtc::compile("int x;\0", "nul.cu", "sm_80", &[]) {
        Err(CudaError::Nvrtc(_)) => {}
        other => panic!("expected an NVRTC error, got {other:?}"),
    }
}

#[test]
fn compiles_for_sm80_and_sm90_when_nvrtc_is_present() {
    // CI runs the full check (examples/compile_check.rs via .ci/cuda-compile-check.sh); here
    // only when libnvrtc happens to be loadable, and only the smallest program.
    if nvrtc::available().is_err() {
        eprintln!("skipped: libnvrtc not on the loader path");
        return;
    }
    let src = kernels::file_program("gate.cu").unwrap();
    for arch in ["sm_80", "sm_90"] {
        let c = nvrtc::compile(&src, "gate.cu", arch, &[]).unwrap();
        assert!(nvrtc::ptx_defines(&c.ptx, "kda_gate"));
        assert!(c.cubin.is_some());
    }
}

//! The CUDA C sources, embedded in the binary with `include_str!`, and the kernels they define.
//!
//! Each `.cu` file holds one idea and lists the files it needs; [`module_source`] concatenates
//! all of them, in dependency order, into the one NVRTC program that is loaded per device.

/// One embedded source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFile {
    /// File name under `src/kernels/`.
    pub name: &'static str,
    /// The CUDA C source.
    pub source: &'static str,
    /// Files (by name) that must precede this one in a program.
    pub needs: &'static [&'static str],
    /// The `extern "C"` kernels this file defines.
    pub kernels: &'static [&'static str],
}

/// Every embedded file, in dependency order (each file's `needs` come earlier).
pub const FILES: &[KernelFile] = &[
    KernelFile {
        name: "common.cuh",
        source: include_str!("kernels/common.cuh"),
        needs: &[],
        kernels: &[],
    },
    KernelFile {
        name: "gate.cu",
        source: include_str!("kernels/gate.cu"),
        needs: &["common.cuh"],
        kernels: &["kda_gate"],
    },
    KernelFile {
        name: "conv.cu",
        source: include_str!("kernels/conv.cu"),
        needs: &["common.cuh"],
        kernels: &["kda_conv_prefill", "kda_conv_state_update"],
    },
    KernelFile {
        name: "norm.cu",
        source: include_str!("kernels/norm.cu"),
        needs: &["common.cuh"],
        kernels: &["kda_gated_norm"],
    },
    KernelFile {
        name: "recurrent.cu",
        source: include_str!("kernels/recurrent.cu"),
        needs: &["common.cuh"],
        kernels: &["kda_recurrent"],
    },
    KernelFile {
        name: "decode.cu",
        source: include_str!("kernels/decode.cu"),
        needs: &["common.cuh", "gate.cu", "recurrent.cu"],
        kernels: &["kda_decode"],
    },
    KernelFile {
        name: "chunked.cu",
        source: include_str!("kernels/chunked.cu"),
        needs: &["common.cuh"],
        kernels: &["kda_chunk_intra", "kda_chunk_state"],
    },
    KernelFile {
        name: "cast.cu",
        source: include_str!("kernels/cast.cu"),
        needs: &["common.cuh"],
        kernels: &["kda_cast_f32_to_bf16", "kda_cast_bf16_to_f32"],
    },
];

/// The file called `name`, if embedded.
pub fn file(name: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.name == name)
}

/// Every kernel name, in file order.
pub fn all_kernels() -> impl Iterator<Item = &'static str> {
    FILES.iter().flat_map(|f| f.kernels.iter().copied())
}

fn push_with_needs(name: &str, out: &mut String, done: &mut Vec<&'static str>) {
    let Some(f) = file(name) else { return };
    if done.contains(&f.name) {
        return;
    }
    for need in f.needs {
        push_with_needs(need, out, done);
    }
    out.push_str("\n// ---- ");
    out.push_str(f.name);
    out.push_str(" ----\n");
    out.push_str(f.source);
    done.push(f.name);
}

/// A standalone program for one file: the files it needs, then the file itself.
pub fn file_program(name: &str) -> Option<String> {
    file(name)?;
    let mut out = String::new();
    push_with_needs(name, &mut out, &mut Vec::new());
    Some(out)
}

/// The whole module: every file once, in dependency order.
pub fn module_source() -> String {
    let mut out = String::new();
    let mut done = Vec::new();
    for f in FILES {
        push_with_needs(f.name, &mut out, &mut done);
    }
    out
}

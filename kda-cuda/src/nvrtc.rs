//! Run-time compilation of the embedded kernels with NVRTC.
//!
//! `libnvrtc` is found by [`crate::libs`] and opened dynamically by cudarc; [`available`] checks
//! for it without panicking,
//! and every call into it runs under the crate's panic guard. A compile returns the PTX, the
//! CUBIN when the target is a real architecture (`sm_XY`), and the compiler log (warnings and,
//! when asked for, ptxas's register/spill report).

use std::ffi::{c_char, CString};

use cudarc::nvrtc::{result, sys};

use crate::error::CudaError;
use crate::libs::{self, CudaLibrary};
use crate::probe::{guarded, library_message};

/// The compiler options every kernel is built with (plus `--gpu-architecture`).
///
/// IEEE f32 semantics (no fast math, precise division and square root, denormals kept) so the
/// kernels follow the CPU reference's `libm` arithmetic up to rounding and FMA contraction.
pub const BASE_OPTIONS: &[&str] = &[
    "--std=c++17",
    "--fmad=true",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
];

/// Output of one NVRTC compile.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// PTX text (no trailing NUL).
    pub ptx: String,
    /// The device binary, when compiled for a real architecture (`sm_XY`).
    pub cubin: Option<Vec<u8>>,
    /// The compiler log (empty when there was nothing to say).
    pub log: String,
}

fn nvrtc_panic(message: String) -> CudaError {
    CudaError::Nvrtc(library_message(&message, "NVRTC (libnvrtc)"))
}

/// `Ok(())` when `libnvrtc` can be loaded, otherwise [`CudaError::Nvrtc`] naming every folder
/// searched. The library is looked for first ([`crate::libs::prepare`]: `libnvrtc.so.13`, then
/// `.so.12`, never newer than the driver when one is present), then by cudarc's own names on the
/// loader path.
pub fn available() -> Result<(), CudaError> {
    let max_major = crate::probe::driver_cuda_major();
    libs::prepare(CudaLibrary::Nvrtc, max_major);
    // SAFETY: `is_culib_present` only tries to dlopen the candidate file names and closes them.
    let present = guarded(|| Ok(unsafe { sys::is_culib_present() }), nvrtc_panic)?;
    if present {
        Ok(())
    } else {
        Err(CudaError::Nvrtc(libs::unavailable_message(
            CudaLibrary::Nvrtc,
            max_major,
        )))
    }
}

/// NVRTC's version `(major, minor)`.
pub fn version() -> Result<(i32, i32), CudaError> {
    available()?;
    guarded(
        || {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two valid out-pointers to c_int.
            unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
                .result()
                .map_err(|e| CudaError::Nvrtc(format!("nvrtcVersion: {e:?}")))?;
            Ok((major, minor))
        },
        nvrtc_panic,
    )
}

/// Destroys the program when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the handle came from `create_program` and is destroyed exactly once, here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn log_of(prog: &Program) -> String {
    // SAFETY: `prog` is a live program handle.
    match unsafe { result::get_program_log(prog.0) } {
        Ok(raw) => {
            let bytes: Vec<u8> = raw
                .into_iter()
                .take_while(|&c| c != 0)
                .map(|c| u8::from_ne_bytes(c.to_ne_bytes())) // c_char: i8 on x86-64, u8 on aarch64
                .collect();
            String::from_utf8_lossy(&bytes).trim().to_owned()
        }
        Err(e) => format!("(no log: {e:?})"),
    }
}

/// Compiles `source` (program name `name`) for `arch` (`sm_90`, `compute_80`, ...) with
/// [`BASE_OPTIONS`] and `extra` options. A compile error is [`CudaError::Nvrtc`] with the log.
pub fn compile(
    source: &str,
    name: &str,
    arch: &str,
    extra: &[&str],
) -> Result<Compiled, CudaError> {
    available()?;
    let src = CString::new(source)
        .map_err(|_| CudaError::Nvrtc(format!("{name}: source contains a NUL byte")))?;
    let cname = CString::new(name)
        .map_err(|_| CudaError::Nvrtc(format!("{name}: name contains a NUL byte")))?;
    let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(extra.iter().map(|s| s.to_string()));
    guarded(
        move || {
            let prog = Program(
                result::create_program(&src, Some(&cname))
                    .map_err(|e| CudaError::Nvrtc(format!("{name}: nvrtcCreateProgram: {e:?}")))?,
            );
            // SAFETY: `prog` is a live program handle. (An option containing a NUL byte would
            // make cudarc panic inside this guard, which becomes an error; ours contain none.)
            let compiled = unsafe { result::compile_program(prog.0, &options) };
            let log = log_of(&prog);
            if let Err(e) = compiled {
                return Err(CudaError::Nvrtc(format!(
                    "{name} for {arch} failed ({e:?}); options {options:?}\n{log}"
                )));
            }
            // SAFETY: `prog` was compiled successfully.
            let ptx_raw = unsafe { result::get_ptx(prog.0) }
                .map_err(|e| CudaError::Nvrtc(format!("{name}: nvrtcGetPTX: {e:?}")))?;
            let ptx_bytes: Vec<u8> = ptx_raw
                .into_iter()
                .take_while(|&c| c != 0)
                .map(|c| u8::from_ne_bytes(c.to_ne_bytes())) // c_char: i8 on x86-64, u8 on aarch64
                .collect();
            let ptx = String::from_utf8_lossy(&ptx_bytes).into_owned();
            let cubin = cubin_of(&prog);
            Ok(Compiled { ptx, cubin, log })
        },
        nvrtc_panic,
    )
}

/// The CUBIN of a compiled program, `None` when it was compiled for a virtual architecture.
fn cubin_of(prog: &Program) -> Option<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: live, compiled program; valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .ok()?;
    if size == 0 {
        return None;
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has exactly the size NVRTC reported for the CUBIN.
    unsafe { sys::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr() as *mut c_char) }
        .result()
        .ok()?;
    Some(buf)
}

/// Whether a PTX text defines the kernel entry `name` (`.entry name(`).
pub fn ptx_defines(ptx: &str, name: &str) -> bool {
    ptx.lines().any(|l| {
        let l = l.trim_start();
        (l.starts_with(".visible .entry ") || l.starts_with(".entry "))
            && l.split(".entry ")
                .nth(1)
                .map(|rest| rest.trim_start().starts_with(&format!("{name}(")))
                .unwrap_or(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_entries_in_ptx() {
        let ptx = "//\n.visible .entry kda_gate(\n\t.param .align 8 .b8 kda_gate_param_0[88]\n)\n";
        assert!(ptx_defines(ptx, "kda_gate"));
        assert!(!ptx_defines(ptx, "kda_gat"));
        assert!(!ptx_defines(ptx, "kda_decode"));
    }
}

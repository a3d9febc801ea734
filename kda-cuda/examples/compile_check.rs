//! Compiles every embedded kernel source with NVRTC for each target architecture (default
//! `sm_80` and `sm_90`; override with arguments), without a GPU, and fails on any error or
//! warning, on a kernel the Rust side loads that the PTX lacks, or on a register spill in a
//! kernel that must not spill.
//!
//! Needs only `libnvrtc` (12 or 13) where `kda_cuda::libs` finds it: `KDA_CUDA_LIB_DIR`,
//! `LD_LIBRARY_PATH`, a Python environment's `nvidia/*/lib` (`KDA_CUDA_PYTHON_SITE`), ...; see
//! `.ci/cuda-compile-check.sh`. With `KDA_EXPECT_NVRTC=MAJOR.MINOR` set, any other NVRTC
//! version is an error (so a check meant for one version cannot silently run another).
//!
//! ```text
//! cargo run -p kda-cuda --example compile_check [-- sm_80 sm_90 ...]
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kda_cuda::{kernels, nvrtc, CudaError};

/// One NVRTC program: a file with what it needs, or the whole module.
struct Program {
    name: String,
    source: String,
    kernels: Vec<&'static str>,
}

/// One compile to run.
struct Job<'a> {
    arch: &'a str,
    program: &'a Program,
}

/// A finished compile and its wall time.
type Outcome = Option<(Result<nvrtc::Compiled, CudaError>, f64)>;

/// Kernels allowed to spill registers a little (the decode kernel keeps a 128-float state
/// column in registers next to the conv and norm work; a few bytes of spill are tolerated).
const SPILL_TOLERANT: &[&str] = &["kda_decode"];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let archs: Vec<String> = if args.is_empty() {
        vec!["sm_80".into(), "sm_90".into()]
    } else {
        args
    };
    let dirs = kda_cuda::libs::SearchDirs::from_env();
    for lib in kda_cuda::libs::CudaLibrary::ALL {
        match kda_cuda::libs::find(lib, &dirs.dirs, None) {
            Some(f) => println!("{}: {}", lib.stem(), f.path.display()),
            None => println!("{}: not in the searched folders", lib.stem()),
        }
    }
    match nvrtc::version() {
        Ok((major, minor)) => {
            let files = kda_cuda::libs::loaded_files();
            let shown: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
            println!("NVRTC {major}.{minor} ({})", shown.join(", "));
            let expected = std::env::var("KDA_EXPECT_NVRTC").unwrap_or_default();
            if !expected.is_empty() && expected != format!("{major}.{minor}") {
                eprintln!("error: NVRTC {major}.{minor} loaded, KDA_EXPECT_NVRTC={expected}");
                return ExitCode::FAILURE;
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    let mut failures = 0usize;
    let started = Instant::now();
    println!(
        "{:<14} {:<8} {:>10} {:>10} {:>8}  kernels",
        "program", "arch", "PTX bytes", "CUBIN", "seconds"
    );
    let mut programs: Vec<Program> = kernels::FILES
        .iter()
        .filter(|f| !f.kernels.is_empty())
        .map(|f| Program {
            name: f.name.to_string(),
            source: kernels::file_program(f.name).unwrap_or_default(),
            kernels: f.kernels.to_vec(),
        })
        .collect();
    programs.push(Program {
        name: "(module)".into(),
        source: kernels::module_source(),
        kernels: kernels::all_kernels().collect(),
    });
    // Every (arch, program) compile is independent: run them on all cores, report in order.
    let jobs: Vec<Job<'_>> = archs
        .iter()
        .flat_map(|a| {
            programs.iter().map(move |p| Job {
                arch: a,
                program: p,
            })
        })
        .collect();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(jobs.len());
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Outcome>> = jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(job) = jobs.get(i) else { break };
                let t0 = Instant::now();
                let r = nvrtc::compile(
                    &job.program.source,
                    &job.program.name,
                    job.arch,
                    &["--ptxas-options=--verbose"],
                );
                *results[i].lock().unwrap_or_else(|p| p.into_inner()) =
                    Some((r, t0.elapsed().as_secs_f64()));
            });
        }
    });
    for (job, slot) in jobs.iter().zip(results) {
        let (arch, name, expected) = (job.arch, &job.program.name, &job.program.kernels);
        let Some((res, secs)) = slot.into_inner().unwrap_or_else(|p| p.into_inner()) else {
            println!("{name:<14} {arch:<8} NOT RUN");
            failures += 1;
            continue;
        };
        match res {
            Err(e) => {
                println!("{name:<14} {arch:<8} FAILED");
                eprintln!("{e}");
                failures += 1;
            }
            Ok(c) => {
                let missing: Vec<&&str> = expected
                    .iter()
                    .filter(|k| !nvrtc::ptx_defines(&c.ptx, k))
                    .collect();
                println!(
                    "{name:<14} {arch:<8} {:>10} {:>10} {secs:>8.2}  {}",
                    c.ptx.len(),
                    c.cubin.as_ref().map_or(0, |b| b.len()),
                    expected.join(" ")
                );
                if !missing.is_empty() {
                    eprintln!("{name} for {arch}: PTX lacks kernels {missing:?}");
                    failures += 1;
                }
                if c.log.lines().any(|l| l.contains("warning")) {
                    eprintln!("{name} for {arch}: compiler warnings:\n{}", c.log);
                    failures += 1;
                }
                if name == "(module)" {
                    failures += report_resources(arch, &c.log);
                }
            }
        }
    }
    println!(
        "{} program(s) × {} arch(es) in {:.1} s: {}",
        programs.len(),
        archs.len(),
        started.elapsed().as_secs_f64(),
        if failures == 0 { "OK" } else { "FAILED" }
    );
    if failures == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints ptxas's per-kernel registers / spills; returns 1 for a forbidden spill.
fn report_resources(arch: &str, log: &str) -> usize {
    let mut failures = 0;
    let mut current = String::new();
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            current = rest.split('\'').next().unwrap_or_default().to_string();
        } else if line.contains("spill stores") && !current.is_empty() {
            let spills = line
                .split("bytes spill stores")
                .next()
                .and_then(|s| s.rsplit(',').next())
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if spills > 0 && !SPILL_TOLERANT.contains(&current.as_str()) {
                eprintln!("{arch}: {current} spills {spills} bytes of registers");
                failures += 1;
            }
        } else if line.contains("Used") && line.contains("registers") && !current.is_empty() {
            let used = line.split("Used").nth(1).unwrap_or_default().trim();
            println!("    {arch} {current:<24} {used}");
        }
    }
    failures
}

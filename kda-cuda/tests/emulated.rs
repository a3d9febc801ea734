//! Runs the real kernel sources on the CPU in a small SIMT emulator (tests/emulator: every CUDA
//! thread an OS thread, real barriers, warp shuffles, NaN-poisoned shared memory) against a
//! float64 reference of the same math — the numerical check available without a GPU. It
//! verifies indexing, the algorithms and the barrier structure; GPU-only behaviour (timing,
//! register limits, occupancy, the driver) is left to `scripts/gpu-check.sh`.
//!
//! Needs a C++20 compiler (`$CXX`, default `c++`); skipped with a message when there is none,
//! or when `KDA_CUDA_SKIP_EMULATOR` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

fn newest_source(dir: &Path, newest: &mut SystemTime) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            newest_source(&p, newest);
        } else if let Ok(t) = e.metadata().and_then(|m| m.modified()) {
            *newest = (*newest).max(t);
        }
    }
}

#[test]
fn kernels_match_the_float64_reference_in_the_host_emulator() {
    if std::env::var_os("KDA_CUDA_SKIP_EMULATOR").is_some() {
        eprintln!("skipped: KDA_CUDA_SKIP_EMULATOR is set");
        return;
    }
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx)
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_err()
    {
        eprintln!("skipped: no C++ compiler ({cxx})");
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let harness = root.join("tests/emulator/harness.cpp");
    let bin = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kda_cuda_emulator");
    let mut newest = SystemTime::UNIX_EPOCH;
    newest_source(&root.join("src/kernels"), &mut newest);
    newest_source(&root.join("tests/emulator"), &mut newest);
    let fresh = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t > newest);
    if !fresh {
        let out = Command::new(&cxx)
            .args([
                "-std=c++20",
                "-O2",
                "-pthread",
                "-Wall",
                "-Wno-unknown-pragmas",
                "-o",
            ])
            .arg(&bin)
            .arg(&harness)
            .output()
            .expect("run the C++ compiler");
        let log = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            if log.contains("barrier")
                && (log.contains("No such file") || log.contains("not found"))
            {
                eprintln!("skipped: {cxx} lacks C++20 <barrier>:\n{log}");
                return;
            }
            panic!("emulator build failed:\n{log}");
        }
    }
    let mut child = Command::new(&bin)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the emulator");
    let deadline = Instant::now() + Duration::from_secs(900);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for the emulator") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("emulator timed out (a barrier deadlock?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    if let Some(mut s) = child.stdout.take() {
        use std::io::Read;
        let _ = s.read_to_string(&mut stdout);
    }
    println!("{stdout}");
    assert!(
        status.success(),
        "emulated kernels disagree with the reference:\n{stdout}"
    );
}

//! Nothing lost, nothing hangs (issue 12): files are replaced atomically (a `kill -9` or a full
//! disk leaves the previous file byte for byte), `kda forward` is transactional and refuses to
//! overwrite its own inputs, thread counts and sizes from the command line are bounded before
//! anything starts, allocations sized by a file fail with an `error:` line instead of an
//! abort, and special files (FIFOs, devices) are refused at once.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use kda_core::KdaConfig;
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, ExportOptions};
use kda_host::checkpoint::safetensors::SafetensorsFile;
use kda_host::io::write_input;
use kda_host::rng::Rng;
use kda_host::state_file::write_state;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};

const HIDDEN: usize = 8;

/// A checkpoint (hidden 8, `heads` × `head_dim`), an input of `n` one-token sequences, and a
/// state file for them with random contents.
struct Setup {
    dir: TempDir,
    cfg: KdaConfig,
    ckpt: String,
    input: String,
}

impl Setup {
    fn new(tag: &str, heads: usize, head_dim: usize, n: usize) -> Self {
        let dir = TempDir::new(tag);
        let cfg = KdaConfig::kimi_linear(HIDDEN, heads, head_dim);
        let l = OwnedLayer::random(cfg, WeightDtype::Bf16, 1).unwrap();
        export_dir(
            &dir.path("ckpt"),
            &[(0, &l)],
            &ExportOptions::published(Layout::KimiLinear, 2),
        )
        .unwrap();
        let mut rng = Rng::new(2);
        let x = rng.normals(n * HIDDEN, 1.0);
        let cu: Vec<usize> = (0..=n).collect();
        write_input(&dir.path("in.st"), &x, HIDDEN, Some(&cu)).unwrap();
        let mut c = SequenceCaches::new(&cfg, n).unwrap();
        c.recurrent.iter_mut().for_each(|v| *v = rng.normal() * 0.1);
        write_state(&dir.path("state.st"), &cfg, &c).unwrap();
        let ckpt = s(&dir.path("ckpt")).to_string();
        let input = s(&dir.path("in.st")).to_string();
        Setup {
            dir,
            cfg,
            ckpt,
            input,
        }
    }

    fn p(&self, name: &str) -> PathBuf {
        self.dir.path(name)
    }

    fn forward_args<'a>(&'a self, out: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
        let mut a = vec![
            "forward",
            "--model",
            &self.ckpt,
            "--input",
            &self.input,
            "--output",
            s(out),
        ];
        a.extend_from_slice(extra);
        a
    }
}

fn temporaries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".kda-tmp-"))
        .collect()
}

/// `kill -9` while `kda forward --state-in S --state-out S` writes a large S leaves S byte for
/// byte as it was. The kill must land while the temporary is being written: the test checks
/// that it did (the temporary outlives the process) and retries otherwise.
#[test]
fn kill_during_state_write_keeps_the_previous_file() {
    // 2 heads × 128 × 128 f32 = 128 KiB of recurrent state per sequence: 1024 sequences ≈ 130 MB.
    let st = Setup::new("kill", 2, 128, 1024);
    let state = st.p("state.st");
    let before = std::fs::read(&state).unwrap();
    let out = st.p("out.st");
    let args = st.forward_args(
        &out,
        &[
            "--state-in",
            s(&state),
            "--state-out",
            s(&state),
            "--threads",
            "1",
        ],
    );
    let mut killed_mid_write = false;
    for attempt in 0..5 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kda"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        // Wait until the state's temporary has some bytes, then kill.
        let seen = loop {
            let t = temporaries(&st.dir.0);
            let growing = t.iter().any(|p| {
                p.to_string_lossy().contains(".state.st.kda-tmp-")
                    && std::fs::metadata(p).is_ok_and(|m| m.len() > 0)
            });
            if growing || start.elapsed() > Duration::from_secs(60) {
                break growing;
            }
            if child.try_wait().unwrap().is_some() {
                break false;
            }
        };
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let left = temporaries(&st.dir.0);
        let state_tmp_left = left
            .iter()
            .any(|p| p.to_string_lossy().contains(".state.st.kda-tmp-"));
        if seen && state_tmp_left && !status.success() {
            killed_mid_write = true;
            let after = std::fs::read(&state).unwrap();
            assert!(
                after == before,
                "attempt {attempt}: the state file changed after kill -9 mid-write"
            );
            assert!(!out.exists(), "the output was written before the state");
            println!(
                "attempt {attempt}: killed while writing the {} MB state; previous file intact",
                before.len() >> 20
            );
            break;
        }
        // Too late or too early: the process finished (then S was replaced whole). Restore.
        std::fs::write(&state, &before).unwrap();
        left.iter().for_each(|p| {
            let _ = std::fs::remove_file(p);
        });
    }
    assert!(killed_mid_write, "never managed to kill kda while it wrote");
}

/// In-place `--state-in S --state-out S` gives the same state as writing elsewhere.
#[test]
fn in_place_state_update_is_allowed_and_equal() {
    let st = Setup::new("inplace", 1, 16, 3);
    let state = st.p("state.st");
    let copy = st.p("copy.st");
    std::fs::copy(&state, &copy).unwrap();
    let (out1, out2, s2) = (st.p("o1.st"), st.p("o2.st"), st.p("s2.st"));
    kda_ok(&st.forward_args(&out1, &["--state-in", s(&state), "--state-out", s(&s2)]));
    kda_ok(&st.forward_args(&out2, &["--state-in", s(&copy), "--state-out", s(&copy)]));
    assert_eq!(std::fs::read(&s2).unwrap(), std::fs::read(&copy).unwrap());
    assert_eq!(std::fs::read(&out1).unwrap(), std::fs::read(&out2).unwrap());
    assert!(temporaries(&st.dir.0).is_empty());
}

/// Unmounts on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk while writing the state leaves the previous state and the previous output
/// (written first, on another disk) untouched. On a small tmpfs when one can be mounted (as
/// root), else with the writer's injected failure in this process.
#[test]
fn full_disk_keeps_the_previous_files() {
    let st = Setup::new("full", 1, 64, 16);
    let mnt = st.p("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=400k", "tmpfs", s(&mnt)])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if mounted {
        let _guard = Mount(mnt.clone());
        // 16 × 64 × 64 × 4 = 256 KiB of state: it fits once in 400 KiB, not twice.
        let state = mnt.join("state.st");
        std::fs::copy(st.p("state.st"), &state).unwrap();
        let before = std::fs::read(&state).unwrap();
        assert!(before.len() > 200 << 10 && before.len() < 400 << 10);
        let out = st.p("out.st");
        std::fs::write(&out, b"previous output").unwrap();
        let line = kda_err(
            &st.forward_args(&out, &["--state-in", s(&state), "--state-out", s(&state)]),
            &["state.st", "No space left on device"],
        );
        println!("full disk (tmpfs of 400 KiB): {line}");
        assert_eq!(std::fs::read(&state).unwrap(), before);
        assert_eq!(std::fs::read(&out).unwrap(), b"previous output");
        assert!(temporaries(&mnt).is_empty(), "{:?}", temporaries(&mnt));
        assert!(temporaries(&st.dir.0).is_empty());
    } else {
        println!("full disk: cannot mount a tmpfs here; using the writer's injected failure");
        let state = st.p("state.st");
        let before = std::fs::read(&state).unwrap();
        let c = SequenceCaches::new(&st.cfg, 16).unwrap();
        kda_host::fsio::fail_writes_after(Some(100 << 10));
        let e = write_state(&state, &st.cfg, &c).unwrap_err().to_string();
        kda_host::fsio::fail_writes_after(None);
        assert!(e.contains("state.st") && e.contains("No space left"), "{e}");
        assert_eq!(std::fs::read(&state).unwrap(), before);
        assert!(temporaries(&st.dir.0).is_empty());
    }
}

/// Outputs must be distinct from each other and from every input; an error leaves every
/// existing file untouched.
#[test]
fn outputs_never_overwrite_inputs_or_each_other() {
    let st = Setup::new("clobber", 1, 16, 3);
    let out = st.p("out.st");
    std::fs::write(&out, b"previous output").unwrap();
    let weights = st.p("ckpt").join("model.safetensors");
    let config = st.p("ckpt").join("config.json");
    let w_before = std::fs::read(&weights).unwrap();
    kda_err(
        &st.forward_args(&out, &["--state-out", s(&out)]),
        &["--state-out", "out.st", "same file as --output"],
    );
    kda_err(
        &st.forward_args(&weights, &[]),
        &["--output", "model.safetensors", "same file as --model"],
    );
    kda_err(
        &st.forward_args(&out, &["--state-out", s(&config)]),
        &["--state-out", "config.json", "same file as --model"],
    );
    kda_err(
        &st.forward_args(&st.p("in.st"), &[]),
        &["--output", "in.st", "same file as --input"],
    );
    kda_err(
        &st.forward_args(&st.p("state.st"), &["--state-in", s(&st.p("state.st"))]),
        &["--output", "state.st", "same file as --state-in"],
    );
    // A hard link and a symlink to the weights are the same file.
    let hard = st.p("hard.st");
    std::fs::hard_link(&weights, &hard).unwrap();
    kda_err(
        &st.forward_args(&hard, &[]),
        &["hard.st", "same file as --model"],
    );
    let soft = st.p("soft.st");
    std::os::unix::fs::symlink(&weights, &soft).unwrap();
    kda_err(&st.forward_args(&soft, &[]), &["same file as --model"]);
    // A state path that cannot be written fails before the output is touched.
    kda_err(
        &st.forward_args(&out, &["--state-out", s(&st.p("none/s.st"))]),
        &["none/s.st"],
    );
    assert_eq!(std::fs::read(&out).unwrap(), b"previous output");
    assert_eq!(std::fs::read(&weights).unwrap(), w_before);
    // A directory or device is not replaced.
    kda_err(
        &st.forward_args(&st.p("ckpt"), &[]),
        &["ckpt", "a directory"],
    );
    kda_err(
        &st.forward_args(Path::new("/dev/null"), &[]),
        &["/dev/null", "character device"],
    );
    assert!(temporaries(&st.dir.0).is_empty());
}

fn timed_err(args: &[&str], culprits: &[&str]) -> Duration {
    let t = Instant::now();
    let line = kda_err(args, culprits);
    let dt = t.elapsed();
    println!("{:?}: {line} ({dt:.2?})", args.first());
    assert!(dt < Duration::from_secs(1), "{args:?} took {dt:?}");
    dt
}

/// `--threads` is bounded at parse time: a huge count fails at once, before any file is read.
#[test]
fn huge_thread_counts_fail_at_once() {
    let st = Setup::new("threads", 1, 16, 3);
    let out = st.p("out.st");
    for n in ["100000", "60000", "1025"] {
        timed_err(
            &st.forward_args(&out, &["--threads", n]),
            &["--threads", n, "1024"],
        );
        timed_err(
            &[
                "forward",
                "--model",
                "/nonexistent",
                "--input",
                "x",
                "--output",
                "y",
                "--threads",
                n,
            ],
            &["--threads", n],
        );
        timed_err(&["bench", "--threads", n], &["--threads", n]);
    }
    // Within the cap but above 4× the cores: runs, on fewer threads.
    kda_ok(&st.forward_args(&out, &["--threads", "1024"]));
}

/// Sizes from the command line are checked before they become allocations.
#[test]
fn huge_prompt_and_batch_are_errors() {
    for (args, culprits) in [
        (
            &["bench", "--prompt", "4611686018427387904"][..],
            &["--prompt"][..],
        ),
        (
            &["bench", "--prompt", "18446744073709551615"][..],
            &["--prompt"][..],
        ),
        (
            &["bench", "--batch", "18446744073709551615"][..],
            &["--batch"][..],
        ),
        (
            &["demo", "--prompt", "18014398509481984"][..],
            &["--prompt"][..],
        ),
        (
            &["demo", "--prompt", "18446744073709551615"][..],
            &["--prompt"][..],
        ),
    ] {
        timed_err(args, culprits);
    }
    // Sizes that fit the address space but not the memory: an `error:` line, not an abort,
    // however much memory the machine has (the limit is set for the child).
    let o = Command::new("sh")
        .args([
            "-c",
            &format!(
                "ulimit -v 4000000; exec {} bench --batch 100000 --steps 1",
                env!("CARGO_BIN_EXE_kda")
            ),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    println!("bench --batch 100000 under ulimit -v 4 GB: {err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("error: cannot allocate")
            && err.contains("--batch")
            && err.lines().count() == 1,
        "{err}"
    );
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

/// FIFOs and devices are refused before they are opened, so nothing hangs or reads forever.
#[test]
fn special_files_fail_at_once() {
    let st = Setup::new("special", 1, 16, 3);
    let out = st.p("out.st");
    let fifo = st.p("fifo");
    mkfifo(&fifo);
    let mut a = st.forward_args(&out, &[]);
    a[4] = "/dev/zero";
    timed_err(&a, &["/dev/zero", "character device"]);
    a[4] = s(&fifo);
    timed_err(&a, &["fifo", "FIFO"]);
    timed_err(
        &st.forward_args(&out, &["--state-in", s(&fifo)]),
        &["fifo", "FIFO"],
    );
    timed_err(
        &st.forward_args(&out, &["--state-in", "/dev/zero"]),
        &["/dev/zero", "character device"],
    );
    // config.json a symlink to /dev/zero; model.safetensors a FIFO; a shard a FIFO.
    let ck = st.p("ckpt");
    let cfg = ck.join("config.json");
    let cfg_saved = std::fs::read(&cfg).unwrap();
    std::fs::remove_file(&cfg).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &cfg).unwrap();
    timed_err(
        &st.forward_args(&out, &[]),
        &["config.json", "character device"],
    );
    timed_err(&["inspect", s(&ck)], &["config.json", "character device"]);
    std::fs::remove_file(&cfg).unwrap();
    std::fs::write(&cfg, &cfg_saved).unwrap();
    let w = ck.join("model.safetensors");
    std::fs::remove_file(&w).unwrap();
    mkfifo(&w);
    timed_err(&st.forward_args(&out, &[]), &["model.safetensors", "FIFO"]);
    timed_err(&["inspect", s(&ck)], &["model.safetensors", "FIFO"]);
    std::fs::write(
        ck.join("model.safetensors.index.json"),
        r#"{"weight_map": {"model.layers.0.self_attn.q_proj.weight": "model.safetensors"}}"#,
    )
    .unwrap();
    timed_err(&["inspect", s(&ck)], &["model.safetensors", "FIFO"]);
    // A file given where a folder is expected.
    timed_err(&["inspect", s(&st.p("in.st"))], &["in.st", "it is a file"]);
}

/// A checkpoint whose tensors are misaligned (so they must be copied) and huge (a sparse
/// file): under a memory limit the copy fails with an `error:` line naming the tensor, not an
/// abort (rc 1, not 134).
#[test]
fn misaligned_sparse_checkpoint_under_a_memory_limit() {
    let st = Setup::new("sparse", 1, 16, 3);
    let ck = st.p("ckpt");
    let small = SafetensorsFile::read(&ck.join("model.safetensors")).unwrap();
    // hidden 8 → 2^26: the [16, D] bf16 projections become 2 GiB each.
    let big = 1usize << 26;
    let mut t: Vec<(String, String, Vec<usize>, usize)> = small
        .header
        .tensors
        .iter()
        .map(|(n, e)| {
            let shape: Vec<usize> = e
                .shape
                .iter()
                .map(|&d| if d == HIDDEN { big } else { d })
                .collect();
            let size = shape.iter().product::<usize>() * e.dtype.bitsize() / 8;
            (n.clone(), format!("{:?}", e.dtype), shape, size)
        })
        .collect();
    t.sort();
    let mut h = String::from("{");
    let mut off = 0;
    for (i, (n, d, shape, size)) in t.iter().enumerate() {
        if i > 0 {
            h.push(',');
        }
        h.push_str(&format!(
            "\"{n}\":{{\"dtype\":\"{d}\",\"shape\":{shape:?},\"data_offsets\":[{off},{}]}}",
            off + size
        ));
        off += size;
    }
    h.push('}');
    if (8 + h.len()) % 2 == 0 {
        h.push(' '); // data starts at an odd offset: no 2- or 4-byte element is aligned
    }
    let file_len = 8 + h.len() + off;
    let w = ck.join("model.safetensors");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&w).unwrap();
        f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
        f.write_all(h.as_bytes()).unwrap();
        f.set_len(file_len as u64).unwrap();
    }
    let cfg = ck.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text.replace(
        &format!("\"hidden_size\": {HIDDEN}"),
        &format!("\"hidden_size\": {big}"),
    );
    std::fs::write(&cfg, text).unwrap();
    // Room for the map of the whole file and 1 GiB more, less than one 2 GiB copy.
    let limit_kib = (file_len >> 10) + (1 << 20);
    let kda = env!("CARGO_BIN_EXE_kda");
    let out = st.p("out.st");
    for cmd in [
        format!("{kda} inspect {}", s(&ck)),
        format!(
            "{kda} forward --layout rows --model {} --input {} --output {}",
            s(&ck),
            s(&st.p("in.st")),
            s(&out)
        ),
    ] {
        let o = Command::new("sh")
            .args(["-c", &format!("ulimit -v {limit_kib}; exec {cmd}")])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        println!(
            "{} GiB sparse checkpoint, ulimit -v {limit_kib} KiB: rc {:?}: {err}",
            file_len >> 30,
            o.status.code()
        );
        assert_eq!(o.status.code(), Some(1), "{cmd}: {err}");
        assert!(
            err.starts_with("error: cannot allocate")
                && err.contains("misaligned")
                && err.contains("q_proj")
                && err.lines().count() == 1,
            "{err}"
        );
    }
}

/// A safetensors header naming a tensor twice is an error naming it (the JSON parser alone
/// keeps the last).
#[test]
fn duplicate_tensor_names_are_errors() {
    let st = Setup::new("dup", 1, 16, 3);
    let x = st.p("dup.st");
    let h = r#"{"hidden_states":{"dtype":"F32","shape":[1,8],"data_offsets":[0,32]},"hidden_states":{"dtype":"F32","shape":[1,8],"data_offsets":[0,32]}}"#;
    let mut b = (h.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(h.as_bytes());
    b.extend_from_slice(&[0u8; 32]);
    std::fs::write(&x, &b).unwrap();
    let out = st.p("out.st");
    let mut a = st.forward_args(&out, &[]);
    a[4] = s(&x);
    kda_err(&a, &["dup.st", "`hidden_states`", "more than once"]);
}

/// F16 `hidden_states` (as the help says) give the outputs of the same values in F32.
#[test]
fn f16_input_equals_f32_input() {
    use kda_host::checkpoint::safetensors::{write_file, OutTensor};
    let st = Setup::new("f16", 1, 16, 3);
    let vals: Vec<half::f16> = Rng::new(9)
        .normals(4 * HIDDEN, 1.0)
        .iter()
        .map(|&v| half::f16::from_f32(v))
        .collect();
    let f16 = OutTensor {
        name: "hidden_states".into(),
        dtype: safetensors::Dtype::F16,
        shape: vec![4, HIDDEN],
        bytes: vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    let wide: Vec<f32> = vals.iter().map(|v| v.to_f32()).collect();
    write_file(&st.p("x16.st"), &[f16], &Default::default()).unwrap();
    write_input(&st.p("x32.st"), &wide, HIDDEN, None).unwrap();
    let (o16, o32) = (st.p("o16.st"), st.p("o32.st"));
    let mut a = st.forward_args(&o16, &[]);
    let x16 = st.p("x16.st");
    a[4] = s(&x16);
    kda_ok(&a);
    let mut a = st.forward_args(&o32, &[]);
    let x32 = st.p("x32.st");
    a[4] = s(&x32);
    kda_ok(&a);
    assert_eq!(std::fs::read(&o16).unwrap(), std::fs::read(&o32).unwrap());
    let help = kda_ok(&["forward", "--help"]);
    assert!(help.contains("F32/BF16/F16"), "{help}");
}

//! Peak memory of writing a state file: the file is streamed (header, then each tensor through
//! a small buffer), so the process peaks at the caches it already holds plus a few MB, not at
//! a second (or third) copy of the file. Alone in its test binary so that no other test's
//! allocations count.

use kda_core::KdaConfig;
use kda_host::state_file::{state_bytes, write_state};
use kda_host::SequenceCaches;

/// `VmHWM` (peak resident set) of this process, bytes.
fn peak_rss() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn writing_a_state_file_peaks_below_1_2x_its_size() {
    let Some(start) = peak_rss() else {
        println!("no /proc/self/status here: peak RSS not measured");
        return;
    };
    // 16 heads × 128 × 128 f32 = 1 MiB of recurrent state per sequence; 160 sequences.
    let cfg = KdaConfig::kimi_linear(2048, 16, 128);
    let mut c = SequenceCaches::new(&cfg, 160).unwrap();
    // Touch every page (zeroed pages that were never written are not resident).
    for v in [
        &mut c.recurrent,
        &mut c.conv_q,
        &mut c.conv_k,
        &mut c.conv_v,
    ] {
        v.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = (i % 977) as f32);
    }
    let dir = std::env::temp_dir().join(format!("kda-write-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.st");
    write_state(&path, &cfg, &c).unwrap();
    let peak = peak_rss().unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    let _ = std::fs::remove_dir_all(&dir);
    let ratio = peak as f64 / size as f64;
    println!(
        "state file {:.1} MiB: peak RSS {:.1} MiB = {ratio:.3}× the file (process before the caches: {:.1} MiB)",
        size as f64 / (1 << 20) as f64,
        peak as f64 / (1 << 20) as f64,
        start as f64 / (1 << 20) as f64
    );
    assert!(size > 160 << 20, "{size}");
    assert!(
        ratio <= 1.2,
        "peak RSS {peak} is {ratio:.2}× the {size}-byte file"
    );
    // Control: the measurement sees a whole-file copy in memory (what writing used to do).
    let bytes = state_bytes(&cfg, &c).unwrap();
    let copy = peak_rss().unwrap() as f64 / size as f64;
    println!("control: with the file's bytes also in memory, peak RSS = {copy:.3}× the file");
    assert_eq!(bytes.len() as u64, size);
    assert!(copy >= 1.9, "{copy}");
}

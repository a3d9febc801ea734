//! `kda forward --snapshot-every S --snapshots OUT` and `kda demo --speculative` (issue 14).

mod common;

use common::*;
use kda_core::KdaConfig;
use kda_host::checkpoint::config::Layout;
use kda_host::checkpoint::export::{export_dir, ExportOptions};
use kda_host::checkpoint::safetensors::SafetensorsFile;
use kda_host::io::{read_output, write_input};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, WeightDtype};

/// Each snapshot in the file equals the final state of a `kda forward` over exactly that
/// prefix of its sequence (the positions are on the chunk grid: bitwise).
#[test]
fn snapshot_file_holds_the_prefix_states() {
    let dir = TempDir::new("cli_snapshots");
    let cfg = KdaConfig::kimi_linear(24, 2, 8);
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, 4).unwrap();
    let ckpt = dir.path("ckpt");
    let opts = ExportOptions::published(Layout::KimiLinear, 1);
    export_dir(&ckpt, &[(0, &layer)], &opts).unwrap();
    let hd = cfg.hidden;
    let cu = [0usize, 40, 52, 52, 85];
    let x = Rng::new(9).normals(cu[4] * hd, 1.0);
    let (inp, out, snaps) = (dir.path("in.st"), dir.path("out.st"), dir.path("snaps.st"));
    write_input(&inp, &x, hd, Some(&cu)).unwrap();
    let base = [
        "forward",
        "--model",
        s(&ckpt),
        "--threads",
        "1",
        "--mode",
        "chunked",
    ];
    let args = [
        "--input",
        s(&inp),
        "--output",
        s(&out),
        "--snapshot-every",
        "16",
    ];
    kda_ok(&[&base[..], &args[..], &["--snapshots", s(&snaps)]].concat());
    let f = SafetensorsFile::read(&snaps).unwrap();
    let seq = f.int_tensor("snapshot_seq").unwrap();
    let pos = f.int_tensor("snapshot_pos").unwrap();
    // 40 → 16, 32; 12 → none; 0 → none; 33 → 16, 32.
    assert_eq!(seq, [0, 0, 3, 3]);
    assert_eq!(pos, [16, 32, 16, 32]);
    let all = read_state_tensors(&snaps);
    let (sl, cl) = (cfg.state_len().unwrap(), cfg.conv_state_len().unwrap());
    for (m, (&sq, &p)) in seq.iter().zip(&pos).enumerate() {
        let (sq, p) = (sq as usize, p as usize);
        let prefix = &x[cu[sq] * hd..(cu[sq] + p) * hd];
        let (pin, pout, pst) = (dir.path("p.st"), dir.path("po.st"), dir.path("ps.st"));
        write_input(&pin, prefix, hd, None).unwrap();
        let args = [
            "--input",
            s(&pin),
            "--output",
            s(&pout),
            "--state-out",
            s(&pst),
        ];
        kda_ok(&[&base[..], &args[..]].concat());
        let want = read_state_tensors(&pst);
        for (k, (got, want)) in all.iter().zip(&want).enumerate() {
            let len = if k == 0 { sl } else { cl };
            assert_eq!(
                &got[m * len..(m + 1) * len],
                &want[..],
                "snapshot {m}, tensor {k}"
            );
        }
    }
    // The outputs are those of a run without snapshots.
    let plain = dir.path("plain.st");
    kda_ok(&[&base[..], &["--input", s(&inp), "--output", s(&plain)]].concat());
    assert_eq!(read_output(&out).unwrap().0, read_output(&plain).unwrap().0);
    // Each option needs the other, and S = 0 is refused.
    kda_err(
        &[
            &base[..],
            &[
                "--input",
                s(&inp),
                "--output",
                s(&out),
                "--snapshot-every",
                "4",
            ],
        ]
        .concat(),
        &["--snapshots"],
    );
    kda_err(
        &[
            &base[..],
            &[
                "--input",
                s(&inp),
                "--output",
                s(&out),
                "--snapshot-every",
                "0",
                "--snapshots",
                s(&snaps),
            ],
        ]
        .concat(),
        &["--snapshot-every"],
    );
    // The snapshot file must not be another output or an input.
    kda_err(
        &[
            &base[..],
            &[
                "--input",
                s(&inp),
                "--output",
                s(&out),
                "--snapshot-every",
                "4",
                "--snapshots",
                s(&out),
            ],
        ]
        .concat(),
        &["--snapshots"],
    );
}

#[test]
fn demo_shows_speculative_decoding_bitwise() {
    let text = kda_ok(&["demo", "--prompt", "32", "--steps", "4", "--speculative"]);
    let rounds = text
        .lines()
        .filter(|l| l.trim_start().starts_with("accepted"))
        .count();
    assert_eq!(rounds, 4, "{text}");
    assert_eq!(text.matches("yes, bitwise").count(), 4, "{text}");
}

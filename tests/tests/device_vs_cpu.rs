//! Every fla fixture on every GPU backend, compared with the fla reference **and** with the CPU
//! backend (token-by-token recurrence) on the same inputs: output, final recurrent state and
//! conv states. Prints one markdown row per (fixture, backend), which
//! `kda-cuda/scripts/gpu-check.sh` collects into its results table. Without a GPU it prints
//! `skipped: no CUDA device (...)` and checks nothing else.

use kda_conformance::{backends, layer_fixtures, rel_rms, CpuHarness, Fixture, Harness};
use kda_host::SequenceCaches;

/// GPU vs CPU and GPU vs fla, f32 weights and rows (different summation orders).
const TOL: f64 = 1e-4;

/// Output and final caches of one run.
struct Run {
    out: Vec<f32>,
    caches: SequenceCaches,
}

fn run(h: &mut dyn Harness, fx: &Fixture) -> Run {
    let (mut caches, init) = fx.initial_caches();
    let out = h
        .forward(
            &fx.layer(),
            &fx.f32("hidden_states"),
            &fx.cu_seqlens(),
            &mut caches,
            init,
        )
        .unwrap_or_else(|e| panic!("{} on {}: {e}", fx.name, h.name()));
    Run { out, caches }
}

/// Worst rel-RMS of the three conv states.
fn conv_err(got: &SequenceCaches, want: [&[f32]; 3]) -> f64 {
    [&got.conv_q, &got.conv_k, &got.conv_v]
        .iter()
        .zip(want)
        .map(|(g, w)| rel_rms(g, w))
        .fold(0.0, f64::max)
}

#[test]
fn every_fixture_on_the_gpu_against_fla_and_the_cpu() {
    let mut gpus: Vec<Box<dyn Harness>> = backends()
        .into_iter()
        .filter(|b| b.name().starts_with("cuda"))
        .collect();
    if gpus.is_empty() {
        return; // `backends()` printed the reason.
    }
    println!("| fixture | backend | out vs fla | state vs fla | conv vs fla | out vs cpu | state vs cpu | conv vs cpu |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut worst: f64 = 0.0;
    for name in layer_fixtures() {
        let fx = Fixture::open(&name);
        let cpu = run(&mut CpuHarness::recurrent(64), &fx);
        let (fq, fk, fv) = (
            fx.f32("final_conv_state_q"),
            fx.f32("final_conv_state_k"),
            fx.f32("final_conv_state_v"),
        );
        for gpu in gpus.iter_mut() {
            let got = run(gpu.as_mut(), &fx);
            let errs = [
                rel_rms(&got.out, &fx.f32("output")),
                rel_rms(&got.caches.recurrent, &fx.f32("final_recurrent_state")),
                conv_err(&got.caches, [&fq, &fk, &fv]),
                rel_rms(&got.out, &cpu.out),
                rel_rms(&got.caches.recurrent, &cpu.caches.recurrent),
                conv_err(
                    &got.caches,
                    [&cpu.caches.conv_q, &cpu.caches.conv_k, &cpu.caches.conv_v],
                ),
            ];
            let cells: Vec<String> = errs.iter().map(|e| format!("{e:.1e}")).collect();
            println!("| {name} | {} | {} |", gpu.name(), cells.join(" | "));
            for e in errs {
                assert!(
                    e <= TOL,
                    "{name} on {}: rel-RMS {e:.3e} > {TOL:e}",
                    gpu.name()
                );
                worst = worst.max(e);
            }
        }
    }
    println!("GPU fixtures: worst rel-RMS vs fla and vs CPU {worst:.2e}");
}

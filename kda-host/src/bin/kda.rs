//! The `kda` command-line tool.

use std::process::ExitCode;
use std::time::Instant;

use clap::{Parser, Subcommand};
use kda_core::{InitialCaches, KdaConfig};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, Runner, SequenceCaches, WeightDtype};

#[derive(Parser)]
#[command(name = "kda", version, about = "Kimi Delta Attention layers on the CPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Built-in default: a Kimi-K3-0.40B-sized KDA layer (hidden 1024, 8 heads × 32) with
    /// seeded random bf16 weights; runs a prefill and decode steps and prints the speed.
    Demo {
        /// Prompt length.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// Decode steps after the prompt.
        #[arg(long, default_value_t = 64)]
        steps: usize,
        /// Seed for the weights and the inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn demo(prompt: usize, steps: usize, seed: u64) -> Result<(), String> {
    let cfg = KdaConfig::kimi_k3(1024, 8, 32);
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, seed).map_err(|e| e.to_string())?;
    let mut caches = SequenceCaches::new(&cfg, 1).map_err(|e| e.to_string())?;
    let mut runner = Runner::default();
    let mut rng = Rng::new(seed ^ 0x5eed);
    println!(
        "kda demo: Kimi-K3-0.40B-sized KDA layer: hidden {}, {} heads x {}, conv {}, gate lower bound -5, full-rank output gate",
        cfg.hidden, cfg.heads, cfg.head_dim, cfg.conv_width
    );
    println!(
        "weights: {:.1} MiB bf16 (seeded random, seed {seed}); cache per sequence: {} KiB f32 (recurrent {} KiB + conv {} KiB)",
        layer.weight_bytes() as f64 / (1 << 20) as f64,
        caches.bytes() / 1024,
        caches.recurrent.len() * 4 / 1024,
        (caches.conv_q.len() * 3) * 4 / 1024
    );
    let x = rng.normals(prompt * cfg.hidden, 1.0);
    let t = Instant::now();
    let y = runner
        .forward(&layer, &x, &[0, prompt], &mut caches, InitialCaches::Zero)
        .map_err(|e| e.to_string())?;
    let dt = t.elapsed().as_secs_f64();
    let rms = (y.iter().map(|v| (v * v) as f64).sum::<f64>() / y.len().max(1) as f64).sqrt();
    println!(
        "prefill: {prompt} tokens in {:.3} s = {:.0} tokens/s (output RMS {rms:.4})",
        dt,
        prompt as f64 / dt
    );
    let t = Instant::now();
    let mut last = Vec::new();
    for _ in 0..steps {
        let xt = rng.normals(cfg.hidden, 1.0);
        last = runner.decode(&layer, &xt, &mut caches).map_err(|e| e.to_string())?;
    }
    let dt = t.elapsed().as_secs_f64();
    println!(
        "decode: {steps} steps in {:.3} s = {:.0} tokens/s ({:.3} ms/token); last output[0..4] = {:?}",
        dt,
        steps as f64 / dt,
        1e3 * dt / steps.max(1) as f64,
        &last[..last.len().min(4)]
    );
    if !y.iter().chain(&last).all(|v| v.is_finite()) {
        return Err("non-finite output".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo {
            prompt,
            steps,
            seed,
        } => demo(prompt, steps, seed),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

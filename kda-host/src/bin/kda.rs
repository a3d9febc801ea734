//! The `kda` command-line tool.
//!
//! Every failure exits non-zero with one line on stderr, starting `error:` and naming the file,
//! tensor or option at fault.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand, ValueEnum};
use kda_core::{DecayGate, ForwardOptions, GateProj, InitialCaches, KdaConfig, KdaLayer};
use kda_host::bench::{self, BenchOptions, Preset};
use kda_host::checkpoint::layout::{GateTensors, WeightTensor};
use kda_host::io::{write_output, Input};
use kda_host::rng::Rng;
use kda_host::state_file::{read_state, write_state};
use kda_host::{
    Checkpoint, HostError, Mode, Model, OwnedLayer, Panels, Runner, SequenceCaches, WeightDtype,
};

#[derive(Parser)]
#[command(
    name = "kda",
    version,
    about = "Kimi Delta Attention layers on the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum PresetArg {
    /// hidden 1024, 8 heads x 32, lower-bound gate, full-rank output gate (Kimi-K3-0.40B).
    Small,
    /// hidden 2304, 32 x 128, softplus gate, low-rank output gate (Kimi Linear 48B).
    KimiLinear,
    /// hidden 7168, 96 x 128, lower-bound gate, full-rank output gate (Kimi K3).
    KimiK3,
}

impl From<PresetArg> for Preset {
    fn from(p: PresetArg) -> Preset {
        match p {
            PresetArg::Small => Preset::Small,
            PresetArg::KimiLinear => Preset::KimiLinear,
            PresetArg::KimiK3 => Preset::KimiK3,
        }
    }
}

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a thread count (a whole number ≥ 1)")),
    }
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
    /// Lists the KDA layers of a checkpoint folder: dims, dtypes, gate forms.
    Inspect {
        /// Checkpoint folder (config.json + model.safetensors or shards with an index).
        dir: PathBuf,
    },
    /// Runs one KDA layer of a checkpoint over the rows of an input file.
    Forward {
        /// Checkpoint folder.
        #[arg(long, value_name = "DIR")]
        model: PathBuf,
        /// Model layer, 0-based (default: the first KDA layer).
        #[arg(long, value_name = "N", allow_hyphen_values = true)]
        layer: Option<usize>,
        /// Input safetensors: `hidden_states` `[T, hidden]` F32/BF16, optional `cu_seqlens` `[N+1]` I64/I32.
        #[arg(long, value_name = "IN")]
        input: PathBuf,
        /// Output safetensors: `output` `[T, hidden]` F32.
        #[arg(long, value_name = "OUT")]
        output: PathBuf,
        /// Initial states (`recurrent_state` `[N,H,K,V]`, `conv_state_{q,k,v}` `[N,H·K,W−1]`, F32).
        #[arg(long, value_name = "S")]
        state_in: Option<PathBuf>,
        /// Where to write the final states (same format).
        #[arg(long, value_name = "S")]
        state_out: Option<PathBuf>,
        /// Sequence path.
        #[arg(long, value_enum, default_value_t = Mode::Auto)]
        mode: Mode,
        /// Worker threads (default: the available cores).
        #[arg(long, value_name = "N", value_parser = parse_threads, allow_hyphen_values = true)]
        threads: Option<usize>,
        /// Weight layout: `panels` (bf16 matrices repacked for the CPU kernels: one more copy
        /// in memory, faster) or `rows` (the checkpoint layout, used in place). Same results.
        #[arg(long, value_enum, default_value_t = LayoutArg::Panels)]
        layout: LayoutArg,
    },
    /// Measures prefill and decode of one synthetic layer at a published size.
    Bench {
        /// Layer size.
        #[arg(long, value_enum, default_value_t = PresetArg::Small)]
        preset: PresetArg,
        /// Prompt tokens per sequence.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// Decode steps.
        #[arg(long, default_value_t = 32)]
        steps: usize,
        /// Sequences.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Seed for the weights and inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Worker threads (default: the available cores).
        #[arg(long, value_name = "N", value_parser = parse_threads, allow_hyphen_values = true)]
        threads: Option<usize>,
        /// Weight layout: `panels` (repacked for the CPU kernels) or `rows` (checkpoint
        /// layout, used in place).
        #[arg(long, value_enum, default_value_t = LayoutArg::Panels)]
        layout: LayoutArg,
    },
}

/// `--layout` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LayoutArg {
    Panels,
    Rows,
}

fn demo(prompt: usize, steps: usize, seed: u64) -> Result<(), String> {
    let cfg = KdaConfig::kimi_k3(1024, 8, 32);
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, seed).map_err(|e| e.to_string())?;
    // The default layout of `kda forward` and `kda bench`: bf16 matrices in panels.
    let base = layer.weights().map_err(|e| e.to_string())?;
    let panels = Panels::new(&base).map_err(|e| e.to_string())?;
    let w = panels.weights(&base).map_err(|e| e.to_string())?;
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
    let layer = KdaLayer::new(&cfg, w, ForwardOptions::default()).map_err(|e| e.to_string())?;
    let y = runner
        .forward(&layer, &x, &[0, prompt], &mut caches, InitialCaches::Zero)
        .map_err(|e| e.to_string())?;
    let layer = layer.with_mode(Mode::Recurrent);
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
        last = runner
            .decode(&layer, &xt, &mut caches)
            .map_err(|e| e.to_string())?;
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

fn dtype_summary(tensors: &[&WeightTensor]) -> String {
    let short = |t: &WeightTensor| {
        let s = t.name.rsplit("self_attn.").next().unwrap_or(&t.name);
        let s = s.strip_suffix(".weight").unwrap_or(s).to_string();
        if t.used != t.shape.iter().product::<usize>() {
            format!("{s}{:?}(first {} used)", t.shape, t.used)
        } else {
            s
        }
    };
    let mut groups: Vec<(&'static str, Vec<String>)> = Vec::new();
    for t in tensors {
        let d = t.dtype.name();
        match groups.iter_mut().find(|(g, _)| *g == d) {
            Some((_, v)) => v.push(short(t)),
            None => groups.push((d, vec![short(t)])),
        }
    }
    if groups.len() == 1 {
        let padded: Vec<String> = tensors
            .iter()
            .filter(|t| t.used != t.shape.iter().product::<usize>())
            .map(|t| short(t))
            .collect();
        let extra = if padded.is_empty() {
            String::new()
        } else {
            format!(" ({})", padded.join(", "))
        };
        return format!("all {}{extra}", groups[0].0);
    }
    groups
        .iter()
        .map(|(d, v)| format!("{d}: {}", v.join(" ")))
        .collect::<Vec<_>>()
        .join("; ")
}

fn gate_forms(cfg: &KdaConfig) -> String {
    let decay = match cfg.decay_gate {
        DecayGate::Softplus => "softplus decay gate".to_string(),
        DecayGate::LowerBound(lb) => format!("lower-bound {lb} decay gate"),
    };
    let dp = match cfg.decay_proj {
        GateProj::FullRank => "full-rank".to_string(),
        GateProj::LowRank { rank } => format!("low-rank {rank}"),
    };
    let og = match cfg.output_gate {
        GateProj::FullRank => "full-rank output gate (g_proj)".to_string(),
        GateProj::LowRank { rank } => format!("low-rank {rank} output gate (g_a/g_b)"),
    };
    format!("{decay} (f_a/f_b {dp}), {og}")
}

fn inspect(dir: &Path) -> Result<(), String> {
    let model = Model::open(dir).map_err(|e| e.to_string())?;
    let c = model.config();
    println!(
        "{}: {} layout, model_type {}, hidden {}, {} layers: {} KDA, {} full attention",
        model.name(),
        c.layout.name(),
        c.model_type.as_deref().unwrap_or("?"),
        c.hidden,
        c.num_layers.map_or("?".to_string(), |n| n.to_string()),
        c.kda_layers.len(),
        c.full_attn_layers.len()
    );
    println!(
        "weight files used: {}; KDA weights {:.1} MiB",
        model.files().len(),
        model.weight_bytes() as f64 / (1 << 20) as f64
    );
    if !c.full_attn_layers.is_empty() {
        let v: Vec<String> = c.full_attn_layers.iter().map(usize::to_string).collect();
        println!("full-attention layers (0-based): {}", v.join(","));
    }
    for l in model.layers() {
        let all = l.tensors.all();
        let copied = all.iter().filter(|t| !t.in_place()).count();
        let gate_shape = match &l.tensors.output_gate {
            GateTensors::FullRank(g) => format!("g_proj {:?}", g.shape),
            GateTensors::LowRank(a, b) => format!("g_a {:?} g_b {:?}", a.shape, b.shape),
        };
        println!(
            "layer {:>3}: KDA hidden {}, {} heads x {} (P {}), conv {} {:?}, {}, rms eps {:e}; {gate_shape}; dtypes {}; {:.1} MiB{}",
            l.index,
            l.cfg.hidden,
            l.cfg.heads,
            l.cfg.head_dim,
            l.cfg.proj_dim(),
            l.cfg.conv_width,
            l.tensors.conv[0].shape,
            gate_forms(&l.cfg),
            l.cfg.rms_eps,
            dtype_summary(&all),
            l.weight_bytes() as f64 / (1 << 20) as f64,
            if copied == 0 {
                String::new()
            } else {
                format!(", {copied} tensors copied (misaligned)")
            }
        );
    }
    Ok(())
}

fn thread_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, String> {
    let n = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| format!("--threads {n}: cannot start the thread pool: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn forward(
    model_dir: &Path,
    layer: Option<usize>,
    input: &Path,
    output: &Path,
    state_in: Option<&Path>,
    state_out: Option<&Path>,
    mode: Mode,
    threads: Option<usize>,
    layout: LayoutArg,
) -> Result<(), String> {
    let pool = thread_pool(threads)?;
    let ckpt = Checkpoint::open(model_dir).map_err(|e| e.to_string())?;
    let index = match layer {
        Some(n) => {
            ckpt.config
                .check_kda_layer(n)
                .map_err(|e| format!("--layer {n}: {e}"))?;
            n
        }
        None => *ckpt
            .config
            .kda_layers
            .first()
            .ok_or_else(|| format!("{}: the config lists no KDA layers", ckpt.name()))?,
    };
    let mut model = ckpt.load(Some(&[index])).map_err(|e| e.to_string())?;
    if matches!(layout, LayoutArg::Panels) {
        model.repack_panels().map_err(|e| e.to_string())?;
    }
    let (cfg, w) = model.weights(index).map_err(|e| e.to_string())?;
    let inp = Input::read(input, cfg.hidden).map_err(|e| e.to_string())?;
    let n = inp.sequences();
    let (mut caches, init) = match state_in {
        Some(p) => (
            read_state(p, cfg, Some(n)).map_err(|e| e.to_string())?,
            InitialCaches::Given,
        ),
        None => (
            SequenceCaches::try_new(cfg, n).map_err(|e| e.to_string())?,
            InitialCaches::Zero,
        ),
    };
    let mut runner = Runner::default();
    let opts = ForwardOptions::default().with_mode(mode);
    let layer = KdaLayer::new(cfg, w, opts).map_err(|e| format!("layer {index}: {e}"))?;
    let out = pool
        .install(|| {
            runner.forward(
                &layer,
                &inp.hidden_states,
                &inp.cu_seqlens,
                &mut caches,
                init,
            )
        })
        .map_err(|e: HostError| format!("layer {index}: {e}"))?;
    write_output(output, &out, cfg.hidden).map_err(|e| e.to_string())?;
    if let Some(p) = state_out {
        write_state(p, cfg, &caches).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Demo {
            prompt,
            steps,
            seed,
        } => demo(prompt, steps, seed),
        Command::Inspect { dir } => inspect(&dir),
        Command::Forward {
            model,
            layer,
            input,
            output,
            state_in,
            state_out,
            mode,
            threads,
            layout,
        } => forward(
            &model,
            layer,
            &input,
            &output,
            state_in.as_deref(),
            state_out.as_deref(),
            mode,
            threads,
            layout,
        ),
        Command::Bench {
            preset,
            prompt,
            steps,
            batch,
            seed,
            threads,
            layout,
        } => {
            if batch == 0 {
                return Err("--batch: must be at least 1".into());
            }
            let pool = thread_pool(threads)?;
            let opts = BenchOptions {
                preset: preset.into(),
                prompt,
                steps,
                batch,
                seed,
                threads: pool.current_num_threads(),
                progress: true,
                panels: matches!(layout, LayoutArg::Panels),
            };
            pool.install(|| bench::run(&opts, &mut std::io::stdout()))
                .map_err(|e| e.to_string())
        }
    }
}

/// One line: newlines and runs of spaces collapsed.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn main() -> ExitCode {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!("error: internal: {}{at}", one_line(&msg));
    }));
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    ExitCode::SUCCESS
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                | ErrorKind::MissingSubcommand => {
                    eprintln!("error: a command is required (demo, inspect, forward, bench); see `kda --help`");
                    ExitCode::from(2)
                }
                _ => {
                    // clap's message up to its usage/tip lines, on one line.
                    let text = e.to_string();
                    let body: Vec<&str> = text
                        .lines()
                        .take_while(|l| {
                            !l.starts_with("Usage:") && !l.starts_with("For more information")
                        })
                        .filter(|l| !l.trim_start().starts_with("tip:"))
                        .collect();
                    let msg = one_line(&body.join(" "));
                    let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
                    eprintln!("error: {msg}");
                    ExitCode::from(2)
                }
            };
        }
    };
    match std::panic::catch_unwind(move || run(cli)) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(e)) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
        // The hook has printed the one line.
        Err(_) => ExitCode::FAILURE,
    }
}

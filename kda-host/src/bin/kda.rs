//! The `kda` command-line tool.
//!
//! Every failure exits non-zero with one line on stderr, starting `error:` and naming the file,
//! tensor or option at fault.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::error::ErrorKind;
use kda_core::{
    snapshot_count, snapshot_positions, DecayGate, ForwardOptions, GateProj, InitialCaches,
    KdaConfig, KdaLayer, Precision, SnapshotPos,
};
use kda_host::bench::{self, BenchModel, BenchOptions};
use kda_host::checkpoint::layout::{GateTensors, WeightTensor};
use kda_host::cli::{self, Cli, Command, LayoutArg, DEMO_HIDDEN};
use kda_host::error::Context;
use kda_host::fsio::{self, FileId};
use kda_host::io::{stage_output, Input};
use kda_host::quantize::{quantize, QuantizeOptions};
use kda_host::rng::Rng;
use kda_host::state_file::{read_state, stage_snapshots, stage_state};
use kda_host::{
    Checkpoint, HostError, Mode, Model, OwnedLayer, Panels, Runner, SequenceCaches, WeightDtype,
};

fn demo(prompt: usize, steps: usize, seed: u64, speculative: bool) -> Result<(), HostError> {
    let cfg = KdaConfig::kimi_k3(DEMO_HIDDEN, 8, 32);
    let layer = OwnedLayer::random(cfg, WeightDtype::Bf16, seed)?;
    // The default layout of `kda forward` and `kda bench`: bf16 matrices in panels.
    let base = layer.weights()?;
    let panels = Panels::new(&base)?;
    let w = panels.weights(&base)?;
    let mut caches = SequenceCaches::new(&cfg, 1)?;
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
    // `Cli::check` has bounded prompt × hidden; the buffer is still allocated fallibly.
    let mut x = kda_host::error::try_zeroed::<f32>(prompt * cfg.hidden, "the demo's prompt")
        .context(|| format!("--prompt {prompt}"))?;
    x.iter_mut().for_each(|v| *v = rng.normal());
    let t = Instant::now();
    let layer = KdaLayer::new(&cfg, w, ForwardOptions::default())?;
    let y = runner.forward(&layer, &x, &[0, prompt], &mut caches, InitialCaches::Zero)?;
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
        last = runner.decode(&layer, &xt, &mut caches)?;
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
        return Err(HostError::Invalid("non-finite output".into()));
    }
    if speculative {
        demo_speculative(&layer, &mut runner, &mut caches, &mut rng)?;
    }
    Ok(())
}

/// Speculative decoding on the demo layer: rounds of D = 4 drafts, each verified in one call
/// and committed with a different number of accepted tokens, checked against decoding the
/// accepted tokens one by one (outputs and caches, bitwise).
fn demo_speculative(
    layer: &KdaLayer<'_>,
    runner: &mut Runner,
    caches: &mut SequenceCaches,
    rng: &mut Rng,
) -> Result<(), HostError> {
    const D: usize = 4;
    let cfg = *layer.config();
    let h = cfg.hidden;
    let state_bytes = caches.bytes();
    println!(
        "speculative: {D} drafts per round, verified in one call, then the accepted ones committed"
    );
    for accepted in [2, 0, D, 1] {
        let drafts = rng.normals(D * h, 1.0);
        let mut direct = caches.clone();
        let t = Instant::now();
        let (out, mut record) = runner.verify(layer, &drafts, D, caches)?;
        let t_verify = t.elapsed().as_secs_f64();
        let t = Instant::now();
        runner.commit(layer, &mut record, D, &[accepted], caches)?;
        let t_commit = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut steps = Vec::new();
        for i in 0..accepted {
            steps.extend(runner.decode(layer, &drafts[i * h..(i + 1) * h], &mut direct)?);
        }
        let t_steps = t.elapsed().as_secs_f64();
        let same = out[..accepted * h] == steps[..] && *caches == direct;
        println!(
            "  accepted {accepted} of {D}: verify {:.2} ms + commit {:.3} ms (decoding the {accepted}: {:.2} ms); record {:.0} KiB vs {D} state copies {:.0} KiB; outputs and caches equal decoding them: {}",
            1e3 * t_verify,
            1e3 * t_commit,
            1e3 * t_steps,
            4.0 * record.len() as f64 / 1024.0,
            (D * state_bytes) as f64 / 1024.0,
            if same { "yes, bitwise" } else { "NO" }
        );
        if !same {
            return Err(HostError::Invalid(
                "speculative commit differs from decoding the accepted tokens".into(),
            ));
        }
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

fn inspect(dir: &Path) -> Result<(), HostError> {
    let model = Model::open(dir)?;
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
        print_matrix_formats(&model, l.index)?;
    }
    Ok(())
}

/// One line per matrix of model layer `index`: name, shape, storage format, bits per weight.
fn print_matrix_formats(model: &Model, index: usize) -> Result<(), HostError> {
    use kda_host::format_label::{bits_per_weight, format_label, named_matrices};
    let (_, w) = model.weights(index)?;
    let mats = named_matrices(&w);
    for (name, m) in mats {
        let d = m.data();
        println!(
            "  {name:<8} [{}, {}]  {}  {:.2} bits/weight",
            m.rows(),
            m.cols(),
            format_label(&d),
            bits_per_weight(&d)
        );
    }
    Ok(())
}

/// The rayon pool for `--threads` (checked by the parser; capped by `cli::resolve_threads`).
fn thread_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, HostError> {
    let (n, lowered) = cli::resolve_threads(threads);
    if lowered {
        eprintln!(
            "note: --threads {}: using {n} ({} × the available cores)",
            threads.unwrap_or(n),
            cli::THREADS_PER_CORE
        );
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .map_err(|e| {
            HostError::Invalid(format!("--threads {n}: cannot start the thread pool: {e}"))
        })
}

/// What `kda forward` was asked to do.
struct ForwardArgs<'a> {
    model_dir: &'a Path,
    layer: Option<usize>,
    input: &'a Path,
    output: &'a Path,
    state_in: Option<&'a Path>,
    state_out: Option<&'a Path>,
    mode: Mode,
    threads: Option<usize>,
    layout: LayoutArg,
    precision: Precision,
    /// `(S, file)`: snapshots every S tokens of each sequence.
    snapshots: Option<(usize, &'a Path)>,
}

/// Checks before anything is computed that the output files can be written and replace no
/// file the run reads, nor each other (by canonical path and by device/inode). The one
/// exception is `--state-in S --state-out S`: the state is replaced atomically at the end.
fn check_outputs(a: &ForwardArgs, ckpt: &Checkpoint) -> Result<(), HostError> {
    let mut outputs = vec![("--output", a.output)];
    outputs.extend(a.state_out.map(|p| ("--state-out", p)));
    outputs.extend(a.snapshots.map(|(_, p)| ("--snapshots", p)));
    let mut inputs: Vec<(String, PathBuf)> = ckpt
        .files_on_disk()
        .into_iter()
        .map(|p| ("--model".to_string(), p))
        .collect();
    inputs.push(("--input".into(), a.input.to_path_buf()));
    let mut ids = Vec::new();
    for (opt, p) in &outputs {
        fsio::check_output(p).context(|| opt.to_string())?;
        let id = FileId::of(p).context(|| opt.to_string())?;
        if let Some((other, _)) = ids.iter().find(|(_, i): &&(&str, FileId)| i.same(&id)) {
            return Err(HostError::Invalid(format!(
                "{opt} {} is the same file as {other}; each output needs its own file",
                p.display()
            )));
        }
        ids.push((opt, id));
    }
    for (opt, p) in inputs
        .iter()
        .map(|(o, p)| (o.as_str(), p.as_path()))
        .chain(a.state_in.map(|p| ("--state-in", p)))
    {
        let Ok(input) = FileId::of(p) else { continue };
        for (out_opt, out) in &ids {
            let in_place = opt == "--state-in" && *out_opt == "--state-out";
            if out.same(&input) && !in_place {
                return Err(HostError::Invalid(format!(
                    "{out_opt} {} is the same file as {opt} {}; the run would overwrite its own input",
                    out.path.display(),
                    p.display()
                )));
            }
        }
    }
    Ok(())
}

fn forward(a: &ForwardArgs) -> Result<(), HostError> {
    if a.precision == Precision::Bf16 && a.layout != LayoutArg::Panels {
        return Err(HostError::Invalid(
            "--precision bf16 needs --layout panels (the bf16 kernels read the panel layout)"
                .into(),
        ));
    }
    let ckpt = Checkpoint::open(a.model_dir)?;
    fsio::regular_file(a.input)?;
    if let Some(p) = a.state_in {
        fsio::regular_file(p)?;
    }
    check_outputs(a, &ckpt)?;
    let index = match a.layer {
        Some(n) => {
            ckpt.config
                .check_kda_layer(n)
                .context(|| format!("--layer {n}"))?;
            n
        }
        None => *ckpt.held_layers().first().ok_or_else(|| {
            HostError::Invalid(format!("{}: the config lists no KDA layers", ckpt.name()))
        })?,
    };
    let mut model = ckpt.load(Some(&[index]))?;
    if a.layout == LayoutArg::Panels {
        model.repack_panels()?;
    }
    let (cfg, w) = model.weights(index)?;
    let inp = Input::read(a.input, cfg.hidden)?;
    let n = inp.sequences();
    let (mut caches, init) = match a.state_in {
        Some(p) => (read_state(p, cfg, Some(n))?, InitialCaches::Given),
        None => (SequenceCaches::try_new(cfg, n)?, InitialCaches::Zero),
    };
    // Every argument and file is checked: only now start the threads.
    let pool = thread_pool(a.threads)?;
    let mut runner = Runner::default();
    let opts = ForwardOptions::default()
        .with_mode(a.mode)
        .with_precision(a.precision);
    let layer = KdaLayer::new(cfg, w, opts).context(|| format!("layer {index}"))?;
    let at = match a.snapshots {
        Some((every, _)) => snapshot_list(&inp.cu_seqlens, every)?,
        None => Vec::new(),
    };
    let (x, cu) = (&inp.hidden_states, &inp.cu_seqlens);
    let (out, snaps) = pool
        .install(|| match a.snapshots {
            Some(_) => runner
                .forward_with_snapshots(&layer, x, cu, &mut caches, init, &at)
                .map(|(o, s)| (o, Some(s))),
            None => runner
                .forward(&layer, x, cu, &mut caches, init)
                .map(|o| (o, None)),
        })
        .context(|| format!("layer {index}"))?;
    // Every file is written in full before any replaces anything.
    let mut staged = vec![stage_output(a.output, &out, cfg.hidden)?];
    if let Some(p) = a.state_out {
        staged.push(stage_state(p, cfg, &caches)?);
    }
    if let (Some((_, p)), Some(s)) = (a.snapshots, &snaps) {
        staged.push(stage_snapshots(p, cfg, &at, s)?);
    }
    fsio::commit_all(staged)
}

/// The snapshot positions every `every` tokens of each sequence of `cu_seqlens`.
fn snapshot_list(cu_seqlens: &[usize], every: usize) -> Result<Vec<SnapshotPos>, HostError> {
    let m = snapshot_count(cu_seqlens, every).context(|| "--snapshot-every".to_string())?;
    let mut at = kda_host::error::try_zeroed::<SnapshotPos>(m, "the snapshot positions")?;
    snapshot_positions(cu_seqlens, every, &mut at).context(|| "--snapshot-every".to_string())?;
    Ok(at)
}

fn run(cli: Cli) -> Result<(), HostError> {
    cli.check().map_err(HostError::Invalid)?;
    match cli.command {
        Command::Demo {
            prompt,
            steps,
            seed,
            speculative,
        } => demo(prompt, steps, seed, speculative),
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
            precision,
            snapshot_every,
            snapshots,
        } => forward(&ForwardArgs {
            model_dir: &model,
            layer,
            input: &input,
            output: &output,
            state_in: state_in.as_deref(),
            state_out: state_out.as_deref(),
            mode,
            threads,
            layout,
            precision,
            snapshots: snapshot_every.zip(snapshots.as_deref()),
        }),
        Command::Quantize {
            model,
            out,
            qtype,
            layers,
            threads,
        } => {
            let pool = thread_pool(threads)?;
            let opts = QuantizeOptions {
                model,
                out,
                output: qtype.into(),
                layers: layers.map(|l| l.0),
                progress: std::io::stderr().is_terminal(),
            };
            pool.install(|| quantize_cmd(&opts))
        }
        Command::Bench {
            preset,
            model,
            layer,
            prompt,
            steps,
            prefill_runs,
            batch,
            seed,
            threads,
            layout,
            precision,
            isa,
        } => {
            let pool = thread_pool(threads)?;
            let opts = BenchOptions {
                preset: preset.into(),
                model: model.map(|path| BenchModel { path, layer }),
                prompt,
                steps,
                prefill_runs: prefill_runs as usize,
                batch,
                seed,
                threads: pool.current_num_threads(),
                progress: true,
                panels: layout == LayoutArg::Panels,
                precision,
                isa: isa.isa(),
            };
            pool.install(|| bench::run(&opts, &mut std::io::stdout()))
        }
    }
}

fn quantize_cmd(opts: &QuantizeOptions) -> Result<(), HostError> {
    let t = Instant::now();
    let r = quantize(opts)?;
    let mib = |b: f64| b / (1 << 20) as f64;
    let bytes: u64 = r.tensors.iter().map(|t| t.bytes).sum();
    let source: usize = r.tensors.iter().map(|t| t.source_bytes).sum();
    let types: Vec<String> = r
        .type_counts()
        .iter()
        .map(|(n, c)| format!("{c} {n}"))
        .collect();
    let layers: Vec<String> = r.layers.iter().map(usize::to_string).collect();
    println!(
        "{}: {} KDA layers ({}), {} tensors ({}); {:.2} MiB from {:.2} MiB, matrices {:.2} bits per weight; {:.1} s",
        opts.out.display(),
        r.layers.len(),
        layers.join(","),
        r.tensors.len(),
        types.join(", "),
        mib(bytes as f64),
        mib(source as f64),
        r.matrix_bits_per_weight(),
        t.elapsed().as_secs_f64()
    );
    Ok(())
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
    let cli = match cli::parse(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    ExitCode::SUCCESS
                }
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                | ErrorKind::MissingSubcommand => {
                    eprintln!("error: a command is required (demo, inspect, forward, quantize, bench); see `kda --help`");
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
            eprintln!("error: {}", one_line(&e.to_string()));
            ExitCode::FAILURE
        }
        // The hook has printed the one line.
        Err(_) => ExitCode::FAILURE,
    }
}

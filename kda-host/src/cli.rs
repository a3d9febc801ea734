//! The command line of the `kda` tool: its arguments ([`Cli`]) and the checks on them that
//! need no file ([`Cli::check`]), so that a bad size or thread count fails at once, before any
//! thread, file or buffer exists. The fuzz target `cli_args` drives [`parse`].

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::bench::Preset;
use crate::quantize::mix::QuantType;
use crate::quantize::Output;
use kda_core::{Isa, Mode, Precision};

/// The command line of `kda`.
#[derive(Debug, Parser)]
#[command(
    name = "kda",
    version,
    about = "Kimi Delta Attention layers on the CPU"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// `--preset` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PresetArg {
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

/// The most `--threads` accepted; more is an error before anything starts.
pub const MAX_THREADS: usize = 1024;

/// `--threads` above this many times the available cores run on that many threads.
pub const THREADS_PER_CORE: usize = 4;

fn parse_threads(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) if n > MAX_THREADS => Err(format!("{n} is more than the {MAX_THREADS} allowed")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is not a thread count (a whole number ≥ 1)")),
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
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
        /// Also show speculative decoding: draft tokens verified in one step, a commit of the
        /// accepted ones, checked against decoding them one by one.
        #[arg(long)]
        speculative: bool,
    },
    /// Lists the KDA layers of a checkpoint: dims, dtypes, gate forms, each matrix's format.
    Inspect {
        /// Checkpoint folder (config.json + model.safetensors or shards with an index), or a
        /// Kimi Linear GGUF file (any file of a split set).
        dir: PathBuf,
    },
    /// Runs one KDA layer of a checkpoint over the rows of an input file.
    Forward {
        /// Checkpoint folder, or a Kimi Linear GGUF file (any file of a split set).
        #[arg(long, value_name = "DIR|FILE.gguf")]
        model: PathBuf,
        /// Model layer, 0-based (default: the first KDA layer).
        #[arg(long, value_name = "N", allow_hyphen_values = true)]
        layer: Option<usize>,
        /// Input safetensors: `hidden_states` `[T, hidden]` F32/BF16/F16, optional `cu_seqlens` `[N+1]` I64/I32.
        #[arg(long, value_name = "IN")]
        input: PathBuf,
        /// Output safetensors: `output` `[T, hidden]` F32. Written only when the whole run
        /// succeeded, replacing the file atomically.
        #[arg(long, value_name = "OUT")]
        output: PathBuf,
        /// Initial states (`recurrent_state` `[N,H,K,V]`, `conv_state_{q,k,v}` `[N,H·K,W−1]`, F32).
        #[arg(long, value_name = "S")]
        state_in: Option<PathBuf>,
        /// Where to write the final states (same format; may be the `--state-in` file, which is
        /// then replaced atomically).
        #[arg(long, value_name = "S")]
        state_out: Option<PathBuf>,
        /// Sequence path.
        #[arg(long, value_enum, default_value_t = Mode::Auto)]
        mode: Mode,
        /// Worker threads (default: the available cores; at most 1024, and at most 4× the cores
        /// are used).
        #[arg(long, value_name = "N", value_parser = parse_threads, allow_hyphen_values = true)]
        threads: Option<usize>,
        /// Weight layout: `panels` (bf16 matrices repacked for the CPU kernels: one more copy
        /// in memory, faster) or `rows` (the checkpoint layout, used in place). Same results.
        #[arg(long, value_enum, default_value_t = LayoutArg::Panels)]
        layout: LayoutArg,
        /// Projection arithmetic: `exact` (f32 activations, the reference's arithmetic) or
        /// `bf16` (activations rounded to bf16, bf16 products with f32 sums: `vdpbf16ps` on
        /// CPUs with avx512_bf16; needs `--layout panels`).
        #[arg(long, value_enum, default_value_t = Precision::Exact)]
        precision: Precision,
        /// Also keep each sequence's states after every S of its tokens (S, 2S, … up to its
        /// length) in the file given by --snapshots.
        #[arg(long, value_name = "S", requires = "snapshots")]
        snapshot_every: Option<usize>,
        /// Snapshot file: `snapshot_seq` I64 `[M]`, `snapshot_pos` I64 `[M]`, `recurrent_state`
        /// F32 `[M,H,K,V]`, `conv_state_{q,k,v}` F32 `[M,H·K,W−1]`, in order of sequence then
        /// position. Written only when the whole run succeeded.
        #[arg(long, value_name = "OUT", requires = "snapshot_every")]
        snapshots: Option<PathBuf>,
    },
    /// Writes the KDA layers of a bf16 / f16 / f32 Kimi Linear checkpoint as a GGUF file, with
    /// llama.cpp's tensor names and metadata (architecture kimi-linear) and the bytes ggml's
    /// reference quantisers make (what llama-quantize writes without an importance matrix).
    /// Only the KDA tensors are written: the convs, ssm_a (= −exp(A_log)), ssm_dt.bias and
    /// ssm_norm as F32, the matrices in the --type's formats (rows that fit no K-quant fall
    /// back as llama-quantize does: Q4_K → Q5_0, Q6_K → Q8_0). OUT is replaced atomically:
    /// any error leaves an existing OUT untouched.
    Quantize {
        /// Checkpoint folder (config.json + model.safetensors or shards with an index).
        #[arg(long, value_name = "DIR")]
        model: PathBuf,
        /// GGUF file to write (a folder for `--type int4-g32`).
        #[arg(long, value_name = "OUT.gguf")]
        out: PathBuf,
        /// Quantisation.
        #[arg(long = "type", value_enum, value_name = "TYPE")]
        qtype: QuantTypeArg,
        /// Model layers to write, 0-based, e.g. `0,2,5-9` (default: every KDA layer; each
        /// must be a KDA layer).
        #[arg(long, value_name = "LIST", value_parser = parse_layers)]
        layers: Option<LayerList>,
        /// Worker threads for the quantisation (default: the available cores).
        #[arg(long, value_name = "N", value_parser = parse_threads, allow_hyphen_values = true)]
        threads: Option<usize>,
    },
    /// Measures prefill and decode of one synthetic layer at a published size.
    Bench {
        /// Layer size of the seeded layer.
        #[arg(long, value_enum, default_value_t = PresetArg::Small)]
        preset: PresetArg,
        /// Run a layer of this checkpoint (a folder, or a GGUF file) instead, its weights in
        /// their stored formats.
        #[arg(long, value_name = "DIR|FILE.gguf", conflicts_with = "preset")]
        model: Option<PathBuf>,
        /// With --model: the model layer, 0-based (default: the first KDA layer).
        #[arg(long, value_name = "N", requires = "model")]
        layer: Option<usize>,
        /// Prompt tokens per sequence.
        #[arg(long, default_value_t = 256)]
        prompt: usize,
        /// Decode steps.
        #[arg(long, default_value_t = 32)]
        steps: usize,
        /// Prefill runs, each from empty caches; the fastest is reported (with the first and
        /// the median), as the torch side by side takes its best (1 to 100).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
        prefill_runs: u32,
        /// Sequences.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Seed for the weights and inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Worker threads (default: the available cores; at most 1024, and at most 4× the cores
        /// are used).
        #[arg(long, value_name = "N", value_parser = parse_threads, allow_hyphen_values = true)]
        threads: Option<usize>,
        /// Weight layout: `panels` (repacked for the CPU kernels) or `rows` (checkpoint
        /// layout, used in place).
        #[arg(long, value_enum, default_value_t = LayoutArg::Panels)]
        layout: LayoutArg,
        /// Projection arithmetic: `exact` or `bf16` (see `kda forward --help`; needs
        /// `--layout panels`).
        #[arg(long, value_enum, default_value_t = Precision::Exact)]
        precision: Precision,
        /// Kernel path: `auto` (the fastest this CPU supports) or one this CPU has, e.g.
        /// `avx2` on an AVX-512 machine; the FMA peak and the read reference use it too.
        #[arg(long, value_enum, default_value_t = IsaArg::Auto)]
        isa: IsaArg,
    },
}

/// `kda quantize --type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum QuantTypeArg {
    /// Every KDA matrix Q8_0 (8.5 bits per weight).
    #[value(name = "q8_0")]
    Q8_0,
    /// Every KDA matrix Q4_K (4.5 bits; llama-quantize `--pure Q4_K_M`).
    #[value(name = "q4_k")]
    Q4K,
    /// Every KDA matrix Q6_K (6.56 bits).
    #[value(name = "q6_k")]
    Q6K,
    /// llama-quantize's Q4_K_M mix: Q4_K, and Q6_K for `attn_v` (the KDA v_proj) in the
    /// first and last eighth of the KDA layers and every third in between.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// Not a GGUF: a compressed-tensors `pack-quantized` checkpoint folder at OUT (int4,
    /// groups of 32, symmetric, bf16 scales, as Kimi K2-Thinking ships), quantised as
    /// compressed-tensors does; Kimi K3 checkpoints too.
    #[value(name = "int4-g32")]
    Int4G32,
}

impl From<QuantTypeArg> for Output {
    fn from(t: QuantTypeArg) -> Output {
        match t {
            QuantTypeArg::Q8_0 => Output::Gguf(QuantType::Q8_0),
            QuantTypeArg::Q4K => Output::Gguf(QuantType::Q4K),
            QuantTypeArg::Q6K => Output::Gguf(QuantType::Q6K),
            QuantTypeArg::Q4KM => Output::Gguf(QuantType::Q4KM),
            QuantTypeArg::Int4G32 => Output::CtInt4G32,
        }
    }
}

/// A `--layers` list: 0-based model layers, ascending, without repeats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerList(pub Vec<usize>);

/// Parses `--layers`: 0-based model layers, comma-separated, with ranges `a-b` (inclusive).
pub fn parse_layers(s: &str) -> Result<LayerList, String> {
    let num = |t: &str| {
        t.trim()
            .parse::<usize>()
            .map_err(|_| format!("`{t}` is not a layer number (0-based)"))
    };
    let mut v = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("`{part}` is an empty range"));
                }
                if b - a >= 1 << 20 {
                    return Err(format!("`{part}` names more layers than a model has"));
                }
                v.extend(a..=b);
            }
            None => v.push(num(part)?),
        }
    }
    v.sort_unstable();
    v.dedup();
    Ok(LayerList(v))
}

/// `--isa` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IsaArg {
    /// The fastest path this CPU supports.
    Auto,
    /// Plain Rust, no vector intrinsics.
    Portable,
    /// x86-64 AVX2 + FMA.
    Avx2,
    /// x86-64 AVX-512F.
    Avx512f,
    /// x86-64 AVX-512F with avx512_bf16.
    Avx512bf16,
    /// aarch64 NEON.
    Neon,
}

impl IsaArg {
    /// The path asked for (`None` for `auto`).
    pub fn isa(self) -> Option<Isa> {
        match self {
            IsaArg::Auto => None,
            IsaArg::Portable => Some(Isa::Portable),
            IsaArg::Avx2 => Some(Isa::Avx2Fma),
            IsaArg::Avx512f => Some(Isa::Avx512F),
            IsaArg::Avx512bf16 => Some(Isa::Avx512Bf16),
            IsaArg::Neon => Some(Isa::Neon),
        }
    }
}

/// `--layout` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// bf16 matrices repacked into panels.
    Panels,
    /// The checkpoint layout, used in place.
    Rows,
}

/// Hidden size of `kda demo`'s layer.
pub const DEMO_HIDDEN: usize = 1024;

/// Parses `args` (the program name first), as `kda` does.
pub fn parse<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    Cli::try_parse_from(args)
}

/// The thread count to run with: `requested` (default: the available cores), at most
/// [`THREADS_PER_CORE`] × the available cores. The second value says whether it was lowered.
pub fn resolve_threads(requested: Option<usize>) -> (usize, bool) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cap = cores.saturating_mul(THREADS_PER_CORE).clamp(1, MAX_THREADS);
    match requested {
        None => (cores.clamp(1, cap), false),
        Some(n) if n > cap => (cap, true),
        Some(n) => (n.max(1), false),
    }
}

/// Values of `--prompt` tokens of `hidden` floats each, for `batch` sequences: an error naming
/// the options when the count does not fit in memory addresses.
fn check_tokens(prompt: usize, batch: usize, hidden: usize) -> Result<(), String> {
    let values = prompt
        .checked_mul(batch)
        .and_then(|t| t.checked_mul(hidden))
        .and_then(|v| v.checked_mul(4));
    match values {
        Some(b) if b <= isize::MAX as usize => Ok(()),
        _ => {
            let batch = if batch == 1 {
                String::new()
            } else {
                format!(" × --batch {batch}")
            };
            Err(format!(
                "--prompt {prompt}{batch} × hidden {hidden} f32 values do not fit in memory"
            ))
        }
    }
}

impl Cli {
    /// Checks the sizes given on the command line (before any file is read or buffer made).
    pub fn check(&self) -> Result<(), String> {
        match &self.command {
            Command::Demo { prompt, .. } => check_tokens(*prompt, 1, DEMO_HIDDEN),
            Command::Bench {
                preset,
                prompt,
                steps,
                batch,
                isa,
                ..
            } => {
                if *batch == 0 {
                    return Err("--batch: must be at least 1".into());
                }
                if let Some(isa) = isa.isa().filter(|i| !i.is_supported()) {
                    return Err(format!(
                        "--isa {}: this CPU lacks {}",
                        isa.name(),
                        isa.feature()
                    ));
                }
                let hidden = Preset::from(*preset).config().hidden;
                check_tokens(*prompt, *batch, hidden)?;
                check_tokens(*steps, *batch, hidden).map_err(|e| e.replace("--prompt", "--steps"))
            }
            Command::Forward {
                snapshot_every: Some(0),
                ..
            } => Err("--snapshot-every: must be at least 1".into()),
            Command::Inspect { .. } | Command::Forward { .. } | Command::Quantize { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str]) -> Result<(), String> {
        parse(std::iter::once("kda").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?
            .check()
    }

    #[test]
    fn sizes_and_threads() {
        assert!(check(&["demo"]).is_ok());
        assert!(check(&["bench", "--batch", "3", "--prompt", "100"]).is_ok());
        for (args, want) in [
            (&["demo", "--prompt", "18014398509481984"][..], "--prompt"),
            (
                &["bench", "--prompt", "4611686018427387904"][..],
                "--prompt",
            ),
            (
                &["bench", "--prompt", "18446744073709551615"][..],
                "--prompt",
            ),
            (&["bench", "--batch", "0"][..], "--batch"),
            (
                &["bench", "--steps", "1", "--batch", "9223372036854775807"][..],
                "--batch",
            ),
            (&["bench", "--threads", "100000"][..], "1024"),
        ] {
            let e = check(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        assert_eq!(resolve_threads(Some(1)), (1, false));
        let (n, lowered) = resolve_threads(Some(MAX_THREADS));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(n, (cores * THREADS_PER_CORE).min(MAX_THREADS));
        assert_eq!(lowered, n < MAX_THREADS);
    }
}

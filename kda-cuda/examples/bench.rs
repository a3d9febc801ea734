//! GPU benchmark of the KDA layer: prefill (T = 8192, H = 96, K = 128, bf16; one sequence and
//! packed variable lengths; chunked and, for reference, token-by-token) and decode (batch 1
//! and 64). Prints markdown tables; exits 0 without measuring when there is no GPU.
//!
//! Decode is also stated in µs per step and as a fraction of memory bandwidth for the bytes a
//! step must move at least: the recurrent and conv states (read and written) and the weights
//! (read once per step for the whole batch). Two bandwidths: the datasheet figure of the GPU
//! when its name is known (`--hbm-gbps N` overrides), and a device-to-device copy measured in
//! the same run.
//!
//! ```text
//! cargo run --release -p kda-cuda --example bench [-- --quick] [--chunk N] [--hbm-gbps N]
//! ```
//!
//! Timing: wall clock around `iters` back-to-back calls after two warm-up calls, with a
//! device synchronisation before the clock starts and before it stops (so it includes launch
//! overhead, which matters for decode). Weights are random bf16 (Kimi K3 shape: low-rank decay
//! projection, full-rank output gate); hidden = 2304 (Kimi Linear's width) for the layer rows,
//! hidden = 128 for the "core" rows, where the projections are negligible and the time is the
//! conv, gate, delta-rule and norm kernels.

use std::time::Instant;

use kda_core::{
    bf16, Data, GateProj, GateWeights, InitialCaches, KdaBackend, KdaConfig, KdaWeights, MatRef,
    Mode,
};
use kda_cuda::{
    CudaBackend, CudaError, CudaOptions, DeviceCaches, DeviceRows, DeviceWeights, DeviceWorkspace,
    Dtype, WeightFormat,
};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn bf16s(&mut self, n: usize, scale: f32) -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(self.next() * scale))
            .collect()
    }
    fn f32s(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

/// Owned random bf16 weights for `cfg` (K3 shape).
struct Owned {
    mats: Vec<Vec<bf16>>,
    small: Vec<Vec<f32>>,
}

fn random_weights(cfg: &KdaConfig) -> Owned {
    let mut r = Rng(1);
    let (hd, d, h, k, w) = (
        cfg.hidden,
        cfg.proj_dim(),
        cfg.heads,
        cfg.head_dim,
        cfg.conv_width,
    );
    let rank = cfg.decay_proj.rank();
    let s = 1.0 / (hd as f32).sqrt();
    let mats = vec![
        r.bf16s(d * hd, s),                            // q
        r.bf16s(d * hd, s),                            // k
        r.bf16s(d * hd, s),                            // v
        r.bf16s(rank * hd, s),                         // f_a
        r.bf16s(d * rank, 1.0 / (rank as f32).sqrt()), // f_b
        r.bf16s(h * hd, s),                            // b
        r.bf16s(d * hd, s),                            // g (full rank)
        r.bf16s(hd * d, 1.0 / (d as f32).sqrt()),      // o_proj
    ];
    let small = vec![
        r.f32s(d * w, 0.7),                             // q conv
        r.f32s(d * w, 0.7),                             // k conv
        r.f32s(d * w, 0.7),                             // v conv
        r.f32s(h, 0.5),                                 // A_log
        r.f32s(d, 0.5),                                 // dt_bias
        (0..k).map(|_| 1.0 + 0.1 * r.next()).collect(), // o_norm
    ];
    Owned { mats, small }
}

fn view<'a>(cfg: &KdaConfig, o: &'a Owned) -> KdaWeights<'a> {
    let (hd, d, h) = (cfg.hidden, cfg.proj_dim(), cfg.heads);
    let rank = cfg.decay_proj.rank();
    let m = |i: usize, r: usize, c: usize| {
        MatRef::new("w", Data::Bf16(&o.mats[i]), r, c).expect("shape")
    };
    KdaWeights {
        q_proj: m(0, d, hd),
        k_proj: m(1, d, hd),
        v_proj: m(2, d, hd),
        q_conv: Data::F32(&o.small[0]),
        k_conv: Data::F32(&o.small[1]),
        v_conv: Data::F32(&o.small[2]),
        a_log: Some(Data::F32(&o.small[3])),
        dt_bias: Some(Data::F32(&o.small[4])),
        decay_proj: GateWeights::LowRank {
            down: m(3, rank, hd),
            up: m(4, d, rank),
        },
        b_proj: m(5, h, hd),
        output_gate: GateWeights::FullRank(m(6, d, hd)),
        o_norm: Data::F32(&o.small[5]),
        o_proj: m(7, hd, d),
    }
}

fn cfg(hidden: usize) -> KdaConfig {
    let mut c = KdaConfig::kimi_k3(hidden, 96, 128);
    c.output_gate = GateProj::FullRank;
    c
}

struct Row {
    case: String,
    mode: String,
    tokens: usize,
    ms: f64,
    /// Bytes a decode step must move (states read + written, weights read); `None` for prefill.
    min_bytes: Option<f64>,
}

/// Bytes of weights one decode step reads (bf16 matrices, f32 conv / norm / gate vectors).
fn weight_bytes(c: &KdaConfig) -> f64 {
    let (hd, d, h, w) = (c.hidden, c.proj_dim(), c.heads, c.conv_width);
    let rank = c.decay_proj.rank();
    let bf16_elems = 5 * d * hd + rank * hd + d * rank + h * hd;
    let f32_elems = 3 * d * w + h + d + c.head_dim;
    (2 * bf16_elems + 4 * f32_elems) as f64
}

/// Bytes of state one sequence's decode step reads and writes (recurrent + conv, f32).
fn state_bytes_per_seq(c: &KdaConfig) -> f64 {
    let recurrent = c.heads * c.head_dim * c.head_dim;
    let conv = 3 * c.proj_dim() * (c.conv_width - 1);
    (2 * 4 * (recurrent + conv)) as f64
}

/// Datasheet HBM bandwidth in GB/s for known GPU names (most specific first).
fn datasheet_gbps(name: &str) -> Option<(f64, &'static str)> {
    const KNOWN: [(&str, f64, &str); 6] = [
        ("H200", 4800.0, "H200 datasheet"),
        ("H100 PCIe", 2000.0, "H100 PCIe datasheet"),
        ("H100", 3350.0, "H100 SXM datasheet"),
        ("H20", 4000.0, "H20 datasheet"),
        ("A100-SXM4-80GB", 2039.0, "A100 80GB SXM datasheet"),
        ("A100", 1555.0, "A100 40GB datasheet"),
    ];
    KNOWN
        .iter()
        .find(|(k, _, _)| name.contains(k))
        .map(|&(_, g, what)| (g, what))
}

/// Device-to-device copy bandwidth (GB/s, bytes read + written) on 1 GiB buffers.
fn copy_gbps() -> Result<f64, String> {
    let err = |e: cudarc::driver::DriverError| e.to_string();
    let ctx = cudarc::driver::CudaContext::new(0).map_err(err)?;
    let stream = ctx.new_stream().map_err(err)?;
    let n = 1usize << 30;
    let src = stream.alloc_zeros::<u8>(n).map_err(err)?;
    let mut dst = stream.alloc_zeros::<u8>(n).map_err(err)?;
    for _ in 0..2 {
        stream.memcpy_dtod(&src, &mut dst).map_err(err)?;
    }
    stream.synchronize().map_err(err)?;
    let iters = 10;
    let t0 = Instant::now();
    for _ in 0..iters {
        stream.memcpy_dtod(&src, &mut dst).map_err(err)?;
    }
    stream.synchronize().map_err(err)?;
    Ok((2 * n * iters) as f64 / t0.elapsed().as_secs_f64() / 1e9)
}

/// Prints the newest row at once, so a run cut short (time limit) still reports it.
fn measured(rows: &[Row]) {
    if let Some(r) = rows.last() {
        println!(
            "measured: {} | {} | {} tokens | {:.3} ms",
            r.case, r.mode, r.tokens, r.ms
        );
    }
}

fn time<F>(be: &mut CudaBackend, iters: usize, mut f: F) -> Result<f64, CudaError>
where
    F: FnMut(&mut CudaBackend) -> Result<(), CudaError>,
{
    for _ in 0..2 {
        f(be)?;
    }
    be.synchronize()?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f(be)?;
    }
    be.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e3 / iters as f64)
}

fn prefill(
    be: &mut CudaBackend,
    rows: &mut Vec<Row>,
    hidden: usize,
    label: &str,
    cu: &[usize],
    mode: Mode,
    iters: usize,
) -> Result<(), CudaError> {
    let c = cfg(hidden);
    let owned = random_weights(&c);
    let w = DeviceWeights::upload(be, &c, &view(&c, &owned), WeightFormat::Bf16)?;
    let t = *cu.last().unwrap_or(&0);
    let x: Vec<f32> = Rng(2).f32s(t * hidden, 1.0);
    let xd = DeviceRows::from_f32(be, &x, Dtype::Bf16)?;
    let mut od = DeviceRows::zeros(be, Dtype::Bf16, x.len())?;
    let mut caches = DeviceCaches::zeros(be, &c, cu.len() - 1)?;
    let mut ws = DeviceWorkspace::new(be, be.forward_workspace_len(&c, t)?)?;
    be.opts = CudaOptions {
        mode,
        chunk_size: flag_value("--chunk"),
    };
    let chunk = if mode == Mode::Recurrent {
        "-".to_string()
    } else {
        be.chunk_size(&c)?.to_string()
    };
    let ms = time(be, iters, |be| {
        be.forward(
            &c,
            &w,
            &xd,
            cu,
            &mut caches,
            InitialCaches::Zero,
            &mut od,
            &mut ws,
        )
    })?;
    rows.push(Row {
        case: label.to_string(),
        mode: format!("{mode:?} C={chunk}"),
        tokens: t,
        ms,
        min_bytes: None,
    });
    measured(rows);
    Ok(())
}

fn decode(
    be: &mut CudaBackend,
    rows: &mut Vec<Row>,
    batch: usize,
    iters: usize,
) -> Result<(), CudaError> {
    let hidden = 2304;
    let c = cfg(hidden);
    let owned = random_weights(&c);
    let w = DeviceWeights::upload(be, &c, &view(&c, &owned), WeightFormat::Bf16)?;
    let x: Vec<f32> = Rng(3).f32s(batch * hidden, 1.0);
    let xd = DeviceRows::from_f32(be, &x, Dtype::Bf16)?;
    let mut od = DeviceRows::zeros(be, Dtype::Bf16, x.len())?;
    let mut caches = DeviceCaches::zeros(be, &c, batch)?;
    let mut ws = DeviceWorkspace::new(be, be.decode_workspace_len(&c, batch)?)?;
    let ms = time(be, iters, |be| {
        be.decode_step(&c, &w, &xd, &mut caches, &mut od, &mut ws)
    })?;
    rows.push(Row {
        case: format!("decode batch {batch}, hidden {hidden}"),
        mode: "fused step".into(),
        tokens: batch,
        ms,
        min_bytes: Some(weight_bytes(&c) + batch as f64 * state_bytes_per_seq(&c)),
    });
    measured(rows);
    Ok(())
}

/// The value after `--flag` on the command line, parsed (`None` when absent or unparsable).
fn flag_value<T: std::str::FromStr>(flag: &str) -> Option<T> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1)?.parse().ok()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let hbm_override = flag_value::<f64>("--hbm-gbps");
    let mut be = match CudaBackend::new(0) {
        Ok(be) => be,
        Err(e) => {
            println!("skipped: no CUDA device ({e})");
            return;
        }
    };
    let d = be.device_info().clone();
    println!(
        "device: {} (sm_{}{}, {:.0} GiB), shared memory per block {} KiB",
        d.name,
        d.compute_capability.0,
        d.compute_capability.1,
        d.total_memory_bytes as f64 / (1u64 << 30) as f64,
        be.shared_memory_per_block() / 1024
    );
    for f in kda_cuda::libs::loaded_files() {
        println!("library: {}", f.display());
    }
    let t = 8192;
    let packed: Vec<usize> = {
        let lens = [1usize, 7, 64, 100, 500, 1000, 2000, 4520];
        let mut cu = vec![0];
        for l in lens {
            cu.push(cu.last().unwrap() + l);
        }
        cu
    };
    let iters = if quick { 2 } else { 5 };
    let mut rows = Vec::new();
    let run = |r: Result<(), CudaError>, what: &str| {
        if let Err(e) = r {
            println!("{what}: FAILED: {e}");
        }
    };
    run(
        prefill(
            &mut be,
            &mut rows,
            2304,
            "prefill T=8192 H=96 K=128 layer",
            &[0, t],
            Mode::Chunked,
            iters,
        ),
        "prefill",
    );
    run(
        prefill(
            &mut be,
            &mut rows,
            128,
            "prefill T=8192 H=96 K=128 core",
            &[0, t],
            Mode::Chunked,
            iters,
        ),
        "prefill core",
    );
    run(
        prefill(
            &mut be,
            &mut rows,
            2304,
            "prefill packed 8 seqs (1..4520) layer",
            &packed,
            Mode::Chunked,
            iters,
        ),
        "packed",
    );
    run(
        prefill(
            &mut be,
            &mut rows,
            128,
            "prefill packed 8 seqs (1..4520) core",
            &packed,
            Mode::Chunked,
            iters,
        ),
        "packed core",
    );
    if !quick {
        run(
            prefill(
                &mut be,
                &mut rows,
                128,
                "prefill T=8192 H=96 K=128 core",
                &[0, t],
                Mode::Recurrent,
                1,
            ),
            "recurrent",
        );
    }
    let steps = if quick { 20 } else { 200 };
    run(decode(&mut be, &mut rows, 1, steps), "decode 1");
    run(decode(&mut be, &mut rows, 64, steps), "decode 64");

    println!();
    println!("| case | mode | tokens | ms / call | tokens / s |");
    println!("|---|---|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.3} | {:.0} |",
            r.case,
            r.mode,
            r.tokens,
            r.ms,
            r.tokens as f64 / (r.ms / 1e3)
        );
    }
    println!();
    println!(
        "Published, same shape (T = 8192, H = 96, K = V = 128, bf16), on an H20 (4.0 TB/s HBM3, \
         148 dense bf16 TFLOP/s; an H200 has 4.8 TB/s and 989): fla chunk_kda 4.51 ms, \
         FlashKDA 2.62 ms. They time the delta-rule kernel alone: compare the \"core\" rows."
    );
    decode_bandwidth(&rows, &d.name, hbm_override);
}

/// The decode rows in µs per step and as fractions of the datasheet and measured bandwidths.
fn decode_bandwidth(rows: &[Row], name: &str, hbm_override: Option<f64>) {
    let datasheet = hbm_override
        .map(|g| (g, "--hbm-gbps"))
        .or_else(|| datasheet_gbps(name));
    let copy = copy_gbps();
    println!();
    match &copy {
        Ok(g) => println!("device-to-device copy, 1 GiB, read + write: {g:.0} GB/s"),
        Err(e) => println!("device-to-device copy: FAILED: {e}"),
    }
    match datasheet {
        Some((g, what)) => println!("HBM bandwidth: {g:.0} GB/s ({what})"),
        None => println!("HBM bandwidth: unknown for \"{name}\" (pass --hbm-gbps N)"),
    }
    println!();
    println!(
        "| decode | µs / step | state + weight bytes / step | GB/s | of HBM | of measured copy |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for r in rows {
        let Some(bytes) = r.min_bytes else { continue };
        let gbs = bytes / (r.ms / 1e3) / 1e9;
        let frac =
            |g: Option<f64>| g.map_or("-".to_owned(), |g| format!("{:.0} %", 100.0 * gbs / g));
        println!(
            "| {} | {:.1} | {:.1} MB | {gbs:.0} | {} | {} |",
            r.case,
            r.ms * 1e3,
            bytes / 1e6,
            frac(datasheet.map(|(g, _)| g)),
            frac(copy.as_ref().ok().copied()),
        );
    }
}

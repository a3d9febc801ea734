//! GPU benchmark of the KDA layer: prefill (T = 8192, H = 96, K = 128, bf16; one sequence and
//! packed variable lengths; chunked and, for reference, token-by-token) and decode (batch 1
//! and 64). Prints a table; exits 0 without measuring when there is no GPU.
//!
//! ```text
//! cargo run --release -p kda-cuda --example bench [-- --quick]
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

#[allow(clippy::too_many_arguments)]
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
        chunk_size: None,
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
    });
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
    });
    Ok(())
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
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
    // Decode moves the whole recurrent state twice (read + write) per step.
    let state_bytes = 96 * 128 * 128 * 4;
    for r in rows.iter().filter(|r| r.case.starts_with("decode")) {
        let gbs = (2 * state_bytes * r.tokens) as f64 / (r.ms / 1e3) / 1e9;
        println!("{}: recurrent-state traffic {:.0} GB/s", r.case, gbs);
    }
}

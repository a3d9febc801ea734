//! Links kda-core into a program with no std and no allocator, runs a 6-token prefill and the
//! same tokens as decode steps, and exits 0 only if both agree bitwise and are finite.
#![no_std]
#![no_main]

use kda_core::{
    forward_workspace_len, Batch, CachesMut, Data, ForwardOptions, GateWeights, InitialCaches,
    KdaConfig, KdaLayer, KdaWeights, MatRef, Serial,
};

#[link(name = "c")]
extern "C" {
    fn write(fd: i32, buf: *const u8, count: usize) -> isize;
    fn abort() -> !;
}

fn say(msg: &str) {
    // SAFETY: `msg` is a valid buffer of `msg.len()` bytes for the duration of the call.
    unsafe {
        write(1, msg.as_ptr(), msg.len());
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    say("kda-nostd-check: panic\n");
    // SAFETY: abort never returns and takes no arguments.
    unsafe { abort() }
}

/// The prebuilt `libcore` is compiled with unwinding and references this symbol; with
/// `panic = "abort"` it is never called.
#[no_mangle]
pub extern "C" fn rust_eh_personality() {}

const HD: usize = 8;
const H: usize = 2;
const K: usize = 4;
const W: usize = 4;
const D: usize = H * K;
const T: usize = 6;
const WS: usize = 2048;

fn fill(buf: &mut [f32], seed: &mut u32, scale: f32) {
    for v in buf {
        *seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        *v = (((*seed >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0) * scale;
    }
}

fn run() -> Result<bool, kda_core::KdaError> {
    let cfg = KdaConfig::kimi_k3(HD, H, K);
    let mut s = 1u32;
    let (mut q, mut k, mut v, mut g, mut o) = (
        [0f32; D * HD],
        [0f32; D * HD],
        [0f32; D * HD],
        [0f32; D * HD],
        [0f32; HD * D],
    );
    let (mut fa, mut fb, mut b) = ([0f32; K * HD], [0f32; D * K], [0f32; H * HD]);
    let (mut cq, mut ck, mut cv, mut a, mut norm) = (
        [0f32; D * W],
        [0f32; D * W],
        [0f32; D * W],
        [0f32; H],
        [0f32; K],
    );
    for m in [
        &mut q[..],
        &mut k,
        &mut v,
        &mut g,
        &mut o,
        &mut fa,
        &mut fb,
        &mut b,
        &mut cq,
        &mut ck,
        &mut cv,
        &mut a,
    ] {
        fill(m, &mut s, 0.5);
    }
    norm.fill(1.0);
    let w = KdaWeights {
        q_proj: MatRef::new("q", Data::F32(&q), D, HD)?,
        k_proj: MatRef::new("k", Data::F32(&k), D, HD)?,
        v_proj: MatRef::new("v", Data::F32(&v), D, HD)?,
        q_conv: Data::F32(&cq),
        k_conv: Data::F32(&ck),
        v_conv: Data::F32(&cv),
        a_log: Some(Data::F32(&a)),
        dt_bias: None,
        decay_proj: GateWeights::LowRank {
            down: MatRef::new("fa", Data::F32(&fa), K, HD)?,
            up: MatRef::new("fb", Data::F32(&fb), D, K)?,
        },
        b_proj: MatRef::new("b", Data::F32(&b), H, HD)?,
        output_gate: GateWeights::FullRank(MatRef::new("g", Data::F32(&g), D, HD)?),
        o_norm: Data::F32(&norm),
        o_proj: MatRef::new("o", Data::F32(&o), HD, D)?,
    };
    let layer = KdaLayer::new(&cfg, w, ForwardOptions::default())?;
    let mut x = [0f32; T * HD];
    fill(&mut x, &mut s, 1.0);
    let mut ws = [0f32; WS];
    let need = forward_workspace_len(&cfg, T)?;
    if need > WS {
        say("kda-nostd-check: workspace constant too small for this kda-core\n");
        return Err(kda_core::KdaError::TooSmall {
            arg: "workspace",
            needed: need,
            actual: WS,
        });
    }

    let (mut st, mut c1, mut c2, mut c3) = (
        [0f32; H * K * K],
        [0f32; D * (W - 1)],
        [0f32; D * (W - 1)],
        [0f32; D * (W - 1)],
    );
    let mut out = [0f32; T * HD];
    let caches = CachesMut {
        recurrent: &mut st,
        conv_q: &mut c1,
        conv_k: &mut c2,
        conv_v: &mut c3,
    };
    let batch = Batch {
        x: &x,
        cu_seqlens: &[0, T],
        out: &mut out,
    };
    layer.forward(batch, caches, InitialCaches::Zero, &mut ws, &Serial)?;

    let (mut st2, mut d1, mut d2, mut d3) = (
        [0f32; H * K * K],
        [0f32; D * (W - 1)],
        [0f32; D * (W - 1)],
        [0f32; D * (W - 1)],
    );
    let mut steps = [0f32; T * HD];
    for t in 0..T {
        let caches = CachesMut {
            recurrent: &mut st2,
            conv_q: &mut d1,
            conv_k: &mut d2,
            conv_v: &mut d3,
        };
        layer.decode_step(
            &x[t * HD..(t + 1) * HD],
            &mut steps[t * HD..(t + 1) * HD],
            caches,
            &mut ws,
            &Serial,
        )?;
    }
    Ok(out == steps && st == st2 && out.iter().all(|v| v.is_finite()))
}

/// C entry point (libc's start files call it).
#[no_mangle]
pub extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    match run() {
        Ok(true) => {
            say("kda-nostd-check: ok (no std, no alloc; prefill == decode steps)\n");
            0
        }
        Ok(false) => {
            say("kda-nostd-check: MISMATCH\n");
            1
        }
        Err(_) => {
            say("kda-nostd-check: error from kda-core\n");
            2
        }
    }
}

//! Speed and accuracy of kda-core's scalar math (`kda_core::math`: libm by default, micromath
//! with the `micromath` feature) on the target. For each function: `M <name> <calls> <ticks>
//! <max relative error>`, the error against an f64 `libm` reference over the same inputs.
#![no_std]
#![no_main]

use core::fmt::Write as _;
use core::hint::black_box;

use kda_core::math;
use kda_embedded_firmware::FwSink;

const N: usize = 256;

fn bench(sink: &mut FwSink, name: &str, lo: f32, hi: f32, f: fn(f32) -> f32, want: fn(f64) -> f64) {
    let x = |i: usize| lo + (hi - lo) * (i as f32 + 0.5) / N as f32;
    let mut acc = 0.0f32;
    sink.time(name, || {
        for i in 0..N {
            acc += f(black_box(x(i)));
        }
    });
    black_box(acc);
    let mut worst = 0.0f64;
    for i in 0..N {
        let w = want(x(i) as f64);
        let got = f(x(i)) as f64;
        let err = (got - w).abs() / w.abs().max(1e-30);
        if err > worst {
            worst = err;
        }
    }
    let _ = write!(sink.out, "M {name} {N} {worst:e}");
    sink.out.end_line();
}

#[cortex_m_rt::entry]
fn main() -> ! {
    kda_embedded_firmware::paint_stack();
    let mut sink = FwSink::new(if cfg!(feature = "micromath") {
        "kda-mathbench-micromath"
    } else {
        "kda-mathbench"
    });
    // Baseline: the loop and the input arithmetic alone.
    bench(&mut sink, "identity", -8.0, 8.0, |x| x, |x| x);
    bench(&mut sink, "exp", -10.0, 2.0, math::exp, libm::exp);
    bench(&mut sink, "sigmoid", -10.0, 10.0, math::sigmoid, |x| {
        1.0 / (1.0 + libm::exp(-x))
    });
    bench(&mut sink, "silu", -8.0, 8.0, math::silu, |x| {
        x / (1.0 + libm::exp(-x))
    });
    bench(&mut sink, "softplus", -10.0, 10.0, math::softplus, |x| {
        libm::log1p(libm::exp(x))
    });
    bench(&mut sink, "rsqrt", 1e-3, 100.0, math::rsqrt, |x| {
        1.0 / libm::sqrt(x)
    });
    sink.finish(Ok(()))
}

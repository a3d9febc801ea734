//! Data for the C firmware (`kda-capi/firmware/`): the embedded example's weights
//! (`embedded/model/src/weights.rs`, generated from its seed: f32, and int8 with row scales) as
//! a C header of exact arrays (hex floats), and the outputs the Rust API computes for the Rust
//! firmware's runs, in their log formats:
//! * `kda-f32`: for the lower-bound then the softplus gate, an 8-token prefill and 4 decode
//!   steps, portable kernels: `O <gate> <token> <64 × f32 bits>` (`fw_expected.txt`);
//! * `kda-fixed`: int8 weights, every token through the integer path:
//!   `Q <gate> <token> <64 × Q15.16>` (`fw_expected_fixed.txt`).
//!
//! `cargo run -p kda-capi --example fw_export -- <dir>` writes `<dir>/fw_weights_f32.h`,
//! `<dir>/fw_weights_i8.h`, `<dir>/fw_expected.txt` and `<dir>/fw_expected_fixed.txt`.

use std::fmt::Write as _;

use kda_core::fixed::{self, FixedCachesMut};
use kda_core::{
    Batch, CachesMut, Data, DecayGate, ForwardOptions, GateProj, GateWeights, InitialCaches, Isa,
    KdaConfig, KdaLayer, KdaWeights, MatRef, Serial,
};

#[rustfmt::skip]
#[allow(dead_code, clippy::approx_constant, clippy::excessive_precision)]
#[path = "../../embedded/model/src/weights.rs"]
mod fw;

const HIDDEN: usize = 64;
const HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const D: usize = HEADS * HEAD_DIM;
const RANK: usize = 16;
const T_PREFILL: usize = 8;
const T_ALL: usize = 12;
const INPUT_SEED: u64 = 0x4B44_415F_494E_5031;

/// The embedded example's config for one gate form (embedded/model: `config`).
fn config(lower_bound: bool) -> KdaConfig {
    let mut c = KdaConfig::kimi_k3(HIDDEN, HEADS, HEAD_DIM);
    c.conv_width = 4;
    c.decay_proj = GateProj::LowRank { rank: RANK };
    c.output_gate = GateProj::FullRank;
    c.decay_gate = if lower_bound {
        DecayGate::LowerBound(-5.0)
    } else {
        DecayGate::Softplus
    };
    c
}

fn weights() -> Result<KdaWeights<'static>, kda_core::KdaError> {
    let m = |d: &'static [f32], r, c| MatRef::new("w", Data::F32(d), r, c);
    Ok(KdaWeights {
        q_proj: m(&fw::Q_PROJ, D, HIDDEN)?,
        k_proj: m(&fw::K_PROJ, D, HIDDEN)?,
        v_proj: m(&fw::V_PROJ, D, HIDDEN)?,
        q_conv: Data::F32(&fw::Q_CONV),
        k_conv: Data::F32(&fw::K_CONV),
        v_conv: Data::F32(&fw::V_CONV),
        a_log: Some(Data::F32(&fw::A_LOG)),
        dt_bias: Some(Data::F32(&fw::DT_BIAS)),
        decay_proj: GateWeights::LowRank {
            down: m(&fw::F_A_PROJ, RANK, HIDDEN)?,
            up: m(&fw::F_B_PROJ, D, RANK)?,
        },
        b_proj: m(&fw::B_PROJ, HEADS, HIDDEN)?,
        output_gate: GateWeights::FullRank(m(&fw::G_PROJ, D, HIDDEN)?),
        o_norm: Data::F32(&fw::O_NORM),
        o_proj: m(&fw::O_PROJ, HIDDEN, D)?,
    })
}

/// The same layer with int8 weights (embedded/model: `i8_weights`).
fn i8_weights() -> Result<KdaWeights<'static>, kda_core::KdaError> {
    let q = |data: &'static [i8], scales: &'static [f32]| Data::I8 { data, scales };
    let m = |d, r, c| MatRef::new("w", d, r, c);
    Ok(KdaWeights {
        q_proj: m(q(&fw::Q_PROJ_I8, &fw::Q_PROJ_S), D, HIDDEN)?,
        k_proj: m(q(&fw::K_PROJ_I8, &fw::K_PROJ_S), D, HIDDEN)?,
        v_proj: m(q(&fw::V_PROJ_I8, &fw::V_PROJ_S), D, HIDDEN)?,
        q_conv: q(&fw::Q_CONV_I8, &fw::Q_CONV_S),
        k_conv: q(&fw::K_CONV_I8, &fw::K_CONV_S),
        v_conv: q(&fw::V_CONV_I8, &fw::V_CONV_S),
        a_log: Some(Data::F32(&fw::A_LOG)),
        dt_bias: Some(Data::F32(&fw::DT_BIAS)),
        decay_proj: GateWeights::LowRank {
            down: m(q(&fw::F_A_PROJ_I8, &fw::F_A_PROJ_S), RANK, HIDDEN)?,
            up: m(q(&fw::F_B_PROJ_I8, &fw::F_B_PROJ_S), D, RANK)?,
        },
        b_proj: m(q(&fw::B_PROJ_I8, &fw::B_PROJ_S), HEADS, HIDDEN)?,
        output_gate: GateWeights::FullRank(m(q(&fw::G_PROJ_I8, &fw::G_PROJ_S), D, HIDDEN)?),
        o_norm: Data::F32(&fw::O_NORM),
        o_proj: m(q(&fw::O_PROJ_I8, &fw::O_PROJ_S), HIDDEN, D)?,
    })
}

/// splitmix64's output function.
fn mix(z: u64) -> u64 {
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The embedded example's input element, Q15.16 (embedded/model/src/synth.rs: `input_q16`).
fn input_q16(t: usize, i: usize) -> i32 {
    let h = mix(INPUT_SEED ^ ((t * HIDDEN + i) as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93));
    ((h >> 46) as i32) - (1 << 17)
}

/// The same input as f32 (exact).
fn input(t: usize, i: usize) -> f32 {
    input_q16(t, i) as f32 * (1.0 / 65536.0)
}

/// `f` as an exact C99 hex-float literal.
fn hex_float(f: f32) -> String {
    let b = f.to_bits();
    let sign = if b >> 31 == 1 { "-" } else { "" };
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    match exp {
        0 if man == 0 => format!("{sign}0x0p+0f"),
        0 => format!("{sign}0x0.{:06x}p-126f", man << 1),
        255 => panic!("non-finite weight"),
        _ => format!("{sign}0x1.{:06x}p{:+}f", man << 1, exp - 127),
    }
}

fn c_array(out: &mut String, name: &str, v: &[f32]) {
    let _ = writeln!(out, "static const float {name}[{}] = {{", v.len());
    for row in v.chunks(8) {
        let items: Vec<String> = row.iter().map(|&f| hex_float(f)).collect();
        let _ = writeln!(out, "    {},", items.join(", "));
    }
    out.push_str("};\n");
}

fn c_array_i8(out: &mut String, name: &str, v: &[i8]) {
    let _ = writeln!(out, "static const int8_t {name}[{}] = {{", v.len());
    for row in v.chunks(16) {
        let items: Vec<String> = row.iter().map(|q| q.to_string()).collect();
        let _ = writeln!(out, "    {},", items.join(", "));
    }
    out.push_str("};\n");
}

const GENERATED: &str = "/* Generated by `cargo run -p kda-capi --example fw_export` from\n \
    * embedded/model/src/weights.rs (the Rust firmware's weights); floats as exact hex floats. */\n";

/// The f32 weights and the small parameters (`fw_weights_f32.h`).
fn header_f32() -> String {
    let mut s = String::from(GENERATED);
    for (name, v) in [
        ("Q_PROJ", &fw::Q_PROJ[..]),
        ("K_PROJ", &fw::K_PROJ),
        ("V_PROJ", &fw::V_PROJ),
        ("Q_CONV", &fw::Q_CONV),
        ("K_CONV", &fw::K_CONV),
        ("V_CONV", &fw::V_CONV),
        ("A_LOG", &fw::A_LOG),
        ("DT_BIAS", &fw::DT_BIAS),
        ("F_A_PROJ", &fw::F_A_PROJ),
        ("F_B_PROJ", &fw::F_B_PROJ),
        ("B_PROJ", &fw::B_PROJ),
        ("G_PROJ", &fw::G_PROJ),
        ("O_NORM", &fw::O_NORM),
        ("O_PROJ", &fw::O_PROJ),
    ] {
        c_array(&mut s, name, v);
    }
    s
}

/// The int8 matrices and conv weights with their row scales, and the small parameters
/// (`fw_weights_i8.h`).
fn header_i8() -> String {
    let mut s = String::from(GENERATED);
    for (name, v) in [
        ("A_LOG", &fw::A_LOG[..]),
        ("DT_BIAS", &fw::DT_BIAS),
        ("O_NORM", &fw::O_NORM),
    ] {
        c_array(&mut s, name, v);
    }
    for (name, v, scales) in [
        ("Q_PROJ", &fw::Q_PROJ_I8[..], &fw::Q_PROJ_S[..]),
        ("K_PROJ", &fw::K_PROJ_I8, &fw::K_PROJ_S),
        ("V_PROJ", &fw::V_PROJ_I8, &fw::V_PROJ_S),
        ("Q_CONV", &fw::Q_CONV_I8, &fw::Q_CONV_S),
        ("K_CONV", &fw::K_CONV_I8, &fw::K_CONV_S),
        ("V_CONV", &fw::V_CONV_I8, &fw::V_CONV_S),
        ("F_A_PROJ", &fw::F_A_PROJ_I8, &fw::F_A_PROJ_S),
        ("F_B_PROJ", &fw::F_B_PROJ_I8, &fw::F_B_PROJ_S),
        ("B_PROJ", &fw::B_PROJ_I8, &fw::B_PROJ_S),
        ("G_PROJ", &fw::G_PROJ_I8, &fw::G_PROJ_S),
        ("O_PROJ", &fw::O_PROJ_I8, &fw::O_PROJ_S),
    ] {
        c_array_i8(&mut s, &format!("{name}_I8"), v);
        c_array(&mut s, &format!("{name}_S"), scales);
    }
    s
}

fn line(out: &mut String, gate: &str, t: usize, row: &[f32]) {
    let _ = write!(out, "O {gate} {t}");
    for v in row {
        let _ = write!(out, " {:08x}", v.to_bits());
    }
    out.push('\n');
}

/// The Rust firmware's run (embedded/model: `run_float`) through the Rust API.
fn expected() -> Result<String, kda_core::KdaError> {
    let opts = ForwardOptions {
        isa: Some(Isa::Portable),
        ..ForwardOptions::default()
    };
    let mut text = String::new();
    for (gate, lb) in [("lb", true), ("sp", false)] {
        let cfg = config(lb);
        let layer = KdaLayer::new(&cfg, weights()?, opts)?;
        let mut state = vec![0f32; cfg.state_len()?];
        let mut conv = vec![vec![0f32; cfg.conv_state_len()?]; 3];
        let mut ws = vec![0f32; layer.workspace_len(T_PREFILL, 1)?];
        let x: Vec<f32> = (0..T_PREFILL * HIDDEN)
            .map(|j| input(j / HIDDEN, j % HIDDEN))
            .collect();
        let mut out = vec![0f32; T_PREFILL * HIDDEN];
        let [cq, ck, cv] = &mut conv[..] else {
            unreachable!()
        };
        let mut caches = CachesMut {
            recurrent: &mut state,
            conv_q: cq,
            conv_k: ck,
            conv_v: cv,
        };
        let batch = Batch {
            x: &x,
            cu_seqlens: &[0, T_PREFILL],
            out: &mut out,
        };
        layer.forward(
            batch,
            caches.reborrow(),
            InitialCaches::Zero,
            &mut ws,
            &Serial,
        )?;
        for (t, row) in out.chunks_exact(HIDDEN).enumerate() {
            line(&mut text, gate, t, row);
        }
        for t in T_PREFILL..T_ALL {
            let x: Vec<f32> = (0..HIDDEN).map(|i| input(t, i)).collect();
            let row = &mut out[..HIDDEN];
            layer.decode_step(&x, row, caches.reborrow(), &mut ws, &Serial)?;
            line(&mut text, gate, t, row);
        }
    }
    Ok(text)
}

/// The Rust firmware's integer run (embedded/model: `run_fixed`) through the Rust API.
fn expected_fixed() -> Result<String, kda_core::KdaError> {
    let w = i8_weights()?;
    let mut text = String::new();
    for (gate, lb) in [("lb", true), ("sp", false)] {
        let cfg = config(lb);
        let mut params = vec![0i32; fixed::params_len(&cfg)?];
        let fw = fixed::prepare(&cfg, &w, &mut params)?;
        let mut state = vec![0i32; cfg.state_len()?];
        let mut conv = vec![vec![0i32; cfg.conv_state_len()?]; 3];
        let mut ws = vec![0i32; kda_core::fixed_workspace_len(&cfg)?];
        let mut out = vec![0i32; HIDDEN];
        for t in 0..T_ALL {
            let x: Vec<i32> = (0..HIDDEN).map(|i| input_q16(t, i)).collect();
            let [cq, ck, cv] = &mut conv[..] else {
                unreachable!()
            };
            let caches = FixedCachesMut {
                recurrent: &mut state,
                conv_q: cq,
                conv_k: ck,
                conv_v: cv,
            };
            kda_core::decode_step_fixed(&cfg, &fw, &x, caches, &mut out, &mut ws)?;
            let _ = write!(text, "Q {gate} {t}");
            for v in &out {
                let _ = write!(text, " {:08x}", *v as u32);
            }
            text.push('\n');
        }
    }
    Ok(text)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: fw_export <dir>")?;
    let dir = std::path::Path::new(&dir);
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("fw_weights_f32.h"), header_f32())?;
    std::fs::write(dir.join("fw_weights_i8.h"), header_i8())?;
    std::fs::write(dir.join("fw_expected.txt"), expected()?)?;
    std::fs::write(dir.join("fw_expected_fixed.txt"), expected_fixed()?)?;
    Ok(())
}

//! Each building block against its fla-core 0.6.0 fixture (`components.safetensors`).

use kda_conformance::{rel_rms, Fixture};
use kda_core::ops::{conv, gate, norm, recurrent};
use kda_core::{Data, DecayGate};

const TOL: f64 = 1e-5;

fn fx() -> Fixture {
    Fixture::open("components.safetensors")
}

fn assert_close(what: &str, got: &[f32], want: &[f32]) {
    let e = rel_rms(got, want);
    println!("{what:<22} rel-RMS {e:.2e}");
    assert!(e <= TOL, "{what}: rel-RMS {e:.3e} > {TOL:e}");
}

#[test]
fn decay_gates() {
    let f = fx();
    for (prefix, form) in [
        ("gate_softplus", DecayGate::Softplus),
        ("gate_lower_bound", DecayGate::LowerBound(-5.0)),
    ] {
        let raw = f.t(&format!("{prefix}.raw"));
        let (h, k) = (
            raw.shape[raw.shape.len() - 2],
            raw.shape[raw.shape.len() - 1],
        );
        let mut g = raw.f32();
        let a = f.f32(&format!("{prefix}.A_log"));
        let b = f.f32(&format!("{prefix}.dt_bias"));
        gate::decay_gate(&mut g, form, Some(Data::F32(&a)), Some(Data::F32(&b)), h, k).unwrap();
        assert_close(prefix, &g, &f.f32(&format!("{prefix}.out")));
        assert!(g.iter().all(|v| *v <= 0.0));
    }
}

#[test]
fn beta() {
    let f = fx();
    let mut b = f.f32("beta.raw");
    gate::beta_sigmoid(&mut b);
    assert_close("beta", &b, &f.f32("beta.out"));
}

#[test]
fn l2_norm() {
    let f = fx();
    let x = f.t("l2norm.x");
    let mut v = x.f32();
    norm::l2_norm(&mut v, x.shape[1], 1e-6).unwrap();
    assert_close("l2norm", &v, &f.f32("l2norm.out"));
}

#[test]
fn short_conv_prefill_and_step() {
    let f = fx();
    let x = f.t("conv.x");
    let d = x.shape[1];
    let w = f.f32("conv.weight");
    let mut y = x.f32();
    let mut state = f.f32("conv.state_in");
    let mut scratch = vec![0.0; conv::short_conv_prefill_scratch(w.len() / d)];
    conv::short_conv_prefill(&mut y, d, Data::F32(&w), &mut state, &mut scratch).unwrap();
    assert_close("conv prefill", &y, &f.f32("conv.out"));
    assert_close("conv prefill state", &state, &f.f32("conv.state_out"));
    let mut s = f.f32("conv.step_x");
    conv::short_conv_step(&mut s, Data::F32(&w), &mut state).unwrap();
    assert_close("conv step", &s, &f.f32("conv.step_out"));
    assert_close("conv step state", &state, &f.f32("conv.step_state_out"));
}

#[test]
fn gated_rms_norm() {
    let f = fx();
    let x = f.t("rmsnorm_gated.x");
    let k = *x.shape.last().unwrap();
    let mut o = x.f32();
    let w = f.f32("rmsnorm_gated.weight");
    norm::gated_rms_norm(&mut o, &f.f32("rmsnorm_gated.gate"), Data::F32(&w), k, 1e-5).unwrap();
    assert_close("gated rmsnorm", &o, &f.f32("rmsnorm_gated.out"));
}

/// `naive_recurrent_kda` (with −1000 gates) and `naive_chunk_kda` outputs, both reproduced by
/// the token-by-token recurrence.
#[test]
fn recurrence_against_naive_recurrent_and_naive_chunk() {
    let f = fx();
    for (prefix, out, ht) in [("recurrent", "o", "ht"), ("chunk", "o", "ht")] {
        let q = f.t(&format!("{prefix}.q"));
        let (h, k) = (q.shape[2], q.shape[3]);
        let mut v = f.f32(&format!("{prefix}.v"));
        let mut state = f.f32(&format!("{prefix}.h0"));
        let mut o = vec![0.0; v.len()];
        let rows = recurrent::SequenceRows {
            q: &q.f32(),
            k: &f.f32(&format!("{prefix}.k")),
            v: &mut v,
            g: &f.f32(&format!("{prefix}.g")),
            beta: &f.f32(&format!("{prefix}.beta")),
            state: &mut state,
        };
        recurrent::recurrent_sequence(rows, h, k, 1.0 / (k as f32).sqrt(), &mut o).unwrap();
        assert_close(
            &format!("{prefix} o"),
            &o,
            &f.f32(&format!("{prefix}.{out}")),
        );
        assert_close(
            &format!("{prefix} state"),
            &state,
            &f.f32(&format!("{prefix}.{ht}")),
        );
    }
}

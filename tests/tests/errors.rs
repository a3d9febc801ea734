//! Bad input is an `Err` naming the argument — never a panic — and NaN propagates.

use kda_core::{
    forward_workspace_len, validate_offsets, Batch, CachesMut, DecayGate, ForwardOptions, GateProj,
    InitialCaches, KdaConfig, KdaError, KdaLayer, Serial,
};
use kda_host::rng::Rng;
use kda_host::{OwnedLayer, SequenceCaches, WeightDtype};

fn setup() -> (KdaConfig, OwnedLayer) {
    let cfg = KdaConfig::kimi_linear(12, 2, 4);
    (cfg, OwnedLayer::random(cfg, WeightDtype::F32, 3).unwrap())
}

fn run(
    cfg: &KdaConfig,
    layer: &OwnedLayer,
    x: &[f32],
    cu: &[usize],
    caches: &mut SequenceCaches,
    out_len: usize,
    ws_len: usize,
) -> Result<Vec<f32>, KdaError> {
    let w = layer.weights()?;
    let mut out = vec![0.0; out_len];
    let mut ws = vec![0.0; ws_len];
    let batch = Batch {
        x,
        cu_seqlens: cu,
        out: &mut out,
    };
    KdaLayer::new(cfg, w, ForwardOptions::default())?.forward(
        batch,
        caches.as_mut(),
        InitialCaches::Zero,
        &mut ws,
        &Serial,
    )?;
    Ok(out)
}

#[test]
fn offsets_are_checked() {
    for (cu, reason) in [
        (&[][..], "empty"),
        (&[0][..], "two entries"),
        (&[1, 3][..], "start at 0"),
        (&[0, 2, 1, 3][..], "non-decreasing"),
        (&[0, 2][..], "end at"),
    ] {
        let e = validate_offsets(cu, 3).unwrap_err();
        assert!(e.to_string().contains(reason), "{cu:?}: {e}");
        assert!(e.to_string().contains("cu_seqlens"));
    }
    assert_eq!(validate_offsets(&[0, 0, 3, 3], 3), Ok(3));
}

#[test]
fn every_length_mismatch_names_its_argument() {
    let (cfg, layer) = setup();
    let ws = forward_workspace_len(&cfg, 4).unwrap();
    let x = vec![0.1; 3 * 12];
    let mut c = SequenceCaches::new(&cfg, 1).unwrap();
    let name = |e: KdaError| match e {
        KdaError::Length { arg, .. } | KdaError::TooSmall { arg, .. } => arg,
        KdaError::Offsets { .. } => "cu_seqlens",
        other => panic!("unexpected {other:?}"),
    };
    assert_eq!(
        name(run(&cfg, &layer, &x[..35], &[0, 3], &mut c, 35, ws).unwrap_err()),
        "x"
    );
    assert_eq!(
        name(run(&cfg, &layer, &x, &[0, 3], &mut c, 24, ws).unwrap_err()),
        "out"
    );
    assert_eq!(
        name(run(&cfg, &layer, &x, &[0, 2], &mut c, 36, ws).unwrap_err()),
        "cu_seqlens"
    );
    assert_eq!(
        name(run(&cfg, &layer, &x, &[0, 1, 3], &mut c, 36, ws).unwrap_err()),
        "recurrent state"
    );
    assert_eq!(
        name(run(&cfg, &layer, &x, &[0, 3], &mut c, 36, 10).unwrap_err()),
        "workspace"
    );
    c.conv_k.pop();
    assert_eq!(
        name(run(&cfg, &layer, &x, &[0, 3], &mut c, 36, ws).unwrap_err()),
        "conv_state_k"
    );
}

#[test]
fn nothing_is_written_when_validation_fails() {
    let (cfg, layer) = setup();
    let w = layer.weights().unwrap();
    let kda = KdaLayer::new(&cfg, w, ForwardOptions::default()).unwrap();
    let mut c = SequenceCaches::new(&cfg, 1).unwrap();
    c.recurrent.fill(7.0);
    let mut out = vec![3.0; 24];
    let mut ws = vec![0.0; forward_workspace_len(&cfg, 1).unwrap()];
    let batch = Batch {
        x: &[0.0; 24],
        cu_seqlens: &[0, 1],
        out: &mut out,
    };
    let e = kda.forward(batch, c.as_mut(), InitialCaches::Zero, &mut ws, &Serial);
    assert!(e.is_err());
    assert!(c.recurrent.iter().all(|&v| v == 7.0));
    assert!(out.iter().all(|&v| v == 3.0));
}

#[test]
fn weights_must_match_the_config() {
    let (cfg, layer) = setup();
    // Shape mismatch: a config with a different hidden size.
    let other = KdaConfig { hidden: 13, ..cfg };
    let mut l2 = layer.clone();
    l2.cfg = other;
    assert!(matches!(
        l2.weights(),
        Err(KdaError::Shape {
            arg: "q_proj.weight",
            ..
        })
    ));
    // Form mismatch: config says full-rank output gate, weights are low-rank.
    let mut l3 = layer.clone();
    l3.cfg.output_gate = GateProj::FullRank;
    assert!(matches!(
        l3.weights(),
        Err(KdaError::Weights {
            arg: "g_proj.weight",
            ..
        })
    ));
    // Softplus needs A_log.
    let mut l4 = layer.clone();
    l4.a_log = None;
    assert!(matches!(
        l4.weights(),
        Err(KdaError::Weights { arg: "A_log", .. })
    ));
    l4.cfg.decay_gate = DecayGate::LowerBound(-5.0);
    assert!(l4.weights().is_ok());
}

#[test]
fn bad_configs_are_errors() {
    let base = KdaConfig::kimi_k3(8, 1, 4);
    let bad = [
        (KdaConfig { hidden: 0, ..base }, "hidden"),
        (KdaConfig { heads: 0, ..base }, "heads"),
        (
            KdaConfig {
                head_dim: 0,
                ..base
            },
            "head_dim",
        ),
        (
            KdaConfig {
                conv_width: 0,
                ..base
            },
            "conv_width",
        ),
        (
            KdaConfig {
                decay_gate: DecayGate::LowerBound(0.0),
                ..base
            },
            "decay_gate",
        ),
        (
            KdaConfig {
                decay_gate: DecayGate::LowerBound(f32::NAN),
                ..base
            },
            "decay_gate",
        ),
        (
            KdaConfig {
                output_gate: GateProj::LowRank { rank: 0 },
                ..base
            },
            "output_gate",
        ),
        (
            KdaConfig {
                rms_eps: -1.0,
                ..base
            },
            "rms_eps",
        ),
        (
            KdaConfig {
                l2_eps: f32::INFINITY,
                ..base
            },
            "l2_eps",
        ),
        (
            KdaConfig {
                scale: Some(f32::NAN),
                ..base
            },
            "scale",
        ),
        (
            KdaConfig {
                heads: usize::MAX,
                head_dim: 3,
                ..base
            },
            "overflow",
        ),
    ];
    for (cfg, field) in bad {
        let e = cfg.validate().unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains(field) || (field == "overflow" && matches!(e, KdaError::Overflow { .. })),
            "{msg}"
        );
        assert!(forward_workspace_len(&cfg, 1).is_err());
    }
}

#[test]
fn nan_in_nan_out_and_no_panic() {
    let (cfg, layer) = setup();
    let w = layer.weights().unwrap();
    let kda = KdaLayer::new(&cfg, w, ForwardOptions::recurrent()).unwrap();
    let mut x = Rng::new(4).normals(2 * 12, 1.0);
    x[5] = f32::NAN;
    let mut c = SequenceCaches::new(&cfg, 2).unwrap();
    let mut out = vec![0.0; x.len()];
    let mut ws = vec![0.0; forward_workspace_len(&cfg, 2).unwrap()];
    kda.decode_step(&x, &mut out, c.as_mut(), &mut ws, &Serial)
        .unwrap();
    // Sequence 0's row had a NaN: its output is NaN; sequence 1 is untouched by it.
    assert!(out[..12].iter().all(|v| v.is_nan()));
    assert!(out[12..].iter().all(|v| v.is_finite()));
    // Infinite and huge inputs, extreme caches: still no panic.
    let x = vec![f32::INFINITY; 24];
    c.recurrent.fill(f32::MAX);
    kda.decode_step(&x, &mut out, c.as_mut(), &mut ws, &Serial)
        .unwrap();
    // A decode step with zero sequences is a no-op.
    let mut empty = CachesMut {
        recurrent: &mut [],
        conv_q: &mut [],
        conv_k: &mut [],
        conv_v: &mut [],
    };
    kda.decode_step(&[], &mut [], empty.reborrow(), &mut ws, &Serial)
        .unwrap();
}

//! The projection kernels on every path: prefill and decode against the reference loops and
//! against each other, bitwise, for any split of the work.

use half::bf16;
use std::vec::Vec;

use super::*;
use crate::simd::portable;
use crate::simd::test_support::{exact, rnd, same, test_paths};
use crate::simd::types::{DECODE_LD, DECODE_PANELS, DIRECT, PANEL};
use crate::simd::vector;

fn rows_len(ws: Rows<'_, '_>) -> usize {
    match ws {
        Rows::F32(w) => w.len(),
        Rows::Bf16(w) => w.len(),
    }
}

/// Sums of `xs` × `ws` over `0..n` through `rows_fma` or `pack_panel` + `panel_fma`, in
/// k-blocks of `kstep` (0: one block), compacted to `[t·rows + r]`.
fn project(
    isa: Path,
    n: usize,
    xs: &[&[f32]],
    ws: Rows<'_, '_>,
    kstep: usize,
    pack: bool,
) -> Vec<f32> {
    let (stride, mr) = (if pack { PANEL } else { DIRECT }, rows_len(ws));
    let mut acc = std::vec![0.0f32; xs.len() * stride];
    let mut panel = std::vec![0.0f32; n.max(1) * PANEL];
    let step = if kstep == 0 { n.max(1) } else { kstep };
    let mut k0 = 0;
    loop {
        let k1 = (k0 + step).min(n);
        if pack {
            assert!(pack_panel(isa, ws, k0, k1, &mut panel).is_ok());
            assert!(panel_fma(isa, xs, k0, k1, &panel, &mut acc).is_ok());
        } else {
            assert!(rows_fma(isa, xs, ws, k0, k1, &mut acc).is_ok());
        }
        k0 = k1;
        if k0 >= n {
            return acc.chunks(stride).flat_map(|a| a[..mr].to_vec()).collect();
        }
    }
}

#[test]
fn projection_kernels_agree_bitwise_and_match_f64() {
    for isa in test_paths() {
        for n in [1usize, 7, 8, 9, 37, 300] {
            let tokens = 13;
            let xv: Vec<Vec<f32>> = (0..tokens).map(|t| rnd(n, 50 + t as u32)).collect();
            let wv: Vec<Vec<f32>> = (0..DIRECT).map(|r| rnd(n, 90 + r as u32)).collect();
            let wbv: Vec<Vec<bf16>> = wv
                .iter()
                .map(|w| w.iter().map(|&v| bf16::from_f32(v)).collect())
                .collect();
            let xs: Vec<&[f32]> = xv.iter().map(|v| v.as_slice()).collect();
            let ws: Vec<&[f32]> = wv.iter().map(|v| v.as_slice()).collect();
            let wbs: Vec<&[bf16]> = wbv.iter().map(|v| v.as_slice()).collect();
            let full = project(isa, n, &xs, Rows::F32(&ws), 0, false);
            let fullb = project(isa, n, &xs, Rows::Bf16(&wbs), 0, false);
            if exact(isa) {
                // The generic kernels over plain lanes: the reference loops' bits.
                let r = project(Path::Reference, n, &xs, Rows::F32(&ws), 0, false);
                let rb = project(Path::Reference, n, &xs, Rows::Bf16(&wbs), 0, false);
                assert!(
                    same(isa, &full, &r, 0.0) && same(isa, &fullb, &rb, 0.0),
                    "{isa:?}"
                );
            }
            for t in 0..tokens {
                for r in 0..DIRECT {
                    let want: f64 = (0..n).map(|i| xv[t][i] as f64 * wv[r][i] as f64).sum();
                    let wantb: f64 = (0..n)
                        .map(|i| xv[t][i] as f64 * wbv[r][i].to_f32() as f64)
                        .sum();
                    assert!((full[t * DIRECT + r] as f64 - want).abs() < 1e-5 * n as f64);
                    assert!((fullb[t * DIRECT + r] as f64 - wantb).abs() < 1e-5 * n as f64);
                }
            }
            // Any token group, row range, k-blocking and kernel: bitwise the same.
            for &(t0, t1) in &[(0, 1), (2, 5), (0, 6), (1, 13), (5, 12)] {
                for &(r0, r1) in &[
                    (0, 1),
                    (0, 3),
                    (0, 8),
                    (0, 9),
                    (0, 16),
                    (5, 21),
                    (16, 32),
                    (0, 32),
                ] {
                    for kstep in [0usize, 1, 8, 13, 64] {
                        for pack in [false, true] {
                            let mr = r1 - r0;
                            if pack && mr > PANEL {
                                continue;
                            }
                            let xg = &xs[t0..t1];
                            let o = project(isa, n, xg, Rows::F32(&ws[r0..r1]), kstep, pack);
                            let ob = project(isa, n, xg, Rows::Bf16(&wbs[r0..r1]), kstep, pack);
                            for t in 0..t1 - t0 {
                                for r in 0..mr {
                                    let (i, j) = (t * mr + r, (t0 + t) * DIRECT + r0 + r);
                                    assert_eq!(
                                        o[i].to_bits(),
                                        full[j].to_bits(),
                                        "{isa:?} n={n} t={t} r={r} mr={mr} k={kstep} pack={pack}"
                                    );
                                    assert_eq!(ob[i].to_bits(), fullb[j].to_bits());
                                }
                            }
                        }
                    }
                }
            }
            // Short slices are refused, not read past.
            let mut acc = std::vec![0.0f32; DIRECT];
            let mut panel = std::vec![0.0f32; n * PANEL];
            assert!(rows_fma(isa, &xs[..1], Rows::F32(&ws), 0, n + 1, &mut acc).is_err());
            assert!(rows_fma(isa, &xs[..2], Rows::F32(&ws), 0, n, &mut acc).is_err());
            assert!(rows_fma(isa, &xs[..1], Rows::F32(&[]), 0, n, &mut acc).is_err());
            assert!(pack_panel(isa, Rows::F32(&ws), 0, n, &mut panel).is_err());
            assert!(pack_panel(isa, Rows::F32(&ws[..PANEL]), 0, n + 1, &mut panel).is_err());
            assert!(panel_fma(isa, &xs[..1], 0, n + 1, &panel, &mut acc).is_err());
            assert!(panel_fma(isa, &xs[..3], 0, n, &panel, &mut acc).is_err());
        }
    }
}

#[test]
fn panel_layout_kernel_matches_the_row_kernels_bitwise() {
    for isa in test_paths() {
        for n in [1usize, 5, 16, 37, 130] {
            let xv: Vec<Vec<f32>> = (0..4).map(|t| rnd(n, 7 + t as u32)).collect();
            let wv: Vec<Vec<bf16>> = (0..DECODE_PANELS * PANEL)
                .map(|r| {
                    rnd(n, 300 + r as u32)
                        .iter()
                        .map(|&v| bf16::from_f32(v))
                        .collect()
                })
                .collect();
            // Panel p: element (k, r) at 16k + r.
            let panels: Vec<Vec<bf16>> = (0..DECODE_PANELS)
                .map(|p| {
                    (0..n * PANEL)
                        .map(|i| wv[p * PANEL + i % PANEL][i / PANEL])
                        .collect()
                })
                .collect();
            let xs: Vec<&[f32]> = xv.iter().map(|v| v.as_slice()).collect();
            let ws: Vec<&[bf16]> = wv.iter().map(|v| v.as_slice()).collect();
            let ps: Vec<&[bf16]> = panels.iter().map(|v| v.as_slice()).collect();
            for mt in 1..=4 {
                for np in 1..=DECODE_PANELS {
                    for kstep in [0usize, 3, 16] {
                        let mut acc = std::vec![0.0f32; mt * DECODE_LD];
                        let step = if kstep == 0 { n } else { kstep };
                        let mut k0 = 0;
                        while k0 < n {
                            let k1 = (k0 + step).min(n);
                            assert!(panels_fma(isa, &xs[..mt], &ps[..np], k0, k1, &mut acc).is_ok());
                            k0 = k1;
                        }
                        for p in 0..np {
                            let want = project(
                                isa,
                                n,
                                &xs[..mt],
                                Rows::Bf16(&ws[p * PANEL..(p + 1) * PANEL]),
                                0,
                                true,
                            );
                            for t in 0..mt {
                                for r in 0..PANEL {
                                    assert_eq!(
                                        acc[t * DECODE_LD + p * PANEL + r].to_bits(),
                                        want[t * PANEL + r].to_bits(),
                                        "{isa:?} n={n} mt={mt} np={np} p={p} t={t} r={r}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            let mut acc = std::vec![0.0f32; 4 * DECODE_LD];
            assert!(panels_fma(isa, &xs[..1], &ps[..1], 0, n + 1, &mut acc).is_err());
            assert!(panels_fma(isa, &xs, &ps, 0, n, &mut acc[..4 * DECODE_LD - 1]).is_err());
            assert!(panels_fma(isa, &[], &ps, 0, n, &mut acc).is_err());
            let nine = [ps[0]; DECODE_PANELS + 1];
            assert!(panels_fma(isa, &xs[..1], &nine, 0, n, &mut acc).is_err());
        }
    }
}

#[test]
fn prefill_panel_kernel_matches_packing_the_rows_bitwise() {
    // Token counts across the register blocks' even split (6 and 12 tokens a block),
    // one to four panels, accumulators `ld` apart with room to spare, two k-blocks.
    for isa in test_paths() {
        for n in [1usize, 16, 37] {
            let xv: Vec<Vec<f32>> = (0..30).map(|t| rnd(n, 7 + t as u32)).collect();
            let wv: Vec<Vec<bf16>> = (0..4 * PANEL)
                .map(|r| {
                    let row = rnd(n, 300 + r as u32);
                    row.iter().map(|&v| bf16::from_f32(v)).collect()
                })
                .collect();
            let panels: Vec<Vec<bf16>> = (0..4)
                .map(|p| {
                    (0..n * PANEL)
                        .map(|i| wv[p * PANEL + i % PANEL][i / PANEL])
                        .collect()
                })
                .collect();
            let ws: Vec<&[bf16]> = wv.iter().map(|v| v.as_slice()).collect();
            for tokens in [1usize, 5, 7, 12, 13, 25, 30] {
                let xs: Vec<&[f32]> = xv[..tokens].iter().map(|v| v.as_slice()).collect();
                for np in 1..=4 {
                    let ld = np * PANEL + 3;
                    let mut acc = std::vec![0.0f32; (tokens - 1) * ld + np * PANEL];
                    let h = n / 2;
                    let first: Vec<&[bf16]> =
                        panels[..np].iter().map(|p| &p[..h * PANEL]).collect();
                    let second: Vec<&[bf16]> =
                        panels[..np].iter().map(|p| &p[h * PANEL..]).collect();
                    // Each call prefetches the other half (the results must not depend on it).
                    let ok = panel_fma_bf16(isa, &xs, (0, h), &first, (&mut acc, ld), &second);
                    assert!(ok.is_ok());
                    let ok = panel_fma_bf16(isa, &xs, (h, n), &second, (&mut acc, ld), &first);
                    assert!(ok.is_ok());
                    for p in 0..np {
                        let rows = Rows::Bf16(&ws[p * PANEL..(p + 1) * PANEL]);
                        let want = project(isa, n, &xs, rows, 0, true);
                        for t in 0..tokens {
                            for r in 0..PANEL {
                                assert_eq!(
                                    acc[t * ld + p * PANEL + r].to_bits(),
                                    want[t * PANEL + r].to_bits(),
                                    "{isa:?} n={n} tokens={tokens} np={np} p={p} t={t} r={r}"
                                );
                            }
                        }
                    }
                    // Short slices and a stride under the group's width are refused.
                    let bad_steps =
                        panel_fma_bf16(isa, &xs, (h, n + 1), &second, (&mut acc, ld), &[]);
                    assert!(bad_steps.is_err());
                    let narrow = panel_fma_bf16(isa, &xs, (h, n), &second, (&mut acc, ld - 4), &[]);
                    assert!(narrow.is_err());
                    let short = acc.len() - 1;
                    let bad_acc =
                        panel_fma_bf16(isa, &xs, (h, n), &second, (&mut acc[..short], ld), &[]);
                    assert!(bad_acc.is_err());
                }
            }
        }
    }
}

/// Activations rounded to bf16 pairs, as the bf16 mode's layer does.
fn pair_rows(tokens: usize, n: usize, seed: u32) -> Vec<Vec<u32>> {
    (0..tokens)
        .map(|t| {
            let x = rnd(n, seed + t as u32);
            let mut p = std::vec![0u32; n.div_ceil(2)];
            round_pairs_row(Path::Reference, &x, &mut p).unwrap();
            p
        })
        .collect()
}

/// The bf16 pair kernels give the reference loops' bits on every path (the native
/// `vdpbf16ps` included: these values keep every partial sum normal), for any split of
/// the pairs into calls, and decode (`pairs_panels_fma`) equals prefill
/// (`pairs_panel_fma`) bitwise.
#[test]
fn pair_kernels_match_reference_bitwise() {
    for path in test_paths() {
        for n in [1usize, 2, 3, 15, 16, 17, 33, 64, 255, 300] {
            let panels: Vec<Vec<bf16>> = (0..DECODE_PANELS as u32)
                .map(|p| {
                    rnd(n * PANEL, 40 + p)
                        .iter()
                        .map(|&v| bf16::from_f32(v))
                        .collect()
                })
                .collect();
            let pr: Vec<&[bf16]> = panels.iter().map(|p| &p[..]).collect();
            let all = PairSteps::all(n);
            for tokens in [1usize, 2, 3, 4, 5, 11, 12, 13, 25] {
                let rows = pair_rows(tokens, n, 7 * n as u32);
                let xs: Vec<&[u32]> = rows.iter().map(|r| &r[..]).collect();
                let start = rnd(tokens * PANEL, 3);
                let mut want = start.clone();
                portable::pairs_panels_fma(&xs, &pr[..1], all.tuple(), &mut want, PANEL);
                let mut got = start.clone();
                let mid = all.j1 / 3;
                let halves = [PairSteps { j1: mid, ..all }, PairSteps { j0: mid, ..all }];
                for st in halves {
                    pairs_panel_fma(path, &xs, st, &pr[..1], (&mut got, PANEL), &[]).unwrap();
                }
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(same, "{path:?} pairs_panel_fma n={n} tokens={tokens}");
                // Three panels in one call, tokens `ld` apart: each panel's sums as alone.
                let ld = 3 * PANEL + 5;
                let mut three = std::vec![0.0f32; (tokens - 1) * ld + 3 * PANEL];
                // Prefetching the other panels on the way must not change a bit.
                let ahead = &pr[3..6];
                pairs_panel_fma(path, &xs, all, &pr[..3], (&mut three, ld), ahead).unwrap();
                let short = three.len() - 1;
                let cut = pairs_panel_fma(path, &xs, all, &pr[..3], (&mut three[..short], ld), &[]);
                assert!(cut.is_err());
                let narrow = pairs_panel_fma(path, &xs, all, &pr[..3], (&mut three, ld - 6), &[]);
                assert!(narrow.is_err());
                for p in 0..3 {
                    let mut one = std::vec![0.0f32; tokens * PANEL];
                    let st = all.tuple();
                    portable::pairs_panels_fma(&xs, &pr[p..p + 1], st, &mut one, PANEL);
                    for t in 0..tokens {
                        let got = &three[t * ld + p * PANEL..][..PANEL];
                        let ok = got
                            .iter()
                            .zip(&one[t * PANEL..(t + 1) * PANEL])
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(ok, "{path:?} three panels: {p} n={n} t={t}/{tokens}");
                    }
                }
                if tokens > 4 {
                    continue;
                }
                for np in 1..=DECODE_PANELS {
                    let mut acc = std::vec![0.0f32; tokens * DECODE_LD];
                    pairs_panels_fma(path, &xs, &pr[..np], all, &mut acc).unwrap();
                    for p in 0..np {
                        let mut one = std::vec![0.0f32; tokens * PANEL];
                        let one_acc = (&mut one[..], PANEL);
                        pairs_panel_fma(Path::Reference, &xs, all, &pr[p..p + 1], one_acc, &[])
                            .unwrap();
                        for t in 0..tokens {
                            let d = &acc[t * DECODE_LD + p * PANEL..][..PANEL];
                            let ok = d
                                .iter()
                                .zip(&one[t * PANEL..(t + 1) * PANEL])
                                .all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(ok, "{path:?} pairs_panels_fma n={n} t={t} p={p}/{np}");
                        }
                    }
                }
            }
        }
        let mut acc = std::vec![0.0f32; PANEL];
        let bad = PairSteps {
            j1: 3,
            ..PairSteps::all(4)
        };
        let w: &[bf16] = &[bf16::ZERO; 64];
        assert!(pairs_panel_fma(path, &[&[0u32; 3]], bad, &[w], (&mut acc, PANEL), &[]).is_err());
    }
}

/// Rounding to bf16 pairs: every path bitwise equal to the scalar rule, which is
/// `half`'s round-to-nearest-even for normal values, with subnormals to signed zero and
/// NaN kept a NaN.
#[test]
fn round_pairs_every_path() {
    let mut xs: Vec<f32> = rnd(1000, 5).iter().map(|v| v * 1e3).collect();
    xs.extend([
        0.0,
        -0.0,
        1.0e-40,
        -1.0e-40,
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0x3f80_8001),
    ]);
    for &x in &xs {
        let r = vector::round_bf16(x);
        if x.is_nan() {
            assert!(bf16::from_bits(r).is_nan());
        } else if x.is_subnormal() {
            assert_eq!(r, (x.to_bits() >> 16) as u16 & 0x8000);
        } else {
            assert_eq!(r, bf16::from_f32(x).to_bits(), "{x:e}");
        }
    }
    for path in test_paths() {
        for n in [0usize, 1, 2, 31, 32, 33, 63, xs.len()] {
            let (mut want, mut got) = (
                std::vec![0u32; n.div_ceil(2)],
                std::vec![1u32; n.div_ceil(2)],
            );
            portable::round_pairs_row(&xs[..n], &mut want);
            round_pairs_row(path, &xs[..n], &mut got).unwrap();
            assert_eq!(got, want, "{path:?} round_pairs_row n={n}");
        }
    }
    assert!(round_pairs_row(Path::Reference, &xs[..3], &mut [0u32; 1]).is_err());
}

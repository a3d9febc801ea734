//! Host side of the embedded example: redraws the weights from the seed (and compares them with
//! the flash data bitwise), runs the firmware's exact computation with kda-core on the host,
//! and checks each QEMU log against it. Also measures each ELF (flash, RAM) and, for the
//! integer path, proves from the disassembly that no float routine or instruction is reachable
//! from the decode step.
//!
//! ```text
//! kda-embedded-check [--report FILE] RUN...
//!   RUN = TARGET:VARIANT:ELF:LOG   TARGET ∈ {m3, m4}   VARIANT ∈ {f32, i8, fixed, f32-micromath,
//!         i8-micromath, mathbench, mathbench-micromath}
//! env KDA_OBJDUMP: llvm-objdump to use (default: `llvm-objdump`)
//! ```
//! Exit status 0 only if every check passes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::process::{Command, ExitCode};

use kda_core::fixed::{from_q, ACT_FRAC};
use kda_core::{quantize_rows, Data};
use kda_embedded_model::{self as model, synth, weights, Gate, Phase, Sink, T_ALL};

/// Float paths on the target vs the same code on the host: rel-RMS bound (observed: 0, the
/// outputs are bitwise identical — same code, IEEE f32 on both, no FMA contraction).
const TOL_FLOAT: f64 = 1e-5;
/// micromath builds vs the libm host reference.
const TOL_MICROMATH: f64 = 5e-2;
/// Instructions per tick of the CMSDK timer under `-icount shift=0`.
const INSTR_PER_TICK: f64 = 40.0;

type Key = (&'static str, usize);
/// A flash tensor: name, f32 values, int8 values and scales when quantised.
type FlashTensor = (
    &'static str,
    &'static [f32],
    Option<(&'static [i8], &'static [f32])>,
);
/// A mathbench run: target, variant, `M` lines, `T` ticks.
type MathRun = (
    String,
    String,
    Vec<(String, f64, String)>,
    HashMap<String, f64>,
);

#[derive(Default)]
struct Collect {
    f: BTreeMap<Key, Vec<f32>>,
    q: BTreeMap<Key, Vec<i32>>,
}

impl Sink for Collect {
    fn start(&mut self) {}
    fn stop(&mut self, _: Gate, _: Phase, _: usize) {}
    fn out_f32(&mut self, gate: Gate, tokens: std::ops::Range<usize>, rows: &[f32]) {
        for (t, r) in tokens.zip(rows.chunks_exact(synth::HIDDEN)) {
            self.f.insert((gate.name(), t), r.to_vec());
        }
    }
    fn out_q16(&mut self, gate: Gate, token: usize, row: &[i32]) {
        self.q.insert((gate.name(), token), row.to_vec());
    }
}

/// Every flash tensor next to its name, for the bitwise comparison with the seed.
fn flash() -> Vec<FlashTensor> {
    use weights::*;
    vec![
        ("Q_PROJ", &Q_PROJ, Some((&Q_PROJ_I8, &Q_PROJ_S))),
        ("K_PROJ", &K_PROJ, Some((&K_PROJ_I8, &K_PROJ_S))),
        ("V_PROJ", &V_PROJ, Some((&V_PROJ_I8, &V_PROJ_S))),
        ("F_A_PROJ", &F_A_PROJ, Some((&F_A_PROJ_I8, &F_A_PROJ_S))),
        ("F_B_PROJ", &F_B_PROJ, Some((&F_B_PROJ_I8, &F_B_PROJ_S))),
        ("B_PROJ", &B_PROJ, Some((&B_PROJ_I8, &B_PROJ_S))),
        ("G_PROJ", &G_PROJ, Some((&G_PROJ_I8, &G_PROJ_S))),
        ("O_PROJ", &O_PROJ, Some((&O_PROJ_I8, &O_PROJ_S))),
        ("Q_CONV", &Q_CONV, Some((&Q_CONV_I8, &Q_CONV_S))),
        ("K_CONV", &K_CONV, Some((&K_CONV_I8, &K_CONV_S))),
        ("V_CONV", &V_CONV, Some((&V_CONV_I8, &V_CONV_S))),
        ("A_LOG", &A_LOG, None),
        ("DT_BIAS", &DT_BIAS, None),
        ("O_NORM", &O_NORM, None),
    ]
}

/// Redraws every tensor from the seed and compares with the flash data bitwise.
fn verify_weights() -> Result<(), String> {
    let mut rng = synth::Rng::new(synth::SEED);
    let fl = flash();
    for (ti, t) in synth::TENSORS.iter().enumerate() {
        let (name, f, q) = fl[ti];
        if name != t.name {
            return Err(format!("tensor order: {name} vs {}", t.name));
        }
        let mut v = vec![0.0f32; t.rows * t.cols];
        synth::draw(&mut rng, ti, &mut v);
        if v.iter().zip(f).any(|(a, b)| a.to_bits() != b.to_bits()) || v.len() != f.len() {
            return Err(format!(
                "{name}: flash data differs from seed {:#x}",
                synth::SEED
            ));
        }
        if let Some((qi, qs)) = q {
            let (mut q2, mut s2) = (vec![0i8; v.len()], vec![0.0f32; t.rows]);
            quantize_rows(Data::F32(&v), t.rows, &mut q2, &mut s2).map_err(|e| e.to_string())?;
            if q2 != qi || s2.iter().zip(qs).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(format!(
                    "{name}: int8 flash data differs from quantize_rows"
                ));
            }
        }
    }
    Ok(())
}

#[derive(Default, Debug)]
struct Log {
    name: String,
    cal: Option<(f64, f64)>,
    /// (gate, phase) → ticks per region.
    times: BTreeMap<(String, String), Vec<f64>>,
    f: BTreeMap<(String, usize), Vec<f32>>,
    q: BTreeMap<(String, usize), Vec<i32>>,
    math: Vec<(String, f64, String)>,
    math_ticks: HashMap<String, f64>,
    stack: Option<usize>,
    done: bool,
    errors: Vec<String>,
}

fn parse_log(text: &str) -> Log {
    let mut l = Log::default();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("KDA") => l.name = w.get(1).unwrap_or(&"").to_string(),
            Some("CAL") if w.len() == 3 => {
                l.cal = Some((w[1].parse().unwrap_or(0.0), w[2].parse().unwrap_or(0.0)))
            }
            Some("T") if w.len() == 5 => {
                let t: f64 = w[4].parse().unwrap_or(f64::NAN);
                l.times
                    .entry((w[1].into(), w[2].into()))
                    .or_default()
                    .push(t);
            }
            Some("T") if w.len() == 3 => {
                l.math_ticks
                    .insert(w[1].into(), w[2].parse().unwrap_or(f64::NAN));
            }
            Some("O") if w.len() > 3 => {
                let v = w[3..]
                    .iter()
                    .map(|h| f32::from_bits(u32::from_str_radix(h, 16).unwrap_or(0x7fc0_0000)))
                    .collect();
                l.f.insert((w[1].into(), w[2].parse().unwrap_or(usize::MAX)), v);
            }
            Some("Q") if w.len() > 3 => {
                let v = w[3..]
                    .iter()
                    .map(|h| u32::from_str_radix(h, 16).unwrap_or(0) as i32)
                    .collect();
                l.q.insert((w[1].into(), w[2].parse().unwrap_or(usize::MAX)), v);
            }
            Some("M") if w.len() == 4 => {
                l.math
                    .push((w[1].into(), w[2].parse().unwrap_or(0.0), w[3].into()))
            }
            Some("STACK") => l.stack = w.get(1).and_then(|s| s.parse().ok()),
            Some("DONE") => l.done = true,
            Some("ERR") | Some("PANIC") | Some("HARDFAULT") => l.errors.push(line.to_string()),
            _ => {}
        }
    }
    l
}

/// Section sizes of an ELF32 (little endian).
fn sections(path: &str) -> Result<HashMap<String, u64>, String> {
    let b = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if b.len() < 52 || &b[..4] != b"\x7fELF" || b[4] != 1 {
        return Err(format!("{path}: not an ELF32"));
    }
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u32_at(0x20), u16_at(0x2E), u16_at(0x30), u16_at(0x32));
    let sh = |i: usize| shoff + i * shentsize;
    let stroff = u32_at(sh(shstrndx) + 16);
    let mut out = HashMap::new();
    for i in 0..shnum {
        let name_off = stroff + u32_at(sh(i));
        let end = b[name_off..].iter().position(|&c| c == 0).unwrap_or(0);
        let name = String::from_utf8_lossy(&b[name_off..name_off + end]).to_string();
        out.insert(name, u32_at(sh(i) + 20) as u64);
    }
    Ok(out)
}

/// Symbols that are float arithmetic routines (compiler-builtins' soft float, libm).
fn is_float_routine(sym: &str) -> bool {
    let s = sym;
    s.contains("__aeabi_f")
        || s.contains("__aeabi_d")
        || s.contains("__aeabi_i2f")
        || s.contains("__aeabi_ui2f")
        || s.contains("__aeabi_l2f")
        || s.contains("__aeabi_ul2f")
        || s.contains("__aeabi_i2d")
        || s.contains("__aeabi_ui2d")
        || s.contains("__aeabi_l2d")
        || s.contains("__aeabi_ul2d")
        || s.contains("compiler_builtins::float")
        || s.contains("libm::")
        || [
            "sf3", "df3", "sfsi", "dfsi", "sisf", "sidf", "sfdi", "disf", "sfdf2", "dfsf2", "sf2",
            "df2",
        ]
        .iter()
        .any(|suf| s.trim_start_matches('_').starts_with("__") && s.ends_with(suf))
}

struct Disasm {
    reachable: BTreeSet<String>,
    float_calls: Vec<String>,
    fpu_insns: Vec<String>,
    indirect: usize,
    root: String,
}

/// Walks the static call graph from the function whose name ends with `root` (the integer
/// decode's per-token function; or a float build's `main`, as a positive control).
fn check_disassembly(elf: &str, root: &str) -> Result<Disasm, String> {
    let objdump = std::env::var("KDA_OBJDUMP").unwrap_or_else(|_| "llvm-objdump".into());
    let out = Command::new(&objdump)
        .args(["-d", "-C", "--no-show-raw-insn", elf])
        .output()
        .map_err(|e| format!("{objdump}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{objdump} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // function → (callees, fpu instructions, indirect calls)
    let mut funcs: BTreeMap<String, (BTreeSet<String>, Vec<String>, usize)> = BTreeMap::new();
    let mut cur = String::new();
    let strip = |s: &str| -> String {
        let s = s.split('+').next().unwrap_or(s);
        // Drop the `::h0123…` hash.
        match s.rfind("::h") {
            Some(i) if s.len() - i == 19 => s[..i].to_string(),
            _ => s.to_string(),
        }
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_suffix(">:") {
            if let Some(i) = rest.find(" <") {
                cur = strip(&rest[i + 2..]);
                funcs.entry(cur.clone()).or_default();
                continue;
            }
        }
        let Some((addr, insn)) = line.trim_start().split_once(':') else {
            continue;
        };
        if addr.is_empty() || !addr.bytes().all(|c| c.is_ascii_hexdigit()) {
            continue;
        }
        let insn = insn.trim();
        let mnem = insn.split_whitespace().next().unwrap_or("");
        let entry = funcs.entry(cur.clone()).or_default();
        if mnem.starts_with('v') {
            entry.1.push(insn.to_string());
        }
        if mnem == "blx" && !insn.contains('<') {
            entry.2 += 1;
        }
        let is_branch = mnem.starts_with('b')
            && !mnem.starts_with("bic")
            && !mnem.starts_with("bfi")
            && !mnem.starts_with("bfc");
        if is_branch {
            if let (Some(a), Some(b)) = (insn.find('<'), insn.rfind('>')) {
                let t = strip(&insn[a + 1..b]);
                if t != cur {
                    entry.0.insert(t);
                }
            }
        }
    }
    let root = funcs
        .keys()
        .find(|k| k.ends_with(root))
        .cloned()
        .ok_or(format!("no `{root}` in the ELF"))?;
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.clone()];
    let (mut float_calls, mut fpu_insns, mut indirect) = (Vec::new(), Vec::new(), 0);
    while let Some(f) = stack.pop() {
        if !seen.insert(f.clone()) {
            continue;
        }
        // Panic paths (bounds checks) end the program; they are not part of the decode.
        if f.contains("panic") {
            continue;
        }
        if is_float_routine(&f) {
            float_calls.push(f.clone());
            continue;
        }
        if let Some((callees, fpu, ind)) = funcs.get(&f) {
            fpu_insns.extend(fpu.iter().map(|i| format!("{f}: {i}")));
            indirect += ind;
            stack.extend(callees.iter().cloned());
        }
    }
    Ok(Disasm {
        reachable: seen,
        float_calls,
        fpu_insns,
        indirect,
        root,
    })
}

fn rel_rms(got: &[f32], want: &[f32]) -> f64 {
    let (mut n, mut d) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        n += (g as f64 - w as f64).powi(2);
        d += (w as f64).powi(2);
    }
    if d == 0.0 {
        n.sqrt()
    } else {
        (n / d).sqrt()
    }
}

fn flat_f(m: &BTreeMap<(String, usize), Vec<f32>>) -> Vec<f32> {
    let mut v = Vec::new();
    for g in Gate::ALL {
        for t in 0..T_ALL {
            match m.get(&(g.name().to_string(), t)) {
                Some(r) => v.extend(r),
                None => v.extend(std::iter::repeat_n(f32::NAN, synth::HIDDEN)),
            }
        }
    }
    v
}

fn flat_ref_f(m: &BTreeMap<Key, Vec<f32>>) -> Vec<f32> {
    let mut v = Vec::new();
    for g in Gate::ALL {
        for t in 0..T_ALL {
            v.extend(&m[&(g.name(), t)]);
        }
    }
    v
}

struct Row {
    target: String,
    variant: String,
    decode: String,
    prefill: String,
    flash: String,
    ram: String,
    err: String,
    check: String,
    ok: bool,
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut report = None;
    if let Some(i) = args.iter().position(|a| a == "--report") {
        report = args.get(i + 1).cloned();
        args.drain(i..(i + 2).min(args.len()));
    }
    let mut ok = true;
    let mut text = String::new();

    match verify_weights() {
        Ok(()) => println!(
            "weights: flash data == seed {:#x} (bitwise, f32 and int8)",
            synth::SEED
        ),
        Err(e) => {
            println!("FAIL weights: {e}");
            ok = false;
        }
    }

    // Host references: exactly the firmware's calls.
    let (wf, wq) = (model::f32_weights().unwrap(), model::i8_weights().unwrap());
    let mut r_f32 = Collect::default();
    model::run_float(&wf, &mut Box::new(model::FloatBufs::new()), &mut r_f32).unwrap();
    let mut r_i8 = Collect::default();
    model::run_float(&wq, &mut Box::new(model::FloatBufs::new()), &mut r_i8).unwrap();
    let mut r_fx = Collect::default();
    model::run_fixed(&wq, &mut Box::new(model::FixedBufs::new()), &mut r_fx).unwrap();
    let ref_f32 = flat_ref_f(&r_f32.f);
    let ref_i8 = flat_ref_f(&r_i8.f);
    let mut ref_fx_f = BTreeMap::new();
    for (k, v) in &r_fx.q {
        ref_fx_f.insert(
            *k,
            v.iter().map(|&x| from_q(x, ACT_FRAC)).collect::<Vec<f32>>(),
        );
    }
    let ref_fx = flat_ref_f(&ref_fx_f);
    println!(
        "host: int8 weights vs f32 weights, rel-RMS {:.2e}; integer path vs float path (int8 weights) {:.2e}, vs f32 weights {:.2e}",
        rel_rms(&ref_i8, &ref_f32),
        rel_rms(&ref_fx, &ref_i8),
        rel_rms(&ref_fx, &ref_f32)
    );

    let mut rows = Vec::new();
    let mut math: Vec<MathRun> = Vec::new();
    for spec in &args {
        let parts: Vec<&str> = spec.splitn(4, ':').collect();
        if parts.len() != 4 {
            println!("FAIL bad run spec {spec}");
            ok = false;
            continue;
        }
        let (target, variant, elf, logf) = (parts[0], parts[1], parts[2], parts[3]);
        let log = parse_log(&std::fs::read_to_string(logf).unwrap_or_default());
        let mut fails: Vec<String> = log.errors.clone();
        if !log.done {
            fails.push("run did not finish (no DONE)".into());
        }
        match log.cal {
            Some((n, t)) if t > 0.0 && (n / t - INSTR_PER_TICK).abs() < 0.01 => {}
            c => fails.push(format!("calibration {c:?}: expected {INSTR_PER_TICK} instructions per tick (-icount shift=0?)")),
        }
        let sec = sections(elf).unwrap_or_else(|e| {
            fails.push(e);
            HashMap::new()
        });
        let g = |n: &str| sec.get(n).copied().unwrap_or(0);
        let flash = g(".vector_table") + g(".text") + g(".rodata") + g(".data");
        let ram_static = g(".data") + g(".bss") + g(".uninit");
        let stack = log.stack.unwrap_or(0) as u64;

        if variant.starts_with("mathbench") {
            math.push((
                target.into(),
                variant.into(),
                log.math.clone(),
                log.math_ticks.clone(),
            ));
            let row_ok = fails.is_empty();
            ok &= row_ok;
            if !row_ok {
                println!("FAIL {target} {variant}: {}", fails.join("; "));
            }
            continue;
        }

        // Outputs.
        let (err_f32, mut check) = if variant == "fixed" {
            let mut mism = 0usize;
            let mut got_f = BTreeMap::new();
            for g in Gate::ALL {
                for t in 0..T_ALL {
                    let want = &r_fx.q[&(g.name(), t)];
                    match log.q.get(&(g.name().to_string(), t)) {
                        Some(got) => {
                            mism += got.iter().zip(want).filter(|(a, b)| a != b).count();
                            got_f.insert(
                                (g.name().to_string(), t),
                                got.iter()
                                    .map(|&x| from_q(x, ACT_FRAC))
                                    .collect::<Vec<f32>>(),
                            );
                        }
                        None => mism += synth::HIDDEN,
                    }
                }
            }
            if mism > 0 {
                fails.push(format!("{mism} integer outputs differ from the host's"));
            }
            let got = flat_f(&got_f);
            (rel_rms(&got, &ref_f32), format!("bit-exact vs host ({} mismatches); vs f32 path with the same int8 weights {:.1e}", mism, rel_rms(&got, &ref_i8)))
        } else {
            let micromath = variant.ends_with("-micromath");
            let want = if variant.starts_with("i8") {
                &ref_i8
            } else {
                &ref_f32
            };
            let got = flat_f(&log.f);
            let e = rel_rms(&got, want);
            let exact = got
                .iter()
                .zip(want.iter())
                .filter(|(a, b)| a.to_bits() == b.to_bits())
                .count();
            let tol = if micromath { TOL_MICROMATH } else { TOL_FLOAT };
            if e.is_nan() || e > tol {
                fails.push(format!("outputs rel-RMS {e:.2e} vs host > {tol:.0e}"));
            }
            let what = if micromath { "vs host libm" } else { "vs host" };
            (
                rel_rms(&got, &ref_f32),
                format!(
                    "{what}: rel-RMS {e:.1e} (tol {tol:.0e}), {exact}/{} bit-identical",
                    want.len()
                ),
            )
        };

        // Instructions per decode token (mean over the decode steps of both gates).
        let mut per_gate = Vec::new();
        let mut prefill = Vec::new();
        for g in Gate::ALL {
            if let Some(v) = log.times.get(&(g.name().to_string(), "decode".to_string())) {
                per_gate.push(v.iter().sum::<f64>() / v.len() as f64 * INSTR_PER_TICK);
            }
            if let Some(v) = log
                .times
                .get(&(g.name().to_string(), "prefill".to_string()))
            {
                prefill.push(v.iter().sum::<f64>() * INSTR_PER_TICK);
            }
        }
        let fmt_k = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{:.0}k", x / 1000.0))
                .collect::<Vec<_>>()
                .join(" / ")
        };

        // The integer path: nothing float reachable from the per-token function.
        if variant == "fixed" {
            match check_disassembly(elf, "kda_core::fixed::decode::token") {
                Ok(d) => {
                    if !d.float_calls.is_empty() || !d.fpu_insns.is_empty() {
                        fails.push(format!(
                            "float in the integer decode: calls {:?}, FPU instructions {:?}",
                            d.float_calls,
                            d.fpu_insns.iter().take(5).collect::<Vec<_>>()
                        ));
                    }
                    check += &format!(
                        "; disassembly: {} functions reachable from `{}`, 0 soft-float/libm calls, 0 FPU instructions, {} indirect calls",
                        d.reachable.len(),
                        d.root.rsplit("::").next().unwrap_or(""),
                        d.indirect
                    );
                    println!(
                        "{target} fixed: reachable from {}: {:?}",
                        d.root, d.reachable
                    );
                }
                Err(e) => fails.push(format!("disassembly: {e}")),
            }
        }
        // "Fitting one": the integer build must fit a 64 KiB flash / 20 KiB RAM Cortex-M3
        // (STM32F103C8 class), flash image and RAM including the measured stack.
        if variant == "fixed" && target == "m3" {
            let ram = ram_static + stack;
            if flash > 64 * 1024 || ram > 20 * 1024 {
                fails.push(format!(
                    "does not fit 64 KiB flash / 20 KiB RAM: flash {flash} B, RAM {ram} B"
                ));
            } else {
                check += "; fits a 64 KiB flash / 20 KiB RAM Cortex-M3";
            }
        }
        // Positive control for the detector: the float builds' main must reach float code.
        if variant == "f32" || variant == "i8" {
            match check_disassembly(elf, "__cortex_m_rt_main") {
                Ok(d) if !d.float_calls.is_empty() || !d.fpu_insns.is_empty() => {
                    check += &format!(
                        "; control: main reaches {} float routines, {} FPU instructions",
                        d.float_calls.len(),
                        d.fpu_insns.len()
                    );
                }
                Ok(_) => {
                    fails.push("float detector control: no float found in a float build".into())
                }
                Err(e) => fails.push(format!("disassembly: {e}")),
            }
        }
        let row_ok = fails.is_empty();
        ok &= row_ok;
        println!(
            "{} {target} {variant}: decode {} instr/token, flash {flash} B, RAM {} B (+ stack {stack} B), error vs f32 {err_f32:.2e}; {check}{}",
            if row_ok { "ok  " } else { "FAIL" },
            fmt_k(&per_gate),
            ram_static,
            if row_ok { String::new() } else { format!(" — {}", fails.join("; ")) }
        );
        rows.push(Row {
            target: target.into(),
            variant: variant.into(),
            decode: fmt_k(&per_gate),
            prefill: fmt_k(&prefill),
            flash: format!(
                "{flash} ({} text + {} rodata + {} data)",
                g(".vector_table") + g(".text"),
                g(".rodata"),
                g(".data")
            ),
            ram: format!(
                "{} ({} data+bss + {stack} stack)",
                ram_static + stack,
                ram_static
            ),
            err: format!("{err_f32:.1e}"),
            check,
            ok: row_ok,
        });
    }

    writeln!(text, "| target | path | instructions / decode token (lb / sp gate) | instructions / 8-token prompt (lb / sp) | flash, bytes | RAM, bytes | output rel-RMS vs f32 weights | check |").unwrap();
    writeln!(text, "|---|---|---|---|---|---|---|---|").unwrap();
    for r in &rows {
        writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {}{} |",
            r.target,
            r.variant,
            r.decode,
            r.prefill,
            r.flash,
            r.ram,
            r.err,
            r.check,
            if r.ok { "" } else { " **FAIL**" }
        )
        .unwrap();
    }
    if !math.is_empty() {
        writeln!(text, "\n| target | build | function | instructions / call (minus loop) | max relative error vs f64 |").unwrap();
        writeln!(text, "|---|---|---|---|---|").unwrap();
        for (target, variant, lines, ticks) in &math {
            let base = ticks.get("identity").copied().unwrap_or(0.0);
            for (name, _, err) in lines {
                if name == "identity" {
                    continue;
                }
                let n = lines
                    .iter()
                    .find(|l| &l.0 == name)
                    .map(|l| l.1)
                    .unwrap_or(1.0);
                let per =
                    (ticks.get(name).copied().unwrap_or(f64::NAN) - base) * INSTR_PER_TICK / n;
                writeln!(text, "| {target} | {variant} | {name} | {per:.0} | {err} |").unwrap();
            }
        }
    }
    println!("\n{text}");
    if let Some(p) = report {
        std::fs::write(&p, &text).expect("write report");
    }
    if ok {
        println!("embedded check: all passed");
        ExitCode::SUCCESS
    } else {
        println!("embedded check: FAILED");
        ExitCode::FAILURE
    }
}

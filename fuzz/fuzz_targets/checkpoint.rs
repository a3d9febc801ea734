//! A whole checkpoint from bytes: `[u16 LE config length][config.json][model.safetensors]`.
//! Loads every KDA layer; when the layer is small, runs it over a few tokens.
#![no_main]

use kda_host::{Checkpoint, Mode, Runner};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let n = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
    let (config, weights) = data[2..].split_at(n);
    let Ok(ckpt) = Checkpoint::from_memory(
        config,
        None,
        vec![("model.safetensors".into(), weights.to_vec())],
    ) else {
        return;
    };
    let Ok(model) = ckpt.load(None) else {
        return;
    };
    for l in model.layers() {
        let _ = l.weight_bytes();
        let Ok(cache_len) = l.cfg.cache_len() else {
            continue;
        };
        if cache_len > 1 << 20 || l.cfg.hidden > 1 << 12 {
            continue;
        }
        let mut cache = model.new_cache(2).expect("small cache");
        let x: Vec<f32> = (0..3 * l.cfg.hidden)
            .map(|i| ((i * 7919) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let mut runner = Runner::new(2);
        model
            .forward(&mut runner, l.index, &x, &[0, 1, 3], &mut cache, Mode::Auto)
            .expect("a loaded layer runs");
        let _ = model.decode(&mut runner, l.index, &x[..2 * l.cfg.hidden], &mut cache);
    }
});

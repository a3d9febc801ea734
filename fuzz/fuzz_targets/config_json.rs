//! `config.json` and `model.safetensors.index.json` parsing.
#![no_main]

use kda_host::checkpoint::config::ModelConfig;
use kda_host::checkpoint::ShardIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = ModelConfig::parse(data, "config.json") {
        for i in c.kda_layers.iter().chain(&c.full_attn_layers).take(64) {
            let _ = c.check_kda_layer(*i);
            let _ = c.layout.layer_prefix(*i);
        }
        let _ = c.check_kda_layer(usize::MAX);
        let _ = c.kda_list();
        c.layer_config(1, 1)
            .validate()
            .expect("a parsed config gives a valid layer");
    }
    let _ = ShardIndex::parse(data, "model.safetensors.index.json");
});

//! Safetensors files the tool reads: `[selector byte][file]`. Selector 0: an input file
//! (hidden 4); 1: a one-layer state file (hidden 4, 1 head × 2, conv 3), parsed from bytes
//! and read from a file (the two must agree); other: any header.
#![no_main]

use kda_core::KdaConfig;
use kda_host::checkpoint::safetensors::{parse_header, Buffer, SafetensorsFile};
use kda_host::io::Input;
use kda_host::state_file::{parse_state, read_state};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, file)) = data.split_first() else {
        return;
    };
    match sel % 3 {
        0 => {
            if let Ok(i) = Input::parse(file, "in", 4) {
                assert_eq!(i.hidden_states.len(), i.tokens * 4);
                assert_eq!(i.cu_seqlens.first(), Some(&0));
                assert_eq!(i.cu_seqlens.last(), Some(&i.tokens));
            }
        }
        1 => {
            let mut cfg = KdaConfig::kimi_k3(4, 1, 2);
            cfg.conv_width = 3;
            let parsed = parse_state(file, "state", &cfg, None);
            if let Ok(c) = &parsed {
                assert_eq!(c.recurrent.len(), c.sequences * 4);
                assert_eq!(c.conv_q.len(), c.sequences * 4);
            }
            // The streamed reader of files agrees with the parser of bytes.
            let path = std::env::temp_dir().join(format!("kda-fuzz-state-{}", std::process::id()));
            std::fs::write(&path, file).expect("temp file");
            let streamed = read_state(&path, &cfg, None);
            match (&parsed, &streamed) {
                (Ok(a), Ok(b)) => {
                    // Bitwise: NaN payloads included (NaN != NaN for `==`).
                    let bits = |c: &kda_host::SequenceCaches| -> Vec<u32> {
                        [&c.recurrent, &c.conv_q, &c.conv_k, &c.conv_v]
                            .iter()
                            .flat_map(|v| v.iter().map(|x| x.to_bits()))
                            .collect()
                    };
                    assert_eq!(a.sequences, b.sequences);
                    assert_eq!(bits(a), bits(b));
                }
                (Err(_), Err(_)) => {}
                _ => panic!("parse_state {parsed:?} but read_state {streamed:?}"),
            }
        }
        _ => {
            if parse_header(file, "f").is_ok() {
                let f =
                    SafetensorsFile::parse("f", Buffer::Owned(file.to_vec())).expect("parsed once");
                for name in f.header.tensors.keys() {
                    let _ = f.f32_tensor(name, None, false);
                    let _ = f.int_tensor(name);
                }
            }
        }
    }
});

//! The write path: tensors (and metadata) built from the bytes are laid out and written as
//! kda-host writes every file (header, then each tensor streamed), then read back with the
//! crate's parser and the `safetensors` crate's: what was written must be what is read. A
//! one-layer state file is round-tripped the same way.
//!
//! Input: `[selector]` then, for selector 0, tensors as `[name len][name][dtype][rank]
//! [dims…]` with values taken from the rest of the input; for 1, a state's shape and values.
#![no_main]

use std::collections::BTreeMap;

use kda_core::KdaConfig;
use kda_host::checkpoint::safetensors::{parse_header, serialize, OutTensor, SafetensorsFile};
use kda_host::checkpoint::safetensors::Buffer;
use kda_host::state_file::{parse_state, state_bytes};
use kda_host::SequenceCaches;
use libfuzzer_sys::fuzz_target;
use safetensors::Dtype;

const DTYPES: [Dtype; 12] = [
    Dtype::F32,
    Dtype::BF16,
    Dtype::F16,
    Dtype::I64,
    Dtype::I32,
    Dtype::U8,
    Dtype::I8,
    Dtype::F64,
    Dtype::BOOL,
    Dtype::F4,
    Dtype::U16,
    Dtype::F8_E4M3,
];

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn byte(&mut self) -> u8 {
        let Some((&b, rest)) = self.0.split_first() else {
            return 0;
        };
        self.0 = rest;
        b
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a.to_vec()
    }
}

fn tensors(r: &mut Reader) -> (Vec<OutTensor>, BTreeMap<String, String>) {
    let count = r.byte() % 6;
    let mut out = Vec::new();
    for _ in 0..count {
        let len = (r.byte() % 12) as usize;
        let name = String::from_utf8_lossy(&r.take(len)).into_owned();
        let dtype = DTYPES[r.byte() as usize % DTYPES.len()];
        let rank = (r.byte() % 4) as usize;
        let shape: Vec<usize> = (0..rank).map(|_| (r.byte() % 9) as usize).collect();
        let bits = shape.iter().product::<usize>() * dtype.bitsize();
        let mut bytes = r.take(bits.div_ceil(8));
        bytes.resize(bits.div_ceil(8), 0xa5);
        out.push(OutTensor {
            name,
            dtype,
            shape,
            bytes,
        });
    }
    let mut meta = BTreeMap::new();
    if r.byte() % 2 == 1 {
        let k = String::from_utf8_lossy(&r.take(4)).into_owned();
        let v = String::from_utf8_lossy(&r.take(6)).into_owned();
        meta.insert(k, v);
    }
    (out, meta)
}

fn round_trip(r: &mut Reader) {
    let (t, meta) = tensors(r);
    let mut names: Vec<&str> = t.iter().map(|x| x.name.as_str()).collect();
    names.sort();
    names.dedup();
    let writable = names.len() == t.len()
        && !names.contains(&"__metadata__")
        && t.iter().all(|x| x.bytes.len() * 8 == x.shape.iter().product::<usize>() * x.dtype.bitsize());
    let Ok(bytes) = serialize(&t, &meta, "f") else {
        assert!(!writable, "a valid tensor list was refused");
        return;
    };
    assert!(writable, "an invalid tensor list was written");
    let reference = safetensors::SafeTensors::deserialize(&bytes).expect("the crate reads it");
    parse_header(&bytes, "f").expect("kda-host reads it");
    let f = SafetensorsFile::parse("f", Buffer::Owned(bytes.clone())).unwrap();
    assert_eq!(f.header.tensors.len(), t.len());
    for x in &t {
        let e = f.entry(&x.name).unwrap();
        assert_eq!((e.dtype, &e.shape), (x.dtype, &x.shape));
        assert_eq!(f.bytes(e), &x.bytes[..]);
        let v = reference.tensor(&x.name).unwrap();
        assert_eq!(v.data(), &x.bytes[..]);
    }
    for (k, v) in &meta {
        assert_eq!(f.header.metadata.get(k), Some(v));
    }
}

fn state_round_trip(r: &mut Reader) {
    let mut cfg = KdaConfig::kimi_k3(4, 1 + (r.byte() % 3) as usize, 1 + (r.byte() % 4) as usize);
    cfg.conv_width = 1 + (r.byte() % 4) as usize;
    cfg.hidden = cfg.heads * cfg.head_dim;
    let n = (r.byte() % 4) as usize;
    let Ok(mut c) = SequenceCaches::new(&cfg, n) else {
        return;
    };
    for v in [&mut c.recurrent, &mut c.conv_q, &mut c.conv_k, &mut c.conv_v] {
        for x in v.iter_mut() {
            *x = f32::from_le_bytes([r.byte(), r.byte(), r.byte(), r.byte()]);
        }
    }
    let b = state_bytes(&cfg, &c).expect("a state is always writable");
    let back = parse_state(&b, "s", &cfg, Some(n)).expect("a written state reads back");
    // Bitwise (NaN payloads included).
    for (a, b) in [
        (&c.recurrent, &back.recurrent),
        (&c.conv_q, &back.conv_q),
        (&c.conv_k, &back.conv_k),
        (&c.conv_v, &back.conv_v),
    ] {
        assert!(a.iter().map(|x| x.to_bits()).eq(b.iter().map(|x| x.to_bits())));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader(data);
    match r.byte() % 2 {
        0 => round_trip(&mut r),
        _ => state_round_trip(&mut r),
    }
});

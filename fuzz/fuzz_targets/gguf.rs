//! GGUF files from bytes: `GgufFile::parse` (every check of `GgufHeader::parse`), the typed
//! getters, the array readers and `GgufSet::from_files`. A file that parses is written again by
//! `GgufWriter::copy_of` into memory and parsed again: the same tensors (names, types, ne,
//! offsets, byte ranges, bytes) and the same metadata (keys in order, types, values bit for
//! bit); writing that copy once more gives the same bytes. Then the bytes are opened as a
//! checkpoint and every KDA layer it holds is loaded (`Checkpoint::from_gguf_memory`,
//! `Checkpoint::load`): a model, or a one-line error.
#![no_main]

use kda_host::checkpoint::gguf::{GgufFile, GgufSet, GgufWriter, Value};
use kda_host::checkpoint::safetensors::Buffer;
use kda_host::checkpoint::Checkpoint;
use libfuzzer_sys::fuzz_target;

fn one_line(r: kda_host::error::Result<()>) {
    if let Err(e) = r {
        assert!(!e.to_string().contains('\n'), "{e}");
    }
}

/// Reads every value every way; nothing may panic, and every error must render.
fn read_all(f: &GgufFile) {
    let m = f.metadata();
    for (key, value) in m.iter() {
        one_line(m.get_str(key).map(drop));
        one_line(m.get_u32(key).map(drop));
        one_line(m.get_array_i32(key).map(drop));
        if let Value::Array(a) = value {
            assert_eq!(a.iter().count(), a.len());
            if let Some(s) = a.strings() {
                assert_eq!(s.count(), a.len());
            }
            if let Some(v) = a.values::<u8>() {
                assert_eq!(v.len(), a.len());
            }
        }
    }
    for t in f.tensors() {
        assert_eq!(f.bytes_of(t).len(), t.nbytes());
        assert_eq!(f.tensor(&t.name).map(|u| u.offset).ok(), Some(t.offset));
    }
}

fn rewrite(f: &GgufFile) -> Vec<u8> {
    GgufWriter::copy_of(f, "copy.gguf")
        .expect("a parsed file can be given to the writer")
        .to_bytes()
        .expect("and written")
}

fuzz_target!(|data: &[u8]| {
    let f = match GgufFile::parse("fuzz.gguf", Buffer::Owned(data.to_vec())) {
        Ok(f) => f,
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("fuzz.gguf: ") && !e.contains('\n'), "{e}");
            return;
        }
    };
    read_all(&f);
    let copy = rewrite(&f);
    let g = GgufFile::parse("copy.gguf", Buffer::Owned(copy.clone()))
        .expect("what the writer writes parses");
    assert_eq!(g.header.version, 3);
    assert_eq!(f.header.alignment, g.header.alignment);
    assert_eq!(f.tensors(), g.tensors());
    for t in f.tensors() {
        assert_eq!(f.bytes_of(t), g.bytes_of(t), "{}", t.name);
    }
    assert!(f.metadata().iter().eq(g.metadata().iter()));
    assert_eq!(rewrite(&g), copy);
    one_line(GgufSet::from_files(vec![f]).map(drop));
    one_line(
        Checkpoint::from_gguf_memory(vec![("fuzz.gguf".into(), data.to_vec())])
            .and_then(|c| c.load(None))
            .map(drop),
    );
});

//! GGUF files made by llama.cpp's converter, read by kda-host and compared with what gguf-py
//! reads from them (dumps made by `tests/scripts/gguf_dump_json.py`): version, alignment, data
//! offset, every key with its type and value, every tensor's name, type, ne, size and offsets.
//!
//! The committed fixture is `tests/fixtures/gguf/kimi-linear-tiny-q8_0.gguf` (its README says
//! how it was made). Set `KDA_GGUF_DUMPS` to a folder of more dumps (each naming its file) to
//! check those files too, split sets included; set `KDA_WRITE_FUZZ_SEEDS=1` to (re)write the
//! `gguf` fuzz target's seeds.

use std::path::{Path, PathBuf};

use kda_host::checkpoint::gguf::{
    ArrayBuf, GgmlType, GgufFile, GgufSet, GgufWriter, Source, Value,
};
use kda_host::checkpoint::safetensors::Buffer;
use serde_json::{json, Value as Json};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf")
}

/// A metadata value as gguf-py's `contents()` gives it, in JSON.
fn to_json(v: &Value) -> Json {
    match *v {
        Value::Str(s) => json!(String::from_utf8_lossy(s)),
        Value::Array(a) => Json::Array(a.iter().map(|v| to_json(&v)).collect()),
        Value::F32(x) => json!(f64::from(x)),
        Value::F64(x) => json!(x),
        Value::Bool(b) => json!(b),
        ref v => match v.as_integer() {
            Some(i) if i < 0 => json!(i as i64),
            Some(i) => json!(i as u64),
            None => Json::Null,
        },
    }
}

/// The dump's type list of `v`: `["UINT32"]`, `["ARRAY", "INT32"]`.
fn types(v: &Value) -> Json {
    match v {
        Value::Array(a) => json!(["ARRAY", a.elem_type().name()]),
        v => json!([v.value_type().name()]),
    }
}

/// The header of `f` in the dump's form.
fn dump_of(f: &GgufFile, file: &Json) -> Json {
    let h = &f.header;
    let kv: Vec<Json> = f
        .metadata()
        .iter()
        .map(|(k, v)| json!({"key": k, "types": types(&v), "value": to_json(&v)}))
        .collect();
    let tensors: Vec<Json> = f
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ggml_type.name(),
                "ne": t.ne(),
                "n_bytes": t.nbytes(),
                "offset": t.offset,
                "data_offset": t.range.start,
            })
        })
        .collect();
    json!({
        "file": file,
        "version": h.version,
        "alignment": h.alignment,
        "data_offset": h.data_start,
        "kv": kv,
        "tensors": tensors,
    })
}

/// Parses the file the dump `json` names and compares the two; returns the file's path.
fn check_dump(json: &Path) -> PathBuf {
    let dump: Json = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let file = json.parent().unwrap().join(dump["file"].as_str().unwrap());
    let f = GgufFile::open(&file).unwrap_or_else(|e| panic!("{e}"));
    let ours = dump_of(&f, &dump["file"]);
    for key in ["version", "alignment", "data_offset"] {
        assert_eq!(ours[key], dump[key], "{}: {key}", file.display());
    }
    let (a, b) = (
        ours["kv"].as_array().unwrap(),
        dump["kv"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len(), "{}: key count", file.display());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x, y, "{}", file.display());
    }
    let (a, b) = (
        ours["tensors"].as_array().unwrap(),
        dump["tensors"].as_array().unwrap(),
    );
    assert_eq!(a.len(), b.len(), "{}: tensor count", file.display());
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x, y, "{}", file.display());
    }
    file
}

#[test]
fn the_fixture_matches_gguf_py() {
    let file = check_dump(&fixtures().join("kimi-linear-tiny-q8_0.json"));
    let set = GgufSet::open(&file).unwrap();
    assert_eq!((set.files().len(), set.len()), (1, 34));
    let m = set.metadata();
    assert_eq!(m.get_str("general.architecture").unwrap(), "kimi-linear");
    assert_eq!(
        m.get_array_i32("kimi-linear.attention.head_count_kv")
            .unwrap(),
        [0, 1]
    );
    let (_, q) = set.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.ggml_type, q.ne()), (GgmlType::Q8_0, &[256, 64][..]));
    assert_eq!(
        set.tensor_bytes("blk.0.attn_q.weight").unwrap().len(),
        64 * 8 * 34
    );
    // Copied by the writer, the file comes out byte for byte (the converter's layout is ours).
    let f = &set.files()[0];
    let copy = GgufWriter::copy_of(f, "copy").unwrap().to_bytes().unwrap();
    assert_eq!(copy, &f.buffer[..]);
}

/// Every `*.json` dump in `KDA_GGUF_DUMPS`, checked; split sets (files named `-0000N-of-`)
/// are opened as sets too.
#[test]
fn more_files_match_gguf_py() {
    let Some(dir) = std::env::var_os("KDA_GGUF_DUMPS") else {
        eprintln!("KDA_GGUF_DUMPS not set: only the committed fixture is checked");
        return;
    };
    let mut dumps: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    dumps.sort();
    assert!(
        !dumps.is_empty(),
        "no dumps in {}",
        Path::new(&dir).display()
    );
    for d in &dumps {
        let file = check_dump(d);
        let set = GgufSet::open(&file).unwrap_or_else(|e| panic!("{e}"));
        let split = file.to_string_lossy().contains("-of-");
        eprintln!(
            "{}: {} keys, {} tensors{}",
            file.display(),
            set.files()[0].metadata().len(),
            set.len(),
            if split {
                format!(" in a set of {}", set.files().len())
            } else {
                String::new()
            }
        );
    }
}

/// Small valid files for the `gguf` fuzz target's corpus.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let heads = ArrayBuf::of(&[0i32, 1, 0, 1]);
    let tokens = ArrayBuf::of_strings(&["<s>", "a", "bc"]);
    let data = vec![3u8; 34 * 2];
    let mut w = GgufWriter::new("seed");
    w.add("general.architecture", "kimi-linear").unwrap();
    w.add("kimi-linear.attention.head_count_kv", heads.value())
        .unwrap();
    w.add("tokenizer.ggml.tokens", tokens.value()).unwrap();
    w.add("kimi-linear.rope.freq_base", 10000.0f32).unwrap();
    w.add("general.alignment", 64u32).unwrap();
    w.add_tensor(
        "blk.0.attn_q.weight",
        &[32, 2],
        GgmlType::Q8_0,
        Source::Bytes(&data),
    )
    .unwrap();
    w.add_tensor(
        "blk.0.ssm_a",
        &[1, 2, 1, 1],
        GgmlType::F32,
        Source::Bytes(&data[..8]),
    )
    .unwrap();
    let mut s = GgufWriter::new("seed");
    s.add("split.no", 1u16).unwrap();
    s.add("split.count", 3u16).unwrap();
    s.add("split.tensors.count", 80i32).unwrap();
    s.add_tensor(
        "output_norm.weight",
        &[4],
        GgmlType::F32,
        Source::Bytes(&data[..16]),
    )
    .unwrap();
    vec![
        ("kimi-linear-q8_0", w.to_bytes().unwrap()),
        ("split-2-of-3", s.to_bytes().unwrap()),
    ]
}

#[test]
fn fuzz_seeds() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/gguf");
    let write = std::env::var_os("KDA_WRITE_FUZZ_SEEDS").is_some();
    for (name, bytes) in seeds() {
        let p = dir.join(format!("seed-{name}"));
        if write {
            std::fs::create_dir_all(&dir).unwrap();
            kda_host::fsio::write_bytes(&p, &bytes).unwrap();
        }
        let on_disk = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(
            on_disk,
            bytes,
            "{} is stale: rewrite the seeds",
            p.display()
        );
        GgufFile::parse(name, Buffer::Owned(on_disk)).unwrap();
    }
}

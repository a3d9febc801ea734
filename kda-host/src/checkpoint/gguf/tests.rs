//! Tests of the GGUF reader and writer: round trips, and one test per way a file can be broken,
//! each asserting the words of its error.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::parse::{MAX_ARRAY, MAX_STRING};
use super::split::split_name;
use super::*;
use crate::checkpoint::safetensors::Buffer;

const FILE: &str = "t.gguf";

fn parse(b: &[u8]) -> crate::error::Result<GgufHeader> {
    GgufHeader::parse(b, FILE)
}

/// The error `b` is refused with; every one names the file.
fn err(b: &[u8]) -> String {
    let e = parse(b).expect_err("refused").to_string();
    assert!(e.starts_with("t.gguf: not a valid GGUF file: "), "{e}");
    assert!(!e.contains('\n'), "{e}");
    e
}

fn f32_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect()
}

/// A file with every kind of value and three tensors.
fn sample() -> Vec<u8> {
    let heads = ArrayBuf::of(&[0i32, 1, 0, 1]);
    let tokens = ArrayBuf::of_strings(&["a", "bc", ""]);
    let a = f32_bytes(8);
    let q = vec![7u8; 68];
    let s = 3.5f32.to_le_bytes();
    let mut w = GgufWriter::new(FILE);
    w.add("general.architecture", "kimi-linear").unwrap();
    w.add("kimi-linear.block_count", 4u32).unwrap();
    w.add("kimi-linear.rope.freq_base", 10000.0f32).unwrap();
    w.add("kimi-linear.attention.head_count_kv", heads.value())
        .unwrap();
    w.add("tokenizer.ggml.tokens", tokens.value()).unwrap();
    w.add("flag", true).unwrap();
    w.add("split.no", 0u16).unwrap();
    w.add("i8", -3i8).unwrap();
    w.add("i64", -1i64 << 40).unwrap();
    w.add("f64", f64::NAN).unwrap();
    w.add_tensor("a", &[4, 2], GgmlType::F32, Source::Bytes(&a))
        .unwrap();
    w.add_tensor("q", &[32, 2], GgmlType::Q8_0, Source::Bytes(&q))
        .unwrap();
    w.add_tensor("s", &[], GgmlType::F32, Source::Bytes(&s))
        .unwrap();
    w.to_bytes().unwrap()
}

#[test]
fn round_trip() {
    let b = sample();
    let h = parse(&b).unwrap();
    assert_eq!((h.version, h.alignment), (3, 32));
    assert_eq!(h.data_start % 32, 0);
    let m = h.metadata(&b);
    assert_eq!(m.len(), 10);
    assert_eq!(m.get_str("general.architecture").unwrap(), "kimi-linear");
    assert_eq!(m.get_u32("kimi-linear.block_count").unwrap(), 4);
    assert_eq!(m.get_f32("kimi-linear.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(
        m.get_array_i32("kimi-linear.attention.head_count_kv")
            .unwrap(),
        [0, 1, 0, 1]
    );
    let tokens = m.get_array("tokenizer.ggml.tokens").unwrap();
    let tokens: Vec<_> = tokens.strings().unwrap().collect();
    assert_eq!(tokens, [&b"a"[..], b"bc", b""]);
    assert!(m.get_bool("flag").unwrap());
    assert_eq!(m.get_u16("split.no").unwrap(), 0);
    assert_eq!(m.value::<i8>("i8").unwrap(), -3);
    assert_eq!(m.value::<i64>("i64").unwrap(), -1 << 40);
    assert!(m.value::<f64>("f64").unwrap().is_nan());
    let keys: Vec<_> = m.iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys[..2],
        ["general.architecture", "kimi-linear.block_count"]
    );
    let names: Vec<_> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "q", "s"]);
    let offsets: Vec<_> = h.tensors.iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 32, 128]);
    let q = h.tensor("q").unwrap();
    assert_eq!(
        (q.ne(), q.ggml_type, q.nbytes()),
        (&[32, 2][..], GgmlType::Q8_0, 68)
    );
    assert_eq!(q.range.start, h.data_start + 32);
    assert_eq!(&b[q.range.clone()], &[7u8; 68][..]);
    assert_eq!(h.tensor("s").unwrap().ne(), &[] as &[u64]);
    assert_eq!(h.tensor("s").unwrap().n_elements(), 1);
    let f = GgufFile::parse(FILE, Buffer::Owned(b.clone())).unwrap();
    assert_eq!(f.tensor_bytes("a").unwrap(), &f32_bytes(8)[..]);
    let e = f.tensor_bytes("nope").unwrap_err().to_string();
    assert_eq!(e, "t.gguf: missing tensor `nope`");
    // A copy is the same file, byte for byte.
    let copy = GgufWriter::copy_of(&f, FILE).unwrap().to_bytes().unwrap();
    assert_eq!(copy, b);
}

#[test]
fn alignment_key_sets_the_layout() {
    let a = f32_bytes(3);
    let mut w = GgufWriter::new(FILE);
    w.add("general.alignment", 64u32).unwrap();
    w.add_tensor("a", &[3], GgmlType::F32, Source::Bytes(&a))
        .unwrap();
    w.add_tensor("b", &[3], GgmlType::F32, Source::Bytes(&a))
        .unwrap();
    assert_eq!(w.alignment(), 64);
    let b = w.to_bytes().unwrap();
    let h = parse(&b).unwrap();
    assert_eq!(h.alignment, 64);
    assert_eq!(h.data_start % 64, 0);
    assert_eq!(h.tensors[1].offset, 64);
}

#[test]
fn no_tensors_means_no_padding_needed() {
    let mut w = GgufWriter::new(FILE);
    w.add("k", 1u8).unwrap();
    let b = w.to_bytes().unwrap();
    let end = 24 + 8 + 1 + 4 + 1;
    // As in llama.cpp: without tensors the data section starts right after the metadata.
    let h = parse(&b[..end]).unwrap();
    assert_eq!((h.data_start, h.tensors.len()), (end, 0));
    assert!(parse(&b).is_ok());
}

#[test]
fn streamed_sources_are_counted() {
    let mut w = GgufWriter::new(FILE);
    let src = Source::Stream(Box::new(|o: &mut dyn std::io::Write| o.write_all(&[1; 8])));
    w.add_tensor("a", &[2], GgmlType::F32, src).unwrap();
    let b = w.to_bytes().unwrap();
    assert_eq!(&b[parse(&b).unwrap().tensors[0].range.clone()], &[1; 8]);
    let mut w = GgufWriter::new(FILE);
    let src = Source::Stream(Box::new(|o: &mut dyn std::io::Write| o.write_all(&[1; 7])));
    w.add_tensor("a", &[2], GgmlType::F32, src).unwrap();
    let e = w.to_bytes().unwrap_err().to_string();
    assert_eq!(
        e,
        "t.gguf: tensor `a`: its source wrote 7 bytes, its shape needs 8"
    );
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kda-gguf-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn files_are_written_atomically_and_mapped() {
    let d = tmpdir("file");
    let p = d.join("m.gguf");
    let a = f32_bytes(4);
    let mut w = GgufWriter::new(p.display().to_string());
    w.add("general.architecture", "x").unwrap();
    w.add_tensor("a", &[4], GgmlType::F32, Source::Bytes(&a))
        .unwrap();
    w.write_file(&p).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert!(matches!(f.buffer, Buffer::Mapped(_)));
    assert_eq!(f.tensor_bytes("a").unwrap(), &a[..]);
    assert_eq!(f.metadata().get_str("general.architecture").unwrap(), "x");
    let leftovers = std::fs::read_dir(&d).unwrap().count();
    assert_eq!(leftovers, 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_large_token_array_is_read_in_place() {
    let tokens: Vec<String> = (0..160_000).map(|i| format!("tok{i}")).collect();
    let tokens = ArrayBuf::of_strings(&tokens);
    let types = ArrayBuf::of(&vec![1i32; 160_000]);
    let mut w = GgufWriter::new(FILE);
    w.add("tokenizer.ggml.tokens", tokens.value()).unwrap();
    w.add("tokenizer.ggml.token_type", types.value()).unwrap();
    let b = w.to_bytes().unwrap();
    let t = Instant::now();
    let h = parse(&b).unwrap();
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let m = h.metadata(&b);
    let a = m.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(a.len(), 160_000);
    assert_eq!(a.strings().unwrap().nth(123_456), Some(&b"tok123456"[..]));
    let types = m.get_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.values::<i32>().unwrap().len(), 160_000);
    assert!(types.values::<u32>().is_none());
    assert!(types.values::<i32>().unwrap().all(|v| v == 1));
}

#[test]
fn every_truncation_is_an_error() {
    let b = sample();
    let h = parse(&b).unwrap();
    let end = h.tensors.last().unwrap().range.end;
    for n in 0..b.len() {
        match parse(&b[..n]) {
            Err(e) => assert!(n < end, "cut at {n}: {e}"),
            // Only the zero padding after the last tensor may be cut.
            Ok(_) => assert!(n >= end, "cut at {n} parsed"),
        }
    }
}

/// The offset of the first occurrence of `needle` in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len())
        .position(|w| w == needle)
        .expect("present")
}

#[test]
fn truncated_at_section_boundaries() {
    let b = sample();
    let h = parse(&b).unwrap();
    let first_key = 24;
    // The name of tensor `a`, then its 2 dimensions, the first 4.
    let infos = find(&b, b"a\x02\0\0\0\x04\0\0\0\0\0\0\0") - 8;
    let cases = [
        (0, "truncated at 0x0: the magic \"GGUF\" needs 4 bytes, 0 remain"),
        (3, "truncated at 0x0: the magic \"GGUF\" needs 4 bytes, 3 remain"),
        (4, "truncated at 0x4: the version needs 4 bytes"),
        (8, "truncated at 0x8: the tensor count needs 8 bytes"),
        (16, "truncated at 0x10: the metadata key count needs 8 bytes"),
        (first_key, "declares 10 metadata keys and 3 tensors, which need at least 212 bytes, but only 0 follow"),
        (infos, "truncated at"),
        (infos + 9, "the dimension count of tensor `a` needs 4 bytes"),
        (infos + 13, "dimension 0 of tensor `a` needs 8 bytes"),
        (h.data_start - 1, "the data section would start at"),
        (h.data_start, "tensor `a`: data"),
        (h.data_start + 40, "tensor `q`: data 0x"),
    ];
    for (n, want) in cases {
        let e = err(&b[..n]);
        assert!(e.contains(want), "cut at {n}: {e}");
    }
    let e = err(&b[..infos]);
    assert!(
        e.contains("the length of the name of tensor 0 needs 8 bytes, 0 remain"),
        "{e}"
    );
    // Cut inside the metadata, far enough in for the counts to fit what remains.
    let flag = find(&b, b"flag") + 4 + 4;
    let e = err(&b[..flag]);
    assert!(
        e.contains(&format!(
            "truncated at 0x{flag:x}: the value of key `flag` needs 1 bytes, 0 remain"
        )),
        "{e}"
    );
    let e = err(&b[..flag - 2]);
    assert!(
        e.contains("the type of key `flag` needs 4 bytes, 2 remain"),
        "{e}"
    );
    let tokens = find(&b, b"tokenizer.ggml.tokens") + 21 + 4 + 4 + 8;
    let e = err(&b[..tokens + 12]);
    assert!(
        e.contains("key `tokenizer.ggml.tokens` is an array of 3 STRING, which needs at least 24 bytes, but 12 remain"),
        "{e}"
    );
    let e = err(&b[..tokens + 25]);
    assert!(
        e.contains("the length of string 2 of key `tokenizer.ggml.tokens` needs 8 bytes, 6 remain"),
        "{e}"
    );
    let e = err(&b[..tokens - 4]);
    assert!(
        e.contains("the element count of key `tokenizer.ggml.tokens` needs 8 bytes, 4 remain"),
        "{e}"
    );
    let e = err(&b[..h.data_start]);
    assert!(
        e.contains(&format!(
            "tensor `a`: data 0x{:x}..0x{:x} runs past the end of the file (0x{:x} bytes)",
            h.data_start,
            h.data_start + 32,
            h.data_start
        )),
        "{e}"
    );
}

/// Hand-assembled files, for what the writer refuses to write.
struct Raw(Vec<u8>);

impl Raw {
    fn new(n_tensors: u64, n_kv: u64) -> Self {
        Raw(b"GGUF".to_vec()).u32(3).u64(n_tensors).u64(n_kv)
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(self, s: &[u8]) -> Self {
        self.u64(s.len() as u64).bytes(s)
    }
    fn kv_u32(self, key: &str, v: u32) -> Self {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn info(self, name: &[u8], ne: &[u64], ty: u32, offset: u64) -> Self {
        let mut r = self.str(name).u32(ne.len() as u32);
        for &n in ne {
            r = r.u64(n);
        }
        r.u32(ty).u64(offset)
    }
    /// Zero padding to a multiple of `a`, then `n` data bytes.
    fn data(mut self, a: usize, n: usize) -> Vec<u8> {
        let pad = self.0.len().next_multiple_of(a) - self.0.len();
        self.0.resize(self.0.len() + pad + n, 0);
        self.0
    }
}

#[test]
fn raw_builder_matches_the_writer() {
    let a = vec![0u8; 16];
    let mut w = GgufWriter::new(FILE);
    w.add("k", 5u32).unwrap();
    w.add_tensor("a", &[4], GgmlType::F32, Source::Bytes(&a))
        .unwrap();
    let raw = Raw::new(1, 1)
        .kv_u32("k", 5)
        .info(b"a", &[4], 0, 0)
        .data(32, 32);
    assert_eq!(w.to_bytes().unwrap(), raw);
}

#[test]
fn magic_and_versions() {
    let ok = Raw::new(0, 0).data(1, 0);
    assert!(parse(&ok).is_ok());
    let mut b = ok.clone();
    b[..4].copy_from_slice(b"GGML");
    assert!(err(&b).contains("the file starts with \"GGML\" ([47, 47, 4d, 4c]), not the magic"));
    let with = |v: u32| {
        let mut b = ok.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        b
    };
    assert_eq!(parse(&with(2)).unwrap().version, 2);
    assert!(err(&with(0)).contains("version 0 is not a GGUF version"));
    assert!(err(&with(1)).contains("version 1 is no longer supported"));
    assert!(err(&with(4)).contains("version 4 is newer than the versions supported"));
    let e = err(&with(0x0300_0000));
    assert!(
        e.contains("version 0x03000000 reads as byte-swapped: a big-endian GGUF file"),
        "{e}"
    );
    // A whole big-endian file: the version is the first thing that gives it away.
    let mut be = b"GGUF".to_vec();
    be.extend_from_slice(&3u32.to_be_bytes());
    be.extend_from_slice(&0u64.to_be_bytes());
    be.extend_from_slice(&0u64.to_be_bytes());
    assert!(err(&be).contains("big-endian"));
}

#[test]
fn offsets_past_the_end_gaps_and_overlaps() {
    let past = Raw::new(1, 0).info(b"w", &[1024], 0, 0).data(32, 64);
    let e = err(&past);
    assert!(
        e.contains("tensor `w`: data 0x40..0x1040 runs past the end of the file (0x80 bytes)"),
        "{e}"
    );
    let two = |off_b: u64| {
        Raw::new(2, 0)
            .info(b"a", &[4], 0, 0)
            .info(b"b", &[4], 0, off_b)
    };
    assert!(parse(&two(32).data(32, 64)).is_ok());
    let e = err(&two(64).data(32, 128));
    assert!(e.contains("tensor `b` has offset 64, expected 32"), "{e}");
    let e = err(&two(0).data(32, 64));
    assert!(e.contains("tensor `b` has offset 0, expected 32"), "{e}");
    let e = err(&two(16).data(32, 64));
    assert!(e.contains("tensor `b` has offset 16, expected 32"), "{e}");
    let e = err(&two(u64::MAX).data(32, 64));
    assert!(
        e.contains(&format!("has offset {}, expected 32", u64::MAX)),
        "{e}"
    );
    let first = Raw::new(1, 0).info(b"a", &[4], 0, 32).data(32, 64);
    assert!(err(&first).contains("tensor `a` has offset 32, expected 0"));
}

#[test]
fn misaligned_data_start() {
    // The data written right after the infos, without the padding: the reader looks for it
    // at the next multiple of 32, where it does not fit.
    let infos = Raw::new(1, 0).info(b"a", &[4], 0, 0);
    let end = infos.0.len();
    assert_ne!(end % 32, 0);
    let unpadded = infos.data(1, 16);
    let e = err(&unpadded);
    assert!(
        e.contains("tensor `a`: data 0x40..0x50 runs past the end of the file (0x49 bytes)"),
        "{e}"
    );
    // With an alignment of 64 the data must start at 128, not at 96.
    let r = Raw::new(1, 1)
        .kv_u32("general.alignment", 64)
        .info(b"a", &[4], 0, 0);
    assert_eq!(r.0.len(), 90);
    let e = err(&r.data(32, 16));
    assert!(
        e.contains(
            "the data section would start at 0x80 (the end of the tensor infos, 0x5a, padded to \
             64), past the end of the file (0x70 bytes)"
        ),
        "{e}"
    );
}

#[test]
fn type_ids() {
    let with = |ty: u32, ne: &[u64]| Raw::new(1, 0).info(b"w", ne, ty, 0).data(32, 256);
    for id in [4, 5, 31, 32, 33, 36, 37, 38] {
        let e = err(&with(id, &[256]));
        assert!(e.contains(&format!("tensor `w`: type id {id} (")), "{e}");
        assert!(e.contains("has been removed from ggml"), "{e}");
    }
    let e = err(&with(43, &[1]));
    assert!(
        e.contains("tensor `w`: unknown ggml type id 43 (ids are below 43)"),
        "{e}"
    );
    assert!(err(&with(u32::MAX, &[1])).contains("unknown ggml type id 4294967295"));
    let e = err(&with(12, &[128]));
    assert!(
        e.contains(
            "tensor `w`: type Q4_K stores blocks of 256 elements, but rows (ne[0]) have 128"
        ),
        "{e}"
    );
    assert!(err(&with(8, &[40])).contains("type Q8_0 stores blocks of 32 elements"));
    assert!(parse(&with(8, &[64, 2])).is_ok());
}

#[test]
fn shapes() {
    let with = |ne: &[u64]| Raw::new(1, 0).info(b"w", ne, 24, 0).data(32, 64);
    let e = err(&with(&[1, 1, 1, 1, 1]));
    assert!(
        e.contains("tensor `w` has 5 dimensions; at most 4 are allowed"),
        "{e}"
    );
    let e = err(&with(&[2, 1 << 63]));
    assert!(
        e.contains("tensor `w`: dimension 1 has 9223372036854775808 elements"),
        "{e}"
    );
    let e = err(&with(&[1 << 32, 1 << 31]));
    assert!(
        e.contains("tensor `w`: shape [4294967296, 2147483648] has more elements than an int64"),
        "{e}"
    );
    // Zero elements: no bytes.
    let h = parse(&with(&[0, 1 << 62])).unwrap();
    assert_eq!(h.tensors[0].nbytes(), 0);
    let h = parse(&with(&[])).unwrap();
    assert_eq!(h.tensors[0].nbytes(), 1);
}

#[test]
fn absurd_counts_fail_before_allocating() {
    let t = Instant::now();
    let e = err(&Raw::new(0, 1 << 62).data(1, 100));
    assert!(
        e.contains("declares 4611686018427387904 metadata keys and 0 tensors"),
        "{e}"
    );
    let e = err(&Raw::new(1 << 62, 0).data(1, 100));
    assert!(
        e.contains("declares 0 metadata keys and 4611686018427387904 tensors"),
        "{e}"
    );
    let e = err(&Raw::new(1 << 63, 0).data(1, 100));
    assert!(
        e.contains("the tensor count is 9223372036854775808, more than an int64 holds"),
        "{e}"
    );
    let e = err(&Raw::new(0, 1).u64(1 << 60).data(1, 64));
    assert!(
        e.contains("key 0 is 1152921504606846976 bytes long, more than the 1073741824 allowed"),
        "{e}"
    );
    let e = err(&Raw::new(0, 1).u64(MAX_STRING).data(1, 64));
    assert!(e.contains("key 0 needs 1073741824 bytes, 64 remain"), "{e}");
    let string_value = Raw::new(0, 1).str(b"k").u32(8).u64(1 << 60).data(1, 64);
    assert!(err(&string_value).contains("the value of key `k` is 1152921504606846976 bytes long"));
    let array = |elem: u32, n: u64| Raw::new(0, 1).str(b"k").u32(9).u32(elem).u64(n).data(1, 64);
    let e = err(&array(0, 1 << 40));
    assert!(
        e.contains(
            "key `k` is an array of 1099511627776 elements, more than the 1073741824 allowed"
        ),
        "{e}"
    );
    let e = err(&array(10, MAX_ARRAY));
    assert!(
        e.contains("key `k` is an array of 1073741824 UINT64, which needs at least 8589934592 bytes, but 64 remain"),
        "{e}"
    );
    let e = err(&array(8, MAX_ARRAY));
    assert!(
        e.contains("1073741824 STRING, which needs at least 8589934592 bytes"),
        "{e}"
    );
    // Within the bytes, but one string's length is not.
    let e = err(&Raw::new(0, 1)
        .str(b"k")
        .u32(9)
        .u32(8)
        .u64(2)
        .u64(1 << 40)
        .data(1, 64));
    assert!(
        e.contains("string 0 of key `k` is 1099511627776 bytes long"),
        "{e}"
    );
    let e = err(&Raw::new(1, 0).u64(1 << 60).data(1, 64));
    assert!(
        e.contains("the name of tensor 0 is 1152921504606846976 bytes long"),
        "{e}"
    );
    // Had any of these allocated what it declared, it would have taken far longer, or aborted.
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

#[test]
fn duplicates_and_empty_keys() {
    let e = err(&Raw::new(0, 2).kv_u32("a", 1).kv_u32("a", 2).data(1, 0));
    assert!(e.contains("key `a` appears twice"), "{e}");
    let e = err(&Raw::new(0, 1).kv_u32("", 1).data(1, 0));
    assert!(e.contains("key 0 is empty"), "{e}");
    let dup = Raw::new(2, 0)
        .info(b"w", &[4], 0, 0)
        .info(b"w", &[4], 0, 32)
        .data(32, 64);
    assert!(err(&dup).contains("tensor `w` appears twice"));
}

#[test]
fn value_types_and_nested_arrays() {
    let e = err(&Raw::new(0, 1).str(b"k").u32(13).u32(0).data(1, 0));
    assert!(e.contains("key `k` has unknown value type 13"), "{e}");
    let e = err(&Raw::new(0, 1).str(b"k").u32(9).u32(99).u64(0).data(1, 0));
    assert!(e.contains("key `k` has unknown value type 99"), "{e}");
    let nested = Raw::new(0, 1)
        .str(b"k")
        .u32(9)
        .u32(9)
        .u64(1)
        .u32(0)
        .u64(1)
        .bytes(&[1]);
    let e = err(&nested.data(1, 0));
    assert!(
        e.contains("key `k` is an array of arrays, which llama.cpp does not accept"),
        "{e}"
    );
    // Empty arrays are accepted, as llama.cpp does.
    let empty = Raw::new(0, 1).str(b"k").u32(9).u32(5).u64(0).data(1, 0);
    let h = parse(&empty).unwrap();
    assert!(h.metadata(&empty).get_array("k").unwrap().is_empty());
    // Any non-zero byte is true.
    let b = Raw::new(0, 1).str(b"k").u32(7).bytes(&[2]).data(1, 0);
    assert!(parse(&b).unwrap().metadata(&b).get_bool("k").unwrap());
}

#[test]
fn utf8_and_name_lengths() {
    let e = err(&Raw::new(0, 1).str(b"k\xff").u32(0).bytes(&[0]).data(1, 0));
    assert!(
        e.contains("key 0 (\"k\u{fffd}\") is not valid UTF-8"),
        "{e}"
    );
    let e = err(&Raw::new(1, 0).info(b"w\xc3", &[4], 0, 0).data(32, 16));
    assert!(
        e.contains("the name of tensor 0 (\"w\u{fffd}\") is not valid UTF-8"),
        "{e}"
    );
    let long = [b'n'; 64];
    let e = err(&Raw::new(1, 0).info(&long, &[4], 0, 0).data(32, 16));
    assert!(
        e.contains("is 64 bytes long; at most 63 are allowed"),
        "{e}"
    );
    assert!(parse(&Raw::new(1, 0).info(&long[..63], &[4], 0, 0).data(32, 16)).is_ok());
    // Control characters in names are escaped: the message stays one line.
    let dup = Raw::new(2, 0)
        .info(b"a\nb", &[4], 0, 0)
        .info(b"a\nb", &[4], 0, 32);
    assert!(err(&dup.data(32, 64)).contains("tensor `a\\nb` appears twice"));
    // String values are bytes; UTF-8 is checked only when one is read as text.
    let b = Raw::new(0, 1).str(b"k").u32(8).str(b"\xff").data(1, 0);
    let h = parse(&b).unwrap();
    let e = h.metadata(&b).get_str("k").unwrap_err().to_string();
    assert_eq!(
        e,
        "t.gguf: not a valid GGUF file: key `k` is not valid UTF-8 (at byte 0)"
    );
}

#[test]
fn alignment_key() {
    let with = |ty: u32, v: &[u8]| {
        Raw::new(1, 1)
            .str(b"general.alignment")
            .u32(ty)
            .bytes(v)
            .info(b"a", &[4], 0, 0)
            .data(64, 64)
    };
    assert_eq!(parse(&with(4, &16u32.to_le_bytes())).unwrap().alignment, 16);
    let e = err(&with(5, &64i32.to_le_bytes()));
    assert!(
        e.contains("key `general.alignment` has type INT32, expected UINT32"),
        "{e}"
    );
    let e = err(&with(10, &64u64.to_le_bytes()));
    assert!(e.contains("has type UINT64, expected UINT32"), "{e}");
    assert!(err(&with(4, &48u32.to_le_bytes()))
        .contains("key `general.alignment` is 48, not a power of two"));
    assert!(err(&with(4, &0u32.to_le_bytes())).contains("is 0, not a power of two"));
}

#[test]
fn typed_getters_name_the_key_and_both_types() {
    let u8s = ArrayBuf::of(&[1u8, 0, 2]);
    let big = ArrayBuf::of(&[1u32, u32::MAX]);
    let floats = ArrayBuf::of(&[1.0f32]);
    let bools = ArrayBuf::of(&[true, false]);
    let mut w = GgufWriter::new(FILE);
    w.add("u16", 7u16).unwrap();
    w.add("u8s", u8s.value()).unwrap();
    w.add("big", big.value()).unwrap();
    w.add("floats", floats.value()).unwrap();
    w.add("bools", bools.value()).unwrap();
    let b = w.to_bytes().unwrap();
    let h = parse(&b).unwrap();
    let m = h.metadata(&b);
    fn e<T: std::fmt::Debug>(r: crate::error::Result<T>) -> String {
        r.unwrap_err().to_string()
    }
    let p = "t.gguf: not a valid GGUF file: ";
    assert_eq!(
        e(m.get_u32("u16")),
        format!("{p}key `u16` has type UINT16, expected UINT32")
    );
    assert_eq!(e(m.get_u32("none")), format!("{p}missing key `none`"));
    assert_eq!(
        e(m.get_str("u8s")),
        format!("{p}key `u8s` has type ARRAY of UINT8, expected STRING")
    );
    assert_eq!(
        e(m.get_array("u16")),
        format!("{p}key `u16` has type UINT16, expected ARRAY")
    );
    assert_eq!(m.get_array_i32("u8s").unwrap(), [1, 0, 2]);
    assert_eq!(m.get_array_u32("big").unwrap(), [1, u32::MAX]);
    assert_eq!(
        e(m.get_array_i32("big")),
        format!("{p}key `big` element 1 is 4294967295, which does not fit in i32")
    );
    assert_eq!(
        e(m.get_array_i32("floats")),
        format!("{p}key `floats` has type ARRAY of FLOAT32, expected an array of integers (i32)")
    );
    assert_eq!(m.get_array_u32("bools").unwrap(), [1, 0]);
    assert_eq!(m.opt::<u16>("u16").unwrap(), Some(7));
    assert_eq!(m.opt::<u16>("none").unwrap(), None);
    assert!(m.contains("u16") && !m.contains("none"));
    let items: Vec<_> = m.get_array("u8s").unwrap().iter().collect();
    assert_eq!(items, [Value::U8(1), Value::U8(0), Value::U8(2)]);
}

#[test]
fn the_writer_refuses_what_the_parser_refuses() {
    let mut w = GgufWriter::new(FILE);
    let e = |r: crate::error::Result<()>| r.unwrap_err().to_string();
    let p = "t.gguf: not a valid GGUF file: ";
    w.add("a", 1u8).unwrap();
    assert_eq!(e(w.add("a", 2u8)), format!("{p}key `a` appears twice"));
    assert_eq!(e(w.add("", 2u8)), format!("{p}key 1 is empty"));
    assert_eq!(
        e(w.add("general.alignment", 64i32)),
        format!("{p}key `general.alignment` has type INT32, expected UINT32")
    );
    assert_eq!(
        e(w.add("general.alignment", 3u32)),
        format!("{p}key `general.alignment` is 3, not a power of two")
    );
    let d = [0u8; 16];
    let long = "n".repeat(64);
    assert!(e(w.add_tensor(&long, &[4], GgmlType::F32, Source::Bytes(&d))).contains("at most 63"));
    let five = [1, 1, 1, 1, 4];
    assert!(e(w.add_tensor("x", &five, GgmlType::F32, Source::Bytes(&d))).contains("5 dimensions"));
    assert!(
        e(w.add_tensor("x", &[16], GgmlType::Q8_0, Source::Bytes(&d))).contains("blocks of 32")
    );
    assert_eq!(
        e(w.add_tensor("x", &[3], GgmlType::F32, Source::Bytes(&d))),
        format!("{p}tensor `x`: 16 bytes given, its shape [3] of type F32 needs 12")
    );
    w.add_tensor("x", &[4], GgmlType::F32, Source::Bytes(&d))
        .unwrap();
    assert_eq!(
        e(w.add_tensor("x", &[4], GgmlType::F32, Source::Bytes(&d))),
        format!("{p}tensor `x` appears twice")
    );
    let huge = [1 << 62, 1];
    let e2 = e(w.add_tensor("y", &huge, GgmlType::F64, Source::Bytes(&d)));
    assert!(e2.contains("more bytes than a u64 holds"), "{e2}");
    let b = w.to_bytes().unwrap();
    assert_eq!(parse(&b).unwrap().tensors.len(), 1);
}

#[test]
fn rewriting_a_parsed_file_gives_the_same_file() {
    // What the fuzz target checks, on a file with a bool byte that is not 0 or 1.
    let b = Raw::new(1, 2)
        .str(b"b")
        .u32(7)
        .bytes(&[5])
        .kv_u32("general.alignment", 16)
        .info(b"w", &[2], 1, 0)
        .data(16, 16);
    let f = GgufFile::parse(FILE, Buffer::Owned(b)).unwrap();
    let again = GgufWriter::copy_of(&f, FILE).unwrap().to_bytes().unwrap();
    let g = GgufFile::parse(FILE, Buffer::Owned(again)).unwrap();
    assert_eq!(f.tensors(), g.tensors());
    assert!(f.metadata().iter().eq(g.metadata().iter()));
}

/// Writes a split set of `files.len()` files under `dir`, named `m-0000i-of-0000n.gguf`; each
/// file gets `split.no = no[i]` and its tensors (4-element F32).
fn write_set(dir: &Path, files: &[&[&str]], no: &[u16], count: &[u16], total: i32) -> Vec<PathBuf> {
    let data = f32_bytes(4);
    let n = files.len() as u16;
    let mut paths = Vec::new();
    for (i, names) in files.iter().enumerate() {
        let p = dir.join(split_name("m", i as u16, n));
        let mut w = GgufWriter::new(p.display().to_string());
        if i == 0 {
            w.add("general.architecture", "kimi-linear").unwrap();
        }
        w.add("split.no", no[i]).unwrap();
        w.add("split.count", count[i]).unwrap();
        w.add("split.tensors.count", total).unwrap();
        for t in *names {
            w.add_tensor(t, &[4], GgmlType::F32, Source::Bytes(&data))
                .unwrap();
        }
        w.write_file(&p).unwrap();
        paths.push(p);
    }
    paths
}

const SET: [&[&str]; 3] = [&["a", "b"], &["c"], &["d"]];

#[test]
fn split_sets() {
    let d = tmpdir("split");
    let paths = write_set(&d, &SET, &[0, 1, 2], &[3, 3, 3], 4);
    assert!(paths[1].ends_with("m-00002-of-00003.gguf"));
    for p in &paths {
        let set = GgufSet::open(p).unwrap();
        assert_eq!((set.files().len(), set.len()), (3, 4));
        assert_eq!(
            set.metadata().get_str("general.architecture").unwrap(),
            "kimi-linear"
        );
        let (f, t) = set.tensor("c").unwrap();
        assert_eq!((f.name.as_str(), t.offset), (paths[1].to_str().unwrap(), 0));
        assert_eq!(set.tensor_bytes("d").unwrap(), &f32_bytes(4)[..]);
        let names: Vec<_> = set.tensors().map(|(_, t)| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        let e = set.tensor("z").unwrap_err().to_string();
        assert!(
            e.ends_with("missing tensor `z` (nor in the other 2 files of its split set)"),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_single_file_is_a_set_of_one() {
    let d = tmpdir("single");
    let p = d.join("model.gguf");
    std::fs::write(&p, sample()).unwrap();
    let set = GgufSet::open(&p).unwrap();
    assert_eq!((set.files().len(), set.len()), (1, 3));
    let e = set.tensor("z").unwrap_err().to_string();
    assert!(e.ends_with("model.gguf: missing tensor `z`"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_missing_split_file() {
    let d = tmpdir("missing");
    let paths = write_set(&d, &SET, &[0, 1, 2], &[3, 3, 3], 4);
    std::fs::remove_file(&paths[1]).unwrap();
    let e = GgufSet::open(&paths[0]).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "{}: is missing: it is file 2 of the split set of 3 that {} belongs to",
            paths[1].display(),
            paths[0].display()
        )
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_wrong_split_number() {
    let d = tmpdir("wrongno");
    let paths = write_set(&d, &SET, &[0, 2, 2], &[3, 3, 3], 4);
    let e = GgufSet::open(&paths[0]).unwrap_err().to_string();
    let want =
        "not a valid GGUF file: key `split.no` is 2, but the file is number 1 (0-based) of its set";
    assert!(
        e.starts_with(&paths[1].display().to_string()) && e.ends_with(want),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_tensor_in_two_split_files() {
    let d = tmpdir("dup");
    let paths = write_set(
        &d,
        &[&["a", "b"], &["b"], &["d"]],
        &[0, 1, 2],
        &[3, 3, 3],
        4,
    );
    let e = GgufSet::open(&paths[2]).unwrap_err().to_string();
    let want = format!("tensor `b` is also in {}", paths[0].display());
    assert!(
        e.starts_with(&paths[1].display().to_string()) && e.ends_with(&want),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_wrong_split_total_or_count() {
    let d = tmpdir("total");
    let paths = write_set(&d, &SET, &[0, 1, 2], &[3, 3, 3], 5);
    let e = GgufSet::open(&paths[0]).unwrap_err().to_string();
    assert!(
        e.ends_with("key `split.tensors.count` is 5, but the files of the set hold 4 tensors"),
        "{e}"
    );
    let paths = write_set(&d, &SET, &[0, 1, 2], &[3, 4, 3], 4);
    let e = GgufSet::open(&paths[0]).unwrap_err().to_string();
    let want = format!("key `split.count` is 4, but {} says 3", paths[0].display());
    assert!(e.ends_with(&want), "{e}");
    // A split file whose name does not follow the rule.
    let odd = d.join("renamed.gguf");
    std::fs::copy(&paths[0], &odd).unwrap();
    let e = GgufSet::open(&odd).unwrap_err().to_string();
    assert!(
        e.ends_with("as file 1 of a split set of 3 its name must end in `-00001-of-00003.gguf`"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

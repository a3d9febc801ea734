//! The ggml tensor types a GGUF file may name (id, name, block size, bytes per block), the byte
//! size of a tensor from its shape, and the GGUF metadata value types.
//!
//! Block sizes and bytes per block are those of ggml's type table and gguf-py's
//! `GGML_QUANT_SIZES` (llama.cpp commit 0c1e570). Ids 4, 5, 31–33 and 36–38 once named types
//! that ggml has since removed (block size 0 in its table); a file naming them is refused, as
//! llama.cpp refuses it.

/// Elements per block of the K-quants (`QK_K`).
const QK_K: u64 = 256;

macro_rules! ggml_types {
    ($($(#[$doc:meta])* $v:ident = $id:literal, $name:literal, $blck:expr, $size:expr;)*) => {
        /// A ggml tensor type: how the elements of a tensor are stored.
        ///
        /// Variant names follow ggml's (`Q4_K`, not `Q4K`), so that they read as in llama.cpp.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum GgmlType {
            $($(#[$doc])* $v = $id,)*
        }

        impl GgmlType {
            /// Every type a file may hold, by id.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$v),*];

            fn known(id: u32) -> Option<Self> {
                match id {
                    $($id => Some(GgmlType::$v),)*
                    _ => None,
                }
            }

            /// The name gguf-py gives it (`F32`, `BF16`, `Q4_K`, …).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$v => $name,)*
                }
            }

            /// Elements per block (1 for the plain number types).
            pub fn block_size(self) -> u64 {
                match self {
                    $(GgmlType::$v => $blck,)*
                }
            }

            /// Bytes per block.
            pub fn type_size(self) -> u64 {
                match self {
                    $(GgmlType::$v => $size,)*
                }
            }
        }
    };
}

ggml_types! {
    /// IEEE binary32.
    F32 = 0, "F32", 1, 4;
    /// IEEE binary16.
    F16 = 1, "F16", 1, 2;
    /// 4-bit, blocks of 32 with an f16 scale.
    Q4_0 = 2, "Q4_0", 32, 18;
    /// 4-bit, blocks of 32 with an f16 scale and minimum.
    Q4_1 = 3, "Q4_1", 32, 20;
    /// 5-bit, blocks of 32 with an f16 scale.
    Q5_0 = 6, "Q5_0", 32, 22;
    /// 5-bit, blocks of 32 with an f16 scale and minimum.
    Q5_1 = 7, "Q5_1", 32, 24;
    /// 8-bit, blocks of 32 with an f16 scale.
    Q8_0 = 8, "Q8_0", 32, 34;
    /// 8-bit, blocks of 32 with an f16 scale and sum (an activation type).
    Q8_1 = 9, "Q8_1", 32, 36;
    /// 2-bit K-quant.
    Q2_K = 10, "Q2_K", QK_K, 84;
    /// 3-bit K-quant.
    Q3_K = 11, "Q3_K", QK_K, 110;
    /// 4-bit K-quant.
    Q4_K = 12, "Q4_K", QK_K, 144;
    /// 5-bit K-quant.
    Q5_K = 13, "Q5_K", QK_K, 176;
    /// 6-bit K-quant.
    Q6_K = 14, "Q6_K", QK_K, 210;
    /// 8-bit K-quant (an intermediate type).
    Q8_K = 15, "Q8_K", QK_K, 292;
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 66;
    /// i-quant, 2.31 bits per weight.
    IQ2_XS = 17, "IQ2_XS", QK_K, 74;
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 98;
    /// i-quant, 1.56 bits per weight.
    IQ1_S = 19, "IQ1_S", QK_K, 50;
    /// 4-bit non-linear, blocks of 32.
    IQ4_NL = 20, "IQ4_NL", 32, 18;
    /// i-quant, 3.44 bits per weight.
    IQ3_S = 21, "IQ3_S", QK_K, 110;
    /// i-quant, 2.56 bits per weight.
    IQ2_S = 22, "IQ2_S", QK_K, 82;
    /// 4-bit non-linear, blocks of 256.
    IQ4_XS = 23, "IQ4_XS", QK_K, 136;
    /// 8-bit integer.
    I8 = 24, "I8", 1, 1;
    /// 16-bit integer.
    I16 = 25, "I16", 1, 2;
    /// 32-bit integer.
    I32 = 26, "I32", 1, 4;
    /// 64-bit integer.
    I64 = 27, "I64", 1, 8;
    /// IEEE binary64.
    F64 = 28, "F64", 1, 8;
    /// i-quant, 1.75 bits per weight.
    IQ1_M = 29, "IQ1_M", QK_K, 56;
    /// bfloat16.
    BF16 = 30, "BF16", 1, 2;
    /// Ternary, 1.69 bits per weight.
    TQ1_0 = 34, "TQ1_0", QK_K, 54;
    /// Ternary, 2.06 bits per weight.
    TQ2_0 = 35, "TQ2_0", QK_K, 66;
    /// OCP MXFP4: blocks of 32 E2M1 values with an E8M0 scale.
    MXFP4 = 39, "MXFP4", 32, 17;
    /// NVFP4: blocks of 64 E2M1 values with four UE4M3 scales.
    NVFP4 = 40, "NVFP4", 64, 36;
    /// 1-bit, blocks of 128.
    Q1_0 = 41, "Q1_0", 128, 18;
    /// 2-bit, blocks of 64.
    Q2_0 = 42, "Q2_0", 64, 18;
}

/// Ids ggml once used for types it has removed.
const REMOVED: [(u32, &str); 8] = [
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

/// One past the largest type id (`GGML_TYPE_COUNT`).
pub const GGML_TYPE_COUNT: u32 = 43;

impl GgmlType {
    /// The type of id `id`, or why there is none (removed or unknown).
    pub fn from_id(id: u32) -> Result<Self, String> {
        if let Some(t) = Self::known(id) {
            return Ok(t);
        }
        match REMOVED.iter().find(|(r, _)| *r == id) {
            Some((_, name)) => Err(format!(
                "type id {id} ({name}) has been removed from ggml and is not accepted"
            )),
            None => Err(format!(
                "unknown ggml type id {id} (ids are below {GGML_TYPE_COUNT})"
            )),
        }
    }

    /// Its id in files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The byte size of a tensor of this type with dimensions `ne` (`ne[0]` the contiguous
    /// one; at most 4), or why it has none: a dimension above `i64::MAX`, an element count
    /// that overflows `i64` (llama.cpp's limits), a row length that is not a whole number of
    /// blocks, or a byte size that overflows `u64`.
    pub fn tensor_bytes(self, ne: &[u64]) -> Result<u64, String> {
        if let Some((i, n)) = ne.iter().enumerate().find(|(_, &n)| n > i64::MAX as u64) {
            return Err(format!(
                "dimension {i} has {n} elements, more than an int64 holds"
            ));
        }
        let elements = element_count(ne)
            .ok_or_else(|| format!("shape {ne:?} has more elements than an int64 holds"))?;
        let row = ne.first().copied().unwrap_or(1);
        if row % self.block_size() != 0 {
            return Err(format!(
                "type {} stores blocks of {} elements, but rows (ne[0]) have {row}",
                self.name(),
                self.block_size()
            ));
        }
        (elements / self.block_size())
            .checked_mul(self.type_size())
            .ok_or_else(|| {
                format!(
                    "shape {ne:?} of type {} has more bytes than a u64 holds",
                    self.name()
                )
            })
    }
}

/// The product of `ne` (each at most `i64::MAX`), multiplied in order as llama.cpp does: `None`
/// when a partial product would pass `i64::MAX` (so `[0, 2^40, 2^40]` has 0 elements while
/// `[2^40, 2^40, 0]` is refused, as there).
fn element_count(ne: &[u64]) -> Option<u64> {
    let (&first, rest) = ne.split_first().unwrap_or((&1, &[]));
    rest.iter().try_fold(first, |acc, &n| {
        if n > 1 && (i64::MAX as u64) / n < acc {
            None
        } else {
            Some(acc * n)
        }
    })
}

/// The type of a GGUF metadata value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`.
    U8 = 0,
    /// `i8`.
    I8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i16`.
    I16 = 3,
    /// `u32`.
    U32 = 4,
    /// `i32`.
    I32 = 5,
    /// `f32`.
    F32 = 6,
    /// A byte, 0 for false and anything else for true.
    Bool = 7,
    /// A u64 length, then that many bytes (UTF-8 by convention; not checked for values).
    Str = 8,
    /// An element type, a u64 count, then the elements packed.
    Array = 9,
    /// `u64`.
    U64 = 10,
    /// `i64`.
    I64 = 11,
    /// `f64`.
    F64 = 12,
}

impl ValueType {
    /// The type of id `id`, if there is one.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        const BY_ID: [ValueType; 13] = [
            U8, I8, U16, I16, U32, I32, F32, Bool, Str, Array, U64, I64, F64,
        ];
        BY_ID.get(id as usize).copied()
    }

    /// Its id in files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name gguf-py gives it (`UINT32`, `STRING`, …).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            Str => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }

    /// Bytes of one value, for the fixed-size types (not strings and arrays).
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            Str | Array => None,
        }
    }

    /// True for the integer types (not bool).
    pub fn is_integer(self) -> bool {
        use ValueType::*;
        matches!(self, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_refused() {
        for id in 0..GGML_TYPE_COUNT + 5 {
            match GgmlType::from_id(id) {
                Ok(t) => assert_eq!(t.id(), id),
                Err(e) if REMOVED.iter().any(|(r, _)| *r == id) => {
                    assert!(e.contains("removed"), "{e}")
                }
                Err(e) => {
                    assert!(id >= GGML_TYPE_COUNT, "{id}: {e}");
                    assert!(e.contains("unknown ggml type id"), "{e}");
                }
            }
        }
        assert_eq!(
            GgmlType::ALL.len() + REMOVED.len(),
            GGML_TYPE_COUNT as usize
        );
        for id in 0..13 {
            assert_eq!(ValueType::from_id(id).map(ValueType::id), Some(id));
        }
        assert_eq!(ValueType::from_id(13), None);
    }

    #[test]
    fn tensor_bytes() {
        assert_eq!(GgmlType::F32.tensor_bytes(&[256, 2]), Ok(2048));
        assert_eq!(GgmlType::Q8_0.tensor_bytes(&[256, 512]), Ok(139_264));
        assert_eq!(GgmlType::Q4_K.tensor_bytes(&[512, 3, 2]), Ok(2 * 144 * 6));
        assert_eq!(GgmlType::F32.tensor_bytes(&[]), Ok(4));
        assert_eq!(GgmlType::Q4_0.tensor_bytes(&[0, 1 << 62, 1 << 62]), Ok(0));
        assert_eq!(GgmlType::F64.tensor_bytes(&[1 << 62, 0]), Ok(0));
        let e = GgmlType::F32
            .tensor_bytes(&[1 << 40, 1 << 40, 0])
            .unwrap_err();
        assert!(e.contains("more elements than an int64"), "{e}");
        let e = GgmlType::Q4_K.tensor_bytes(&[128, 2]).unwrap_err();
        assert!(e.contains("blocks of 256") && e.contains("128"), "{e}");
        let e = GgmlType::F32.tensor_bytes(&[1 << 32, 1 << 32]).unwrap_err();
        assert!(e.contains("more elements than an int64"), "{e}");
        let e = GgmlType::F64.tensor_bytes(&[1 << 61, 2]).unwrap_err();
        assert!(e.contains("more bytes than a u64"), "{e}");
        let e = GgmlType::I8.tensor_bytes(&[1 << 63]).unwrap_err();
        assert!(e.contains("dimension 0"), "{e}");
    }
}

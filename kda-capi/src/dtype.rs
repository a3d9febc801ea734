//! The `KdaTensor::dtype` values.

/// `KdaTensor::dtype`: IEEE f32 (`float`), 4-byte aligned.
pub const KDA_DTYPE_F32: u32 = 0;
/// `KdaTensor::dtype`: bfloat16 stored as `uint16_t`, 2-byte aligned.
pub const KDA_DTYPE_BF16: u32 = 1;
/// `KdaTensor::dtype`: IEEE f16 stored as `uint16_t`, 2-byte aligned.
pub const KDA_DTYPE_F16: u32 = 2;
/// `KdaTensor::dtype`: symmetric int8 (`int8_t`) with f32 scales (`KdaTensor::scales`): one per
/// row (per output feature; per channel for conv weights).
pub const KDA_DTYPE_I8: u32 = 3;
/// `KdaTensor::dtype` of a GGUF block-quantised matrix: `KDA_DTYPE_GGUF_BASE + t`, `t` the
/// ggml type id (2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K,
/// 14 Q6_K). `data` holds the blocks exactly as a GGUF file stores them (each row a whole
/// number of blocks), `len` is their size in **bytes**, `scales` NULL. Matrices only,
/// row-major.
pub const KDA_DTYPE_GGUF_BASE: u32 = 0x100;
/// `KdaTensor::dtype` of a compressed-tensors `pack-quantized` matrix: `data` points to a
/// [`crate::KdaGroups`] handle initialised by `kda_groups_init` (which, with the data it views, must
/// outlive the layer), `len` is `rows · cols`, `scales` NULL. Matrices only, row-major.
pub const KDA_DTYPE_GROUPS: u32 = 5;

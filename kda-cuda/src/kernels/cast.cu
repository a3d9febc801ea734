// kda-cuda: f32 <-> bf16 conversion of strided row blocks, for GEMM operands whose storage
// format differs from the weights' (e.g. f32 activations with bf16 weights). Needs common.cuh.

struct CastParams {
    const void* src;  // [rows, src_ld]
    void* dst;        // [rows, dst_ld]
    i64 src_ld;
    i64 dst_ld;
    i64 rows;
    i64 cols;
};
KDA_FIELD(CastParams, src, 0);
KDA_FIELD(CastParams, dst, 8);
KDA_FIELD(CastParams, src_ld, 16);
KDA_FIELD(CastParams, dst_ld, 24);
KDA_FIELD(CastParams, rows, 32);
KDA_FIELD(CastParams, cols, 40);
KDA_SIZE(CastParams, 48);

// Grid-stride over rows*cols; round to nearest even.
extern "C" __global__ void kda_cast_f32_to_bf16(const CastParams p) {
    const i64 total = p.rows * p.cols;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const i64 r = i / p.cols, c = i - (i / p.cols) * p.cols;
        ((kda_bf16*)p.dst)[r * p.dst_ld + c] = kda_f32_to_bf16(((const float*)p.src)[r * p.src_ld + c]);
    }
}

// Exact widening.
extern "C" __global__ void kda_cast_bf16_to_f32(const CastParams p) {
    const i64 total = p.rows * p.cols;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const i64 r = i / p.cols, c = i - (i / p.cols) * p.cols;
        ((float*)p.dst)[r * p.dst_ld + c] = kda_bf16_to_f32(((const kda_bf16*)p.src)[r * p.src_ld + c]);
    }
}

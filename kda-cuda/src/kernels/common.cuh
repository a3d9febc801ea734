// kda-cuda: helpers shared by every kernel file.
//
// The kernels are compiled at run time with NVRTC and include NO header at all (not even
// <cuda_bf16.h>), so NVRTC needs no CUDA include directory: bf16 is handled as raw 16-bit
// patterns, and only NVRTC's built-in math (expf, log1pf, sqrtf) and warp intrinsics are used.
//
// Parameter structs: every kernel takes exactly one struct by value. Its layout is mirrored by a
// `#[repr(C)]` struct in src/params.rs; the KDA_FIELD(...) lines below each struct pin every
// field's offset and the total size here (checked by NVRTC at compile time) and are parsed by a
// Rust unit test that compares them with `core::mem::offset_of!` on the Rust side.
//
// Conventions: row-major buffers; `*_ld` is a row stride in elements; indices that can exceed
// 2^31 are 64-bit. Blocks are one-dimensional with a multiple of 32 threads (the reductions
// use full-warp shuffles).

typedef unsigned short kda_bf16;  // raw bfloat16 bits
typedef long long i64;

// Shared memory is declared through these two macros so that the host emulator
// (kda-cuda/tests/emulator) can run the very same source on the CPU with its own definitions.
#ifndef KDA_HOST_EMULATION
#define KDA_DYNAMIC_SMEM(name) extern __shared__ float name[]
#define KDA_SHARED_ARRAY(type, name, n) __shared__ type name[n]
// NVRTC's EDG front end has no offsetof/__builtin_offsetof without headers; __INTADDR__ is its
// constant-folding address builtin, which gives the member offset at compile time.
#define KDA_FIELD(S, f, off) static_assert(__INTADDR__(&((S*)0)->f) == (off), #S "." #f " offset")
#endif
#define KDA_SIZE(S, n) static_assert(sizeof(S) == (n), #S " size")

// Largest key dim for which the delta-rule kernels keep a state column in registers.
#define KDA_REG_K 128

__device__ __forceinline__ float kda_bf16_to_f32(kda_bf16 x) {
    return __uint_as_float(((unsigned int)x) << 16);
}

// Round to nearest even, NaN stays NaN (quietened) -- the same as half::bf16::from_f32.
__device__ __forceinline__ kda_bf16 kda_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (kda_bf16)((u >> 16) | 0x0040u);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (kda_bf16)(u >> 16);
}

// Element i of an activation buffer that is f32 (is_bf16 == 0) or bf16.
__device__ __forceinline__ float kda_load(const void* p, i64 i, int is_bf16) {
    return is_bf16 ? kda_bf16_to_f32(((const kda_bf16*)p)[i]) : ((const float*)p)[i];
}

__device__ __forceinline__ void kda_store(void* p, i64 i, int is_bf16, float v) {
    if (is_bf16) {
        ((kda_bf16*)p)[i] = kda_f32_to_bf16(v);
    } else {
        ((float*)p)[i] = v;
    }
}

// The scalar activations of kda-core's math.rs, in IEEE f32 (no fast-math intrinsics).
__device__ __forceinline__ float kda_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float kda_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float kda_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float kda_rsqrt(float x) { return 1.0f / sqrtf(x); }

__device__ __forceinline__ float kda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum of `v` over the whole block; every thread gets the result. `red` is shared scratch of at
// least 32 floats. Every thread of the block must call it (it contains barriers).
__device__ float kda_block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    v = kda_warp_sum(v);
    __syncthreads();  // earlier readers of red[0] are done
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? red[lane] : 0.0f;
        t = kda_warp_sum(t);
        if (lane == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

// NaN-propagating max (as the CPU's spread fold: a NaN wins).
__device__ __forceinline__ float kda_max_nan(float m, float s) {
    return (s > m || s != s) ? s : m;
}

__device__ float kda_block_max_nan(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int warps = (blockDim.x + 31) >> 5;
    for (int o = 16; o > 0; o >>= 1) v = kda_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < warps ? red[lane] : -3.402823466e38f;
        for (int o = 16; o > 0; o >>= 1) t = kda_max_nan(t, __shfl_xor_sync(0xffffffffu, t, o));
        if (lane == 0) red[0] = t;
    }
    __syncthreads();
    return red[0];
}

// Sequence of token t: the n with cu[n] <= t < cu[n+1] (cu is [N+1], non-decreasing).
__device__ __forceinline__ int kda_seq_of(const int* cu, int n_seq, int t) {
    int lo = 0, hi = n_seq;  // invariant: cu[lo] <= t < cu[hi]
    while (hi - lo > 1) {
        int mid = (lo + hi) >> 1;
        if (cu[mid] <= t) lo = mid; else hi = mid;
    }
    return lo;
}

// One step of a compensated (TwoSum) running sum: (hi, lo) += x.
__device__ __forceinline__ void kda_two_sum_add(float& hi, float& lo, float x) {
    float s = hi + x;
    float bp = s - hi;
    float err = (hi - (s - bp)) + (x - bp);
    hi = s;
    lo = lo + err;
}

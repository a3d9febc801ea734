// kda-cuda: the gated delta rule token by token (kda-core ops/recurrent.rs, spec §2):
//   S <- diag(exp(g)) S ;  p = S^T k ;  S <- S + beta k (v - p)^T ;  o = S^T (scale q)
// State S is [K, V] K-first per (sequence, head), f32, updated in place in device memory.
// Needs common.cuh. The decode kernel (decode.cu) reuses the column steps below.
//
// Work split: one block per (sequence, head); thread e owns state column e (all K rows), so the
// recurrence needs no cross-thread reduction. When K <= KDA_REG_K and V <= blockDim.x the column
// lives in registers for the whole call (one load and one store of the state per call);
// otherwise it is updated in global memory, two passes per token as on the CPU.

// Column e, register path: load, one token, store.
__device__ __forceinline__ void kda_col_load(float (&s)[KDA_REG_K], const float* S, int K, int V, int e) {
#pragma unroll
    for (int d = 0; d < KDA_REG_K; ++d) {
        if (d < K) s[d] = S[(i64)d * V + e];
    }
}

__device__ __forceinline__ void kda_col_store(const float (&s)[KDA_REG_K], float* S, int K, int V, int e) {
#pragma unroll
    for (int d = 0; d < KDA_REG_K; ++d) {
        if (d < K) S[(i64)d * V + e] = s[d];
    }
}

// q_s: L2-normalised q (unscaled), k_s: normalised k, a_s: exp(g); returns o_e.
__device__ __forceinline__ float kda_col_step_reg(float (&s)[KDA_REG_K], const float* q_s, const float* k_s,
                                                  const float* a_s, int K, float v, float beta, float scale) {
    float p = 0.0f;
#pragma unroll
    for (int d = 0; d < KDA_REG_K; ++d) {
        if (d < K) {
            s[d] *= a_s[d];
            p += k_s[d] * s[d];
        }
    }
    const float delta = beta * (v - p);
    float o = 0.0f;
#pragma unroll
    for (int d = 0; d < KDA_REG_K; ++d) {
        if (d < K) {
            s[d] += k_s[d] * delta;
            o += (q_s[d] * scale) * s[d];
        }
    }
    return o;
}

// Same step with the column in global memory (any K, any V).
__device__ __forceinline__ float kda_col_step_global(float* S, int V, int e, const float* q_s, const float* k_s,
                                                     const float* a_s, int K, float v, float beta, float scale) {
    float p = 0.0f;
    for (int d = 0; d < K; ++d) {
        const float x = S[(i64)d * V + e] * a_s[d];
        S[(i64)d * V + e] = x;
        p += k_s[d] * x;
    }
    const float delta = beta * (v - p);
    float o = 0.0f;
    for (int d = 0; d < K; ++d) {
        const float x = S[(i64)d * V + e] + k_s[d] * delta;
        S[(i64)d * V + e] = x;
        o += (q_s[d] * scale) * x;
    }
    return o;
}

struct RecurrentParams {
    const float* qkv;   // conv'd rows: q (normalised) at column 0, k (normalised) at D, v at 2D; stride qkv_ld
    const float* g;     // log-decay [T, H*K] (already through the gate)
    const float* beta;  // [T, H] (already through the sigmoid)
    float* state;       // [N, H, K, V] K-first, in/out
    float* o;           // out [T, o_ld], head h at column h*V
    const int* cu;      // [N+1]
    i64 qkv_ld;
    i64 o_ld;
    int seqs;
    int heads;
    int head_dim;       // K
    int value_dim;      // V
    float scale;
    int pad_;
};
KDA_FIELD(RecurrentParams, qkv, 0);
KDA_FIELD(RecurrentParams, g, 8);
KDA_FIELD(RecurrentParams, beta, 16);
KDA_FIELD(RecurrentParams, state, 24);
KDA_FIELD(RecurrentParams, o, 32);
KDA_FIELD(RecurrentParams, cu, 40);
KDA_FIELD(RecurrentParams, qkv_ld, 48);
KDA_FIELD(RecurrentParams, o_ld, 56);
KDA_FIELD(RecurrentParams, seqs, 64);
KDA_FIELD(RecurrentParams, heads, 68);
KDA_FIELD(RecurrentParams, head_dim, 72);
KDA_FIELD(RecurrentParams, value_dim, 76);
KDA_FIELD(RecurrentParams, scale, 80);
KDA_SIZE(RecurrentParams, 88);

// Grid (N, H), dynamic shared memory 3*K floats. Sequence n's tokens in order.
extern "C" __global__ void __launch_bounds__(256) kda_recurrent(const RecurrentParams p) {
    KDA_DYNAMIC_SMEM(smem);
    const int n = blockIdx.x;
    const int h = blockIdx.y;
    const int K = p.head_dim;
    const int V = p.value_dim;
    const i64 D = (i64)p.heads * K;
    float* q_s = smem;
    float* k_s = smem + K;
    float* a_s = smem + 2 * K;
    float* S = p.state + ((i64)n * p.heads + h) * K * V;
    const int t0 = p.cu[n];
    const int t1 = p.cu[n + 1];
    const bool in_regs = K <= KDA_REG_K && V <= (int)blockDim.x;
    const int e0 = threadIdx.x;
    float s[KDA_REG_K];
    if (in_regs && e0 < V) kda_col_load(s, S, K, V, e0);
    for (int t = t0; t < t1; ++t) {
        const float* row = p.qkv + (i64)t * p.qkv_ld;
        for (int d = threadIdx.x; d < K; d += blockDim.x) {
            q_s[d] = row[(i64)h * K + d];
            k_s[d] = row[D + (i64)h * K + d];
            a_s[d] = expf(p.g[(i64)t * D + (i64)h * K + d]);
        }
        __syncthreads();
        const float beta = p.beta[(i64)t * p.heads + h];
        if (in_regs) {
            if (e0 < V) {
                const float v = row[2 * D + (i64)h * V + e0];
                p.o[(i64)t * p.o_ld + (i64)h * V + e0] = kda_col_step_reg(s, q_s, k_s, a_s, K, v, beta, p.scale);
            }
        } else {
            for (int e = e0; e < V; e += blockDim.x) {
                const float v = row[2 * D + (i64)h * V + e];
                p.o[(i64)t * p.o_ld + (i64)h * V + e] =
                    kda_col_step_global(S, V, e, q_s, k_s, a_s, K, v, beta, p.scale);
            }
        }
        __syncthreads();  // q_s/k_s/a_s are rewritten for the next token
    }
    if (in_regs && e0 < V) kda_col_store(s, S, K, V, e0);
}

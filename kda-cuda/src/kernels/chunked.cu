// kda-cuda: the chunked (WY/UT) delta rule over packed sequences (kda-core ops/chunked.rs,
// spec §5-6). Needs common.cuh.
//
// Per chunk of L <= C tokens of one head, with b_r the chunk-local cumulative log-decay (a
// compensated hi+lo pair, as on the CPU) and S0 the state at the chunk start:
//   A_qk[i,j] = scale * sum_d q_id k_jd e^(b_id - b_jd)        (j <= i)
//   N[i,j]    = -beta_i * sum_d k_id k_jd e^(b_id - b_jd)       (j <  i)
//   M         = (I - N)^-1                      (forward substitution, f32)
//   w = M (beta * k * e^b),  u = M (beta * v)   =>  Delta = u - w S0   (= the CPU's innovations)
//   O         = scale (q * e^b) S0 + A_qk Delta
//   S_next    = diag(e^(b_{L-1})) S0 + (k * e^(b_{L-1} - b))^T Delta
// Two kernels: kda_chunk_intra (parallel over chunks and heads) computes A_qk, M, w, u and the row
// factors; kda_chunk_state (parallel over sequences, heads and 32-column V tiles, sequential
// over a sequence's chunks) runs the state recurrence and writes the outputs.
//
// Exponents: every exponent is a difference of cumulative sums that is <= 0, except on the
// 16-row diagonal blocks of A, which use the block's first row as reference (factors up to
// e^spread) only when the block's decay spread is <= 80, and per-pair exponents otherwise --
// exactly the CPU's rule. So any gate <= 0 (hard resets of -1000, the unbounded softplus gate)
// stays finite.

#define KDA_SUB 16          // rows of the diagonal blocks
#define KDA_MAX_SPREAD 80.0f
#define KDA_VT 32           // V columns per kda_chunk_state block

struct ChunkIntraParams {
    const float* qkv;    // conv'd rows: q (normalised) at column 0, k at D, v at 2D; stride qkv_ld
    const float* g;      // log-decay [T, H*K]
    const float* beta;   // [T, H]
    const int* chunks;   // [n_chunks][2]: first token, length
    float* qg;           // out [T, H*K]: scale * q * e^b
    float* kg;           // out [T, H*K]: k * e^(b_last - b)   (scratch for beta*k*e^b before that)
    float* w;            // out [T, H*K]: M (beta * k * e^b)
    float* u;            // out [T, H*V]: M (beta * v)
    float* aqk;          // out [T, H, C]: row t holds its chunk row of A_qk (zeros past the chunk)
    i64 qkv_ld;
    int n_chunks;
    int heads;
    int head_dim;        // K
    int value_dim;       // V
    int chunk;           // C (multiple of 16, <= 64)
    float scale;
};
KDA_FIELD(ChunkIntraParams, qkv, 0);
KDA_FIELD(ChunkIntraParams, g, 8);
KDA_FIELD(ChunkIntraParams, beta, 16);
KDA_FIELD(ChunkIntraParams, chunks, 24);
KDA_FIELD(ChunkIntraParams, qg, 32);
KDA_FIELD(ChunkIntraParams, kg, 40);
KDA_FIELD(ChunkIntraParams, w, 48);
KDA_FIELD(ChunkIntraParams, u, 56);
KDA_FIELD(ChunkIntraParams, aqk, 64);
KDA_FIELD(ChunkIntraParams, qkv_ld, 72);
KDA_FIELD(ChunkIntraParams, n_chunks, 80);
KDA_FIELD(ChunkIntraParams, heads, 84);
KDA_FIELD(ChunkIntraParams, head_dim, 88);
KDA_FIELD(ChunkIntraParams, value_dim, 92);
KDA_FIELD(ChunkIntraParams, chunk, 96);
KDA_FIELD(ChunkIntraParams, scale, 100);
KDA_SIZE(ChunkIntraParams, 104);

// (b_i - b_j)[d] from the compensated sums, as the CPU's `diff`.
__device__ __forceinline__ float kda_bdiff(const float* bh, const float* bl, int K, int i, int j, int d) {
    return (bh[i * K + d] - bh[j * K + d]) + (bl[i * K + d] - bl[j * K + d]);
}

// Grid (n_chunks, H). Dynamic shared memory, in floats (src/plan.rs mirrors this formula):
//   bh, bl [C*K] | qt, kt, kh [16*(K+1)] | A_qk, N, M [C*C] | beta [C]
extern "C" __global__ void __launch_bounds__(256) kda_chunk_intra(const ChunkIntraParams p) {
    KDA_DYNAMIC_SMEM(smem);
    KDA_SHARED_ARRAY(float, red, 32);
    const int ci = blockIdx.x;
    const int h = blockIdx.y;
    const int K = p.head_dim;
    const int V = p.value_dim;
    const int C = p.chunk;
    const int KP = K + 1;  // padded row stride of the 16-row tiles (conflict-free columns)
    const i64 D = (i64)p.heads * K;
    const i64 DV = (i64)p.heads * V;
    const int c0 = p.chunks[2 * ci];
    const int L = p.chunks[2 * ci + 1];
    const int tid = threadIdx.x;
    const int nt = blockDim.x;

    float* bh = smem;
    float* bl = bh + C * K;
    float* qt = bl + C * K;
    float* kt = qt + KDA_SUB * KP;
    float* kh = kt + KDA_SUB * KP;
    float* a_qk = kh + KDA_SUB * KP;
    float* n_kk = a_qk + C * C;
    float* mm = n_kk + C * C;
    float* beta_s = mm + C * C;

    const float* qrow = p.qkv + (i64)c0 * p.qkv_ld + (i64)h * K;  // q of row r: qrow[r*qkv_ld + d]
    const float* krow = qrow + D;
    const float* vrow = p.qkv + (i64)c0 * p.qkv_ld + 2 * D + (i64)h * V;
#define Q(r, d) qrow[(i64)(r) * p.qkv_ld + (d)]
#define KK(r, d) krow[(i64)(r) * p.qkv_ld + (d)]
#define VV(r, e) vrow[(i64)(r) * p.qkv_ld + (e)]
    const i64 tok = (i64)c0 * D + (i64)h * K;  // (row 0, column 0) of this head in [T, H*K] buffers
#define TK(r, d) (tok + (i64)(r) * D + (d))

    // 1. chunk-local compensated cumulative sums (one thread per key column), beta, zeroed A.
    for (int d = tid; d < K; d += nt) {
        float hi = p.g[TK(0, d)];
        float lo = 0.0f;
        bh[d] = hi;
        bl[d] = lo;
        for (int r = 1; r < L; ++r) {
            kda_two_sum_add(hi, lo, p.g[TK(r, d)]);
            bh[r * K + d] = hi;
            bl[r * K + d] = lo;
        }
    }
    for (int r = tid; r < L; r += nt) beta_s[r] = p.beta[(i64)(c0 + r) * p.heads + h];
    for (int i = tid; i < C * C; i += nt) {
        a_qk[i] = 0.0f;
        n_kk[i] = 0.0f;
    }
    __syncthreads();

    // 2. A_qk and N by 16-row blocks a (rows a0..a1), reference row a0.
    for (int a0 = 0; a0 < L; a0 += KDA_SUB) {
        const int a1 = min(a0 + KDA_SUB, L);
        const int rows = a1 - a0;
        float m = 0.0f;
        for (int d = tid; d < K; d += nt) m = kda_max_nan(m, kda_bdiff(bh, bl, K, a0, a1 - 1, d));
        const float spread = kda_block_max_nan(m, red);
        const bool factorised = spread <= KDA_MAX_SPREAD;  // false for NaN
        for (int idx = tid; idx < rows * K; idx += nt) {
            const int ii = idx / K, d = idx - (idx / K) * K;
            const float f = expf(kda_bdiff(bh, bl, K, a0 + ii, a0, d));  // <= 1
            qt[ii * KP + d] = Q(a0 + ii, d) * f;
            kt[ii * KP + d] = KK(a0 + ii, d) * f;
        }
        // Key blocks: all earlier ones, plus this one when factorised.
        const int j_end = factorised ? a1 : a0;
        for (int j0 = 0; j0 < j_end; j0 += KDA_SUB) {
            const int j1 = min(j0 + KDA_SUB, j_end);
            __syncthreads();  // qt/kt written; the previous kh fully read
            for (int idx = tid; idx < (j1 - j0) * K; idx += nt) {
                const int jj = idx / K, d = idx - (idx / K) * K;
                // e^(b_a0 - b_j): <= 1 for earlier blocks, <= e^spread <= e^80 on the diagonal.
                kh[jj * KP + d] = KK(j0 + jj, d) * expf(kda_bdiff(bh, bl, K, a0, j0 + jj, d));
            }
            __syncthreads();
            for (int e = tid; e < KDA_SUB * KDA_SUB; e += nt) {
                const int ii = e / KDA_SUB, jj = e - (e / KDA_SUB) * KDA_SUB;
                if (ii < rows && j0 + jj < j1) {
                    float sq = 0.0f, sk = 0.0f;
                    for (int d = 0; d < K; ++d) {
                        const float x = kh[jj * KP + d];
                        sq += qt[ii * KP + d] * x;
                        sk += kt[ii * KP + d] * x;
                    }
                    a_qk[(a0 + ii) * C + j0 + jj] = sq;
                    n_kk[(a0 + ii) * C + j0 + jj] = sk;
                }
            }
        }
        if (!factorised) {
            // Per-pair exponents on the diagonal block (each exponent <= 0).
            for (int e = tid; e < KDA_SUB * KDA_SUB; e += nt) {
                const int ii = e / KDA_SUB, jj = e - (e / KDA_SUB) * KDA_SUB;
                const int i = a0 + ii, j = a0 + jj;
                if (ii < rows && j <= i) {
                    float sq = 0.0f, sk = 0.0f;
                    for (int d = 0; d < K; ++d) {
                        const float x = KK(j, d) * expf(kda_bdiff(bh, bl, K, i, j, d));
                        sq += Q(i, d) * x;
                        sk += KK(i, d) * x;
                    }
                    a_qk[i * C + j] = sq;
                    n_kk[i * C + j] = sk;
                }
            }
        }
        __syncthreads();
        // Scale and mask this block's rows: A_qk keeps j <= i (times scale), N keeps j < i (times -beta_i).
        for (int idx = tid; idx < rows * L; idx += nt) {
            const int i = a0 + idx / L, j = idx - (idx / L) * L;
            a_qk[i * C + j] = j <= i ? a_qk[i * C + j] * p.scale : 0.0f;
            n_kk[i * C + j] = j < i ? n_kk[i * C + j] * -beta_s[i] : 0.0f;
        }
        __syncthreads();
    }

    // 3. M = (I - N)^-1 by forward substitution, one thread per column:
    //    M[i][c] = [i == c] + sum_{c <= j < i} N[i][j] M[j][c].
    for (int c = tid; c < L; c += nt) {
        for (int i = 0; i < L; ++i) {
            float v = i == c ? 1.0f : 0.0f;
            for (int j = c; j < i; ++j) v += n_kk[i * C + j] * mm[j * C + c];
            mm[i * C + c] = v;
        }
    }
    // 4. beta * k * e^b into the kg buffer (scratch; same block reads it back after the barrier).
    for (int idx = tid; idx < L * K; idx += nt) {
        const int r = idx / K, d = idx - (idx / K) * K;
        const float gm = expf(bh[r * K + d] + bl[r * K + d]);
        p.kg[TK(r, d)] = beta_s[r] * (KK(r, d) * gm);
    }
    __syncthreads();
    // 5. w = M (beta k e^b), u = M (beta v).
    for (int idx = tid; idx < L * K; idx += nt) {
        const int i = idx / K, d = idx - (idx / K) * K;
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) acc += mm[i * C + j] * p.kg[TK(j, d)];
        p.w[TK(i, d)] = acc;
    }
    for (int idx = tid; idx < L * V; idx += nt) {
        const int i = idx / V, e = idx - (idx / V) * V;
        float acc = 0.0f;
        for (int j = 0; j <= i; ++j) acc += mm[i * C + j] * (beta_s[j] * VV(j, e));
        p.u[(i64)(c0 + i) * DV + (i64)h * V + e] = acc;
    }
    __syncthreads();
    // 6. Row factors: qg = scale q e^b (<= 1 factors), kg = k e^(b_last - b) (<= 1).
    for (int idx = tid; idx < L * K; idx += nt) {
        const int r = idx / K, d = idx - (idx / K) * K;
        const float gm = expf(bh[r * K + d] + bl[r * K + d]);
        p.qg[TK(r, d)] = p.scale * Q(r, d) * gm;
        p.kg[TK(r, d)] = KK(r, d) * expf(kda_bdiff(bh, bl, K, L - 1, r, d));
    }
    // 7. A_qk rows to global, C wide per token (zeros past the chunk).
    for (int idx = tid; idx < L * C; idx += nt) {
        const int i = idx / C, j = idx - (idx / C) * C;
        p.aqk[((i64)(c0 + i) * p.heads + h) * C + j] = j < L ? a_qk[i * C + j] : 0.0f;
    }
#undef Q
#undef KK
#undef VV
#undef TK
}

struct ChunkStateParams {
    const float* qg;
    const float* kg;
    const float* w;
    const float* u;
    const float* aqk;
    const float* g;           // log-decay [T, H*K] (for the chunk's total decay e^(b_last))
    const int* chunks;        // [n_chunks][2]
    const int* chunk_first;   // [N+1]: sequence n owns chunks chunk_first[n] .. chunk_first[n+1]
    float* state;             // [N, H, K, V] K-first, in/out
    float* o;                 // out [T, o_ld], head h at column h*V
    i64 o_ld;
    int seqs;
    int heads;
    int head_dim;             // K
    int value_dim;            // V
    int chunk;                // C
    int pad_;
};
KDA_FIELD(ChunkStateParams, qg, 0);
KDA_FIELD(ChunkStateParams, kg, 8);
KDA_FIELD(ChunkStateParams, w, 16);
KDA_FIELD(ChunkStateParams, u, 24);
KDA_FIELD(ChunkStateParams, aqk, 32);
KDA_FIELD(ChunkStateParams, g, 40);
KDA_FIELD(ChunkStateParams, chunks, 48);
KDA_FIELD(ChunkStateParams, chunk_first, 56);
KDA_FIELD(ChunkStateParams, state, 64);
KDA_FIELD(ChunkStateParams, o, 72);
KDA_FIELD(ChunkStateParams, o_ld, 80);
KDA_FIELD(ChunkStateParams, seqs, 88);
KDA_FIELD(ChunkStateParams, heads, 92);
KDA_FIELD(ChunkStateParams, head_dim, 96);
KDA_FIELD(ChunkStateParams, value_dim, 100);
KDA_FIELD(ChunkStateParams, chunk, 104);
KDA_SIZE(ChunkStateParams, 112);

// Grid (N, H, ceil(V/32)). Dynamic shared memory, in floats (src/plan.rs mirrors this formula):
//   S [K*32] | Delta [C*32] | X [C*K] (w, then qg, then kg) | A_qk [C*C] | gamma [K]
extern "C" __global__ void __launch_bounds__(256) kda_chunk_state(const ChunkStateParams p) {
    KDA_DYNAMIC_SMEM(smem);
    const int n = blockIdx.x;
    const int h = blockIdx.y;
    const int K = p.head_dim;
    const int V = p.value_dim;
    const int C = p.chunk;
    const int e0 = blockIdx.z * KDA_VT;
    const int ew = min(KDA_VT, V - e0);
    const i64 D = (i64)p.heads * K;
    const i64 DV = (i64)p.heads * V;
    const int tid = threadIdx.x;
    const int nt = blockDim.x;

    float* s_s = smem;
    float* dl = s_s + K * KDA_VT;
    float* x_s = dl + C * KDA_VT;
    float* a_s = x_s + C * K;
    float* gam = a_s + C * C;

    float* S = p.state + ((i64)n * p.heads + h) * K * V + e0;  // S[d*V + e]
    for (int idx = tid; idx < K * KDA_VT; idx += nt) {
        const int d = idx / KDA_VT, e = idx - (idx / KDA_VT) * KDA_VT;
        s_s[idx] = e < ew ? S[(i64)d * V + e] : 0.0f;
    }
    const int first = p.chunk_first[n];
    const int last = p.chunk_first[n + 1];
    for (int ci = first; ci < last; ++ci) {
        const int c0 = p.chunks[2 * ci];
        const int L = p.chunks[2 * ci + 1];
        const i64 tok = (i64)c0 * D + (i64)h * K;
        // Total decay of the chunk, e^(b_{L-1}): the same compensated sum as kda_chunk_intra.
        for (int d = tid; d < K; d += nt) {
            float hi = p.g[tok + d];
            float lo = 0.0f;
            for (int r = 1; r < L; ++r) kda_two_sum_add(hi, lo, p.g[tok + (i64)r * D + d]);
            gam[d] = expf(hi + lo);
        }
        for (int idx = tid; idx < L * K; idx += nt) {
            const int r = idx / K, d = idx - (idx / K) * K;
            x_s[idx] = p.w[tok + (i64)r * D + d];
        }
        for (int idx = tid; idx < L * C; idx += nt) {
            const int i = idx / C, j = idx - (idx / C) * C;
            a_s[idx] = p.aqk[((i64)(c0 + i) * p.heads + h) * C + j];
        }
        __syncthreads();  // also: the previous chunk's state update is complete
        // Delta = u - w S0
        for (int idx = tid; idx < L * KDA_VT; idx += nt) {
            const int i = idx / KDA_VT, e = idx - (idx / KDA_VT) * KDA_VT;
            float acc = 0.0f;
            if (e < ew) {
                acc = p.u[(i64)(c0 + i) * DV + (i64)h * V + e0 + e];
                for (int d = 0; d < K; ++d) acc -= x_s[i * K + d] * s_s[d * KDA_VT + e];
            }
            dl[idx] = acc;
        }
        __syncthreads();
        for (int idx = tid; idx < L * K; idx += nt) {
            const int r = idx / K, d = idx - (idx / K) * K;
            x_s[idx] = p.qg[tok + (i64)r * D + d];
        }
        __syncthreads();
        // O = qg S0 + A_qk Delta
        for (int idx = tid; idx < L * KDA_VT; idx += nt) {
            const int i = idx / KDA_VT, e = idx - (idx / KDA_VT) * KDA_VT;
            if (e < ew) {
                float acc = 0.0f;
                for (int d = 0; d < K; ++d) acc += x_s[i * K + d] * s_s[d * KDA_VT + e];
                for (int j = 0; j <= i; ++j) acc += a_s[i * C + j] * dl[j * KDA_VT + e];
                p.o[(i64)(c0 + i) * p.o_ld + (i64)h * V + e0 + e] = acc;
            }
        }
        __syncthreads();
        for (int idx = tid; idx < L * K; idx += nt) {
            const int r = idx / K, d = idx - (idx / K) * K;
            x_s[idx] = p.kg[tok + (i64)r * D + d];
        }
        __syncthreads();
        // S = diag(gamma) S0 + kg^T Delta
        for (int idx = tid; idx < K * KDA_VT; idx += nt) {
            const int d = idx / KDA_VT, e = idx - (idx / KDA_VT) * KDA_VT;
            float acc = s_s[idx] * gam[d];
            for (int j = 0; j < L; ++j) acc += x_s[j * K + d] * dl[j * KDA_VT + e];
            s_s[idx] = acc;
        }
        __syncthreads();
    }
    for (int idx = tid; idx < K * KDA_VT; idx += nt) {
        const int d = idx / KDA_VT, e = idx - (idx / KDA_VT) * KDA_VT;
        if (e < ew) S[(i64)d * V + e] = s_s[idx];
    }
}

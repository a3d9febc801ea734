// kda-cuda: one decode step, fused (spec §10): for each (sequence, head) one block does
//   short-conv step + SiLU (conv state shifted in place)  ->  q/k L2 norm  ->  decay gate and
//   beta sigmoid  ->  delta-rule step on the device-resident state (in place)  ->  gated RMSNorm,
// and writes the o_proj operand row. The projections before and o_proj after are cuBLAS GEMMs.
// Needs common.cuh, gate.cu, recurrent.cu.

struct DecodeParams {
    const float* proj;     // raw q/k/v projections [N, proj_ld]: q at column 0, k at D, v at 2D
    const float* f;        // raw decay projection [N, f_ld]
    const float* b;        // raw beta logits [N, b_ld]
    const float* gate;     // raw output-gate logits [N, gate_ld]
    const float* conv_w;   // [3D, W]
    float* conv_q;         // [N, D, W-1], shifted in place
    float* conv_k;
    float* conv_v;
    float* state;          // [N, H, K, V], in place
    const float* norm_w;   // [V]
    void* dst;             // [N, dst_ld] f32 or bf16: the normed rows (o_proj operand)
    KdaGate gp;
    i64 proj_ld;
    i64 f_ld;
    i64 b_ld;
    i64 gate_ld;
    i64 dst_ld;
    int seqs;
    int heads;
    int head_dim;          // K
    int value_dim;         // V
    int width;             // W
    int dst_bf16;
    float scale;
    float l2_eps;
    float rms_eps;
    int pad_;
};
KDA_FIELD(DecodeParams, proj, 0);
KDA_FIELD(DecodeParams, f, 8);
KDA_FIELD(DecodeParams, b, 16);
KDA_FIELD(DecodeParams, gate, 24);
KDA_FIELD(DecodeParams, conv_w, 32);
KDA_FIELD(DecodeParams, conv_q, 40);
KDA_FIELD(DecodeParams, conv_k, 48);
KDA_FIELD(DecodeParams, conv_v, 56);
KDA_FIELD(DecodeParams, state, 64);
KDA_FIELD(DecodeParams, norm_w, 72);
KDA_FIELD(DecodeParams, dst, 80);
KDA_FIELD(DecodeParams, gp, 88);
KDA_FIELD(DecodeParams, proj_ld, 112);
KDA_FIELD(DecodeParams, f_ld, 120);
KDA_FIELD(DecodeParams, b_ld, 128);
KDA_FIELD(DecodeParams, gate_ld, 136);
KDA_FIELD(DecodeParams, dst_ld, 144);
KDA_FIELD(DecodeParams, seqs, 152);
KDA_FIELD(DecodeParams, heads, 156);
KDA_FIELD(DecodeParams, head_dim, 160);
KDA_FIELD(DecodeParams, value_dim, 164);
KDA_FIELD(DecodeParams, width, 168);
KDA_FIELD(DecodeParams, dst_bf16, 172);
KDA_FIELD(DecodeParams, scale, 176);
KDA_FIELD(DecodeParams, l2_eps, 180);
KDA_FIELD(DecodeParams, rms_eps, 184);
KDA_SIZE(DecodeParams, 192);

// One conv step for channel ch of stream `which` of sequence n: returns silu(conv), shifts the
// state left and appends the raw input (kda-core ops/conv.rs::short_conv_step).
__device__ __forceinline__ float kda_conv_step(const DecodeParams& p, int which, int n, i64 ch) {
    const i64 D = (i64)p.heads * p.head_dim;
    const int W = p.width;
    const int hist = W - 1;
    const float raw = p.proj[(i64)n * p.proj_ld + which * D + ch];
    const float* w = p.conv_w + (which * D + ch) * W;
    float* st_base = which == 0 ? p.conv_q : (which == 1 ? p.conv_k : p.conv_v);
    float* st = st_base + ((i64)n * D + ch) * hist;
    float acc = 0.0f;
    for (int i = 0; i < hist; ++i) acc += w[i] * st[i];
    acc += w[hist] * raw;
    for (int i = 0; i + 1 < hist; ++i) st[i] = st[i + 1];
    if (hist > 0) st[hist - 1] = raw;
    return kda_silu(acc);
}

// Register path of one state column for one token (load, step, store). Kept out of line so its
// 128-register column does not compete with the rest of the kernel's live values.
__device__ __noinline__ float kda_decode_column(float* S, const float* q_s, const float* k_s, const float* a_s,
                                                int K, int V, int e, float v, float beta, float scale) {
    float s[KDA_REG_K];
    kda_col_load(s, S, K, V, e);
    const float o = kda_col_step_reg(s, q_s, k_s, a_s, K, v, beta, scale);
    kda_col_store(s, S, K, V, e);
    return o;
}

// Grid (N, H); dynamic shared memory 3*K + 2*V floats.
extern "C" __global__ void __launch_bounds__(256) kda_decode(const DecodeParams p) {
    KDA_DYNAMIC_SMEM(smem);
    KDA_SHARED_ARRAY(float, red, 32);
    const int n = blockIdx.x;
    const int h = blockIdx.y;
    const int K = p.head_dim;
    const int V = p.value_dim;
    float* q_s = smem;
    float* k_s = smem + K;
    float* a_s = smem + 2 * K;
    float* v_s = smem + 3 * K;
    float* o_s = smem + 3 * K + V;

    // 1. conv steps (each channel's state belongs to exactly one thread), decay gate.
    float qq = 0.0f, kk = 0.0f;
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        const i64 ch = (i64)h * K + c;
        const float q = kda_conv_step(p, 0, n, ch);
        const float k = kda_conv_step(p, 1, n, ch);
        q_s[c] = q;
        k_s[c] = k;
        qq += q * q;
        kk += k * k;
        a_s[c] = expf(kda_decay(p.gp, h, ch, p.f[(i64)n * p.f_ld + ch]));
    }
    for (int e = threadIdx.x; e < V; e += blockDim.x) {
        v_s[e] = kda_conv_step(p, 2, n, (i64)h * V + e);
    }
    // 2. L2 norms (eps inside the sqrt). The sums' barriers publish q_s/k_s/a_s/v_s.
    const float rq = kda_rsqrt(kda_block_sum(qq, red) + p.l2_eps);
    const float rk = kda_rsqrt(kda_block_sum(kk, red) + p.l2_eps);
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        q_s[c] *= rq;
        k_s[c] *= rk;
    }
    __syncthreads();

    // 3. delta-rule step, state in place.
    const float beta = kda_sigmoid(p.b[(i64)n * p.b_ld + h]);
    float* S = p.state + ((i64)n * p.heads + h) * K * V;
    const int e0 = threadIdx.x;
    if (K <= KDA_REG_K && V <= (int)blockDim.x) {
        if (e0 < V) o_s[e0] = kda_decode_column(S, q_s, k_s, a_s, K, V, e0, v_s[e0], beta, p.scale);
    } else {
        for (int e = e0; e < V; e += blockDim.x) {
            o_s[e] = kda_col_step_global(S, V, e, q_s, k_s, a_s, K, v_s[e], beta, p.scale);
        }
    }
    // 4. gated RMSNorm over the V outputs of this head.
    float part = 0.0f;
    for (int e = threadIdx.x; e < V; e += blockDim.x) part += o_s[e] * o_s[e];
    const float r = kda_rsqrt(kda_block_sum(part, red) / (float)V + p.rms_eps);
    const float* g = p.gate + (i64)n * p.gate_ld + (i64)h * V;
    for (int e = threadIdx.x; e < V; e += blockDim.x) {
        const float y = o_s[e] * r * p.norm_w[e] * kda_sigmoid(g[e]);
        kda_store(p.dst, (i64)n * p.dst_ld + (i64)h * V + e, p.dst_bf16, y);
    }
}

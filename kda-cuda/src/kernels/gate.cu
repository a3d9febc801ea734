// kda-cuda: the decay gate and the beta sigmoid (kda-core ops/gate.rs, spec §3.3-3.4).
// Needs common.cuh.

// How g is formed from the raw decay projection f (x = f + dt_bias):
//   form 0 (softplus, Kimi Linear):   g = -exp(A_log[h]) * softplus(x)
//   form 1 (lower bound lb, Kimi K3): g = lb * sigmoid(exp(A_log[h]) * x)   (lb * sigmoid(x) without A_log)
// A null a_log / dt_bias means "absent" (the softplus form then uses exp(A_log) = 1, as the CPU).
struct KdaGate {
    const float* a_log;    // [H] or null
    const float* dt_bias;  // [H*K] or null
    int form;              // 0 softplus, 1 lower bound
    float lower_bound;     // lb (< 0) for form 1
};
KDA_FIELD(KdaGate, a_log, 0);
KDA_FIELD(KdaGate, dt_bias, 8);
KDA_FIELD(KdaGate, form, 16);
KDA_FIELD(KdaGate, lower_bound, 20);
KDA_SIZE(KdaGate, 24);

// g for channel `ch` (= h*K + d) of head h from the raw projection value.
__device__ __forceinline__ float kda_decay(const KdaGate& gp, int h, i64 ch, float raw) {
    float x = raw + (gp.dt_bias ? gp.dt_bias[ch] : 0.0f);
    if (gp.form == 0) {
        float a = gp.a_log ? expf(gp.a_log[h]) : 1.0f;
        return -a * kda_softplus(x);
    }
    float z = gp.a_log ? expf(gp.a_log[h]) * x : x;
    return gp.lower_bound * kda_sigmoid(z);
}

// Elementwise: g[t, h*K+d] = decay(f[t, h*K+d]) and beta[t, h] = sigmoid(b[t, h]), written
// compact (g_ld = H*K, beta_ld = H). Grid-stride over T*H*K (+ T*H for beta).
struct GateParams {
    const float* f;     // raw decay projection rows, row stride f_ld
    const float* b;     // raw beta logits, row stride b_ld
    float* g;           // out [T, H*K]
    float* beta;        // out [T, H]
    KdaGate gate;
    i64 f_ld;
    i64 b_ld;
    int tokens;
    int heads;
    int head_dim;
    int pad_;
};
KDA_FIELD(GateParams, f, 0);
KDA_FIELD(GateParams, b, 8);
KDA_FIELD(GateParams, g, 16);
KDA_FIELD(GateParams, beta, 24);
KDA_FIELD(GateParams, gate, 32);
KDA_FIELD(GateParams, f_ld, 56);
KDA_FIELD(GateParams, b_ld, 64);
KDA_FIELD(GateParams, tokens, 72);
KDA_FIELD(GateParams, heads, 76);
KDA_FIELD(GateParams, head_dim, 80);
KDA_SIZE(GateParams, 88);

extern "C" __global__ void kda_gate(const GateParams p) {
    const i64 d = (i64)p.heads * p.head_dim;
    const i64 n_g = (i64)p.tokens * d;
    const i64 n_b = (i64)p.tokens * p.heads;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n_g + n_b; i += stride) {
        if (i < n_g) {
            const i64 t = i / d;
            const i64 ch = i - t * d;
            const int h = (int)(ch / p.head_dim);
            p.g[i] = kda_decay(p.gate, h, ch, p.f[t * p.f_ld + ch]);
        } else {
            const i64 j = i - n_g;
            const i64 t = j / p.heads;
            const i64 h = j - t * p.heads;
            p.beta[j] = kda_sigmoid(p.b[t * p.b_ld + h]);
        }
    }
}

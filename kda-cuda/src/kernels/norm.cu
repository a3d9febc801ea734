// kda-cuda: the sigmoid-gated RMSNorm on the delta-rule output (kda-core ops/norm.rs, spec §8):
//   y = o * rsqrt(mean(o^2) + eps) * weight * sigmoid(gate)
// per (token, head) row of V values, one weight vector [V] shared by all heads. Needs common.cuh.
// (The decode kernel fuses the same computation; see decode.cu.)

struct NormParams {
    const float* o;       // [T, o_ld], head h at column h*V
    const float* gate;    // raw output-gate logits [T, gate_ld], head h at column h*V
    const float* weight;  // [V]
    void* dst;            // [T, dst_ld] f32 or bf16 (the o_proj operand)
    i64 o_ld;
    i64 gate_ld;
    i64 dst_ld;
    int tokens;
    int heads;
    int head_dim;
    int dst_bf16;
    float eps;
    int pad_;
};
KDA_FIELD(NormParams, o, 0);
KDA_FIELD(NormParams, gate, 8);
KDA_FIELD(NormParams, weight, 16);
KDA_FIELD(NormParams, dst, 24);
KDA_FIELD(NormParams, o_ld, 32);
KDA_FIELD(NormParams, gate_ld, 40);
KDA_FIELD(NormParams, dst_ld, 48);
KDA_FIELD(NormParams, tokens, 56);
KDA_FIELD(NormParams, heads, 60);
KDA_FIELD(NormParams, head_dim, 64);
KDA_FIELD(NormParams, dst_bf16, 68);
KDA_FIELD(NormParams, eps, 72);
KDA_SIZE(NormParams, 80);

// Grid (T, H); the row's V values are strided over the block's threads.
extern "C" __global__ void kda_gated_norm(const NormParams p) {
    KDA_SHARED_ARRAY(float, red, 32);
    const i64 t = blockIdx.x;
    const int h = blockIdx.y;
    const int V = p.head_dim;
    const float* o = p.o + t * p.o_ld + (i64)h * V;
    float part = 0.0f;
    for (int e = threadIdx.x; e < V; e += blockDim.x) part += o[e] * o[e];
    const float ss = kda_block_sum(part, red);
    const float r = kda_rsqrt(ss / (float)V + p.eps);
    const float* g = p.gate + t * p.gate_ld + (i64)h * V;
    for (int e = threadIdx.x; e < V; e += blockDim.x) {
        const float y = o[e] * r * p.weight[e] * kda_sigmoid(g[e]);
        kda_store(p.dst, t * p.dst_ld + (i64)h * V + e, p.dst_bf16, y);
    }
}

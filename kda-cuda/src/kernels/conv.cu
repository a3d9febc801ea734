// kda-cuda: the short causal depthwise conv + SiLU over packed sequences, fused with the q/k L2
// norm (kda-core ops/conv.rs and ops/norm.rs::l2_norm; spec §3.1, §7). Needs common.cuh.
//
// Conv-state layout (as the CPU cache): [N, H*K, W-1] f32 per q/k/v, each channel's last W-1 raw
// inputs oldest first. Conv weights on the device: [3*H*K, W] f32 (q rows, then k, then v);
// column W-1 multiplies the current token.

struct ConvParams {
    const float* src;     // raw projections; q at column 0, k at D, v at 2D (D = H*K); row stride src_ld
    const float* weight;  // [3D, W]
    float* state_q;       // [N, D, W-1] (read by the conv, rewritten by kda_conv_state_update)
    float* state_k;
    float* state_v;
    float* dst;           // [T, dst_ld]; q at column 0, k at D, v at 2D (q, k L2-normalised)
    const int* cu;        // [N+1] sequence offsets
    i64 src_ld;
    i64 dst_ld;
    int tokens;
    int seqs;
    int heads;
    int head_dim;
    int width;            // W >= 1
    float l2_eps;
};
KDA_FIELD(ConvParams, src, 0);
KDA_FIELD(ConvParams, weight, 8);
KDA_FIELD(ConvParams, state_q, 16);
KDA_FIELD(ConvParams, state_k, 24);
KDA_FIELD(ConvParams, state_v, 32);
KDA_FIELD(ConvParams, dst, 40);
KDA_FIELD(ConvParams, cu, 48);
KDA_FIELD(ConvParams, src_ld, 56);
KDA_FIELD(ConvParams, dst_ld, 64);
KDA_FIELD(ConvParams, tokens, 72);
KDA_FIELD(ConvParams, seqs, 76);
KDA_FIELD(ConvParams, heads, 80);
KDA_FIELD(ConvParams, head_dim, 84);
KDA_FIELD(ConvParams, width, 88);
KDA_FIELD(ConvParams, l2_eps, 92);
KDA_SIZE(ConvParams, 96);

__device__ __forceinline__ float* kda_conv_state(const ConvParams& p, int which) {
    return which == 0 ? p.state_q : (which == 1 ? p.state_k : p.state_v);
}

// Grid (T, 3H): block (t, which*H + h) convolves the K channels of head h of q (which 0), k (1)
// or v (2) at token t, applies SiLU, and L2-normalises the row for q and k.
extern "C" __global__ void kda_conv_prefill(const ConvParams p) {
    KDA_SHARED_ARRAY(float, red, 32);
    const int t = blockIdx.x;
    const int which = blockIdx.y / p.heads;
    const int h = blockIdx.y - which * p.heads;
    const int K = p.head_dim;
    const int W = p.width;
    const int hist = W - 1;
    const i64 D = (i64)p.heads * K;
    const int n = kda_seq_of(p.cu, p.seqs, t);
    const int start = p.cu[n];
    const int pos = t - start;
    const float* st_base = kda_conv_state(p, which);
    float part = 0.0f;
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        const i64 ch = (i64)h * K + c;
        const float* w = p.weight + (which * D + ch) * W;
        const float* st = st_base + ((i64)n * D + ch) * hist;
        float acc = 0.0f;
        for (int i = 0; i < W; ++i) {
            const int j = pos - hist + i;  // stream position; < 0 reads the history
            const float x = j < 0 ? st[hist + j] : p.src[(i64)(start + j) * p.src_ld + which * D + ch];
            acc += w[i] * x;
        }
        const float y = kda_silu(acc);
        p.dst[(i64)t * p.dst_ld + which * D + ch] = y;
        part += y * y;
    }
    if (which == 2) return;  // v is not normalised (uniform per block: no barrier is skipped unevenly)
    const float ss = kda_block_sum(part, red);
    const float r = kda_rsqrt(ss + p.l2_eps);
    for (int c = threadIdx.x; c < K; c += blockDim.x) {
        const i64 idx = (i64)t * p.dst_ld + which * D + (i64)h * K + c;
        p.dst[idx] *= r;  // written by this same thread above
    }
}

// One thread per (sequence, which, channel): the new conv state is the last W-1 entries of the
// stream [old state ; this call's raw inputs]. Must run after kda_conv_prefill (same stream).
// Ascending slots: slot i reads old slot i + len (> i when len > 0), not yet overwritten.
extern "C" __global__ void kda_conv_state_update(const ConvParams p) {
    const i64 D = (i64)p.heads * p.head_dim;
    const int hist = p.width - 1;
    const i64 total = (i64)p.seqs * 3 * D;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    if (hist == 0) return;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int n = (int)(i / (3 * D));
        const i64 rem = i - (i64)n * 3 * D;
        const int which = (int)(rem / D);
        const i64 ch = rem - which * D;
        const int start = p.cu[n];
        const int len = p.cu[n + 1] - start;
        float* st = kda_conv_state(p, which) + ((i64)n * D + ch) * hist;
        for (int s = 0; s < hist; ++s) {
            const int j = len - hist + s;
            st[s] = j < 0 ? st[hist + j] : p.src[(i64)(start + j) * p.src_ld + which * D + ch];
        }
    }
}

// Runs the kda-cuda kernels in the host emulator (emu.hpp) and compares them with a float64
// reference of the same math (spec §2-§8; the CPU crate's semantics): conv + SiLU + L2 norm,
// the decay gate and beta, the delta rule (chunked and token by token), the gated RMSNorm, the
// conv-state and recurrent-state updates, and the fused decode step. Exit status 1 on any
// mismatch. Built and run by tests/emulated.rs (g++ -std=c++20 -O2 -pthread).
#include "emu.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "../../src/kernels/common.cuh"
#include "../../src/kernels/gate.cu"
#include "../../src/kernels/conv.cu"
#include "../../src/kernels/norm.cu"
#include "../../src/kernels/recurrent.cu"
#include "../../src/kernels/decode.cu"
#include "../../src/kernels/chunked.cu"
#include "../../src/kernels/cast.cu"

using std::vector;

struct Rng {
    unsigned long long s;
    float next() {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return (float)((s >> 40) & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
    }
    vector<float> vec(size_t n, float scale) {
        vector<float> v(n);
        for (auto& x : v) x = next() * scale;
        return v;
    }
};

template <class T> static T* P(vector<T>& v) { return v.data(); }
template <class T> static const T* C(const vector<T>& v) { return v.data(); }

static unsigned row_threads(int n) {
    unsigned t = (unsigned)((n + 31) / 32 * 32);
    return std::min(256u, std::max(32u, t));
}
static dim3 elementwise(long long total) {
    long long b = (total + 255) / 256;
    return dim3{(unsigned)std::min<long long>(std::max<long long>(b, 1), 1 << 20), 1, 1};
}

struct Case {
    const char* name;
    int H, K, W;
    int form;        // 0 softplus, 1 lower bound
    float lb;
    vector<int> cu;
    int chunk;
    float a_log_shift;  // added to A_log (7 gives exp ≈ 1100: hard resets)
    unsigned long long seed;
};

struct Layer {
    int H, K, V, D, W, P, f_off, b_off, g_off;
    vector<float> conv_w, a_log, dt_bias, norm_w;
    int form;
    float lb, scale, l2_eps = 1e-6f, rms_eps = 1e-5f;
};

static Layer make_layer(const Case& c, Rng& r) {
    Layer L;
    L.H = c.H; L.K = c.K; L.V = c.K; L.D = c.H * c.K; L.W = c.W;
    L.f_off = 3 * L.D; L.b_off = 4 * L.D; L.g_off = 4 * L.D + L.H; L.P = 5 * L.D + L.H;
    L.conv_w = r.vec((size_t)3 * L.D * L.W, 0.7f);
    L.a_log = r.vec(L.H, 0.5f);
    for (auto& a : L.a_log) a += c.a_log_shift;
    L.dt_bias = r.vec(L.D, 0.5f);
    if (c.a_log_shift > 0)
        for (int i = 0; i < L.D; i += 3) L.dt_bias[i] = -30.0f;  // some channels keep g ≈ 0
    L.norm_w = r.vec(L.V, 0.2f);
    for (auto& w : L.norm_w) w += 1.0f;
    L.form = c.form; L.lb = c.lb; L.scale = 1.0f / std::sqrt((float)c.K);
    return L;
}

// ---------------------------------------------------------------- float64 reference
static double sig(double x) { return 1.0 / (1.0 + std::exp(-x)); }
static double softplus(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }

struct RefOut {
    vector<double> normed, state, conv[3];
};

// Whole layer core for packed sequences cu over raw projections proj [T, P].
static RefOut reference(const Layer& L, const vector<float>& proj, const vector<int>& cu,
                        const vector<float>& state0, const vector<float>* conv0) {
    const int N = (int)cu.size() - 1, T = cu.back(), K = L.K, V = L.V, D = L.D, H = L.H, hist = L.W - 1;
    RefOut o;
    o.normed.assign((size_t)T * D, 0);
    o.state.assign(state0.begin(), state0.end());
    for (int w = 0; w < 3; ++w) o.conv[w].assign(conv0[w].begin(), conv0[w].end());
    for (int n = 0; n < N; ++n) {
        const int t0 = cu[n], len = cu[n + 1] - cu[n];
        // conv for all channels of this sequence
        vector<double> x[3];
        for (int w = 0; w < 3; ++w) {
            x[w].assign((size_t)len * D, 0);
            for (int ch = 0; ch < D; ++ch) {
                vector<double> stream;
                for (int i = 0; i < hist; ++i) stream.push_back(conv0[w][((size_t)n * D + ch) * hist + i]);
                for (int t = 0; t < len; ++t) stream.push_back(proj[(size_t)(t0 + t) * L.P + w * D + ch]);
                const float* wt = &L.conv_w[((size_t)w * D + ch) * L.W];
                for (int t = 0; t < len; ++t) {
                    double acc = 0;
                    for (int i = 0; i < L.W; ++i) acc += wt[i] * stream[t + i];
                    x[w][(size_t)t * D + ch] = acc * sig(acc);
                }
                for (int i = 0; i < hist; ++i)
                    o.conv[w][((size_t)n * D + ch) * hist + i] = stream[stream.size() - hist + i];
            }
        }
        for (int h = 0; h < H; ++h) {
            vector<double> S((size_t)K * V);
            for (size_t i = 0; i < S.size(); ++i) S[i] = state0[((size_t)n * H + h) * K * V + i];
            for (int t = 0; t < len; ++t) {
                double q[1024], k[1024], a[1024], v[1024], out[1024];
                double qq = 0, kk = 0;
                for (int d = 0; d < K; ++d) {
                    q[d] = x[0][(size_t)t * D + h * K + d];
                    k[d] = x[1][(size_t)t * D + h * K + d];
                    qq += q[d] * q[d];
                    kk += k[d] * k[d];
                }
                for (int d = 0; d < K; ++d) {
                    q[d] /= std::sqrt(qq + L.l2_eps);
                    k[d] /= std::sqrt(kk + L.l2_eps);
                }
                for (int e = 0; e < V; ++e) v[e] = x[2][(size_t)t * D + h * V + e];
                const size_t row = (size_t)(t0 + t) * L.P;
                for (int d = 0; d < K; ++d) {
                    double xg = proj[row + L.f_off + h * K + d] + L.dt_bias[h * K + d];
                    double g = L.form == 0 ? -std::exp((double)L.a_log[h]) * softplus(xg)
                                           : L.lb * sig(std::exp((double)L.a_log[h]) * xg);
                    a[d] = std::exp(g);
                }
                const double beta = sig(proj[row + L.b_off + h]);
                for (int e = 0; e < V; ++e) {
                    double p = 0;
                    for (int d = 0; d < K; ++d) {
                        S[(size_t)d * V + e] *= a[d];
                        p += k[d] * S[(size_t)d * V + e];
                    }
                    const double delta = beta * (v[e] - p);
                    double oo = 0;
                    for (int d = 0; d < K; ++d) {
                        S[(size_t)d * V + e] += k[d] * delta;
                        oo += q[d] * L.scale * S[(size_t)d * V + e];
                    }
                    out[e] = oo;
                }
                double ss = 0;
                for (int e = 0; e < V; ++e) ss += out[e] * out[e];
                const double rr = 1.0 / std::sqrt(ss / V + L.rms_eps);
                for (int e = 0; e < V; ++e)
                    o.normed[(size_t)(t0 + t) * D + h * V + e] =
                        out[e] * rr * L.norm_w[e] * sig(proj[row + L.g_off + h * V + e]);
            }
            for (size_t i = 0; i < S.size(); ++i) o.state[((size_t)n * H + h) * K * V + i] = S[i];
        }
    }
    return o;
}

static double rel(const vector<float>& got, const vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

static KdaGate gate_of(const Layer& L) {
    KdaGate g;
    g.a_log = C(L.a_log);
    g.dt_bias = C(L.dt_bias);
    g.form = L.form;
    g.lower_bound = L.lb;
    return g;
}

static int failures = 0;

static void report(const char* what, const char* name, double e_out, double e_state, double e_conv, double tol) {
    const double worst = std::max(e_out, std::max(e_state, e_conv));
    std::printf("%-10s %-34s out %.1e  state %.1e  conv %.1e  %s\n", what, name, e_out, e_state, e_conv,
                worst <= tol ? "ok" : "FAIL");
    if (!(worst <= tol)) ++failures;
}

// ---------------------------------------------------------------- prefill (chunked / recurrent)
static void run_prefill(const Case& c, bool chunked) {
    Rng r{c.seed};
    Layer L = make_layer(c, r);
    const int N = (int)c.cu.size() - 1, T = c.cu.back(), D = L.D, H = L.H, K = L.K, V = L.V, hist = L.W - 1;
    vector<float> proj = r.vec((size_t)T * L.P, 1.0f);
    vector<float> state0 = r.vec((size_t)N * H * K * V, 0.5f);
    vector<float> conv0[3];
    for (auto& v : conv0) v = r.vec((size_t)N * D * hist, 1.0f);
    RefOut ref = reference(L, proj, c.cu, state0, conv0);

    vector<float> state = state0, conv[3] = {conv0[0], conv0[1], conv0[2]};
    const float nan = NAN;
    vector<float> qkv((size_t)T * 3 * D, nan), g((size_t)T * D, nan), beta((size_t)T * H, nan);
    vector<float> o((size_t)T * D, nan), normed((size_t)T * D, nan);
    vector<int> cu = c.cu;

    ConvParams cp{C(proj), C(L.conv_w), P(conv[0]), P(conv[1]), P(conv[2]), P(qkv), C(cu),
                  L.P, 3LL * D, T, N, H, K, L.W, L.l2_eps};
    emu_launch(kda_conv_prefill, dim3{(unsigned)T, (unsigned)(3 * H), 1}, row_threads(K), 0, cp);
    if (hist > 0) emu_launch(kda_conv_state_update, elementwise((long long)N * 3 * D), 256, 0, cp);
    GateParams gp{C(proj) + L.f_off, C(proj) + L.b_off, P(g), P(beta), gate_of(L), L.P, L.P, T, H, K, 0};
    emu_launch(kda_gate, elementwise((long long)T * D + (long long)T * H), 256, 0, gp);
    if (chunked) {
        const int Ch = c.chunk;
        vector<int> chunks, first;
        for (int n = 0; n < N; ++n) {
            first.push_back((int)chunks.size() / 2);
            for (int t = c.cu[n]; t < c.cu[n + 1]; t += Ch) {
                chunks.push_back(t);
                chunks.push_back(std::min(Ch, c.cu[n + 1] - t));
            }
        }
        first.push_back((int)chunks.size() / 2);
        const int n_chunks = (int)chunks.size() / 2;
        vector<float> qg((size_t)T * D, nan), kg((size_t)T * D, nan), w((size_t)T * D, nan),
            u((size_t)T * D, nan), aqk((size_t)T * H * 64, nan);
        ChunkIntraParams ip{C(qkv), C(g), C(beta), C(chunks), P(qg), P(kg), P(w), P(u), P(aqk),
                            3LL * D, n_chunks, H, K, V, Ch, L.scale};
        const size_t intra = 2 * Ch * K + 3 * 16 * (K + 1) + 3 * Ch * Ch + Ch;
        if (n_chunks > 0)
            emu_launch(kda_chunk_intra, dim3{(unsigned)n_chunks, (unsigned)H, 1}, 256, 4 * intra, ip);
        ChunkStateParams sp{C(qg), C(kg), C(w), C(u), C(aqk), C(g), C(chunks), C(first), P(state), P(o),
                            (long long)D, N, H, K, V, Ch, 0};
        const size_t st = K * 32 + Ch * 32 + Ch * K + Ch * Ch + K;
        emu_launch(kda_chunk_state, dim3{(unsigned)N, (unsigned)H, (unsigned)((V + 31) / 32)}, 256, 4 * st, sp);
    } else {
        RecurrentParams rp{C(qkv), C(g), C(beta), P(state), P(o), C(cu), 3LL * D, (long long)D, N, H, K, V,
                           L.scale, 0};
        emu_launch(kda_recurrent, dim3{(unsigned)N, (unsigned)H, 1}, row_threads(V), 4 * 3 * K, rp);
    }
    NormParams np{C(o), C(proj) + L.g_off, C(L.norm_w), P(normed), (long long)D, L.P, (long long)D, T, H, V, 0,
                  L.rms_eps, 0};
    emu_launch(kda_gated_norm, dim3{(unsigned)T, (unsigned)H, 1}, row_threads(V), 0, np);

    double ec = 0;
    for (int w2 = 0; w2 < 3; ++w2) ec = std::max(ec, rel(conv[w2], ref.conv[w2]));
    char name[96];
    std::snprintf(name, sizeof name, "%s%s", c.name, chunked ? "" : " (recurrent)");
    report(chunked ? "chunked" : "recurrent", name, rel(normed, ref.normed), rel(state, ref.state), ec, 1e-4);
}

// ---------------------------------------------------------------- decode
static void run_decode(const Case& c, int steps) {
    Rng r{c.seed};
    Layer L = make_layer(c, r);
    const int N = (int)c.cu.size() - 1, D = L.D, H = L.H, K = L.K, V = L.V, hist = L.W - 1;
    vector<float> state = r.vec((size_t)N * H * K * V, 0.5f);
    vector<float> conv[3];
    for (auto& v : conv) v = r.vec((size_t)N * D * hist, 1.0f);
    vector<int> cu(N + 1);
    for (int i = 0; i <= N; ++i) cu[i] = i;
    double eo = 0, es = 0, ec = 0;
    for (int s = 0; s < steps; ++s) {
        vector<float> proj = r.vec((size_t)N * L.P, 1.0f);
        RefOut ref = reference(L, proj, cu, state, conv);
        vector<float> normed((size_t)N * D, NAN);
        DecodeParams dp{};
        dp.proj = C(proj); dp.f = C(proj) + L.f_off; dp.b = C(proj) + L.b_off; dp.gate = C(proj) + L.g_off;
        dp.conv_w = C(L.conv_w); dp.conv_q = P(conv[0]); dp.conv_k = P(conv[1]); dp.conv_v = P(conv[2]);
        dp.state = P(state); dp.norm_w = C(L.norm_w); dp.dst = P(normed); dp.gp = gate_of(L);
        dp.proj_ld = dp.f_ld = dp.b_ld = dp.gate_ld = L.P; dp.dst_ld = D;
        dp.seqs = N; dp.heads = H; dp.head_dim = K; dp.value_dim = V; dp.width = L.W; dp.dst_bf16 = 0;
        dp.scale = L.scale; dp.l2_eps = L.l2_eps; dp.rms_eps = L.rms_eps;
        emu_launch(kda_decode, dim3{(unsigned)N, (unsigned)H, 1}, row_threads(V), 4 * (3 * K + 2 * V), dp);
        eo = std::max(eo, rel(normed, ref.normed));
        es = std::max(es, rel(state, ref.state));
        for (int w = 0; w < 3; ++w) ec = std::max(ec, rel(conv[w], ref.conv[w]));
        // continue from the reference's exact states (each step is checked on its own)
        for (size_t i = 0; i < state.size(); ++i) state[i] = (float)ref.state[i];
        for (int w = 0; w < 3; ++w)
            for (size_t i = 0; i < conv[w].size(); ++i) conv[w][i] = (float)ref.conv[w][i];
    }
    report("decode", c.name, eo, es, ec, 1e-4);
}

// ---------------------------------------------------------------- casts and bf16 output
static void run_casts() {
    Rng r{99};
    vector<float> x = r.vec(3 * 37, 100.0f);
    x[5] = NAN; x[6] = INFINITY; x[7] = -0.0f; x[8] = 1e-40f;
    vector<unsigned short> b(3 * 40, 0);
    vector<float> back(3 * 37, 0);
    CastParams a{C(x), P(b), 37, 40, 3, 37};
    emu_launch(kda_cast_f32_to_bf16, elementwise(3 * 37), 256, 0, a);
    CastParams z{C(b), P(back), 40, 37, 3, 37};
    emu_launch(kda_cast_bf16_to_f32, elementwise(3 * 37), 256, 0, z);
    int bad = 0;
    for (int i = 0; i < 3 * 37; ++i) {
        const float want = x[i];
        const float got = back[(i / 37) * 37 + i % 37];
        if (std::isnan(want)) { bad += !std::isnan(got); continue; }
        if (std::isinf(want)) { bad += got != want; continue; }
        bad += std::fabs(got - want) > std::fabs(want) * (1.0f / 256) + 1e-38f;
    }
    std::printf("%-10s %-34s %s\n", "cast", "f32 -> bf16 -> f32", bad == 0 ? "ok" : "FAIL");
    failures += bad != 0;
}

int main() {
    const vector<Case> cases = {
        {"softplus H2 K16 W4 C16 packed", 2, 16, 4, 0, 0.0f, {0, 1, 5, 5, 40, 75}, 16, 0.0f, 1},
        {"lower-bound H1 K32 W2 C32", 1, 32, 2, 1, -5.0f, {0, 33, 70}, 32, 0.0f, 2},
        {"softplus H1 K128 W4 C64", 1, 128, 4, 0, 0.0f, {0, 100}, 64, 0.0f, 3},
        {"lower-bound H2 K64 W1 C48", 2, 64, 1, 1, -5.0f, {0, 2, 70}, 48, 0.0f, 4},
        {"hard resets H1 K32 W4 C32", 1, 32, 4, 0, 0.0f, {0, 90}, 32, 7.0f, 5},
        {"softplus H1 K160 W3 C16 (global)", 1, 160, 3, 0, 0.0f, {0, 20, 41}, 16, 0.0f, 6},
        {"lower-bound H2 K128 W2 C64 packed", 2, 128, 2, 1, -5.0f, {0, 1, 64, 129, 200}, 64, 0.0f, 7},
        {"softplus H2 K48 W3 C37 packed", 2, 48, 3, 0, 0.0f, {0, 37, 38, 120}, 37, 0.0f, 8},
        {"lower-bound H2 K20 W2 C21 packed", 2, 20, 2, 1, -5.0f, {0, 21, 30, 73}, 21, 0.0f, 9},
    };
    for (const auto& c : cases) {
        for (bool chunked : {true, false}) {
            const auto t0 = std::chrono::steady_clock::now();
            run_prefill(c, chunked);
            if (std::getenv("KDA_EMU_TIMING"))
                std::printf("    %.2f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    }
    const vector<Case> dcases = {
        {"softplus N3 H2 K16 W4", 2, 16, 4, 0, 0.0f, {0, 1, 2, 3}, 16, 0.0f, 11},
        {"lower-bound N2 H1 K128 W4", 1, 128, 4, 1, -5.0f, {0, 1, 2}, 16, 0.0f, 12},
        {"softplus N2 H1 K160 W1 (global)", 1, 160, 1, 0, 0.0f, {0, 1, 2}, 16, 0.0f, 13},
        {"hard resets N2 H1 K32 W2", 1, 32, 2, 0, 0.0f, {0, 1, 2}, 16, 7.0f, 14},
    };
    for (const auto& c : dcases) run_decode(c, 3);
    run_casts();
    std::printf("%s\n", failures == 0 ? "emulated kernels: all OK" : "emulated kernels: FAILURES");
    return failures == 0 ? 0 : 1;
}

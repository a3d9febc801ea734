/* C firmware for Cortex-M (QEMU mps2-an386 / mps2-an385) calling kda-core through the C API
 * (libkda_capi.a for thumbv7em-none-eabihf / thumbv7m-none-eabi). It runs the Rust firmware's
 * computations (embedded/) on the same layer (hidden 64, 2 heads x 16, conv 4, low-rank decay
 * projection of rank 16, full-rank output gate; weights in flash from fw_weights_*.h, generated
 * from the embedded example's weights) and inputs, for the lower-bound then the softplus gate:
 *   - default build, as `kda-f32`: f32 weights, an 8-token prefill (kda_forward) and 4 decode
 *     steps (kda_decode_step), portable kernels; prints `O <gate> <token> <64 x f32 bits>`;
 *   - -DKDA_FW_FIXED, as `kda-fixed`: int8 weights, every token through the integer-only path
 *     (kda_fixed_decode_step); prints `Q <gate> <token> <64 x Q15.16>`.
 * It prints the Rust firmware's log format over semihosting, so CI compares the two bitwise:
 *   KDA <name> / CAL <instructions> <ticks> / T <gate> <prefill|decode> <token> <ticks> /
 *   O|Q ... / STACK <bytes> / DONE or ERR <message>
 * Every buffer is static (.bss); weights are const (.rodata, flash). */
#include <stddef.h>
#include <stdint.h>

#include "board.h"
#include "kda.h"
#ifdef KDA_FW_FIXED
#include "fw_weights_i8.h"
#define FW_NAME "KDA c-fixed"
#else
#include "fw_weights_f32.h"
#define FW_NAME "KDA c-f32"
#endif

enum {
    HIDDEN = 64,
    HEADS = 2,
    HEAD_DIM = 16,
    D = HEADS * HEAD_DIM,
    RANK = 16,
    CONV = 4,
    STATE = HEADS * HEAD_DIM * HEAD_DIM,
    CONV_STATE = D * (CONV - 1),
    T_PREFILL = 8,
    T_ALL = 12,
    /* The Rust firmware's buffers (embedded/model: WS_F32, WS_FIXED, PARAMS_FIXED), checked
     * against the size functions at run time. */
    WS_F32 = 7875,
    WS_FIXED = 194,
    PARAMS_FIXED = 918,
};

#ifdef KDA_FW_FIXED
static int32_t params[PARAMS_FIXED], state[STATE];
static int32_t conv_q[CONV_STATE], conv_k[CONV_STATE], conv_v[CONV_STATE];
static int32_t ws[WS_FIXED], x[HIDDEN], out[HIDDEN];
static KdaFixedLayer layer;
#else
static float state[STATE], conv_q[CONV_STATE], conv_k[CONV_STATE], conv_v[CONV_STATE];
static float ws[WS_F32], x[T_PREFILL * HIDDEN], out[T_PREFILL * HIDDEN];
static KdaLayer layer;
#endif

/* ---- one output line at a time, one semihosting write per line ---- */

static char line[1024];
static size_t len;

static void put(const char *s) {
    while (*s && len < sizeof line - 2) line[len++] = *s++;
}

static void put_u32(uint32_t v) {
    char d[11];
    int n = 0;
    do d[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
    while (n > 0 && len < sizeof line - 2) line[len++] = d[--n];
}

static void put_hex(uint32_t v) {
    static const char hex[] = "0123456789abcdef";
    put(" ");
    for (int s = 28; s >= 0 && len < sizeof line - 2; s -= 4) line[len++] = hex[(v >> s) & 0xF];
}

static void end_line(void) {
    line[len++] = '\n';
    line[len] = 0;
    sh_write(line);
    len = 0;
}

/* ---- the layer ---- */

/* The embedded example's input element (embedded/model/src/synth.rs: input_q16). */
static int32_t input_q16(uint32_t t, uint32_t i) {
    uint64_t z = 0x4B44415F494E5031ull ^ ((uint64_t)(t * HIDDEN + i) * 0xD6E8FEB86659FD93ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (int32_t)(z >> 46) - (1 << 17);
}

static KdaTensor f32t(const float *p, size_t n) {
    KdaTensor t = {p, n, KDA_DTYPE_F32, KDA_LAYOUT_ROWS, NULL, 0};
    return t;
}

#define F(a) f32t(a, sizeof a / sizeof a[0])

/* The layer's config for one gate form (embedded/model: config). */
static KdaConfig config(int lower_bound) {
    KdaConfig cfg = kda_config_kimi_k3(HIDDEN, HEADS, HEAD_DIM);
    cfg.conv_width = CONV;
    cfg.decay_rank = RANK;
    cfg.output_gate_rank = 0;
    cfg.decay_gate = lower_bound ? KDA_DECAY_LOWER_BOUND : KDA_DECAY_SOFTPLUS;
    cfg.lower_bound = -5.0f;
    return cfg;
}

static void print_time(const char *gate, const char *phase, uint32_t token, uint32_t ticks) {
    put("T ");
    put(gate);
    put(" ");
    put(phase);
    put(" ");
    put_u32(token);
    put(" ");
    put_u32(ticks);
    end_line();
}

#ifdef KDA_FW_FIXED

static KdaTensor i8t(const int8_t *p, size_t n, const float *scales, size_t rows) {
    KdaTensor t = {p, n, KDA_DTYPE_I8, KDA_LAYOUT_ROWS, scales, rows};
    return t;
}

#define Q(name) i8t(name##_I8, sizeof name##_I8, name##_S, sizeof name##_S / sizeof(float))

static KdaWeights weights(void) {
    KdaWeights w;
    w.q_proj = Q(Q_PROJ);
    w.k_proj = Q(K_PROJ);
    w.v_proj = Q(V_PROJ);
    w.q_conv = Q(Q_CONV);
    w.k_conv = Q(K_CONV);
    w.v_conv = Q(V_CONV);
    w.a_log = F(A_LOG);
    w.dt_bias = F(DT_BIAS);
    w.decay_proj = Q(F_A_PROJ);
    w.decay_up = Q(F_B_PROJ);
    w.b_proj = Q(B_PROJ);
    w.gate_proj = Q(G_PROJ);
    w.gate_up = f32t(NULL, 0);
    w.o_norm = F(O_NORM);
    w.o_proj = Q(O_PROJ);
    return w;
}

/* One gate form, integer path (embedded/model: run_fixed): all 12 tokens one decode step at a
 * time, the first 8 reported as prefill. */
static KdaStatus run(int lower_bound) {
    const char *gate = lower_bound ? "lb" : "sp";
    KdaConfig cfg = config(lower_bound);
    KdaWeights w = weights();
    size_t need_params = 0, need_ws = 0;
    KdaStatus s = kda_fixed_params_len(&cfg, &need_params);
    if (s == KDA_STATUS_OK) s = kda_fixed_workspace_len(&cfg, &need_ws);
    if (s == KDA_STATUS_OK && (need_params > PARAMS_FIXED || need_ws > WS_FIXED)) s = KDA_STATUS_TOO_SMALL;
    if (s == KDA_STATUS_OK) s = kda_fixed_init(&layer, &cfg, &w, params, PARAMS_FIXED);
    if (s != KDA_STATUS_OK) return s;
    for (uint32_t i = 0; i < STATE; i++) state[i] = 0;
    for (uint32_t i = 0; i < CONV_STATE; i++) conv_q[i] = conv_k[i] = conv_v[i] = 0;
    KdaFixedCaches caches = {state, STATE, conv_q, CONV_STATE, conv_k, CONV_STATE, conv_v, CONV_STATE};
    for (uint32_t t = 0; t < T_ALL; t++) {
        for (uint32_t i = 0; i < HIDDEN; i++) x[i] = input_q16(t, i);
        KdaFixedTokens tok = {x, HIDDEN, out, HIDDEN};
        uint32_t t0 = counter_now();
        s = kda_fixed_decode_step(&layer, &tok, &caches, ws, WS_FIXED);
        uint32_t ticks = t0 - counter_now();
        if (s != KDA_STATUS_OK) return s;
        print_time(gate, t < T_PREFILL ? "prefill" : "decode", t, ticks);
        put("Q ");
        put(gate);
        put(" ");
        put_u32(t);
        for (uint32_t i = 0; i < HIDDEN; i++) put_hex((uint32_t)out[i]);
        end_line();
    }
    return KDA_STATUS_OK;
}

#else

static void input_row(uint32_t t, float *row) {
    for (uint32_t i = 0; i < HIDDEN; i++) row[i] = (float)input_q16(t, i) * (1.0f / 65536.0f);
}

static KdaWeights weights(void) {
    KdaWeights w;
    w.q_proj = F(Q_PROJ);
    w.k_proj = F(K_PROJ);
    w.v_proj = F(V_PROJ);
    w.q_conv = F(Q_CONV);
    w.k_conv = F(K_CONV);
    w.v_conv = F(V_CONV);
    w.a_log = F(A_LOG);
    w.dt_bias = F(DT_BIAS);
    w.decay_proj = F(F_A_PROJ);
    w.decay_up = F(F_B_PROJ);
    w.b_proj = F(B_PROJ);
    w.gate_proj = F(G_PROJ);
    w.gate_up = f32t(NULL, 0);
    w.o_norm = F(O_NORM);
    w.o_proj = F(O_PROJ);
    return w;
}

static void print_rows(const char *gate, uint32_t t0, const float *rows, uint32_t n) {
    for (uint32_t t = 0; t < n; t++) {
        put("O ");
        put(gate);
        put(" ");
        put_u32(t0 + t);
        for (uint32_t i = 0; i < HIDDEN; i++) {
            union { float f; uint32_t u; } b = {rows[t * HIDDEN + i]};
            put_hex(b.u);
        }
        end_line();
    }
}

/* One gate form (embedded/model: run_float): prefill + decode. Returns the first non-OK
 * status. */
static KdaStatus run(int lower_bound) {
    const char *gate = lower_bound ? "lb" : "sp";
    KdaConfig cfg = config(lower_bound);
    KdaOptions opts = kda_options_default();
    opts.isa = KDA_ISA_PORTABLE;
    KdaWeights w = weights();
    KdaStatus s = kda_layer_init(&layer, &cfg, &w, &opts);
    size_t need = 0;
    if (s == KDA_STATUS_OK) s = kda_layer_workspace_len(&layer, T_PREFILL, &need);
    if (s == KDA_STATUS_OK && need > WS_F32) s = KDA_STATUS_TOO_SMALL;
    if (s != KDA_STATUS_OK) return s;

    for (uint32_t t = 0; t < T_PREFILL; t++) input_row(t, x + t * HIDDEN);
    KdaCaches caches = {state, STATE, conv_q, CONV_STATE, conv_k, CONV_STATE, conv_v, CONV_STATE};
    size_t cu[2] = {0, T_PREFILL};
    KdaBatch batch = {x, T_PREFILL * HIDDEN, cu, 2, out, T_PREFILL * HIDDEN};
    uint32_t t0 = counter_now();
    s = kda_forward(&layer, &batch, &caches, KDA_INIT_ZERO, ws, WS_F32);
    uint32_t ticks = t0 - counter_now();
    if (s != KDA_STATUS_OK) return s;
    print_time(gate, "prefill", T_PREFILL - 1, ticks);
    print_rows(gate, 0, out, T_PREFILL);

    for (uint32_t t = T_PREFILL; t < T_ALL; t++) {
        input_row(t, x);
        KdaTokens tok = {x, HIDDEN, out, HIDDEN};
        t0 = counter_now();
        s = kda_decode_step(&layer, &tok, &caches, ws, WS_F32);
        ticks = t0 - counter_now();
        if (s != KDA_STATUS_OK) return s;
        print_time(gate, "decode", t, ticks);
        print_rows(gate, t, out, 1);
    }
    return KDA_STATUS_OK;
}

#endif

int main(void) {
    paint_stack();
    counter_init();
    put(FW_NAME);
    end_line();
    uint32_t ticks = calibrate(100000);
    put("CAL 200000 ");
    put_u32(ticks);
    end_line();
    KdaStatus s = run(1);
    if (s == KDA_STATUS_OK) s = run(0);
    put("STACK ");
    put_u32(stack_high_water());
    end_line();
    if (s != KDA_STATUS_OK) {
        put("ERR ");
        put(kda_status_message((int)s));
        end_line();
        return 1;
    }
    put("DONE");
    end_line();
    return 0;
}

/* Tests of every status code of the kda C API, from C: NULL pointers, short buffers,
 * misalignment, overlap, bad configs, bad weights, uninitialised handles, and the messages.
 * Prints one line per check and exits non-zero if any check fails.
 *
 *   cc -std=c99 -I kda-capi/include kda-capi/c/status_test.c target/release/libkda_capi.a
 *      -lpthread -ldl -lm -o status_test && ./status_test
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kda.h"

static int failures = 0, checks = 0;
static int seen[KDA_STATUS_PANIC + 1];

static void expect(KdaStatus got, KdaStatus want, const char *what) {
    checks++;
    if ((int)got >= 0 && (int)got <= KDA_STATUS_PANIC) seen[got] = 1;
    if (got != want) {
        failures++;
        printf("FAIL %s: got %d (%s), want %d (%s)\n", what, (int)got,
               kda_status_message((int)got), (int)want, kda_status_message((int)want));
    } else {
        printf("ok   %-58s %s\n", what, kda_status_message((int)got));
    }
}

/* A tiny Kimi K3 layer: hidden 8, 1 head of 4, conv 4; all weights 0.1, all f32. */
enum { HID = 8, H = 1, K = 4, D = H * K, W = 4 };
static float big[64];
static float a_log[H] = {0.5f};

static KdaTensor f32t(const float *p, size_t n) {
    KdaTensor t = {p, n, KDA_DTYPE_F32, KDA_LAYOUT_ROWS, NULL, 0};
    return t;
}

static const KdaTensor absent = {NULL, 0, KDA_DTYPE_F32, KDA_LAYOUT_ROWS, NULL, 0};

static KdaWeights weights(void) {
    KdaWeights w;
    w.q_proj = w.k_proj = w.v_proj = f32t(big, D * HID);
    w.q_conv = w.k_conv = w.v_conv = f32t(big, D * W);
    w.a_log = f32t(a_log, H);
    w.dt_bias = absent;
    w.decay_proj = f32t(big, K * HID); /* low rank K: down [K, HID] */
    w.decay_up = f32t(big, D * K);     /* up [D, K] */
    w.b_proj = f32t(big, H * HID);
    w.gate_proj = f32t(big, D * HID); /* full rank */
    w.gate_up = absent;
    w.o_norm = f32t(big, K);
    w.o_proj = f32t(big, HID * D);
    return w;
}

int main(void) {
    for (size_t i = 0; i < 64; i++) big[i] = 0.1f;
    KdaConfig cfg = kda_config_kimi_k3(HID, H, K);
    KdaWeights w = weights();
    KdaLayer layer;
    size_t len = 0;

    /* Messages: one per code, a fallback for unknown codes. */
    for (int c = 0; c <= KDA_STATUS_PANIC; c++) {
        checks++;
        if (strcmp(kda_status_message(c), "unknown status code") == 0) {
            failures++;
            printf("FAIL no message for status %d\n", c);
        }
    }
    checks++;
    if (strcmp(kda_status_message(-1), "unknown status code") != 0 ||
        strcmp(kda_status_message(99), "unknown status code") != 0) {
        failures++;
        printf("FAIL unknown codes\n");
    }

    /* Config errors. */
    KdaConfig bad = cfg;
    bad.heads = 0;
    expect(kda_state_len(&bad, &len), KDA_STATUS_CONFIG, "state_len: heads = 0");
    bad = cfg;
    bad.decay_gate = 7;
    expect(kda_state_len(&bad, &len), KDA_STATUS_CONFIG, "state_len: unknown decay gate");
    bad = cfg;
    bad.lower_bound = 1.0f;
    expect(kda_layer_init(&layer, &bad, &w, NULL), KDA_STATUS_CONFIG, "init: positive lower bound");
    KdaOptions opts = kda_options_default();
    opts.chunk_size = 0;
    expect(kda_layer_init(&layer, &cfg, &w, &opts), KDA_STATUS_CONFIG, "init: chunk size 0");
    opts = kda_options_default();
    opts.mode = 9;
    expect(kda_workspace_len(&cfg, &opts, 4, &len), KDA_STATUS_CONFIG, "workspace_len: bad mode");
    opts = kda_options_default();
    opts.precision = 7;
    expect(kda_layer_init(&layer, &cfg, &w, &opts), KDA_STATUS_CONFIG, "init: unknown precision");
    opts.precision = KDA_PRECISION_BF16;
    expect(kda_layer_init(&layer, &cfg, &w, &opts), KDA_STATUS_CONFIG,
           "init: bf16 precision with f32 row-major weights");
    bad = cfg;
    bad.hidden = SIZE_MAX / 2;
    bad.heads = SIZE_MAX / 4;
    expect(kda_state_len(&bad, &len), KDA_STATUS_OVERFLOW, "state_len: huge dims overflow");

    /* NULL pointers. */
    expect(kda_state_len(NULL, &len), KDA_STATUS_NULL_POINTER, "state_len: NULL config");
    expect(kda_state_len(&cfg, NULL), KDA_STATUS_NULL_POINTER, "state_len: NULL out");
    expect(kda_layer_init(NULL, &cfg, &w, NULL), KDA_STATUS_NULL_POINTER, "init: NULL handle");
    expect(kda_layer_init(&layer, &cfg, NULL, NULL), KDA_STATUS_NULL_POINTER, "init: NULL weights");
    KdaWeights wn = w;
    wn.q_proj.data = NULL;
    expect(kda_layer_init(&layer, &cfg, &wn, NULL), KDA_STATUS_NULL_POINTER, "init: NULL q_proj data");

    /* Weights: wrong length, unknown dtype, form, layout, missing A_log. */
    KdaWeights wb = w;
    wb.k_proj.len = D * HID - 1;
    expect(kda_layer_init(&layer, &cfg, &wb, NULL), KDA_STATUS_LENGTH, "init: short k_proj");
    char msg[128];
    expect(kda_layer_explain(&cfg, &wb, NULL, msg, sizeof msg), KDA_STATUS_LENGTH,
           "explain: short k_proj");
    checks++;
    if (strstr(msg, "k_proj.weight") == NULL) {
        failures++;
        printf("FAIL explain does not name k_proj.weight: \"%s\"\n", msg);
    } else {
        printf("ok   explain says: %s\n", msg);
    }
    wb = w;
    wb.o_norm.dtype = 42;
    expect(kda_layer_init(&layer, &cfg, &wb, NULL), KDA_STATUS_WEIGHTS, "init: unknown dtype");
    wb = w;
    wb.gate_up = f32t(big, D * K);
    expect(kda_layer_init(&layer, &cfg, &wb, NULL), KDA_STATUS_WEIGHTS, "init: up half on full-rank gate");
    wb = w;
    wb.q_proj.layout = KDA_LAYOUT_PANELS;
    expect(kda_layer_init(&layer, &cfg, &wb, NULL), KDA_STATUS_WEIGHTS, "init: f32 in panel layout");
    KdaConfig sp = cfg;
    sp.decay_gate = KDA_DECAY_SOFTPLUS;
    wb = w;
    wb.a_log = absent;
    expect(kda_layer_init(&layer, &sp, &wb, NULL), KDA_STATUS_WEIGHTS, "init: softplus without A_log");
    KdaConfig wide = cfg;
    wide.decay_rank = 2;
    expect(kda_layer_init(&layer, &wide, &w, NULL), KDA_STATUS_LENGTH, "init: decay rank 2 vs weights of rank 4");

    /* Alignment. */
    wb = w;
    wb.q_proj.data = (const char *)big + 1;
    expect(kda_layer_init(&layer, &cfg, &wb, NULL), KDA_STATUS_BAD_ALIGNMENT, "init: misaligned f32 data");
    expect(kda_layer_init((KdaLayer *)((char *)&layer + 4), &cfg, &w, NULL), KDA_STATUS_BAD_ALIGNMENT,
           "init: misaligned handle");

    /* Uninitialised handle, then a good one. */
    memset(&layer, 0, sizeof layer);
    expect(kda_layer_workspace_len(&layer, 1, &len), KDA_STATUS_BAD_HANDLE, "workspace_len: zeroed handle");
    expect(kda_layer_init(&layer, &cfg, &w, NULL), KDA_STATUS_OK, "init: good layer");
    KdaLayer failed = layer;
    wb = w;
    wb.k_proj.len = 3;
    expect(kda_layer_init(&failed, &cfg, &wb, NULL), KDA_STATUS_LENGTH, "init over a good handle fails");
    expect(kda_layer_workspace_len(&failed, 1, &len), KDA_STATUS_BAD_HANDLE, "failed init leaves no handle");

    /* Buffers of a call. */
    size_t state_len, conv_len, ws_len;
    expect(kda_state_len(&cfg, &state_len), KDA_STATUS_OK, "state_len");
    expect(kda_conv_state_len(&cfg, &conv_len), KDA_STATUS_OK, "conv_state_len");
    expect(kda_layer_workspace_len(&layer, 3, &ws_len), KDA_STATUS_OK, "layer_workspace_len");
    static float state[64], cq[64], ck[64], cv[64], ws[4096], x[3 * HID], out[3 * HID];
    if (state_len > 64 || conv_len > 64 || ws_len + 3 * HID > 4096) {
        printf("FAIL test buffers too small\n");
        return 1;
    }
    KdaCaches caches = {state, state_len, cq, conv_len, ck, conv_len, cv, conv_len};
    size_t cu[] = {0, 3};
    KdaBatch batch = {x, 3 * HID, cu, 2, out, 3 * HID};
    expect(kda_forward(&layer, &batch, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OK, "forward");
    expect(kda_forward(&layer, &batch, &caches, KDA_INIT_ZERO, ws, 1), KDA_STATUS_TOO_SMALL,
           "forward: workspace of 1 float");
    KdaBatch b2 = batch;
    b2.out_len = 2 * HID;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_LENGTH, "forward: short out");
    b2 = batch;
    b2.x = NULL;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_NULL_POINTER, "forward: NULL x");
    size_t bad_cu[] = {0, 2};
    b2 = batch;
    b2.cu_seqlens = bad_cu;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OFFSETS,
           "forward: offsets end before T");
    expect(kda_forward(&layer, &batch, &caches, 5, ws, ws_len), KDA_STATUS_CONFIG, "forward: bad init value");
    KdaCaches c2 = caches;
    c2.recurrent_len = state_len - 1;
    expect(kda_forward(&layer, &batch, &c2, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_LENGTH, "forward: short state");
    c2 = caches;
    c2.conv_k = cq;
    expect(kda_forward(&layer, &batch, &c2, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OVERLAP,
           "forward: conv_k aliases conv_q");
    b2 = batch;
    b2.out = ws;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws + 3 * HID, ws_len), KDA_STATUS_OK,
           "forward: out and workspace adjacent");
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws + 3 * HID - 1, ws_len), KDA_STATUS_OVERLAP,
           "forward: out overlaps workspace by one float");
    b2 = batch;
    b2.out = (float *)x;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OVERLAP, "forward: in place (out == x)");
    b2 = batch;
    b2.x = (const float *)((const char *)x + 2);
    b2.x_len = HID;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_BAD_ALIGNMENT, "forward: misaligned x");
    b2 = batch;
    b2.x_len = SIZE_MAX / 2;
    expect(kda_forward(&layer, &b2, &caches, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OVERFLOW, "forward: x length overflows");

    static float wbuf[64];
    KdaWeights wa = w;
    wa.o_norm = f32t(wbuf, K);
    KdaLayer aliased;
    expect(kda_layer_init(&aliased, &cfg, &wa, NULL), KDA_STATUS_OK, "init: o_norm in a buffer later written");
    c2 = caches;
    c2.conv_v = wbuf + 8;
    expect(kda_forward(&aliased, &batch, &c2, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OK,
           "forward: conv_v next to the weights");
    c2.conv_v = wbuf;
    expect(kda_forward(&aliased, &batch, &c2, KDA_INIT_ZERO, ws, ws_len), KDA_STATUS_OVERLAP,
           "forward: conv_v overwrites o_norm's data");

    KdaTokens tok = {x, HID, out, HID};
    KdaCaches one = {state, state_len, cq, conv_len, ck, conv_len, cv, conv_len};
    expect(kda_decode_step(&layer, &tok, &one, ws, ws_len), KDA_STATUS_OK, "decode_step");
    expect(kda_decode_step(&layer, &tok, &one, ws, 0), KDA_STATUS_TOO_SMALL, "decode_step: no workspace");
    expect(kda_decode_step(&layer, NULL, &one, ws, ws_len), KDA_STATUS_NULL_POINTER, "decode_step: NULL tokens");
    tok.x_len = HID + 1;
    tok.out_len = HID + 1;
    expect(kda_decode_step(&layer, &tok, &one, ws, ws_len), KDA_STATUS_LENGTH, "decode_step: x not whole rows");

    /* Conversions. */
    float kv[2 * K * K], vk[2 * K * K];
    for (size_t i = 0; i < 2 * K * K; i++) kv[i] = (float)i;
    expect(kda_k_first_to_v_first(kv, 2 * K * K, vk, 2 * K * K, K, K), KDA_STATUS_OK, "k_first_to_v_first");
    checks++;
    if (vk[1] != kv[K]) {
        failures++;
        printf("FAIL transpose: vk[1] = %g, want %g\n", vk[1], kv[K]);
    }
    expect(kda_k_first_to_v_first(kv, 2 * K * K, vk, 2 * K * K - 1, K, K), KDA_STATUS_LENGTH,
           "k_first_to_v_first: short dst");
    expect(kda_v_first_to_k_first(kv, 2 * K * K, kv, 2 * K * K, K, K), KDA_STATUS_OVERLAP,
           "v_first_to_k_first: in place");
    expect(kda_v_first_to_k_first(NULL, 4, vk, 4, 2, 2), KDA_STATUS_NULL_POINTER, "v_first_to_k_first: NULL src");

    /* Integer path. */
    size_t params_len, fws_len;
    expect(kda_fixed_params_len(&cfg, &params_len), KDA_STATUS_OK, "fixed_params_len");
    expect(kda_fixed_workspace_len(&cfg, &fws_len), KDA_STATUS_OK, "fixed_workspace_len");
    static int32_t params[1024];
    KdaFixedLayer fl;
    expect(kda_fixed_init(&fl, &cfg, &w, params, params_len), KDA_STATUS_WEIGHTS, "fixed_init: f32 weights");
    size_t qn, qs;
    expect(kda_quantized_len(&cfg, 1, &qn, &qs), KDA_STATUS_OK, "quantized_len");
    static int8_t qdata[2048];
    static float qscales[256];
    KdaQuantBuffers qb = {qdata, qn, qscales, qs, 1};
    KdaWeights qw;
    qb.data_len = qn - 1;
    expect(kda_quantize_layer(&cfg, &w, &qb, &qw), KDA_STATUS_TOO_SMALL, "quantize_layer: short buffer");
    KdaQuantBuffers over = {qdata, qn, big, qs, 1};
    expect(kda_quantize_layer(&cfg, &w, &over, &qw), KDA_STATUS_OVERLAP, "quantize_layer: scales over the weights");
    qb.data_len = qn;
    expect(kda_quantize_layer(&cfg, &w, &qb, &qw), KDA_STATUS_OK, "quantize_layer");
    expect(kda_fixed_init(&fl, &cfg, &qw, params, params_len - 1), KDA_STATUS_TOO_SMALL, "fixed_init: short params");
    expect(kda_fixed_init(&fl, &cfg, &qw, (int32_t *)qscales, params_len), KDA_STATUS_OVERLAP,
           "fixed_init: parameters over the int8 scales");
    expect(kda_fixed_init(&fl, &cfg, &qw, params, params_len), KDA_STATUS_OK, "fixed_init");
    static int32_t fstate[64], fq[64], fk[64], fv[64], fws[1024], fx[HID], fout[HID];
    KdaFixedCaches fc = {fstate, state_len, fq, conv_len, fk, conv_len, fv, conv_len};
    KdaFixedTokens ft = {fx, HID, fout, HID};
    expect(kda_fixed_decode_step(&fl, &ft, &fc, fws, fws_len), KDA_STATUS_OK, "fixed_decode_step");
    expect(kda_fixed_decode_step(&fl, &ft, &fc, fws, fws_len - 1), KDA_STATUS_TOO_SMALL,
           "fixed_decode_step: short workspace");
    KdaFixedCaches fc2 = fc;
    fc2.conv_v = NULL;
    expect(kda_fixed_decode_step(&fl, &ft, &fc2, fws, fws_len), KDA_STATUS_NULL_POINTER, "fixed_decode_step: NULL conv_v");
    expect(kda_fixed_decode_step(&fl, &ft, &fc, params, fws_len), KDA_STATUS_OVERLAP,
           "fixed_decode_step: workspace over the parameters");
    memset(&fl, 0xAB, sizeof fl);
    expect(kda_fixed_decode_step(&fl, &ft, &fc, fws, fws_len), KDA_STATUS_BAD_HANDLE, "fixed_decode_step: garbage handle");

    /* Panels. */
    size_t plen;
    expect(kda_panels_len(20, 3, &plen), KDA_STATUS_OK, "panels_len");
    static uint16_t rows[60], panels[96];
    expect(kda_pack_panels(rows, 60, 20, 3, panels, plen), KDA_STATUS_OK, "pack_panels");
    expect(kda_pack_panels(rows, 60, 20, 3, panels, plen - 1), KDA_STATUS_LENGTH, "pack_panels: short dst");
    expect(kda_panels_len(SIZE_MAX, SIZE_MAX, &plen), KDA_STATUS_OVERFLOW, "panels_len: overflow");

    /* Every code a C caller can provoke was seen (INTERNAL and PANIC are bugs: not reachable). */
    for (int c = 0; c <= KDA_STATUS_PANIC; c++) {
        if (c == KDA_STATUS_INTERNAL || c == KDA_STATUS_PANIC || c == KDA_STATUS_SHAPE) continue;
        checks++;
        if (!seen[c]) {
            failures++;
            printf("FAIL status %d (%s) never produced\n", c, kda_status_message(c));
        }
    }
    printf("%d checks, %d failures\n", checks, failures);
    return failures != 0;
}

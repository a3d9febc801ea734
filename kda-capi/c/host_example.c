/* Host example of the kda C API: loads a layer and its inputs from a flat file written by
 * `cargo run -p kda-capi --example export -- DIR` (format: kda-capi/examples/export.rs), runs
 * a prefill (kda_forward) and decode steps (kda_decode_step), or the integer-only decode path
 * (kda_fixed_decode_step), and prints every output row as hex bit patterns, in the format of
 * the matching DIR/NAME.expected, which the Rust API computed. CI diffs the two.
 *
 *   cc -std=c99 -O2 -I kda-capi/include kda-capi/c/host_example.c target/release/libkda_capi.a
 *      -lpthread -ldl -lm -o host_example
 *   ./host_example DIR/f32_kimi_linear.kdal
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kda.h"

/* ---- reading the flat file (the example's own code; the library never reads files) ---- */

typedef struct {
    const uint8_t *p;
    size_t left;
} Reader;

static void fail(const char *what) {
    fprintf(stderr, "host_example: %s\n", what);
    exit(2);
}

static void take(Reader *r, void *dst, size_t n) {
    if (n > r->left) fail("file truncated");
    memcpy(dst, r->p, n);
    r->p += n;
    r->left -= n;
}

static uint32_t rd_u32(Reader *r) { uint32_t v; take(r, &v, 4); return v; }
static size_t rd_u64(Reader *r) { uint64_t v; take(r, &v, 8); return (size_t)v; }
static float rd_f32(Reader *r) { float v; take(r, &v, 4); return v; }

/* A malloc'd copy of n bytes (malloc's alignment suits every element type). */
static void *rd_bytes(Reader *r, size_t n) {
    void *m = malloc(n ? n : 1);
    if (!m) fail("out of memory");
    take(r, m, n);
    return m;
}

static void check(KdaStatus s, const char *call);

/* A compressed-tensors group-quantised matrix: its tensors, checked into a KdaGroups handle
 * (malloc'd, kept for the run like the tensors it views). */
static const KdaGroups *rd_groups(Reader *r) {
    static const size_t scale_size[] = {4, 2, 2};
    KdaGroupTensors g;
    g.bits = rd_u32(r);
    g.scales_dtype = rd_u32(r);
    g.group_size = rd_u64(r);
    g.rows = rd_u64(r);
    g.cols = rd_u64(r);
    g.packed_len = rd_u64(r);
    g.scales_len = rd_u64(r);
    g.zeros_len = rd_u64(r);
    if (g.scales_dtype > 2) fail("bad scales dtype");
    g.packed = rd_bytes(r, g.packed_len * 4);
    g.scales = rd_bytes(r, g.scales_len * scale_size[g.scales_dtype]);
    g.zeros = g.zeros_len ? (const uint32_t *)rd_bytes(r, g.zeros_len * 4) : NULL;
    KdaGroups *h = malloc(sizeof *h);
    if (!h) fail("out of memory");
    check(kda_groups_init(h, &g), "kda_groups_init");
    return h;
}

static KdaTensor rd_tensor(Reader *r) {
    static const size_t elem[] = {4, 2, 2, 1};
    KdaTensor t;
    t.dtype = rd_u32(r);
    t.layout = rd_u32(r);
    t.len = rd_u64(r);
    t.scales_len = rd_u64(r);
    t.scales = NULL;
    if (t.dtype >= KDA_DTYPE_GGUF_BASE) { /* GGUF blocks, as stored: len bytes */
        t.data = rd_bytes(r, t.len);
        return t;
    }
    if (t.dtype == KDA_DTYPE_GROUPS) {
        t.data = rd_groups(r);
        return t;
    }
    if (t.dtype > 3) fail("bad dtype");
    t.data = t.len ? rd_bytes(r, t.len * elem[t.dtype]) : NULL;
    t.scales = t.scales_len ? (const float *)rd_bytes(r, t.scales_len * 4) : NULL;
    return t;
}

static void print_row(const char *label, const void *row, size_t n) {
    const uint32_t *w = (const uint32_t *)row;
    printf("%s", label);
    for (size_t i = 0; i < n; i++) printf(" %08x", (unsigned)w[i]);
    printf("\n");
}

static void check(KdaStatus s, const char *call) {
    if (s != KDA_STATUS_OK) {
        fprintf(stderr, "host_example: %s: %s\n", call, kda_status_message((int)s));
        exit(1);
    }
}

static void *zalloc(size_t n, size_t size) {
    void *m = calloc(n ? n : 1, size);
    if (!m) fail("out of memory");
    return m;
}

/* ---- the run ---- */

typedef struct {
    size_t tokens, seqs, steps;
    size_t *cu_seqlens;
    float *x;
    void *decode_x; /* steps x seqs x hidden: float, or Q15.16 int32 on the integer path */
} Run;

static void run_float(const KdaConfig *cfg, const KdaWeights *w, const KdaOptions *opts,
                      const Run *run) {
    KdaLayer layer;
    char msg[160];
    if (kda_layer_init(&layer, cfg, w, opts) != KDA_STATUS_OK) {
        kda_layer_explain(cfg, w, opts, msg, sizeof msg);
        fprintf(stderr, "host_example: kda_layer_init: %s\n", msg);
        exit(1);
    }
    size_t n = run->seqs, hd = cfg->hidden, state_len, conv_len, ws_len, dws_len, longest = 1;
    for (size_t s = 0; s < n; s++) {
        size_t l = run->cu_seqlens[s + 1] - run->cu_seqlens[s];
        if (l > longest) longest = l;
    }
    check(kda_state_len(cfg, &state_len), "kda_state_len");
    check(kda_conv_state_len(cfg, &conv_len), "kda_conv_state_len");
    check(kda_layer_workspace_len(&layer, longest, &ws_len), "kda_layer_workspace_len");
    check(kda_layer_decode_workspace_len(&layer, n, &dws_len), "kda_layer_decode_workspace_len");

    float *state = zalloc(n * state_len, 4), *cq = zalloc(n * conv_len, 4);
    float *ck = zalloc(n * conv_len, 4), *cv = zalloc(n * conv_len, 4);
    float *ws = zalloc(ws_len > dws_len ? ws_len : dws_len, 4);
    float *out = zalloc(run->tokens * hd + n * hd, 4);
    KdaCaches caches = {state, n * state_len, cq, n * conv_len, ck, n * conv_len, cv, n * conv_len};

    KdaBatch batch = {run->x, run->tokens * hd, run->cu_seqlens, n + 1, out, run->tokens * hd};
    check(kda_forward(&layer, &batch, &caches, KDA_INIT_ZERO, ws, ws_len), "kda_forward");
    char label[64];
    for (size_t t = 0; t < run->tokens; t++) {
        snprintf(label, sizeof label, "prefill %zu", t);
        print_row(label, out + t * hd, hd);
    }
    for (size_t s = 0; s < run->steps; s++) {
        const float *x = (const float *)run->decode_x + s * n * hd;
        KdaTokens tok = {x, n * hd, out, n * hd};
        check(kda_decode_step(&layer, &tok, &caches, ws, dws_len), "kda_decode_step");
        for (size_t q = 0; q < n; q++) {
            snprintf(label, sizeof label, "decode %zu %zu", s, q);
            print_row(label, out + q * hd, hd);
        }
    }
    float *v_first = zalloc(n * state_len, 4);
    check(kda_k_first_to_v_first(state, n * state_len, v_first, n * state_len, cfg->head_dim,
                                 cfg->head_dim),
          "kda_k_first_to_v_first");
    print_row("state_v_first", v_first, n * state_len);
}

static void run_fixed(const KdaConfig *cfg, const KdaWeights *w, const Run *run) {
    size_t n = run->seqs, hd = cfg->hidden, state_len, conv_len, params_len, ws_len;
    check(kda_state_len(cfg, &state_len), "kda_state_len");
    check(kda_conv_state_len(cfg, &conv_len), "kda_conv_state_len");
    check(kda_fixed_params_len(cfg, &params_len), "kda_fixed_params_len");
    check(kda_fixed_workspace_len(cfg, &ws_len), "kda_fixed_workspace_len");
    int32_t *params = zalloc(params_len, 4);
    KdaFixedLayer layer;
    check(kda_fixed_init(&layer, cfg, w, params, params_len), "kda_fixed_init");

    int32_t *state = zalloc(n * state_len, 4), *cq = zalloc(n * conv_len, 4);
    int32_t *ck = zalloc(n * conv_len, 4), *cv = zalloc(n * conv_len, 4);
    int32_t *ws = zalloc(ws_len, 4), *out = zalloc(n * hd, 4);
    KdaFixedCaches caches = {state, n * state_len, cq, n * conv_len,
                             ck,    n * conv_len,  cv, n * conv_len};
    char label[64];
    for (size_t s = 0; s < run->steps; s++) {
        const int32_t *x = (const int32_t *)run->decode_x + s * n * hd;
        KdaFixedTokens tok = {x, n * hd, out, n * hd};
        check(kda_fixed_decode_step(&layer, &tok, &caches, ws, ws_len), "kda_fixed_decode_step");
        for (size_t q = 0; q < n; q++) {
            snprintf(label, sizeof label, "decode %zu %zu", s, q);
            print_row(label, out + q * hd, hd);
        }
    }
    print_row("state", state, n * state_len);
}

int main(int argc, char **argv) {
    if (argc != 2) fail("usage: host_example FILE.kdal");
    FILE *f = fopen(argv[1], "rb");
    if (!f) fail("cannot open the file");
    static uint8_t buf[1 << 22];
    size_t size = fread(buf, 1, sizeof buf, f);
    fclose(f);
    Reader r = {buf, size};
    char magic[4];
    take(&r, magic, 4);
    if (memcmp(magic, "KDAL", 4) != 0 || rd_u32(&r) != 1) fail("not a KDAL v1 file");

    KdaConfig cfg;
    cfg.hidden = rd_u64(&r);
    cfg.heads = rd_u64(&r);
    cfg.head_dim = rd_u64(&r);
    cfg.conv_width = rd_u64(&r);
    cfg.decay_gate = rd_u32(&r);
    cfg.lower_bound = rd_f32(&r);
    cfg.decay_rank = rd_u64(&r);
    cfg.output_gate_rank = rd_u64(&r);
    cfg.rms_eps = rd_f32(&r);
    cfg.l2_eps = rd_f32(&r);
    cfg.scale = rd_f32(&r);
    KdaOptions opts = kda_options_default();
    opts.mode = rd_u32(&r);
    opts.chunk_size = rd_u64(&r);
    opts.isa = rd_u32(&r);
    uint32_t integer_path = rd_u32(&r);

    KdaWeights w;
    KdaTensor *slots[] = {&w.q_proj, &w.k_proj,  &w.v_proj,   &w.q_conv,  &w.k_conv,
                          &w.v_conv, &w.a_log,   &w.dt_bias,  &w.decay_proj, &w.decay_up,
                          &w.b_proj, &w.gate_proj, &w.gate_up, &w.o_norm,  &w.o_proj};
    for (size_t i = 0; i < sizeof slots / sizeof slots[0]; i++) *slots[i] = rd_tensor(&r);

    Run run;
    run.tokens = rd_u64(&r);
    run.seqs = rd_u64(&r);
    run.cu_seqlens = zalloc(run.seqs + 1, sizeof(size_t));
    for (size_t i = 0; i <= run.seqs; i++) run.cu_seqlens[i] = rd_u64(&r);
    run.x = rd_bytes(&r, run.tokens * cfg.hidden * 4);
    run.steps = rd_u64(&r);
    run.decode_x = rd_bytes(&r, run.steps * run.seqs * cfg.hidden * 4);
    if (r.left != 0) fail("trailing bytes");

    if (integer_path)
        run_fixed(&cfg, &w, &run);
    else
        run_float(&cfg, &w, &opts, &run);
    return 0;
}

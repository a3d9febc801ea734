/* ggml's reference quantisers (quantize_row_*_ref in ggml-quants.c), as llama-quantize runs them
 * without an importance matrix: f32 rows on stdin, the blocks on stdout.
 *
 * Usage: quant_ref FORMAT < rows.f32 > blocks.bin   (FORMAT: q4_0 q4_1 q5_0 q5_1 q8_0 q2_k q3_k
 * q4_k q5_k q6_k; the input is little-endian f32, a multiple of 256 values).
 *
 * Built by tests/scripts/gen_quant_fixtures.py against the ggml sources of the llama-cpp-python
 * 0.3.36 sdist (vendor/llama.cpp/ggml), with gcc -O2 for baseline x86-64, the flags ggml-base
 * (which holds ggml-quants.c) gets in llama.cpp's own CMake build: no FMA, so no multiply-add
 * is fused. The few ggml functions ggml-quants.c links against, and this program never reaches,
 * are stubs that abort. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

void ggml_abort(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "ggml_abort at %s:%d (%s)\n", file, line, fmt);
    abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void)type; (void)ne; abort(); }
size_t ggml_type_size(enum ggml_type type) { (void)type; abort(); }
const char *ggml_type_name(enum ggml_type type) { (void)type; abort(); }

typedef void (*quant_fn)(const float *, void *, int64_t);

struct format {
    const char *name;
    quant_fn fn;
    size_t elems, bytes;
};

static const struct format FORMATS[] = {
    {"q4_0", (quant_fn)quantize_row_q4_0_ref, 32, sizeof(block_q4_0)},
    {"q4_1", (quant_fn)quantize_row_q4_1_ref, 32, sizeof(block_q4_1)},
    {"q5_0", (quant_fn)quantize_row_q5_0_ref, 32, sizeof(block_q5_0)},
    {"q5_1", (quant_fn)quantize_row_q5_1_ref, 32, sizeof(block_q5_1)},
    {"q8_0", (quant_fn)quantize_row_q8_0_ref, 32, sizeof(block_q8_0)},
    {"q2_k", (quant_fn)quantize_row_q2_K_ref, 256, sizeof(block_q2_K)},
    {"q3_k", (quant_fn)quantize_row_q3_K_ref, 256, sizeof(block_q3_K)},
    {"q4_k", (quant_fn)quantize_row_q4_K_ref, 256, sizeof(block_q4_K)},
    {"q5_k", (quant_fn)quantize_row_q5_K_ref, 256, sizeof(block_q5_K)},
    {"q6_k", (quant_fn)quantize_row_q6_K_ref, 256, sizeof(block_q6_K)},
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: quant_ref FORMAT < rows.f32 > blocks.bin\n");
        return 2;
    }
    const struct format *f = NULL;
    for (size_t i = 0; i < sizeof(FORMATS) / sizeof(FORMATS[0]); i++) {
        if (strcmp(argv[1], FORMATS[i].name) == 0) f = &FORMATS[i];
    }
    if (!f) {
        fprintf(stderr, "quant_ref: unknown format %s\n", argv[1]);
        return 2;
    }
    size_t cap = 1 << 16, n = 0;
    float *x = malloc(cap * sizeof(float));
    size_t got;
    while (x && (got = fread(x + n, sizeof(float), cap - n, stdin)) > 0) {
        n += got;
        if (n == cap) x = realloc(x, (cap *= 2) * sizeof(float));
    }
    if (!x || n % 256 != 0) {
        fprintf(stderr, "quant_ref: input is not a multiple of 256 floats\n");
        return 1;
    }
    size_t out_len = n / f->elems * f->bytes;
    void *y = calloc(out_len, 1);
    f->fn(x, y, (int64_t)n);
    if (fwrite(y, 1, out_len, stdout) != out_len) return 1;
    free(x);
    free(y);
    return 0;
}

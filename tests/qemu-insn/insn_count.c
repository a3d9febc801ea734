/*
 * insn_count: a QEMU TCG plugin that counts the guest instructions a program executes.
 *
 * Built by .ci/aarch64.sh (gcc -shared -fPIC) and loaded with
 *     qemu-aarch64 -plugin ./insn_count.so,out=FILE prog args...
 * At exit it writes one line, "insns N", to FILE (or to QEMU's log, stderr, without out=).
 *
 * How it counts: when QEMU translates a block of guest code, the plugin asks how many guest
 * instructions the block holds and attaches an inline "add that many to the counter" op to
 * the block, so every execution of the block adds its length. A block left early (a fault, a
 * signal) is counted whole; ordinary programs never do that in user mode. The inline add is
 * not atomic, so the count is exact only for single-threaded programs (the probe is).
 *
 * Debian ships neither QEMU's plugins nor its header, so the few API items used are declared
 * here, following QEMU's documented plugin API (include/qemu/qemu-plugin.h, API version 1 in
 * QEMU 7.2: QEMU refuses a plugin whose qemu_plugin_version is outside its supported range).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;

typedef struct {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    _Bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;

struct qemu_plugin_tb;

enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };

typedef void (*tb_trans_cb)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*udata_cb)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, udata_cb cb, void *userdata);
void qemu_plugin_outs(const char *string);

/* The API version this file was written against (QEMU 7.2 accepts 0..1). */
EXPORT int qemu_plugin_version = 1;

static uint64_t executed;
static char out_path[4096];

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &executed,
                                             qemu_plugin_tb_n_insns(tb));
}

static void report_at_exit(qemu_plugin_id_t id, void *userdata)
{
    char line[64];
    (void)id;
    (void)userdata;
    snprintf(line, sizeof line, "insns %llu\n", (unsigned long long)executed);
    if (out_path[0] == '\0') {
        qemu_plugin_outs(line);
        return;
    }
    FILE *f = fopen(out_path, "w");
    if (f == NULL || fputs(line, f) == EOF || fclose(f) != 0) {
        qemu_plugin_outs("insn_count: cannot write the out= file\n");
    }
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                               char **argv)
{
    if (info->version.min > qemu_plugin_version || info->version.cur < qemu_plugin_version) {
        qemu_plugin_outs("insn_count: unsupported QEMU plugin API version\n");
        return 1;
    }
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0 && strlen(argv[i] + 4) < sizeof out_path) {
            strcpy(out_path, argv[i] + 4);
        } else {
            qemu_plugin_outs("insn_count: unknown or too long argument (only out=FILE)\n");
            return 1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, report_at_exit, NULL);
    return 0;
}

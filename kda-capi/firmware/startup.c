/* Reset, vector table, semihosting and the instruction counter for the C firmware on QEMU
 * mps2-an386 (see main.c). Mirrors embedded/firmware/src/lib.rs. */
#include <stdint.h>
#include <string.h>

#include "board.h"

extern uint32_t _data_load, _data_start, _data_end, _bss_start, _bss_end, _stack_top;
int main(void);

/* ---- semihosting (ARM "Angel" calls through BKPT 0xAB) ---- */

static int semihost(int op, const void *arg) {
    register int r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

void sh_write(const char *s) { semihost(0x04 /* SYS_WRITE0 */, s); }

void sh_exit(int ok) {
    /* SYS_EXIT with ADP_Stopped_ApplicationExit (QEMU exits 0) or RunTimeErrorUnknown (1). */
    semihost(0x18, (const void *)(uintptr_t)(ok ? 0x20026 : 0x20023));
    for (;;) __asm__ volatile("bkpt 0");
}

/* ---- CMSDK APB timer 0: one tick per 40 instructions under -icount shift=0 ---- */

#define TIMER0_CTRL (*(volatile uint32_t *)0x40000000u)
#define TIMER0_VALUE (*(volatile uint32_t *)0x40000004u)
#define TIMER0_RELOAD (*(volatile uint32_t *)0x40000008u)

void counter_init(void) {
    TIMER0_CTRL = 0;
    TIMER0_RELOAD = 0xFFFFFFFFu;
    TIMER0_VALUE = 0xFFFFFFFFu;
    TIMER0_CTRL = 1;
}

uint32_t counter_now(void) { return TIMER0_VALUE; }

uint32_t calibrate(uint32_t n) {
    uint32_t t0 = counter_now();
    __asm__ volatile("1: subs %0, %0, #1\n bne 1b" : "+r"(n) : : "cc");
    return t0 - counter_now();
}

/* ---- stack painting (as the Rust firmware: up to 128 KiB below the top of RAM) ---- */

#define PATTERN 0x5AC3A55Cu
#define PAINT (128u * 1024u)

static uintptr_t paint_low(void) {
    uintptr_t top = (uintptr_t)&_stack_top, end = (uintptr_t)&_bss_end;
    return end > top - PAINT ? end : top - PAINT;
}

__attribute__((noinline)) void paint_stack(void) {
    uintptr_t sp;
    __asm__ volatile("mov %0, sp" : "=r"(sp));
    for (uintptr_t a = paint_low(); a < sp - 64; a += 4) *(volatile uint32_t *)a = PATTERN;
}

uint32_t stack_high_water(void) {
    uintptr_t top = (uintptr_t)&_stack_top, a = paint_low();
    while (a < top && *(volatile uint32_t *)a == PATTERN) a += 4;
    return (uint32_t)(top - a);
}

/* ---- reset and faults ---- */

void reset_handler(void) {
    memcpy(&_data_start, &_data_load, (size_t)((char *)&_data_end - (char *)&_data_start));
    memset(&_bss_start, 0, (size_t)((char *)&_bss_end - (char *)&_bss_start));
#if defined(__ARM_FP)
    /* Cortex-M4F: enable the FPU (CP10, CP11 full access) before any float instruction. */
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20;
    __asm__ volatile("dsb\n isb");
#endif
    sh_exit(main() == 0);
}

static void fault(void) {
    sh_write("FAULT\n");
    sh_exit(0);
}

/* The library's panic handler calls this (feature firmware-panic-handler). */
void kda_panic_handler(void) {
    sh_write("PANIC\n");
    sh_exit(0);
}

__attribute__((section(".vectors"), used)) static const void *const vectors[16] = {
    &_stack_top, (void *)reset_handler, (void *)fault, (void *)fault, (void *)fault,
    (void *)fault, (void *)fault, 0, 0, 0, 0, (void *)fault, (void *)fault, 0,
    (void *)fault, (void *)fault,
};

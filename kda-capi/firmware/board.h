/* Board support of the C firmware (startup.c). */
#ifndef KDA_FW_BOARD_H
#define KDA_FW_BOARD_H
#include <stdint.h>

/* Instructions per timer tick under QEMU -icount shift=0 (1 ns per instruction, 25 MHz). */
#define INSTR_PER_TICK 40u

void sh_write(const char *s);
void sh_exit(int ok) __attribute__((noreturn));
void counter_init(void);
uint32_t counter_now(void);
uint32_t calibrate(uint32_t n);
void paint_stack(void);
uint32_t stack_high_water(void);
#endif

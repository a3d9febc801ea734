/*
 * A small single-threaded program for validating insn_count.so: the same x86-64 binary is
 * counted under qemu-x86_64 with the plugin and under valgrind (callgrind's Ir, the guest
 * instructions executed), and the two counts must agree closely. Argument: loop iterations.
 */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    volatile double acc = 0.0;
    unsigned x = 12345;
    for (long i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        acc += (double)(x >> 16) * 1e-6;
    }
    printf("%f\n", acc);
    return 0;
}

/* A stand-in for libFuzzer when clang is not at hand (CI): feeds a fuzz target
 * seeds and random mutations of them, deterministically.  The real fuzzing
 * runs are in docs/development.md.
 *     smoke ITERATIONS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const SEEDS[] = {
    "1GiB", "3000m", "50%", "0.25", "12.5%", "4G", "1073741824", "1.5g", "lots", "",
    "99999999999999999999", "7Ti", " 2GiB\n", "100%", "0", "VGPULIM",
};

int main(int argc, char **argv)
{
    long iterations = argc > 1 ? atol(argv[1]) : 10000;
    uint8_t buf[512];
    srand(1);
    for (long i = 0; i < iterations; i++) {
        const char *seed = SEEDS[(size_t)i % (sizeof SEEDS / sizeof SEEDS[0])];
        size_t size = strlen(seed);
        memcpy(buf, seed, size);
        int mutations = rand() % 4;
        for (int m = 0; m < mutations; m++) {
            switch (rand() % 3) {
            case 0: /* flip a byte */
                if (size)
                    buf[rand() % size] = (uint8_t)rand();
                break;
            case 1: /* insert one */
                if (size < sizeof buf - 1) {
                    size_t at = size ? (size_t)rand() % size : 0;
                    memmove(buf + at + 1, buf + at, size - at);
                    buf[at] = (uint8_t)rand();
                    size++;
                }
                break;
            default: /* cut the tail */
                size = size ? (size_t)rand() % size : 0;
            }
        }
        LLVMFuzzerTestOneInput(buf, size);
    }
    printf("%ld inputs\n", iterations);
    return 0;
}

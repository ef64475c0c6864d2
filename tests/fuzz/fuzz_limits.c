/* libFuzzer target: the limit parser.  Whatever the text, the parser returns
 * 0 with a well-formed limit or an error, never crashes, never reads past the
 * string, and agrees with itself on a round trip of what it accepted. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';

    struct vgl_mem_limit limit;
    int err = vgl_parse_memory(text, &limit);
    if (err == 0) {
        /* Exactly one of the two forms, within range. */
        if ((limit.bytes == 0) == (limit.ppm == 0) || limit.ppm > 1000000 || limit.bytes > (UINT64_MAX >> 1))
            abort();
        char again[32];
        if (limit.bytes)
            snprintf(again, sizeof again, "%llu", (unsigned long long)limit.bytes);
        else
            snprintf(again, sizeof again, "%u.%06u%%", limit.ppm / 10000, (limit.ppm % 10000) * 100);
        struct vgl_mem_limit round;
        if (vgl_parse_memory(again, &round) != 0 || round.bytes != limit.bytes || round.ppm != limit.ppm)
            abort();
        if (vgl_cap_bytes(&limit, 80ULL << 30) > (80ULL << 30))
            abort();
    } else if (err != -EINVAL && err != -ERANGE) {
        abort();
    }
    uint32_t pct;
    err = vgl_parse_cores(text, &pct);
    if ((err == 0 && (pct < 1 || pct > 100)) || (err != 0 && err != -EINVAL && err != -ERANGE))
        abort();
    free(text);
    return 0;
}

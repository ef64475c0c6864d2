/* The C unit tests' one assertion: counts, says what failed and where, and
 * goes on, so one run reports every failure.  A test's main ends with
 * `return check_summary();`, whose "N passed, N failed" line CI's log reader knows. */
#ifndef VGPULIMIT_TEST_CHECK_H
#define VGPULIMIT_TEST_CHECK_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                                    \
    do {                                                                    \
        if (cond) {                                                         \
            passed++;                                                       \
        } else {                                                            \
            failed++;                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

static int check_summary(void)
{
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}

#endif

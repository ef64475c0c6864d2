/* elastic_model.c alone: who may use memory past its request, what a view
 * calls free, and which waiter goes first. */
#include <stdio.h>

#include "check.h"
#include "internal.h"

#define GIB (1ull << 30)

int main(void)
{
    /* Others' unused guarantees, each from 0 upward: one using past its guarantee holds nothing. */
    struct vgl_elastic_other others[] = {{10 * GIB, 0}, {4 * GIB, 3 * GIB}, {2 * GIB, 5 * GIB}};
    CHECK(vgl_elastic_held_for_others(others, 3) == 11 * GIB, "held: 10 + 1 + 0");
    CHECK(vgl_elastic_held_for_others(NULL, 0) == 0, "held: no one");
    struct vgl_elastic_other huge[] = {{UINT64_MAX, 0}, {GIB, 0}};
    CHECK(vgl_elastic_held_for_others(huge, 2) == UINT64_MAX, "held: saturates, never wraps");

    /* Within the request: always (the driver may still say the device is full). */
    CHECK(vgl_elastic_may_use(2 * GIB, GIB, 2 * GIB, 0, 100 * GIB), "within the request");
    /* Past it: the device must keep what it holds for others. */
    CHECK(vgl_elastic_may_use(5 * GIB, GIB, 2 * GIB, 12 * GIB, 10 * GIB), "borrow 1 of 2 spare");
    CHECK(!vgl_elastic_may_use(5 * GIB, 3 * GIB, 2 * GIB, 12 * GIB, 10 * GIB), "borrow 3 of 2 spare");
    CHECK(!vgl_elastic_may_use(5 * GIB, GIB, 2 * GIB, 8 * GIB, 10 * GIB), "held past what is free");
    /* Straddling the request: the whole allocation comes from spare memory. */
    CHECK(!vgl_elastic_may_use(3 * GIB, 2 * GIB, 2 * GIB, 11 * GIB, 10 * GIB), "straddling, 1 spare");

    /* Free: up to the request the device's free; past it the spare; never past the cap. */
    CHECK(vgl_elastic_free(8 * GIB, 0, 8 * GIB, 16 * GIB, 0) == 8 * GIB, "a plain cap: cap less use");
    CHECK(vgl_elastic_free(8 * GIB, 0, 8 * GIB, 5 * GIB, 0) == 5 * GIB, "a plain cap: the device's free");
    CHECK(vgl_elastic_free(8 * GIB, 3 * GIB, 2 * GIB, 13 * GIB, 10 * GIB) == 3 * GIB, "a borrower: spare");
    CHECK(vgl_elastic_free(8 * GIB, GIB, 4 * GIB, 2 * GIB, 10 * GIB) == 2 * GIB, "own request, held by borrowers");
    CHECK(vgl_elastic_free(8 * GIB, 9 * GIB, 2 * GIB, 16 * GIB, 0) == 0, "past the cap: none");

    /* Order: a higher rank first, then the older; an equal claim holds no one back. */
    struct vgl_waiter me = {1, 100};
    struct vgl_waiter older_lower[] = {{0, 50}}, newer_higher[] = {{2, 200}}, older_same[] = {{1, 99}},
                      same[] = {{1, 100}}, newer_same[] = {{1, 101}};
    CHECK(vgl_elastic_first(&me, older_lower, 1), "before an older, lower one");
    CHECK(!vgl_elastic_first(&me, newer_higher, 1), "after a newer, higher one");
    CHECK(!vgl_elastic_first(&me, older_same, 1), "after an older one of its rank");
    CHECK(vgl_elastic_first(&me, same, 1), "an equal claim");
    CHECK(vgl_elastic_first(&me, newer_same, 1), "before a newer one of its rank");
    CHECK(vgl_elastic_first(&me, NULL, 0), "alone");
    return check_summary();
}

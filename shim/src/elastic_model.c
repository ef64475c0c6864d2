/* Elastic memory's decisions (docs/memory.md), apart from the board, the
 * beacons and the driver that elastic.c reads them from (the first two
 * through beacons.c): who may use memory past its request, what a view
 * calls free, and which waiter goes first. */
#include "internal.h"

uint64_t vgl_elastic_held_for_others(const struct vgl_elastic_other *others, uint32_t n)
{
    uint64_t held = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t rest = others[i].used_bytes < others[i].guarantee_bytes
                            ? others[i].guarantee_bytes - others[i].used_bytes : 0;
        held = rest > UINT64_MAX - held ? UINT64_MAX : held + rest;
    }
    return held;
}

bool vgl_elastic_may_use(uint64_t used_after, uint64_t bytes, uint64_t request, uint64_t physical_free,
                         uint64_t held_for_others)
{
    if (used_after <= request)
        return true;
    /* Past the request the whole allocation comes from memory no one else
     * is owed: the device must keep what it holds for others free after it. */
    return held_for_others <= physical_free && bytes <= physical_free - held_for_others;
}

uint64_t vgl_elastic_free(uint64_t cap, uint64_t used, uint64_t request, uint64_t physical_free,
                          uint64_t held_for_others)
{
    uint64_t under_cap = used < cap ? cap - used : 0;
    /* Within its request it takes what the device has free; past it, only
     * what the device has free beyond what is held for others. */
    uint64_t own = used < request ? request - used : 0;
    own = own < physical_free ? own : physical_free;
    uint64_t spare = held_for_others < physical_free ? physical_free - held_for_others : 0;
    uint64_t now = spare > own ? spare : own;
    return now < under_cap ? now : under_cap;
}

bool vgl_elastic_first(const struct vgl_waiter *me, const struct vgl_waiter *others, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (others[i].rank > me->rank)
            return false;
        if (others[i].rank == me->rank && others[i].since_ns < me->since_ns)
            return false;
    }
    return true;
}

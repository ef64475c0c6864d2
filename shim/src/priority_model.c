/* What a launch does about priorities, from what the other containers'
 * beacons say (beacons.c reads them): wait for higher containers' work,
 * go as the floor, keep little in flight beside them, or go; and until when
 * the container's work then lasts.  No clock, no files, no atomics: the
 * caller passes the time, and holds its own lock around `hold`.  Tested
 * alone (tests/c/priority_model_test.c). */
#include "internal.h"

int64_t vgl_priority_wait(const struct vgl_priority_view *v, uint64_t own_until_ns, uint64_t now_ns,
                          bool behind, struct vgl_priority_hold *hold)
{
    int64_t wait = 0;
    bool floor = false;
    if (v->higher_ns && v->higher_ns + vgl_timings.priority_grace_ns > now_ns) {
        /* Held this long, one launch goes every vgl_timings.priority_floor_ns. */
        if (!hold->held_since_ns)
            hold->held_since_ns = now_ns;
        floor = now_ns - hold->held_since_ns >= vgl_timings.priority_floor_ns &&
                now_ns - hold->last_floor_ns >= vgl_timings.priority_floor_ns;
        if (floor)
            hold->last_floor_ns = now_ns;
        else
            wait = (int64_t)(v->higher_ns + vgl_timings.priority_grace_ns - now_ns);
    } else if (v->higher_shares && own_until_ns > now_ns + vgl_timings.priority_lookahead_ns) {
        wait = (int64_t)(own_until_ns - now_ns - vgl_timings.priority_lookahead_ns);
    } else if (v->higher_shares && behind) {
        /* The estimate says its work is done, the driver says it is not:
         * the driver is asked again a lookahead later. */
        wait = (int64_t)vgl_timings.priority_lookahead_ns;
    }
    if (wait > 0)
        return wait < vgl_timings.priority_max_wait_ns ? wait : vgl_timings.priority_max_wait_ns;
    if (!floor)
        hold->held_since_ns = 0;
    return 0;
}

uint64_t vgl_priority_until(const struct vgl_priority_view *v, uint64_t own_until_ns, uint64_t now_ns,
                            int64_t cost_ns)
{
    /* Not before what lower containers have in flight: it time-slices with
     * the container's, so they must wait until that is really done.  But
     * believed only as far as an honest one keeps work in flight beside a
     * higher one (the lookahead): what they claim is their tenants' to
     * write, and a claim further ahead would hold back this container
     * (its own lookahead, beside those above it) and those between. */
    uint64_t lower = v->lower_ns < now_ns + vgl_timings.priority_lookahead_ns ? v->lower_ns
                                                                      : now_ns + vgl_timings.priority_lookahead_ns;
    uint64_t start = now_ns > lower ? now_ns : lower;
    start = own_until_ns > start ? own_until_ns : start;
    return start + (uint64_t)(cost_ns > 0 ? cost_ns : 0);
}

/* What a launch does about priorities (shim/src/priority_model.c) alone, on
 * a fake clock, built with AddressSanitizer and UBSan by tests/test_priority.py.
 * Prints "N passed, N failed". */
#include "check.h"
#include "internal.h"

#define MS 1000000ULL

static int64_t wait_at(const struct vgl_priority_view *v, uint64_t own_until, uint64_t now,
                       struct vgl_priority_hold *hold)
{
    return vgl_priority_wait(v, own_until, now, false, hold);
}

int main(void)
{
    const uint64_t t = 1000 * MS;
    struct vgl_priority_hold hold = {0, 0};

    struct vgl_priority_view alone = {0, 0, false};
    CHECK(wait_at(&alone, t + 50 * MS, t, &hold) == 0, "no one above: a queue of any length goes");

    /* A higher container with 3 ms of work: wait, looking again within 2 ms. */
    struct vgl_priority_view busy = {t + 3 * MS, 0, true};
    CHECK(wait_at(&busy, 0, t, &hold) == (int64_t)vgl_timings.priority_max_wait_ns, "held back");
    CHECK(hold.held_since_ns == t, "held since %llu", (unsigned long long)hold.held_since_ns);
    int64_t w = wait_at(&busy, 0, t + 2 * MS, &hold);
    CHECK(w == (int64_t)(1 * MS + vgl_timings.priority_grace_ns), "until its work and the grace: %lld", (long long)w);
    /* Within the grace after its expected end: still held. */
    w = wait_at(&busy, 0, t + 3 * MS + vgl_timings.priority_grace_ns / 2, &hold);
    CHECK(w > 0 && w <= (int64_t)vgl_timings.priority_grace_ns, "the grace: %lld", (long long)w);
    /* Its work done: go, and the hold is over. */
    CHECK(wait_at(&busy, 0, t + 3 * MS + vgl_timings.priority_grace_ns, &hold) == 0, "back after the grace");
    CHECK(hold.held_since_ns == 0, "no longer held");

    /* Beside an idle higher container: at most the lookahead in flight. */
    struct vgl_priority_view idle = {t - 10 * MS, 0, true};
    CHECK(wait_at(&idle, t + vgl_timings.priority_lookahead_ns, t, &hold) == 0, "the lookahead in flight");
    w = wait_at(&idle, t + 2 * MS, t, &hold);
    CHECK(w == (int64_t)(2 * MS - vgl_timings.priority_lookahead_ns), "more waits until it drains: %lld", (long long)w);

    /* Its estimate done, its work not (the driver's word): it waits, and
     * asks again a lookahead later; beside no one above, the driver's word
     * changes nothing. */
    CHECK(vgl_priority_wait(&idle, t, t, true, &hold) == (int64_t)vgl_timings.priority_lookahead_ns,
          "behind its estimate beside a higher container: waits");
    CHECK(vgl_priority_wait(&alone, t, t, true, &hold) == 0, "behind, with no one above: goes");
    CHECK(vgl_priority_wait(&idle, t, t, false, &hold) == 0, "done, as estimated: goes");

    /* The floor: after 50 ms held, one launch, then one every 50 ms. */
    struct vgl_priority_hold h = {0, 0};
    struct vgl_priority_view forever = {t + 1000 * MS, 0, true};
    int went = 0;
    uint64_t first_floor = 0;
    for (uint64_t now = t; now < t + 201 * MS; now += MS / 10) {
        if (wait_at(&forever, 0, now, &h) == 0) {
            went++;
            if (!first_floor)
                first_floor = now;
        }
    }
    CHECK(first_floor == t + vgl_timings.priority_floor_ns, "the first floor at %llu ms",
          (unsigned long long)((first_floor - t) / MS));
    CHECK(went == 4, "one launch every 50 ms once held 50 ms, in 200 ms: %d", went);
    CHECK(h.held_since_ns == t, "a floor launch does not end the hold");

    /* Until when the container's work lasts. */
    struct vgl_priority_view lower = {0, t + vgl_timings.priority_lookahead_ns / 2, false};
    CHECK(vgl_priority_until(&alone, 0, t, 1 * MS) == t + 1 * MS, "from now");
    CHECK(vgl_priority_until(&alone, t + 2 * MS, t, 1 * MS) == t + 3 * MS, "after its own queue");
    CHECK(vgl_priority_until(&lower, 0, t, 1 * MS) == t + vgl_timings.priority_lookahead_ns / 2 + 1 * MS,
          "after the lower ones' in flight");
    CHECK(vgl_priority_until(&alone, 0, t, -5) == t, "a cost below zero adds nothing");
    /* A lower one that claims more than it could have in flight beside this
     * one is believed as far as the lookahead: no further. */
    struct vgl_priority_view forged = {0, t + 5000 * MS, false};
    CHECK(vgl_priority_until(&forged, 0, t, 1 * MS) == t + vgl_timings.priority_lookahead_ns + 1 * MS,
          "a claim 5 s ahead adds the lookahead");
    CHECK(vgl_priority_until(&forged, t + 2 * MS, t, 1 * MS) == t + 3 * MS, "and nothing to a longer queue");
    return check_summary();
}

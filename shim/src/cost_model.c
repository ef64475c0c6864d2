/* What a launch costs on the GPU, learnt from measurements; and how often to
 * measure.  No driver, no clock, no lock: the caller (busy_time.c) feeds it
 * event times and the host's clock and holds its lock; tests feed it numbers
 * (tests/c/cost_model_test.c).
 *
 * A measurement of one launch is an interval [start, end] on the GPU's clock:
 * `end` when its kernel was done (an event recorded after it), `start` when
 * it may have begun.  What an event recorded just before it says is not
 * enough: on an idle stream that event completes at once, while the kernel
 * reaches the GPU only as the launch call returns, after the launch's CPU
 * time (4-5 us on an H200's driver, more than many kernels take).  So a
 * measurement whose start event had completed before the launch was made
 * begins where the launch returned, on the host's clock: as long after the
 * start event as the host took from recording it to the launch's return
 * (vgl_interval_start).  Where the start event had not completed, the kernel
 * was queued behind earlier work and began when that was done: the event's
 * time.
 *
 * A kernel's cost is then the least of its recent measurements (of this
 * window of COST_WINDOW_NS and the one before), since an interval only grows
 * with waiting (behind other processes' time slices); each measurement first
 * goes through the median of the kernel's last three, so that one measurement
 * the host's clock made too short (the thread descheduled as the launch
 * returned) is not taken as its cost. */
#include <string.h>

#include "internal.h"

/* A cost is the least over two of these: a kernel that became slower is
 * charged so within two windows. */
#define COST_WINDOW_NS 1000000000ULL
/* While a kernel's first measurement is under way, for up to this long, its
 * other launches are not measured, and are settled once it is known. */
#define MEASURING_NS 1000000000ULL
/* Measurements follow one another until this many in a row moved no cost up
 * (the first intervals of a kernel are often stretched alike, by sibling
 * processes that started with it); then SAMPLE_FIRST launches between them,
 * four times more after each that moves no cost up, up to SAMPLE_EVERY. */
#define SAMPLES_HELD 2
#define SAMPLE_FIRST 8
#define SAMPLE_EVERY 128

static uint32_t cost_slot(const void *key)
{
    return (uint32_t)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ULL >> 56) % VGL_COSTS;
}

bool vgl_cost_known(const struct vgl_costs *costs, const void *key, int64_t *ns)
{
    const struct vgl_cost *c = &costs->slot[cost_slot(key)];
    bool known = c->key == key && c->ns;
    *ns = known ? c->ns : VGL_FIRST_COST_NS;
    return known;
}

/* Launches of c's kernel waiting for its first measurement are settled at `ns`. */
static struct vgl_settlement settle_pending(struct vgl_cost *c, int64_t ns)
{
    struct vgl_settlement s = {.device = c->device, .launches = c->pending, .used_ns = ns};
    c->pending = 0;
    return s;
}

bool vgl_cost_measure_first(struct vgl_costs *costs, const void *key, int device, uint64_t now_ns,
                            struct vgl_settlement *evicted)
{
    struct vgl_cost *c = &costs->slot[cost_slot(key)];
    *evicted = (struct vgl_settlement){0};
    if (c->key == key && now_ns - c->measuring_ns < MEASURING_NS)
        return false;
    if (c->key != key) {
        *evicted = settle_pending(c, VGL_FIRST_COST_NS);
        *c = (struct vgl_cost){.key = key, .device = device};
    }
    c->measuring_ns = now_ns;
    return true;
}

bool vgl_cost_wait_first(struct vgl_costs *costs, const void *key, int64_t *ns)
{
    struct vgl_cost *c = &costs->slot[cost_slot(key)];
    if (c->key != key)
        return false;
    if (!c->ns) {
        c->pending++;
        return true;
    }
    *ns = c->ns;
    return false;
}

static int64_t median3(int64_t a, int64_t b, int64_t c)
{
    int64_t lo = a < b ? a : b, hi = a < b ? b : a;
    return c < lo ? lo : c > hi ? hi : c;
}

int vgl_cost_learn(struct vgl_costs *costs, const void *key, int64_t per_launch_ns, uint64_t now_ns,
                   struct vgl_settlement *settled)
{
    struct vgl_cost *c = &costs->slot[cost_slot(key)];
    /* At least 1 ns: 0 is "not measured yet" (an empty graph, or an interval below the timer's resolution). */
    if (per_launch_ns < 1)
        per_launch_ns = 1;
    *settled = (struct vgl_settlement){0};
    if (c->key != key || !c->ns) {
        *settled = settle_pending(c, c->key == key ? per_launch_ns : VGL_FIRST_COST_NS);
        *c = (struct vgl_cost){.key = key, .ns = per_launch_ns, .window_ns = per_launch_ns,
                               .earlier_ns = per_launch_ns, .window_from = now_ns,
                               .last = {per_launch_ns, per_launch_ns}};
        return 1;
    }
    int64_t taken = median3(c->last[0], c->last[1], per_launch_ns);
    c->last[0] = c->last[1];
    c->last[1] = per_launch_ns;
    if (now_ns - c->window_from >= COST_WINDOW_NS) {
        c->earlier_ns = c->window_ns;
        c->window_ns = taken;
        c->window_from = now_ns;
    } else if (taken < c->window_ns) {
        c->window_ns = taken;
    }
    int64_t was = c->ns;
    c->ns = c->window_ns < c->earlier_ns ? c->window_ns : c->earlier_ns;
    return 8 * (c->ns - was) > was ? 1 : 8 * (was - c->ns) > was ? -1 : 0;
}

void vgl_costs_forget(struct vgl_costs *costs)
{
    memset(costs, 0, sizeof *costs);
}

int64_t vgl_interval_start(int64_t event_ns, uint64_t recorded_ns, uint64_t returned_ns)
{
    /* recorded_ns is 0 where the event had not completed before the launch. */
    return recorded_ns && returned_ns > recorded_ns ? event_ns + (int64_t)(returned_ns - recorded_ns) : event_ns;
}

bool vgl_cadence_due(const struct vgl_cadence *c)
{
    return c->since >= c->every;
}

void vgl_cadence_skipped(struct vgl_cadence *c)
{
    c->since++;
}

void vgl_cadence_sampled(struct vgl_cadence *c)
{
    c->since = 0;
}

void vgl_cadence_unknown(struct vgl_cadence *c)
{
    c->every = 0;
}

void vgl_cadence_learnt(struct vgl_cadence *c, int moved)
{
    /* A cost that fell was an earlier interval stretched by other contexts'
     * slices (an interval never shrinks below the kernel): it counts as holding. */
    c->held = moved > 0 ? 0 : c->held + 1;
    if (c->held < SAMPLES_HELD)
        c->every = 0;
    else
        c->every = !c->every ? SAMPLE_FIRST : 4 * c->every < SAMPLE_EVERY ? 4 * c->every : SAMPLE_EVERY;
}

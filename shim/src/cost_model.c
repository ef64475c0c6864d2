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
 * time.  (The end event is recorded after the launch returns: a kernel that
 * ended before it was is charged until it was, ~0.2 us of the shim's work on
 * simgpu; no kernel on a GPU is that short.)
 *
 * A kernel's cost is then the least of its recent measurements (of this
 * window and the one before), since an interval only grows
 * with waiting (behind other processes' time slices); a measurement that
 * began on the host's clock first goes through the median of the kernel's
 * last three (unions of runs left out), so that one the host made too short
 * (the thread descheduled as the launch returned) is not taken as its cost.
 *
 * Where a context launches on several streams, runs of launches per stream
 * are merged into the time during which any of its kernels was on the GPU,
 * counted once however many streams overlapped: the union (vgl_union_add),
 * each run counted at most what its launches are known to cost.  A group of
 * overlapping runs teaches its union per launch, which is the cost of
 * kernels that kept their streams busy (concurrent ones counted once); where
 * the streams ran dry between launches it holds the idle gaps, so launches
 * timed alone on those streams teach too, and the least is the cost. */
#include <string.h>

#include "internal.h"

/* The timing constants are timings.def's; the counts are here.  A cost's
 * window holds at least WINDOW_SAMPLES measurements; a kernel's launches
 * until it has been measured FIRST_MEASUREMENTS times are held back and
 * settled at its cost then (processes started together stretch one
 * another's first measurements alike; the third took 20 ms once the first
 * had throttled them apart).  Measurements follow one another until
 * SAMPLES_HELD in a row moved no cost up (the first intervals of a kernel
 * are often stretched alike, by sibling processes that started with it);
 * then SAMPLE_FIRST launches between them, four times more after each that
 * moves no cost up, up to SAMPLE_EVERY, or two cost windows after the last
 * (measured every 128 launches, a process of 20 ms kernels at 25 % would
 * wait ten seconds for the next measurement). */
#define WINDOW_SAMPLES 4
#define FIRST_MEASUREMENTS 3
#define SAMPLES_HELD 2
#define SAMPLE_FIRST 8
#define SAMPLE_EVERY 128
/* busy_time.c's runs of several streams close after this many launches. */
enum {
    RUN_LAUNCHES = 64,
};
/* What runs read back may keep of what their kernels are known to cost and
 * did not take, for later runs whose spans take more (a stream's run that
 * spans its sibling stream's kernels is charged what the sibling's run did
 * not take): two of the longest runs. */
static int64_t allowance_ns(void) { return 2 * vgl_timings.long_run_ns; }

static uint32_t cost_slot(const void *key)
{
    return (uint32_t)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ULL >> 56) % VGL_COSTS;
}

bool vgl_cost_known(const struct vgl_costs *costs, const void *key, int64_t *ns)
{
    const struct vgl_cost *c = &costs->slot[cost_slot(key)];
    bool known = c->key == key && c->ns;
    *ns = known ? c->ns : vgl_timings.first_cost_ns;
    return known;
}

/* Launches of c's kernel held back for its first measurement are settled at
 * `ns` each. */
static struct vgl_settlement settle_pending(struct vgl_cost *c, int64_t ns)
{
    struct vgl_settlement s = {.device = c->device, .charged_ns = c->pending_charged_ns,
                               .used_ns = ns * (int64_t)c->pending};
    c->pending = 0;
    c->pending_charged_ns = 0;
    return s;
}

bool vgl_cost_measure_first(struct vgl_costs *costs, const void *key, int device, uint64_t now_ns,
                            struct vgl_settlement *evicted)
{
    struct vgl_cost *c = &costs->slot[cost_slot(key)];
    *evicted = (struct vgl_settlement){0};
    if (c->key == key && now_ns - c->measuring_ns < vgl_timings.measuring_ns)
        return false;
    if (c->key != key) {
        *evicted = settle_pending(c, vgl_timings.first_cost_ns);
        *c = (struct vgl_cost){.key = key, .device = device};
    }
    c->measuring_ns = now_ns;
    return true;
}

bool vgl_cost_held_back(struct vgl_costs *costs, const void *key, int64_t charged_ns)
{
    struct vgl_cost *c = &costs->slot[cost_slot(key)];
    if (c->key != key || c->measured >= FIRST_MEASUREMENTS)
        return false;
    c->pending++;
    c->pending_charged_ns += charged_ns;
    return true;
}

static int64_t median3(int64_t a, int64_t b, int64_t c)
{
    int64_t lo = a < b ? a : b, hi = a < b ? b : a;
    return c < lo ? lo : c > hi ? hi : c;
}

int vgl_cost_learn(struct vgl_costs *costs, const void *key, int64_t per_launch_ns, enum vgl_clock clock,
                   uint64_t now_ns, struct vgl_settlement *settled)
{
    struct vgl_cost *c = &costs->slot[cost_slot(key)];
    /* At least 1 ns: 0 is "not measured yet" (an empty graph, or an interval below the timer's resolution). */
    if (per_launch_ns < 1)
        per_launch_ns = 1;
    *settled = (struct vgl_settlement){0};
    if (c->key != key || !c->ns) {
        if (c->key != key)
            *settled = settle_pending(c, vgl_timings.first_cost_ns);
        *c = (struct vgl_cost){.key = key, .ns = per_launch_ns, .window_ns = per_launch_ns,
                               .earlier_ns = per_launch_ns, .window_from = now_ns, .window_samples = 1,
                               .last = {per_launch_ns, per_launch_ns},
                               .measured = 1, .pending = c->key == key ? c->pending : 0,
                               .pending_charged_ns = c->key == key ? c->pending_charged_ns : 0, .device = c->device};
        return 1;
    }
    /* A measurement of the GPU's clock alone is never too short: taken as it
     * is.  A union of runs per launch is kept out of the median: its spans
     * hold the idle gaps of a launch-bound program on several streams
     * (several times its kernels), and two of those would outvote its
     * kernel timed alone. */
    int64_t taken = clock == VGL_ON_HOST ? median3(c->last[0], c->last[1], per_launch_ns) : per_launch_ns;
    if (clock != VGL_OVER_RUNS) {
        c->last[0] = c->last[1];
        c->last[1] = per_launch_ns;
    }
    if (now_ns - c->window_from >= vgl_timings.cost_window_ns && c->window_samples >= WINDOW_SAMPLES) {
        c->earlier_ns = c->window_ns;
        c->window_ns = taken;
        c->window_from = now_ns;
        c->window_samples = 1;
    } else {
        c->window_ns = taken < c->window_ns ? taken : c->window_ns;
        c->window_samples++;
    }
    int64_t was = c->ns;
    c->ns = c->window_ns < c->earlier_ns ? c->window_ns : c->earlier_ns;
    if (c->measured < FIRST_MEASUREMENTS && ++c->measured == FIRST_MEASUREMENTS)
        *settled = settle_pending(c, c->ns);
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

uint64_t vgl_call_returned(struct vgl_call_time *calls, uint64_t called_ns, uint64_t returned_ns)
{
    if (!called_ns || returned_ns <= called_ns)
        return returned_ns;
    int64_t took = (int64_t)(returned_ns - called_ns);
    if (!calls->window_from || returned_ns - calls->window_from >= vgl_timings.cost_window_ns) {
        calls->earlier_ns = calls->window_from ? calls->window_ns : took;
        calls->window_ns = took;
        calls->window_from = returned_ns;
    } else if (took < calls->window_ns) {
        calls->window_ns = took;
    }
    int64_t least = calls->window_ns < calls->earlier_ns ? calls->window_ns : calls->earlier_ns;
    return called_ns + (uint64_t)least;
}

bool vgl_cadence_due(const struct vgl_cadence *c, uint64_t now_ns, int64_t cost_ns)
{
    return c->since >= c->every || now_ns - c->sampled_ns >= (2 * vgl_timings.cost_window_ns) || cost_ns >= vgl_timings.long_kernel_ns;
}

void vgl_cadence_skipped(struct vgl_cadence *c)
{
    c->since++;
}

void vgl_cadence_sampled(struct vgl_cadence *c, uint64_t now_ns)
{
    c->since = 0;
    c->sampled_ns = now_ns;
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

bool vgl_union_close(struct vgl_union *u, struct vgl_lesson *lesson)
{
    if (!u->group_launches)
        return false;
    *lesson = (struct vgl_lesson){.key = u->group_key,
                                  .per_launch_ns = (u->covered_ns - u->group_gpu_start) / u->group_launches};
    u->group_launches = 0;
    return true;
}

int64_t vgl_union_add(struct vgl_union *u, const struct vgl_span *r, struct vgl_lesson *lesson, bool *taught)
{
    int64_t start = r->start_ns < r->end_ns ? r->start_ns : r->end_ns, end = r->end_ns;
    /* Overlapping runs teach together: a kernel's cost is their union per
     * launch, as the busy time they are counted is their union.  (A stream's
     * span alone holds its siblings' kernels where they take turns.)  So a
     * group teaches once a run begins after all of it has ended. */
    *taught = start >= u->covered_ns && vgl_union_close(u, lesson);
    /* A group teaches from where its runs began on the GPU's clock alone, so
     * that its lesson, taken as it is (it bypasses the median of the host's
     * measurements), is never too short: a launch timed alone adds to the
     * busy time from its return, which a thread descheduled as its launch
     * returned makes late (a launch-bound program on two streams, alone in
     * its group, taught 0.8 us a launch of 2 us kernels on a busy machine,
     * and was charged 0.65 of its kernels' time). */
    int64_t gpu_start = r->gpu_start_ns < start ? r->gpu_start_ns : start;
    if (!u->group_launches) {
        u->group_key = r->key;
        u->group_start = start;
        u->group_gpu_start = gpu_start;
    } else if (u->group_key != r->key) {
        u->group_key = NULL;
    }
    if (gpu_start < u->group_gpu_start)
        u->group_gpu_start = gpu_start;
    u->group_launches += r->launches;
    /* What this run adds to the busy time so far.  Runs are read back in the
     * order they closed, which is not always the order they began: one that
     * began before its group did adds that stretch too. */
    int64_t from = start > u->covered_ns ? start : u->covered_ns;
    int64_t busy = end > from ? end - from : 0;
    if (start < u->group_start) {
        busy += (end < u->group_start ? end : u->group_start) - start;
        u->group_start = start;
    }
    if (end > u->covered_ns)
        u->covered_ns = end;
    /* At most what its kernels are known to cost: over several runs, as one
     * stream's run may span the time the other's kernels ran, while theirs
     * adds nothing. */
    if (r->known) {
        u->allowance_ns += r->charged_ns;
        if (busy > u->allowance_ns)
            busy = u->allowance_ns;
        u->allowance_ns -= busy;
        if (u->allowance_ns > allowance_ns())
            u->allowance_ns = allowance_ns();
    }
    return busy;
}

void vgl_union_restart(struct vgl_union *u)
{
    u->covered_ns = 0;
}

bool vgl_run_full(int64_t charged_ns, uint32_t launches)
{
    int64_t run_ns = charged_ns / launches >= vgl_timings.long_kernel_ns ? vgl_timings.long_run_ns : vgl_timings.run_ns;
    return launches >= RUN_LAUNCHES || charged_ns >= run_ns;
}

bool vgl_runs_follow(uint32_t streams, uint64_t reference_age_ns)
{
    return streams > 1 && reference_age_ns < vgl_timings.reference_ns;
}

bool vgl_idle_asked(bool known, int64_t cost_ns)
{
    return !known || cost_ns < vgl_timings.idle_asked_below_ns;
}

uint64_t vgl_run_due(bool known, int64_t charged_ns, uint64_t closed_ns)
{
    /* A run of known costs is not done before they have passed, twice over. */
    return known ? closed_ns + 2 * (uint64_t)charged_ns : closed_ns;
}

uint64_t vgl_run_poll(bool known, uint64_t closed_ns, uint64_t now_ns)
{
    /* A run queued behind much work costs few queries. */
    uint64_t late = now_ns > closed_ns ? now_ns - closed_ns : 0;
    uint64_t least = known ? vgl_timings.poll_known_ns : vgl_timings.poll_first_ns;
    return now_ns + (late > least ? late : least);
}

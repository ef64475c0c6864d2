/* Simulated GPU time: one timeline per device in the machine-wide state file,
 * kept as a GPU keeps time.
 *
 * Work is queued in streams, each stream's items in order: kernels, copies
 * and markers (an event recorded, or a stream's wait for an event).  Nothing runs
 * at launch: whichever process next looks at a device (a launch, a query, a
 * synchronisation, NVML) simulates it forward to the clock, under the file's
 * lock, by these rules:
 * - The device runs one context at a time, for a time slice
 *   (SIMGPU_TIMESLICE_US) while another context has work waiting, then the
 *   context served longest ago; a kernel still running at the end of its
 *   context's slice is preempted and resumes in its next one.  A context with
 *   nothing it can run gives its slice up at once.  (Contexts of different
 *   processes time-slice so without MPS.)
 * - Within the context holding the device, the first item of each stream may
 *   run: markers complete at once (an event completes when its stream's
 *   earlier work has, in its context's slice), and up to
 *   SIMGPU_CONCURRENT_KERNELS kernels of different streams run together, the
 *   earliest queued first.  An item waiting for another (`after`) starts only
 *   when that one is done.
 * - Copies and memsets run on the device's copy engines (enum sim_engine),
 *   beside the kernels and whichever context holds the SMs: each engine runs
 *   the earliest queued copy that is first in its stream, one at a time.
 *   They take their stream's turn like kernels, so an event recorded after a
 *   copy completes when the copy has.
 * Time during which a context ran kernels is credited once to its process
 * (and to the utilisation samples NVML reports), however many overlapped;
 * time spent copying is not kernel time, and is credited to no one.
 * A synchronisation sleeps until the simulation's next step, when it looks
 * again: work queued meanwhile can only delay what it waits for. */
#include <errno.h>
#include <time.h>

#include "base.h"
#include "state.h"

_Static_assert(sizeof(struct sim_work) == 72, "work layout");
_Static_assert(sizeof(struct sim_sample) == 24 + 24 * SIM_SAMPLE_PROCS, "sample layout");

/* A GPU has one clock, whatever time namespace a process that drives it is
 * in: the timelines keep the initial namespace's (base/clock.c).  On its own
 * clock, a process whose monotonic clock runs ahead ran every timeline that
 * far ahead, and the others' kernels waited as long. */
uint64_t sim_now_ns(void)
{
    return vgl_node_clock_ns();
}

void sim_sleep_until(uint64_t deadline_ns)
{
    uint64_t own = vgl_node_to_own_ns(deadline_ns);
    struct timespec ts = {.tv_sec = (time_t)(own / 1000000000ULL), .tv_nsec = (long)(own % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        continue;
}

static uint64_t sim_min(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Ends the sample periods that are over by `until` and starts the one that
 * holds it.  A long idle stretch is skipped to the last SIM_SAMPLES periods:
 * the ones before would be overwritten at once. */
static void sim_close_periods(struct sim_timeline *tl, uint64_t until)
{
    struct sim_sample *cur = &tl->current;
    if (!cur->end_ns) {
        cur->end_ns = until - until % SIM_SAMPLE_NS + SIM_SAMPLE_NS;
        return;
    }
    while (cur->end_ns <= until) {
        uint32_t slot = (tl->sample_head + tl->sample_count) % SIM_SAMPLES;
        if (tl->sample_count == SIM_SAMPLES)
            tl->sample_head = (tl->sample_head + 1) % SIM_SAMPLES;
        else
            tl->sample_count++;
        tl->samples[slot] = *cur;
        uint64_t end = cur->end_ns + SIM_SAMPLE_NS;
        uint64_t behind = (until - cur->end_ns) / SIM_SAMPLE_NS;
        if (behind > SIM_SAMPLES)
            end += (behind - SIM_SAMPLES) * SIM_SAMPLE_NS;
        *cur = (struct sim_sample){.end_ns = end};
    }
}

static bool sim_same(const struct sim_pid *a, const struct sim_pid *b)
{
    return a->ns == b->ns && a->pid == b->pid;
}

/* Credits [from, to) of the device's time to `who`, period by period. */
static void sim_credit(struct sim_timeline *tl, uint64_t from, uint64_t to, const struct sim_pid *who)
{
    while (from < to) {
        sim_close_periods(tl, from);
        struct sim_sample *cur = &tl->current;
        uint64_t upto = sim_min(to, cur->end_ns);
        uint64_t ns = upto - from;
        cur->busy_ns += ns;
        tl->busy_ns += ns;
        uint32_t i = 0;
        while (i < cur->nprocs && !sim_same(&cur->procs[i].who, who))
            i++;
        if (i == cur->nprocs && i < SIM_SAMPLE_PROCS) {
            cur->procs[i].who = *who;
            cur->procs[i].busy_ns = 0;
            cur->nprocs++;
        }
        if (i < cur->nprocs)
            cur->procs[i].busy_ns += ns;
        from = upto;
    }
}

static bool sim_same_ctx(const struct sim_work *w, const struct sim_pid *who, uint64_t ctx)
{
    return w->ctx == ctx && sim_same(&w->who, who);
}

static struct sim_work *sim_item(struct sim_timeline *tl, uint64_t ticket)
{
    return &tl->work[ticket % SIM_TIMELINE_SLOTS];
}

/* Whether `ticket` is done; its time in *done_ns (0: no longer kept). */
static bool sim_ticket_done(struct sim_timeline *tl, uint64_t ticket, uint64_t *done_ns)
{
    *done_ns = 0;
    if (ticket >= tl->next)
        return false; /* not a ticket of this device: taken as never done */
    const struct sim_work *w = sim_item(tl, ticket);
    if (w->ticket == ticket) {
        *done_ns = w->done_ns;
        return w->done_ns != 0;
    }
    return true; /* its slot was given to a later item: done long ago */
}

/* When a context last began a slice (0: not remembered). */
static uint64_t *sim_served(struct sim_timeline *tl, const struct sim_pid *who, uint64_t ctx, bool add)
{
    uint32_t oldest = 0;
    for (uint32_t i = 0; i < SIM_SERVED; i++) {
        if (tl->served[i].ctx == ctx && sim_same(&tl->served[i].who, who))
            return &tl->served[i].at_ns;
        if (tl->served[i].at_ns < tl->served[oldest].at_ns)
            oldest = i;
    }
    if (!add)
        return NULL;
    tl->served[oldest].who = *who;
    tl->served[oldest].ctx = ctx;
    tl->served[oldest].at_ns = 0;
    return &tl->served[oldest].at_ns;
}

/* Gives the device to the context of a pending item other than the active
 * one that was served longest ago (or, with `or_active`, to the active one
 * when no other has work); false when there is none. */
static bool sim_switch(struct sim_timeline *tl, uint64_t at, bool or_active)
{
    const struct sim_work *best = NULL;
    uint64_t best_served = 0;
    for (uint64_t t = tl->head; t < tl->next; t++) {
        const struct sim_work *w = sim_item(tl, t);
        if (w->done_ns || sim_same_ctx(w, &tl->active_who, tl->active_ctx))
            continue;
        uint64_t *served = sim_served(tl, &w->who, w->ctx, false);
        uint64_t at_ns = served ? *served : 0;
        if (!best || at_ns < best_served) {
            best = w;
            best_served = at_ns;
        }
    }
    if (!best) {
        if (!or_active)
            return false;
        tl->slice_end_ns = at + sim_config()->timeslice_ns;
        return true;
    }
    tl->active_who = best->who;
    tl->active_ctx = best->ctx;
    tl->slice_end_ns = at + sim_config()->timeslice_ns;
    *sim_served(tl, &best->who, best->ctx, true) = at;
    return true;
}

/* A stream on the device: the same stream address may be another process's. */
struct sim_stream_key {
    struct sim_pid who;
    uint64_t ctx, stream;
};

/* The copy each copy engine runs now (NULL: none): of the copies first in
 * their streams whose wait is over, the earliest queued, whatever context
 * holds the SMs.  A copy whose stream cannot be told apart (more than 64
 * streams with work) waits for a later look. */
static void sim_copies_running(struct sim_timeline *tl, struct sim_work *running[SIM_ENGINES])
{
    struct sim_stream_key seen[64];
    uint32_t nseen = 0, free_engines = SIM_ENGINES - 1;
    for (uint32_t e = 0; e < SIM_ENGINES; e++)
        running[e] = NULL;
    for (uint64_t k = tl->head; k < tl->next && free_engines; k++) {
        struct sim_work *w = sim_item(tl, k);
        if (w->done_ns)
            continue;
        uint32_t i = 0;
        while (i < nseen && !(seen[i].stream == w->stream && sim_same_ctx(w, &seen[i].who, seen[i].ctx)))
            i++;
        if (i < nseen)
            continue; /* not its stream's first */
        if (nseen == 64)
            break;
        seen[nseen++] = (struct sim_stream_key){.who = w->who, .ctx = w->ctx, .stream = w->stream};
        uint64_t ignored;
        if (w->engine == SIM_ENGINE_SM || w->engine >= SIM_ENGINES || running[w->engine] ||
            (w->after && !sim_ticket_done(tl, w->after, &ignored)))
            continue;
        running[w->engine] = w;
        free_engines--;
    }
}

/* Simulates the device forward to `now` (see the top of the file).  *next_ns:
 * when its state next changes if nothing is queued meanwhile (UINT64_MAX:
 * never). */
static void sim_advance(struct sim_timeline *tl, uint64_t now, uint64_t *next_ns)
{
    const struct sim_config *cfg = sim_config();
    uint32_t concurrent = cfg ? cfg->concurrent_kernels : 1;
    *next_ns = UINT64_MAX;
    uint64_t t = tl->clock_ns;
    uint32_t idle_switches = 0;
    if (t > now)
        now = t;
    for (;;) {
        while (tl->head < tl->next && sim_item(tl, tl->head)->done_ns)
            tl->head++;
        if (tl->head == tl->next) {
            tl->active_ctx = 0;
            break;
        }
        /* The active context's runnable heads, and whether another waits. */
        struct sim_work *running[SIM_MAX_CONCURRENT];
        uint64_t seen[64];
        uint32_t nrunning = 0, nseen = 0;
        bool others = false, mine = false, progressed = false, copies = false;
        for (uint64_t k = tl->head; k < tl->next; k++) {
            struct sim_work *w = sim_item(tl, k);
            if (w->done_ns)
                continue;
            copies = copies || w->engine != SIM_ENGINE_SM;
            if (!tl->active_ctx || !sim_same_ctx(w, &tl->active_who, tl->active_ctx)) {
                others = true;
                continue;
            }
            mine = true;
            uint32_t i = 0;
            while (i < nseen && seen[i] != w->stream)
                i++;
            if (i < nseen)
                continue; /* not its stream's first */
            uint64_t ignored;
            if (!w->after || sim_ticket_done(tl, w->after, &ignored)) {
                if (!w->left_ns) {
                    w->done_ns = t ? t : 1;
                    progressed = true;
                    continue; /* the stream's next item may start too */
                }
                if (w->engine == SIM_ENGINE_SM && nrunning < concurrent)
                    running[nrunning++] = w;
            }
            if (nseen < 64)
                seen[nseen++] = w->stream;
        }
        if (progressed) {
            idle_switches = 0;
            continue;
        }
        struct sim_work *copying[SIM_ENGINES] = {NULL};
        if (copies)
            sim_copies_running(tl, copying);
        bool copy_runs = false;
        for (uint32_t e = 1; e < SIM_ENGINES; e++)
            copy_runs = copy_runs || copying[e];
        if (!mine || !nrunning) {
            /* Nothing the active context can run on the SMs: they go to
             * another.  (The context of the oldest item can always run
             * something: what it waits for was queued before it, unless that
             * is a copy.) */
            if (++idle_switches <= SIM_SERVED + 1 && sim_switch(tl, t, false))
                continue;
            tl->active_ctx = 0;
            if (!copy_runs)
                break; /* every pending item waits for one that is not queued yet */
            nrunning = 0; /* only the copy engines run until their next copy ends */
        }
        uint64_t step = UINT64_MAX;
        for (uint32_t i = 0; i < nrunning; i++)
            step = sim_min(step, t + running[i]->left_ns);
        for (uint32_t e = 1; e < SIM_ENGINES; e++)
            if (copying[e])
                step = sim_min(step, t + copying[e]->left_ns);
        if (!nrunning) {
            /* no context holds the SMs */
        } else if (others) {
            if (tl->slice_end_ns <= t) {
                sim_switch(tl, t, true);
                continue;
            }
            step = sim_min(step, tl->slice_end_ns);
        } else if (tl->slice_end_ns < t + cfg->timeslice_ns) {
            tl->slice_end_ns = t + cfg->timeslice_ns; /* a newcomer waits at most a slice */
        }
        if (step > now) {
            *next_ns = step;
            step = now;
        }
        idle_switches = 0;
        uint64_t dt = step - t;
        if (nrunning)
            sim_credit(tl, t, step, &tl->active_who); /* kernel time only: copies are not */
        for (uint32_t i = 0; i < nrunning; i++) {
            running[i]->left_ns -= dt;
            if (!running[i]->left_ns)
                running[i]->done_ns = step;
        }
        for (uint32_t e = 1; e < SIM_ENGINES; e++) {
            if (!copying[e])
                continue;
            copying[e]->left_ns -= dt;
            if (!copying[e]->left_ns)
                copying[e]->done_ns = step;
        }
        t = step;
        if (t == now && *next_ns != UINT64_MAX)
            break;
    }
    tl->clock_ns = now;
    sim_close_periods(tl, now);
}

static struct sim_timeline *sim_lock_timeline(uint32_t device, struct sim_file **out)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return NULL;
    if (device >= f->device_count) {
        sim_state_unlock_file(f);
        return NULL;
    }
    *out = f;
    return &f->timelines[device];
}

int sim_timeline_submit(uint32_t device, struct sim_work *item, uint64_t *ticket, uint64_t *wake_ns)
{
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    uint64_t next;
    sim_advance(tl, sim_now_ns(), &next);
    if (tl->next - tl->head >= SIM_TIMELINE_SLOTS) {
        *wake_ns = next;
        sim_state_unlock_file(f);
        return -EAGAIN;
    }
    if (!tl->next)
        tl->next = tl->head = 1;
    item->ticket = tl->next++;
    item->done_ns = 0;
    item->who = sim_state_self();
    *sim_item(tl, item->ticket) = *item;
    *ticket = item->ticket;
    sim_state_unlock_file(f);
    return 0;
}

int sim_timeline_done(uint32_t device, uint64_t ticket, uint64_t ctx, uint64_t *done_ns, uint64_t *wake_ns)
{
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    sim_advance(tl, sim_now_ns(), wake_ns);
    bool done = sim_ticket_done(tl, ticket, done_ns);
    if (done && ctx) {
        struct sim_pid self = sim_state_self();
        for (uint64_t t = tl->head; done && t < ticket; t++)
            done = sim_item(tl, t)->done_ns || !sim_same_ctx(sim_item(tl, t), &self, ctx);
    }
    sim_state_unlock_file(f);
    return done;
}

int sim_timeline_wait(uint32_t device, uint64_t ticket, uint64_t ctx, uint64_t *done_ns)
{
    uint64_t wake;
    int rc;
    while ((rc = sim_timeline_done(device, ticket, ctx, done_ns, &wake)) == 0) {
        if (wake == UINT64_MAX)
            wake = sim_now_ns() + 1000000; /* waits for work not queued yet: looks again */
        sim_sleep_until(wake);
    }
    return rc < 0 ? rc : 0;
}

int sim_timeline_utilization(uint32_t device, unsigned int *percent)
{
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    uint64_t next;
    sim_advance(tl, sim_now_ns(), &next);
    /* The last second, as far as samples reach back. */
    enum { PERIODS = 1000000000ULL / SIM_SAMPLE_NS };
    uint32_t n = tl->sample_count < PERIODS ? tl->sample_count : PERIODS;
    uint64_t busy = 0;
    for (uint32_t i = 0; i < n; i++)
        busy += tl->samples[(tl->sample_head + tl->sample_count - 1 - i) % SIM_SAMPLES].busy_ns;
    sim_state_unlock_file(f);
    *percent = n ? (unsigned int)((busy * 100 + n * SIM_SAMPLE_NS / 2) / (n * SIM_SAMPLE_NS)) : 0;
    return 0;
}

int sim_timeline_samples(uint32_t device, uint64_t since_us, struct sim_proc_sample *out, uint32_t max)
{
    /* CLOCK_REALTIME minus the timelines' clock, in us: NVML stamps samples with the wall clock. */
    uint64_t mono = sim_now_ns();
    int64_t offset_us = (int64_t)(vgl_clock_ns(CLOCK_REALTIME) / 1000) - (int64_t)(mono / 1000);
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    uint64_t next;
    sim_advance(tl, sim_now_ns(), &next);
    uint32_t n = 0;
    for (uint32_t i = 0; i < tl->sample_count; i++) {
        const struct sim_sample *s = &tl->samples[(tl->sample_head + i) % SIM_SAMPLES];
        uint64_t stamp = (uint64_t)((int64_t)(s->end_ns / 1000) + offset_us);
        if (stamp <= since_us)
            continue;
        for (uint32_t p = 0; p < s->nprocs; p++) {
            if (n < max)
                out[n] = (struct sim_proc_sample){
                    .who = s->procs[p].who,
                    .sm_percent = (unsigned int)((s->procs[p].busy_ns * 100 + SIM_SAMPLE_NS / 2) / SIM_SAMPLE_NS),
                    .timestamp_us = stamp,
                };
            n++;
        }
    }
    sim_state_unlock_file(f);
    struct sim_host_pids host = {0};
    for (uint32_t i = 0; i < n && i < max; i++)
        out[i].pid = sim_driver_pid(&out[i].who, &host);
    sim_host_pids_free(&host);
    return (int)n;
}

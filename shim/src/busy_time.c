/* The GPU time a process's kernels take, measured through the CUDA API alone
 * (so the same code holds on a real GPU) and with few driver calls: the
 * mechanism around the cost model (cost_model.c), which decides what a
 * measurement says and how often to take one.
 *
 * A launch is charged what its target (a function or a graph) is known to
 * cost, and asks the driver nothing, but when a measurement is due (the
 * model's cadence).  On a context that has launched on one stream, a
 * measurement times that one launch: an event recorded just before it
 * (asked at once whether it has completed: then the stream was idle, and the
 * host's clock says when the kernel reached the GPU, see cost_model.c) and
 * one just after, read back later without waiting, as times relative to one
 * reference event per context.  The launch is settled at its interval, and
 * the kernel's cost learnt from it.
 *
 * A context that has launched on several streams is measured at every
 * launch, in runs of launches per stream, each between two events, each run
 * beginning where its stream's last ended: merged in time order they give
 * the time during which any of the context's kernels was on the GPU, counted
 * once however many streams overlapped (the union of busy time); runs that
 * overlap teach together, their union per launch.  (Samples of some streams
 * taken among others' unmeasured kernels taught costs too low: one process on
 * two streams at 10 % got 17 %.)  A run ends once long enough (RUN_LAUNCHES,
 * or RUN_NS of charged time, LONG_RUN_NS where its kernels are long), after a
 * kernel not measured yet, and when the process sleeps for budget (so that
 * intervals hold no sleep).  A run's span also holds the GPU's idle time
 * where its stream ran dry, and time its kernels waited while other contexts
 * held the GPU: runs are charged at most what their launches are known to
 * cost.
 *
 * A kernel not measured yet is measured at once, alone; its other launches
 * meanwhile are settled at what it took.
 *
 * Figures: benchmarks/compute_share.py (shares, and driver calls per launch). */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum {
    INFLIGHT = 256,                 /* runs per context not yet read back */
    CONTEXTS = 16,                  /* contexts per process whose launches are measured */
    STREAMS = 16,                   /* streams per context whose runs are measured */
    RUN_LAUNCHES = 64,              /* a run of several streams closes after this many launches */
};
/* A run of several streams closes once they are charged RUN_NS, or
 * LONG_RUN_NS where they average LONG_KERNEL_NS or more: short runs are more
 * often free of other contexts' slices, so they teach costs better (four
 * processes of 1 ms kernels at 50 % got 47-48 % with 64-launch runs), while a
 * long kernel's span is long anyway. */
#define RUN_NS 20000000
#define LONG_KERNEL_NS 5000000
#define LONG_RUN_NS 640000000
/* What runs read back may keep of what their kernels are known to cost and
 * did not take, for later runs whose spans take more: two runs' worth, so a
 * stream's run that spans its sibling stream's kernels is charged what the
 * sibling's run (adding nothing to the union) did not take. */
#define ALLOWANCE_NS (2 * LONG_RUN_NS)
/* Times are read as float milliseconds from the reference event, whose
 * resolution is a microsecond at 10 s: runs that follow one another stop
 * following once it is this old, so that nothing is in flight for a moment
 * and the next run begins at a new reference. */
#define REFERENCE_NS 10000000000ULL

/* Launches of one stream between two events. */
struct run {
    uint32_t stream;                /* index in the tracker's streams */
    CUevent start;                  /* NULL: the run began where the stream's previous one ended */
    CUevent end;
    int64_t charged_ns;
    uint32_t launches;
    bool known;                     /* every launch was charged a measured cost */
    uint64_t idle_at_ns;            /* its start event had completed at this time (0: not, or not asked) */
    uint64_t returned_ns;           /* ... and its first launch returned at this time */
    const void *key;                /* the one target launched, or NULL for several */
    uint64_t due_ns;                /* not read back before this (CLOCK_MONOTONIC) */
    uint64_t closed_ns;             /* when its end was recorded */
};

struct stream_runs {
    CUstream stream;
    bool open;                      /* a run is open: `current` */
    struct run current;
    int64_t last_end_ns;            /* its last run's end read back, from the reference event */
};

/* A context's samples. */
struct vgl_tracker {
    CUcontext ctx;
    uint32_t device;
    CUevent reference;              /* NULL: not recorded yet */
    uint64_t reference_ns;          /* when it was (CLOCK_MONOTONIC) */
    bool sampling;                  /* each stream's next launch opens a run */
    struct vgl_cadence cadence;
    int64_t covered_ns;             /* busy time is counted up to here, from the reference */
    int64_t allowance_ns;           /* what runs read back are known to cost and were not charged */
    int64_t group_start;            /* where the runs read back since covered_ns last jumped began */
    uint32_t group_launches;        /* their launches (0: none) */
    const void *group_key;          /* the one target they launched, or NULL for several */
    uint32_t nstreams;
    struct stream_runs streams[STREAMS];
    uint32_t head, count;
    struct run ring[INFLIGHT];
    uint32_t nspare;
    CUevent spare[2 * INFLIGHT];    /* events read back, to record again */
};

static struct {
    pthread_mutex_t lock;           /* guards all of it, but what vgl_busy_device reads */
    uint32_t ntrackers;             /* a tracker's ctx and device are set before it is counted */
    struct vgl_tracker trackers[CONTEXTS];
    struct vgl_costs costs;
} measure = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The parent's events and measurements are not the child's. */
static void forget_in_child(void)
{
    pthread_mutex_init(&measure.lock, NULL);
    measure.ntrackers = 0;
    memset(measure.trackers, 0, sizeof measure.trackers);
    vgl_costs_forget(&measure.costs);
}
VGL_AFTER_FORK(forget_in_child)

/* Launches charged VGL_FIRST_COST_NS each, settled as the model says. */
static void settle(struct vgl_settlement s)
{
    if (s.launches)
        vgl_share_used(s.device, VGL_FIRST_COST_NS * (int64_t)s.launches, s.used_ns * (int64_t)s.launches);
}

static void drop_event(CUevent e)
{
    if (e)
        vgl_real.cuEventDestroy_v2(e);
}

static void spare(struct vgl_tracker *t, CUevent e)
{
    if (!e)
        return;
    if (t->nspare < 2 * INFLIGHT)
        t->spare[t->nspare++] = e;
    else
        drop_event(e);
}

/* Under the lock: an event of `t`'s context (which is current), recorded on `stream`. */
static CUevent mark(struct vgl_tracker *t, CUstream stream)
{
    CUevent e;
    if (t->nspare)
        e = t->spare[--t->nspare];
    else if (vgl_real.cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
        return NULL;
    if (vgl_real.cuEventRecord(e, stream) != CUDA_SUCCESS) {
        drop_event(e); /* stale (a destroyed context's or stream's) or unusable */
        return NULL;
    }
    return e;
}

/* Under the lock: the oldest run is settled at `measured_ns`. */
static void settle_oldest(struct vgl_tracker *t, int64_t measured_ns)
{
    struct run *r = &t->ring[t->head];
    vgl_share_used((int)t->device, r->charged_ns, measured_ns);
    spare(t, r->start);
    spare(t, r->end);
    t->head = (t->head + 1) % INFLIGHT;
    t->count--;
}

/* Under the lock: where `e` completed, from the reference event; false: not yet, or unknowable (*failed). */
static bool since_reference(struct vgl_tracker *t, CUevent e, int64_t *ns, bool *failed)
{
    float ms;
    CUresult rc = vgl_real.cuEventElapsedTime(&ms, t->reference, e);
    *failed = rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY;
    *ns = (int64_t)((double)ms * 1e6);
    return rc == CUDA_SUCCESS;
}

/* Under the lock: the runs read back since the union last jumped ahead
 * launched one target: it costs their union per launch.  How far apart the
 * samples are follows from how that moved the cost (the model's cadence). */
static void teach(struct vgl_tracker *t, uint64_t now)
{
    if (!t->group_launches)
        return;
    if (t->group_key) {
        struct vgl_settlement waited;
        int64_t per_launch = (t->covered_ns - t->group_start) / t->group_launches;
        vgl_cadence_learnt(&t->cadence, vgl_cost_learn(&measure.costs, t->group_key, per_launch, now, &waited));
        settle(waited);
    } else {
        vgl_cadence_learnt(&t->cadence, 0);
    }
    t->group_launches = 0;
}

static bool any_open(const struct vgl_tracker *t)
{
    for (uint32_t i = 0; i < t->nstreams; i++)
        if (t->streams[i].open)
            return true;
    return false;
}

/* Under the lock: reads back the runs that are due and done, oldest first,
 * without waiting for any.  One whose events the driver no longer knows (its
 * context or stream was destroyed) counts as charged. */
static void harvest(struct vgl_tracker *t, uint64_t now)
{
    while (t->count) {
        struct run *r = &t->ring[t->head];
        if (now < r->due_ns)
            return;
        struct stream_runs *s = &t->streams[r->stream];
        int64_t end, start = s->last_end_ns;
        bool failed;
        if (!since_reference(t, r->end, &end, &failed) ||
            (r->start && !since_reference(t, r->start, &start, &failed))) {
            if (!failed) {
                /* Asked again after as long as it has been running late: a
                 * run queued behind much work costs few queries. */
                uint64_t late = now > r->closed_ns ? now - r->closed_ns : 0;
                r->due_ns = now + (late > 1000000 ? late : 1000000);
                return;
            }
            settle_oldest(t, r->charged_ns);
            continue;
        }
        s->last_end_ns = end;
        start = vgl_interval_start(start, r->idle_at_ns, r->returned_ns);
        if (start > end)
            start = end;
        /* Overlapping runs (of the context's streams) teach together: a
         * kernel's cost is their union per launch, as the busy time they
         * are counted is their union.  (A stream's span alone holds its
         * siblings' kernels where they take turns.)  So a group teaches
         * once a run begins after all of it has ended, or once all is read. */
        if (start >= t->covered_ns)
            teach(t, now);
        if (!t->group_launches) {
            t->group_key = r->key;
            t->group_start = start;
        } else if (t->group_key != r->key) {
            t->group_key = NULL;
        }
        t->group_launches += r->launches;
        /* The union: what this run adds to the context's busy time so far.
         * Runs are read back in the order they closed, which is not always
         * the order they began: one that began before its group did adds
         * that stretch too. */
        int64_t from = start > t->covered_ns ? start : t->covered_ns;
        int64_t busy = end > from ? end - from : 0;
        if (start < t->group_start) {
            busy += (end < t->group_start ? end : t->group_start) - start;
            t->group_start = start;
        }
        if (end > t->covered_ns)
            t->covered_ns = end;
        /* The context's busy time, at most what its kernels are known to
         * cost: over several runs, as one stream's run may span the time
         * the other's kernels ran, while theirs adds nothing. */
        if (r->known) {
            t->allowance_ns += r->charged_ns;
            if (busy > t->allowance_ns)
                busy = t->allowance_ns;
            t->allowance_ns -= busy;
            if (t->allowance_ns > ALLOWANCE_NS)
                t->allowance_ns = ALLOWANCE_NS;
        } else if (r->key) {
            /* A kernel not measured before: at most what it has been learnt
             * to cost (once a later run ended the group), which a span exceeds
             * when other contexts' slices stretched it; else the processes
             * of one container, started together, would each start owing
             * their siblings' time. */
            int64_t cost;
            if (vgl_cost_known(&measure.costs, r->key, &cost) && busy > cost * r->launches)
                busy = cost * r->launches;
        }
        VGL_LOG(VGL_LOG_DEBUG, "run on stream %u read back: %u launches charged %.3f ms, span %.3f ms, "
                "busy %.3f ms counted, allowance %.3f ms", r->stream, r->launches, r->charged_ns / 1e6,
                (end - start) / 1e6, busy / 1e6, t->allowance_ns / 1e6);
        settle_oldest(t, busy);
    }
    if (!any_open(t))
        teach(t, now);
}

/* Under the lock: closes the stream's open run with an event; the stream's
 * next run begins there if `chain`. */
static void close_run(struct vgl_tracker *t, uint32_t index, uint64_t now, bool chain)
{
    struct stream_runs *s = &t->streams[index];
    if (!s->open)
        return;
    struct run r = s->current;
    s->open = false;
    if (!r.launches) {
        spare(t, r.start); /* nothing ran in it: nothing to measure */
        return;
    }
    r.end = mark(t, s->stream);
    if (!r.end) {
        vgl_share_used((int)t->device, r.charged_ns, r.charged_ns);
        spare(t, r.start);
        return;
    }
    r.due_ns = now + 2 * (uint64_t)r.charged_ns;
    r.closed_ns = now;
    if (t->count == INFLIGHT)
        settle_oldest(t, t->ring[t->head].charged_ns); /* never read back: as charged */
    t->ring[(t->head + t->count) % INFLIGHT] = r;
    t->count++;
    if (chain) {
        s->open = true;
        s->current = (struct run){.stream = index, .known = true};
    }
}

/* Under the lock: the sample ends, every run closed; another follows at once
 * (each stream's run beginning where its last ended) while costs are learnt,
 * if `go_on`. */
static void end_sample(struct vgl_tracker *t, uint64_t now, bool go_on)
{
    if (!t->sampling)
        return;
    bool chain = go_on && t->nstreams > 1 && now - t->reference_ns < REFERENCE_NS;
    for (uint32_t i = 0; i < t->nstreams; i++)
        close_run(t, i, now, chain);
    t->sampling = chain;
    vgl_cadence_sampled(&t->cadence);
}

/* Under the lock: the tracker of `ctx` (on `device`), made on first use;
 * NULL when there are too many. */
static struct vgl_tracker *tracker_for(CUcontext ctx, int device)
{
    for (uint32_t i = 0; i < measure.ntrackers; i++)
        if (measure.trackers[i].ctx == ctx)
            return &measure.trackers[i];
    if (measure.ntrackers == CONTEXTS) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "launches in context %p are not measured (more than %d "
                        "contexts); the compute share charges them what they are expected to take",
                        (void *)ctx, CONTEXTS);
        return NULL;
    }
    struct vgl_tracker *t = &measure.trackers[measure.ntrackers];
    t->ctx = ctx;
    t->device = (uint32_t)device;
    __atomic_store_n(&measure.ntrackers, measure.ntrackers + 1, __ATOMIC_RELEASE);
    return t;
}

/* Under the lock: the stream's place in `t`, made on first use (taking that
 * of a stream with no open run when all are used); -1 when there is none. */
static int stream_index(struct vgl_tracker *t, CUstream stream)
{
    int idle = -1;
    for (uint32_t i = 0; i < t->nstreams; i++) {
        if (t->streams[i].stream == stream)
            return (int)i;
        if (!t->streams[i].open)
            idle = (int)i;
    }
    if (t->nstreams < STREAMS)
        idle = (int)t->nstreams++;
    else if (idle < 0)
        return -1;
    /* A run of the slot's former stream still to be read back needs its end. */
    for (uint32_t k = 0; k < t->count; k++)
        if (t->ring[(t->head + k) % INFLIGHT].stream == (uint32_t)idle)
            return -1;
    t->streams[idle] = (struct stream_runs){.stream = stream};
    return idle;
}

/* Without the lock (on every launch): trackers are only ever added, each
 * published whole by the count. */
int vgl_busy_device(CUcontext ctx)
{
    for (uint32_t i = 0, n = __atomic_load_n(&measure.ntrackers, __ATOMIC_ACQUIRE); i < n; i++)
        if (measure.trackers[i].ctx == ctx)
            return (int)measure.trackers[i].device;
    return -1;
}

void vgl_busy_enter(struct vgl_launch *l, CUcontext ctx, int device, const void *key, CUstream stream,
                    uint64_t now_ns, bool quiet)
{
    pthread_mutex_lock(&measure.lock);
    struct vgl_tracker *t = tracker_for(ctx, device);
    *l = (struct vgl_launch){.device = device, .key = key, .stream = stream, .tracker = t, .index = -1};
    l->known = vgl_cost_known(&measure.costs, key, &l->cost_ns);
    if (t) {
        if (!quiet)
            harvest(t, now_ns);
        l->index = stream_index(t, stream);
    }
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_wait(struct vgl_launch *l, uint64_t now_ns, bool sleeps, bool quiet)
{
    if (!l->tracker)
        return;
    pthread_mutex_lock(&measure.lock);
    if (sleeps && !quiet)
        end_sample(l->tracker, now_ns, false);
    if (!quiet)
        harvest(l->tracker, now_ns);
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_begin(struct vgl_launch *l, uint64_t now_ns, bool quiet)
{
    struct vgl_tracker *t = l->tracker;
    if (!t || l->index < 0 || quiet)
        return;
    pthread_mutex_lock(&measure.lock);
    struct stream_runs *s = &t->streams[l->index];
    bool due = t->sampling || t->nstreams > 1 || vgl_cadence_due(&t->cadence);
    if (!l->known && !s->open && t->nstreams == 1) {
        struct vgl_settlement evicted;
        due = vgl_cost_measure_first(&measure.costs, l->key, l->device, now_ns, &evicted);
        settle(evicted);
    }
    l->pending = !l->known && !due;
    if (s->stream == l->stream && !s->open && due) {
        /* With nothing in flight, the run begins at a new reference: one
         * event less to record and read, and the times read from it stay
         * exact (float milliseconds). */
        CUevent start = NULL;
        if (!t->count && !any_open(t)) {
            teach(t, now_ns);
            spare(t, t->reference);
            if ((t->reference = mark(t, l->stream)))
                t->reference_ns = now_ns;
            t->covered_ns = 0;
            for (uint32_t i = 0; i < t->nstreams; i++)
                t->streams[i].last_end_ns = 0;
            if (t->reference) {
                s->open = true;
                s->current = (struct run){.stream = (uint32_t)l->index, .known = true};
            }
        } else if (t->reference && (start = mark(t, l->stream))) {
            s->open = true;
            s->current = (struct run){.stream = (uint32_t)l->index, .start = start, .known = true};
        }
        /* Whether the event completed at once: the stream was idle, and the
         * kernel will begin when it reaches the GPU, as its launch returns. */
        CUevent recorded = start ? start : t->reference;
        if (s->open && recorded) {
            uint64_t at = vgl_clock_ns(CLOCK_MONOTONIC);
            if (vgl_real.cuEventQuery(recorded) == CUDA_SUCCESS)
                s->current.idle_at_ns = at;
        }
        t->sampling = t->sampling || s->open;
    }
    l->measured = s->stream == l->stream && s->open;
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_quiesce(CUcontext ctx)
{
    pthread_mutex_lock(&measure.lock);
    for (uint32_t i = 0; i < measure.ntrackers; i++)
        if (measure.trackers[i].ctx == ctx)
            end_sample(&measure.trackers[i], vgl_clock_ns(CLOCK_MONOTONIC), false);
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_leave(struct vgl_launch *l, bool launched, bool quiet)
{
    if (!launched) {
        vgl_share_used(l->device, l->cost_ns, 0);
        return;
    }
    struct vgl_tracker *t = l->tracker;
    if (!t) {
        vgl_share_used(l->device, l->cost_ns, l->cost_ns); /* not measured: as charged */
        return;
    }
    uint64_t returned = l->measured ? vgl_clock_ns(CLOCK_MONOTONIC) : 0;
    pthread_mutex_lock(&measure.lock);
    struct stream_runs *s = &t->streams[l->index >= 0 ? l->index : 0];
    /* Not in a sample (or its run was closed meanwhile by another thread's
     * wait): as charged, or once its kernel's cost is known. */
    if (!l->measured || !s->open || s->stream != l->stream) {
        vgl_cadence_skipped(&t->cadence);
        int64_t cost = l->cost_ns;
        if (!l->pending || !vgl_cost_wait_first(&measure.costs, l->key, &cost))
            vgl_share_used(l->device, l->cost_ns, cost);
        pthread_mutex_unlock(&measure.lock);
        return;
    }
    struct run *r = &s->current;
    if (!r->launches)
        r->returned_ns = returned;
    r->key = r->launches == 0 || r->key == l->key ? l->key : NULL;
    r->launches++;
    r->charged_ns += l->cost_ns;
    r->known = r->known && l->known;
    if (!r->known)
        vgl_cadence_unknown(&t->cadence);
    /* On one stream a run is one launch.  A kernel not measured yet is
     * measured alone: its run ends with it, and its other launches meanwhile
     * wait for what it took rather than each being measured. */
    int64_t run_ns = r->charged_ns / r->launches >= LONG_KERNEL_NS ? LONG_RUN_NS : RUN_NS;
    if (!quiet && (t->nstreams == 1 || r->launches >= RUN_LAUNCHES || r->charged_ns >= run_ns || !r->known))
        end_sample(t, returned ? returned : vgl_clock_ns(CLOCK_MONOTONIC), r->known || t->nstreams > 1);
    pthread_mutex_unlock(&measure.lock);
}

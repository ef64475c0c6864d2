/* The GPU time a process's kernels take, measured through the CUDA API alone
 * (so the same code holds on a real GPU) and with few driver calls: the
 * mechanism around the cost model (cost_model.c), which says what a
 * measurement means, what a kernel costs and how often to measure.
 *
 * A launch is charged what its target (a function or a graph) is known to
 * cost, and asks the driver nothing but when a measurement is due.
 *
 * On a context that has launched on one stream, a measurement times one
 * launch alone: an event recorded just before it and one just after, read
 * back later without waiting, as one span.  On an idle stream the first
 * event completes at once, while the kernel reaches the GPU only as the
 * launch returns: so the shim asks whether that event has completed before
 * launching, and if it has, the kernel's interval begins when the launch
 * returned (cost_model.c), or, where the call took longer than the least of
 * recent calls (the thread descheduled in it), that much earlier: the kernel
 * may have been queued before the delay (vgl_call_returned).  The launch is settled at what it took, at most
 * what it was charged (a span stretched by other processes' time slices is
 * not its kernel's), and the kernel's cost learnt from it.
 *
 * A context that has launched on several streams is measured at every
 * launch, in runs of launches per stream, each between two events, each run
 * beginning where its stream's last ended; they are read back as times from
 * one reference event per context and merged into the union of their busy
 * time (cost_model.c).  (Samples of some streams, taken among others'
 * unmeasured kernels, taught costs too low: one process on two streams at 10
 * % got 17 %.)  A run ends once long enough (vgl_run_full: RUN_LAUNCHES,
 * or vgl_timings.run_ns of charged time, vgl_timings.long_run_ns where its kernels are long), after
 * a kernel not measured yet, and when the process sleeps for budget (so that
 * spans hold no sleep).  A run's span may hold the GPU's idle time where its stream ran
 * dry: runs are counted at most what their launches are known to cost.  So
 * that this bounds them by the kernels' time, not the gaps' (a launch-bound
 * program on two streams was charged four times its kernels' time), a
 * launch is also timed alone as the model's cadence asks: its stream's run
 * ends just before it, that event asked whether it completed at once (the
 * stream was idle: the kernel's interval begins as the launch returned, as
 * on one stream), and a run of it alone ends just after; it is read back
 * with the others, adds to the union from where its kernel began, and
 * teaches its cost, beside the union's groups (the least is the cost).
 *
 * A kernel not measured yet is measured at once, alone; its other launches
 * meanwhile are settled at what it took.
 *
 * The gate (launch_hooks.c) calls, for each launch in order: vgl_busy_enter
 * (its charge), vgl_busy_wait while it waits for budget, vgl_busy_begin once
 * admitted (a measurement's first event), and vgl_busy_leave after the
 * driver's call (its last event, or its settlement).  What they keep of the
 * launch is in struct vgl_launch, which only this file writes.  The driver's
 * events and the clock are handed in (struct vgl_events), and what each call
 * settled is handed back (struct vgl_settlements) for the gate to give the
 * share: this file calls neither, and tests/c/busy_time_test.c drives it with
 * a fake GPU.
 *
 * Figures: benchmarks/compute_share.py (shares, and driver calls per launch). */
#include <pthread.h>
#include <string.h>

#include "internal.h"

enum {
    INFLIGHT = 256,                 /* runs per context not yet read back */
    CONTEXTS = 16,                  /* contexts per process whose launches are measured */
    STREAMS = 16,                   /* streams per context whose runs are measured */
};

/* Launches of one stream between two events. */
struct run {
    uint32_t stream;                /* index in the tracker's streams */
    bool alone;                     /* one launch timed by its own two events, read as one span */
    bool timed;                     /* of several streams: one launch timed alone, in its stream's chain */
    CUevent start;                  /* NULL: the run began where the stream's previous one ended */
    CUevent end;
    int64_t charged_ns;
    uint32_t launches;
    bool known;                     /* every launch was charged a measured cost */
    uint64_t idle_at_ns;            /* alone, timed: its start event had completed at this time (0: not, or not asked) */
    uint64_t returned_ns;           /* alone, timed: its launch returned then, as its kernel goes (vgl_call_returned) */
    const void *key;                /* the one target launched, or NULL for several */
    uint64_t due_ns;                /* not read back before this (the events' clock) */
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
    const struct vgl_events *ev;    /* its events and clock, those of its first launch */
    CUevent reference;              /* NULL: not recorded yet */
    uint64_t reference_ns;          /* when it was (the events' clock) */
    bool sampling;                  /* each stream's next launch opens a run */
    struct vgl_cadence cadence;
    struct vgl_union runs;          /* of several streams' runs */
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
    struct vgl_call_time calls;     /* how long launch calls take */
} measure = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The parent's events and measurements are not the child's. */
static void forget_in_child(void)
{
    pthread_mutex_init(&measure.lock, NULL);
    measure.ntrackers = 0;
    memset(measure.trackers, 0, sizeof measure.trackers);
    vgl_costs_forget(&measure.costs);
    measure.calls = (struct vgl_call_time){0};
}
VGL_AFTER_FORK(forget_in_child)

/* Launches charged `charged_ns` are settled at `used_ns`: for the caller to
 * give the share, summed by device (the share's settlement is a sum). */
static void settled(struct vgl_settlements *out, int device, int64_t charged_ns, int64_t used_ns)
{
    if (device < 0 || device >= VGL_MAX_DEVICES)
        return;
    uint32_t i = 0;
    while (i < out->n && out->at[i].device != device)
        i++;
    if (i == out->n)
        out->at[out->n++] = (struct vgl_settlement){.device = device};
    out->at[i].charged_ns += charged_ns;
    out->at[i].used_ns += used_ns;
}

/* Launches settled as the model says. */
static void settle(struct vgl_settlements *out, struct vgl_settlement s)
{
    if (s.charged_ns || s.used_ns) {
        VGL_LOG(VGL_LOG_DEBUG, "launches held back settled: charged %.3f ms, used %.3f ms", s.charged_ns / 1e6,
                s.used_ns / 1e6);
        settled(out, s.device, s.charged_ns, s.used_ns);
    }
}

static void drop_event(const struct vgl_tracker *t, CUevent e)
{
    if (e)
        t->ev->destroy(e);
}

static void spare(struct vgl_tracker *t, CUevent e)
{
    if (!e)
        return;
    if (t->nspare < 2 * INFLIGHT)
        t->spare[t->nspare++] = e;
    else
        drop_event(t, e);
}

/* Under the lock: an event of `t`'s context (which is current), recorded on `stream`. */
static CUevent mark(struct vgl_tracker *t, CUstream stream)
{
    CUevent e;
    if (t->nspare)
        e = t->spare[--t->nspare];
    else if (t->ev->create(&e) != CUDA_SUCCESS)
        return NULL;
    if (t->ev->record(e, stream) != CUDA_SUCCESS) {
        drop_event(t, e); /* stale (a destroyed context's or stream's) or unusable */
        return NULL;
    }
    return e;
}

/* Under the lock: the oldest run is settled at `measured_ns` (< 0: held back, cost_model.c). */
static void settle_oldest(struct vgl_tracker *t, int64_t measured_ns, struct vgl_settlements *out)
{
    struct run *r = &t->ring[t->head];
    if (measured_ns >= 0)
        settled(out, (int)t->device, r->charged_ns, measured_ns);
    spare(t, r->start);
    spare(t, r->end);
    t->head = (t->head + 1) % INFLIGHT;
    t->count--;
}

/* Under the lock: where `e` completed, from the reference event; false: not yet, or unknowable (*failed). */
static bool since_reference(struct vgl_tracker *t, CUevent e, int64_t *ns, bool *failed)
{
    float ms;
    CUresult rc = t->ev->elapsed(&ms, t->reference, e);
    *failed = rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY;
    *ns = (int64_t)((double)ms * 1e6);
    return rc == CUDA_SUCCESS;
}

/* Under the lock: a launch of `key` (NULL: of several targets) took
 * `per_launch_ns`; how far apart measurements are follows from how that
 * moved its cost (the model's cadence). */
static void learnt(struct vgl_tracker *t, const void *key, int64_t per_launch_ns, enum vgl_clock clock,
                   uint64_t now, struct vgl_settlements *out)
{
    int moved = 0;
    if (key) {
        struct vgl_settlement waited;
        moved = vgl_cost_learn(&measure.costs, key, per_launch_ns, clock, now, &waited);
        int64_t cost;
        vgl_cost_known(&measure.costs, key, &cost);
        VGL_LOG(VGL_LOG_DEBUG, "learnt %.3f ms a launch: cost %.3f ms", per_launch_ns / 1e6, cost / 1e6);
        settle(out, waited);
    }
    vgl_cadence_learnt(&t->cadence, moved);
}

/* Under the lock: the group of runs read back so far teaches. */
static void close_group(struct vgl_tracker *t, uint64_t now, struct vgl_settlements *out)
{
    struct vgl_lesson lesson;
    if (vgl_union_close(&t->runs, &lesson))
        learnt(t, lesson.key, lesson.per_launch_ns, VGL_OVER_RUNS, now, out);
}

static bool any_open(const struct vgl_tracker *t)
{
    for (uint32_t i = 0; i < t->nstreams; i++)
        if (t->streams[i].open)
            return true;
    return false;
}

/* Under the lock: the span of a launch timed alone; false: not yet, or unknowable (*failed). */
static bool read_alone(const struct vgl_tracker *t, const struct run *r, int64_t *ns, bool *failed)
{
    float ms;
    CUresult rc = t->ev->elapsed(&ms, r->start, r->end);
    *failed = rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY;
    *ns = (int64_t)((double)ms * 1e6);
    return rc == CUDA_SUCCESS;
}

/* Under the lock: a launch timed alone, read back: its kernel took `span_ns`
 * from its start event's completion, or less (cost_model.c).  What it is
 * settled at; -1: it is held back, with the kernel's first launches. */
static int64_t took_alone(struct vgl_tracker *t, const struct run *r, int64_t span_ns, uint64_t now,
                          struct vgl_settlements *out)
{
    int64_t took = span_ns - vgl_interval_start(0, r->idle_at_ns, r->returned_ns);
    VGL_LOG(VGL_LOG_DEBUG, "launch timed alone read back: charged %.3f ms, span %.3f ms, took %.3f ms%s",
            r->charged_ns / 1e6, span_ns / 1e6, took / 1e6, r->idle_at_ns ? " (from its return)" : "");
    /* A kernel's first few measurements are settled together, at its cost
     * then (cost_model.c). */
    bool held = vgl_cost_held_back(&measure.costs, r->key, r->charged_ns);
    learnt(t, r->key, took, r->idle_at_ns ? VGL_ON_HOST : VGL_ON_GPU, now, out);
    if (held)
        return -1;
    /* Counted at most what it was charged: a span stretched by other
     * contexts' slices is not its kernel's. */
    took = took > 1 ? took : 1;
    return took < r->charged_ns ? took : r->charged_ns;
}

/* Under the lock: a run of several streams, read back: the busy time it adds
 * to its context's (the union's); false: not yet, or unknowable (*failed). */
static bool read_run(struct vgl_tracker *t, const struct run *r, uint64_t now, int64_t *busy, bool *failed,
                     struct vgl_settlements *out)
{
    struct stream_runs *s = &t->streams[r->stream];
    int64_t end, start = s->last_end_ns;
    if (!since_reference(t, r->end, &end, failed) || (r->start && !since_reference(t, r->start, &start, failed)))
        return false;
    s->last_end_ns = end;
    int64_t gpu_start = start;
    if (r->timed) {
        /* Its kernel began at its start event, or, on an idle stream, as its
         * launch returned; it teaches its cost as a launch on one stream does. */
        start = vgl_interval_start(start, r->idle_at_ns, r->returned_ns);
        start = start < end ? start : end;
        learnt(t, r->key, end - start, r->idle_at_ns ? VGL_ON_HOST : VGL_ON_GPU, now, out);
    }
    struct vgl_span span = {.start_ns = start, .gpu_start_ns = gpu_start, .end_ns = end,
                            .charged_ns = r->charged_ns, .launches = r->launches, .known = r->known, .key = r->key};
    struct vgl_lesson lesson;
    bool taught;
    *busy = vgl_union_add(&t->runs, &span, &lesson, &taught);
    if (taught)
        learnt(t, lesson.key, lesson.per_launch_ns, VGL_OVER_RUNS, now, out);
    /* A kernel not measured before: at most what it has been learnt to cost
     * (once a later run ended the group), which a span exceeds when other
     * contexts' slices stretched it; else the processes of one container,
     * started together, would each start owing their siblings' time. */
    int64_t cost;
    if (!r->known && r->key && vgl_cost_known(&measure.costs, r->key, &cost) && *busy > cost * r->launches)
        *busy = cost * r->launches;
    VGL_LOG(VGL_LOG_DEBUG, "run on stream %u read back: %u launches%s charged %.3f ms, span %.3f ms, "
            "busy %.3f ms counted", r->stream, r->launches, r->timed ? " (timed alone)" : "", r->charged_ns / 1e6,
            (end - start) / 1e6, *busy / 1e6);
    return true;
}

/* Under the lock: reads back the runs that are due and done, oldest first,
 * without waiting for any.  One whose events the driver no longer knows (its
 * context or stream was destroyed) counts as charged. */
static void harvest(struct vgl_tracker *t, uint64_t now, struct vgl_settlements *out)
{
    while (t->count) {
        struct run *r = &t->ring[t->head];
        if (now < r->due_ns)
            return;
        int64_t busy;
        bool failed, read = r->alone ? read_alone(t, r, &busy, &failed) : read_run(t, r, now, &busy, &failed, out);
        if (read) {
            settle_oldest(t, r->alone ? took_alone(t, r, busy, now, out) : busy, out);
        } else if (failed) {
            settle_oldest(t, r->charged_ns, out);
        } else {
            r->due_ns = vgl_run_poll(r->known, r->closed_ns, now);
            return;
        }
    }
    if (!any_open(t))
        close_group(t, now, out);
}

/* Under the lock: closes the stream's open run with an event; the stream's
 * next run begins there if `chain`.  Returns that event (NULL: none was
 * recorded), valid until the run is read back. */
static CUevent close_run(struct vgl_tracker *t, uint32_t index, uint64_t now, bool chain,
                         struct vgl_settlements *out)
{
    struct stream_runs *s = &t->streams[index];
    if (!s->open)
        return NULL;
    struct run r = s->current;
    s->open = false;
    if (!r.launches) {
        spare(t, r.start); /* nothing ran in it: nothing to measure */
        return NULL;
    }
    r.end = mark(t, s->stream);
    if (!r.end) {
        settled(out, (int)t->device, r.charged_ns, r.charged_ns);
        spare(t, r.start);
        return NULL;
    }
    r.due_ns = vgl_run_due(r.known, r.charged_ns, now);
    r.closed_ns = now;
    if (t->count == INFLIGHT)
        settle_oldest(t, t->ring[t->head].charged_ns, out); /* never read back: as charged */
    t->ring[(t->head + t->count) % INFLIGHT] = r;
    t->count++;
    if (chain) {
        s->open = true;
        s->current = (struct run){.stream = index, .known = true};
    }
    return r.end;
}

/* Under the lock: the sample ends, every run closed; another follows at once
 * (each stream's run beginning where its last ended) while costs are learnt,
 * if `go_on`. */
static void end_sample(struct vgl_tracker *t, uint64_t now, bool go_on, struct vgl_settlements *out)
{
    if (!t->sampling)
        return;
    bool chain = go_on && vgl_runs_follow(t->nstreams, now - t->reference_ns);
    for (uint32_t i = 0; i < t->nstreams; i++)
        close_run(t, i, now, chain, out);
    t->sampling = chain;
    /* On several streams the cadence is that of launches timed alone. */
    if (t->nstreams == 1)
        vgl_cadence_sampled(&t->cadence, now);
}

/* Under the lock: the tracker of `ctx` (on `device`), made on first use;
 * NULL when there are too many. */
static struct vgl_tracker *tracker_for(const struct vgl_events *ev, CUcontext ctx, int device)
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
    t->ev = ev;
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

void vgl_busy_enter(struct vgl_launch *l, const struct vgl_events *ev, CUcontext ctx, int device, const void *key,
                    CUstream stream, uint64_t now_ns, bool quiet, struct vgl_settlements *out)
{
    out->n = 0;
    pthread_mutex_lock(&measure.lock);
    struct vgl_tracker *t = tracker_for(ev, ctx, device);
    *l = (struct vgl_launch){.device = device, .key = key, .stream = stream, .tracker = t, .index = -1};
    l->known = vgl_cost_known(&measure.costs, key, &l->cost_ns);
    if (t) {
        if (!quiet)
            harvest(t, now_ns, out);
        l->index = stream_index(t, stream);
    }
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_wait(struct vgl_launch *l, uint64_t now_ns, bool sleeps, bool quiet, struct vgl_settlements *out)
{
    out->n = 0;
    if (!l->tracker)
        return;
    pthread_mutex_lock(&measure.lock);
    if (sleeps && !quiet)
        end_sample(l->tracker, now_ns, false, out);
    if (!quiet)
        harvest(l->tracker, now_ns, out);
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_begin(struct vgl_launch *l, uint64_t now_ns, bool quiet, struct vgl_settlements *out)
{
    out->n = 0;
    struct vgl_tracker *t = l->tracker;
    if (!t || l->index < 0 || quiet)
        return;
    pthread_mutex_lock(&measure.lock);
    struct stream_runs *s = &t->streams[l->index];
    bool due = t->sampling || t->nstreams > 1 ||
               vgl_cadence_due(&t->cadence, now_ns, l->known ? l->cost_ns : 0);
    if (!l->known && !s->open && t->nstreams == 1) {
        struct vgl_settlement evicted;
        due = vgl_cost_measure_first(&measure.costs, l->key, l->device, now_ns, &evicted);
        settle(out, evicted);
    }
    /* On several streams, a launch timed alone: its stream's run ends just
     * before it (at `at`), unless none of its launches was made yet. */
    bool timing = t->nstreams > 1 && s->stream == l->stream &&
                  (!l->known || vgl_cadence_due(&t->cadence, now_ns, l->cost_ns));
    CUevent at = NULL;
    if (timing && s->open) {
        if (s->current.launches)
            at = close_run(t, (uint32_t)l->index, now_ns, true, out);
        else if (s->current.start)
            at = s->current.start;
        else
            s->open = false; /* chained to an end that may have been read back (its event recorded again) */
    }
    if (s->stream == l->stream && !s->open && due) {
        CUevent start;
        if (t->nstreams == 1) {
            if ((start = mark(t, l->stream))) {
                s->open = true;
                s->current = (struct run){.stream = (uint32_t)l->index, .alone = true, .start = start, .known = true};
                /* Completed at once: the stream is idle, and the kernel will
                 * begin when it reaches the GPU, as its launch returns. */
                uint64_t at = t->ev->now_ns();
                if (vgl_idle_asked(l->known, l->cost_ns) && t->ev->query(start) == CUDA_SUCCESS)
                    s->current.idle_at_ns = at;
            }
        } else if (!t->count && !any_open(t)) {
            /* With nothing in flight, the runs begin at a new reference: one
             * event less to record and read, and the times read from it stay
             * exact (float milliseconds). */
            close_group(t, now_ns, out);
            spare(t, t->reference);
            if ((t->reference = mark(t, l->stream)))
                t->reference_ns = now_ns;
            vgl_union_restart(&t->runs);
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
        t->sampling = t->sampling || s->open;
        /* A run opened here begins at its start event, or at the reference
         * (a new one, recorded on this stream). */
        if (s->open)
            at = s->current.start ? s->current.start : t->reference;
    }
    if (timing && s->open && at) {
        s->current.timed = true;
        l->timed = true;
        vgl_cadence_sampled(&t->cadence, now_ns);
        uint64_t when = t->ev->now_ns();
        if (vgl_idle_asked(l->known, l->cost_ns) && t->ev->query(at) == CUDA_SUCCESS)
            s->current.idle_at_ns = when;
    }
    l->measured = s->stream == l->stream && s->open;
    /* The first launch of a run is the one a measurement from its return times. */
    bool first = l->measured && !s->current.launches;
    pthread_mutex_unlock(&measure.lock);
    if (first)
        l->called_ns = t->ev->now_ns();
}

void vgl_busy_quiesce(CUcontext ctx, struct vgl_settlements *out)
{
    out->n = 0;
    pthread_mutex_lock(&measure.lock);
    for (uint32_t i = 0; i < measure.ntrackers; i++)
        if (measure.trackers[i].ctx == ctx)
            end_sample(&measure.trackers[i], measure.trackers[i].ev->now_ns(), false, out);
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_stream_ends(CUstream stream, struct vgl_settlements *out)
{
    out->n = 0;
    pthread_mutex_lock(&measure.lock);
    for (uint32_t i = 0; i < measure.ntrackers; i++) {
        struct vgl_tracker *t = &measure.trackers[i];
        for (uint32_t k = 0; k < t->nstreams; k++)
            if (t->streams[k].stream == stream)
                close_run(t, k, t->ev->now_ns(), false, out);
    }
    pthread_mutex_unlock(&measure.lock);
}

void vgl_busy_leave(struct vgl_launch *l, bool launched, bool quiet, struct vgl_settlements *out)
{
    out->n = 0;
    if (!launched) {
        settled(out, l->device, l->cost_ns, 0);
        return;
    }
    struct vgl_tracker *t = l->tracker;
    if (!t) {
        settled(out, l->device, l->cost_ns, l->cost_ns); /* not measured: as charged */
        return;
    }
    /* When the launch returned: its kernel had reached the GPU. */
    uint64_t returned = l->measured ? t->ev->now_ns() : 0;
    pthread_mutex_lock(&measure.lock);
    struct stream_runs *s = &t->streams[l->index >= 0 ? l->index : 0];
    /* Not in a sample (or its run was closed meanwhile by another thread's
     * wait): at what its kernel is known to cost now (it may have waited
     * long for budget, charged a cost measured since), or held back until
     * that is known. */
    if (!l->measured || !s->open || s->stream != l->stream) {
        vgl_cadence_skipped(&t->cadence);
        int64_t cost;
        if (!vgl_cost_held_back(&measure.costs, l->key, l->cost_ns))
            settled(out, l->device, l->cost_ns, vgl_cost_known(&measure.costs, l->key, &cost) ? cost : l->cost_ns);
        pthread_mutex_unlock(&measure.lock);
        return;
    }
    struct run *r = &s->current;
    /* A run to time this launch alone that another launch joined first (from
     * another thread) times neither. */
    if (r->timed && (!l->timed || r->launches))
        r->timed = false;
    if (t->nstreams > 1 && !l->timed)
        vgl_cadence_skipped(&t->cadence);
    /* Where its kernel reached the GPU, for a measurement from its return. */
    uint64_t reached = vgl_call_returned(&measure.calls, l->called_ns, returned);
    if (!r->launches)
        r->returned_ns = reached;
    r->key = r->launches == 0 || r->key == l->key ? l->key : NULL;
    r->launches++;
    r->charged_ns += l->cost_ns;
    r->known = r->known && l->known;
    if (!r->known)
        vgl_cadence_unknown(&t->cadence);
    /* A kernel not measured yet is measured alone: its run ends with it, and
     * its other launches meanwhile wait for what it took rather than each
     * being measured. */
    if (!quiet && r->timed)
        close_run(t, (uint32_t)l->index, returned, true, out); /* the stream's next run begins after it */
    else if (!quiet && (r->alone || vgl_run_full(r->charged_ns, r->launches) || !r->known))
        end_sample(t, returned ? returned : t->ev->now_ns(), r->known || t->nstreams > 1, out);
    pthread_mutex_unlock(&measure.lock);
}

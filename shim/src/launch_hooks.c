/* Kernel launches: every launch path (cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel, cuGraphLaunch and their _ptsz variants) draws
 * from the container's compute budget on its device (throttle.c).
 *
 * A launch is charged what its kernel (or graph) is known to cost, and waits,
 * asleep, while the container's budget is owing; then it sleeps on until the
 * budget holds a little (RESUME_NS, or a few of its kernels), so that
 * launches go in bursts.  The GPU time really used is measured, through the
 * CUDA API alone, so the same code holds on a real GPU, with few driver
 * calls: not around each launch but around runs of launches per stream.  A run
 * opens with an event recorded on its stream (or at the end of the stream's
 * previous run) and closes with another, before the process sleeps for
 * budget, after RUN_LAUNCHES launches or RUN_NS (LONG_RUN_NS) of charged
 * time, or after its first launch of a kernel not measured yet; its events
 * are read back later, without waiting, as times relative to one reference
 * event per context.  A context's runs, merged in time order, give the time
 * during which any of its kernels was on the GPU, counted once however many
 * streams overlapped (the union of busy time).  A run's span also holds time
 * its kernels waited while other contexts held the GPU (time slices): so runs
 * are charged at most what their launches are known to cost, each kernel's
 * cost being the least union per launch of runs of it alone (overlapping runs
 * of several streams together) over the last second or two (so a kernel that
 * became slower is seen).
 *
 * The budget refills with the clock, never with the process's own
 * synchronisation, so a launch cannot wait on work that only its own thread
 * could let finish.
 *
 * While no device of the container is limited (no share, or 100 %), a launch
 * costs one comparison: the region's generation (bumped by every change of
 * limits, `vgpulimit set`) against the generation at which nothing was. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "internal.h"

enum {
    INFLIGHT = 256,                 /* runs per context not yet read back */
    CONTEXTS = 16,                  /* contexts per process whose launches are measured */
    STREAMS = 16,                   /* streams per context whose runs are measured */
    COSTS = 256,                    /* launch targets whose GPU time a process remembers */
    RUN_LAUNCHES = 64,              /* a run closes after this many launches */
    RECHECK_LAUNCHES = 64,          /* a thread's current context is asked again after this many */
};
/* What a kernel never measured is charged at first (then what it took). */
#define FIRST_COST_NS 1000000
/* A kernel's cost is the least it took per launch over two of these. */
#define COST_WINDOW_NS 1000000000ULL
/* A run closes once its launches are charged RUN_NS, or LONG_RUN_NS where
 * they average LONG_KERNEL_NS or more: short runs are more often free of
 * other contexts' slices, so they teach costs better (four processes of 1 ms
 * kernels at 50 % got 47-48 % with 64-launch runs), while a long kernel's
 * span is long anyway, and closing its runs often costs driver calls (three
 * a launch at 90 % with 20 ms kernels; a run ends where the process sleeps
 * all the same). */
#define RUN_NS 20000000
#define LONG_KERNEL_NS 5000000
#define LONG_RUN_NS 640000000
/* What runs read back may keep of what their kernels are known to cost and
 * did not take, for later runs whose spans take more: two runs' worth, so a
 * stream's run that spans its sibling stream's kernels is charged what the
 * sibling's run (adding nothing to the union) did not take. */
#define ALLOWANCE_NS (2 * LONG_RUN_NS)
/* A launch that waited for budget waits on until the budget holds this much,
 * or RESUME_KERNELS of its kernel if more (at most three quarters of what
 * the container may keep), so that bursts, and runs, are long: each sleep
 * ends the process's runs, a few driver calls, and with long kernels a burst
 * of RESUME_NS would be one kernel or two.  (Longer bursts of short kernels,
 * from several processes at once, stretch one another's spans.) */
#define RESUME_NS 20000000
#define RESUME_KERNELS 4
/* A borrowing container asks NVML whether others are busy at most this
 * often, over the driver's samples of the last LEND_WINDOW_US. */
#define LEND_CHECK_NS 200000000ULL
#define LEND_WINDOW_US 300000ULL
/* A waiting launch wakes at least this often, to read measurements back and
 * to see a changed share. */
#define MAX_SLEEP_NS 20000000
/* cuda.h's per-thread default stream: what NULL means in a _ptsz entry point,
 * and what the shim's own calls must name there. */
#define STREAM_PER_THREAD ((CUstream)0x2)

/* ---- whether launches draw at all --------------------------------------------------- */

/* Before the first launch, and where there is no region: generation 1. */
static uint64_t without_budget = 1;
static uint64_t *limits_generation = &without_budget;
/* The generation at which no device was limited; 0 (never a generation): some is. */
static uint64_t unlimited_generation;
static uint64_t seen_generation;

static inline bool unlimited(void)
{
    const uint64_t *generation = __atomic_load_n(&limits_generation, __ATOMIC_RELAXED);
    return __atomic_load_n(generation, __ATOMIC_RELAXED) ==
           __atomic_load_n(&unlimited_generation, __ATOMIC_RELAXED);
}

/* ---- the budgets a launch draws from ---------------------------------------------------- */

/* The device's state in the process's region and in each region that one is
 * nested in (a nested `vgpulimit run`): what the process's kernels take
 * counts in all of them. */
static uint32_t states(int device, struct vgl_device_state **out)
{
    for (uint32_t i = 0; i < vgl_links(); i++)
        out[i] = &vgl_link_at(i).region->devices[device];
    return vgl_links();
}

/* Those of them that hold a share: a launch goes when every one admits it. */
static uint32_t budgets(int device, struct vgl_device_state **out)
{
    struct vgl_device_state *all[VGL_MAX_CHAIN];
    uint32_t n = 0, count = states(device, all);
    for (uint32_t i = 0; i < count; i++)
        if (vgl_throttle_share(all[i]))
            out[n++] = all[i];
    return n;
}

/* Whether a borrowing container may run past its share on `device` now: no
 * other tenant ran kernels there lately, as the real NVML tells.  One process
 * asks at a time, at most every LEND_CHECK_NS; the answer holds for all the
 * container's processes until the next. */
static bool lent(int device, struct vgl_device_state *dev, uint64_t now_ns)
{
    if (__atomic_load_n(&dev->cores_policy, __ATOMIC_RELAXED) != VGL_CORES_BORROW)
        return false;
    uint64_t until = __atomic_load_n(&dev->lend_until_ns, __ATOMIC_ACQUIRE);
    if (now_ns < until)
        return true;
    static uint64_t asked_ns[VGL_MAX_DEVICES];
    uint64_t asked = __atomic_load_n(&asked_ns[device], __ATOMIC_RELAXED);
    if (now_ns - asked < LEND_CHECK_NS ||
        !__atomic_compare_exchange_n(&asked_ns[device], &asked, now_ns, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        return false;
    bool idle = !vgl_others_busy(device, LEND_WINDOW_US);
    __atomic_store_n(&dev->lend_until_ns, idle ? now_ns + LEND_CHECK_NS : 0, __ATOMIC_RELEASE);
    return idle;
}

/* 0: admitted by every budget and charged `cost_ns` in each; else how long
 * to wait, nothing charged. */
static int64_t admit(int device, uint64_t now_ns, int64_t cost_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t n = budgets(device, devs);
    for (uint32_t i = 0; i < n; i++) {
        int64_t wait = vgl_throttle_admit(devs[i], now_ns, cost_ns);
        if (wait > 0 && lent(device, devs[i], now_ns)) {
            vgl_throttle_lend(devs[i], cost_ns);
            wait = 0;
        }
        if (wait > 0) {
            while (i--)
                vgl_throttle_settle(devs[i], cost_ns, 0);
            return wait;
        }
    }
    return 0;
}

static void settle(int device, int64_t charged_ns, int64_t measured_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t n = budgets(device, devs);
    for (uint32_t i = 0; i < n; i++)
        vgl_throttle_settle(devs[i], charged_ns, measured_ns);
}

/* ---- the calling thread's current context ------------------------------------------- */

/* Asking the driver for the current context on every launch would be most of
 * what the share costs, so each thread keeps its answer until a call that
 * changes it (context_hooks.c).  Bumped when a context may have ended, and
 * in a forked child: every thread asks again. */
static uint64_t contexts_epoch = 1;
static __thread struct {
    CUcontext ctx;
    uint64_t epoch;                 /* 0: ask the driver */
    uint32_t uses;                  /* launches since the driver was last asked */
} current;

CUresult vgl_context_changed(bool everywhere, CUresult rc)
{
    if (everywhere)
        __atomic_add_fetch(&contexts_epoch, 1, __ATOMIC_RELEASE);
    current.epoch = 0;
    return rc;
}

static CUresult current_context(CUcontext *ctx)
{
    uint64_t epoch = __atomic_load_n(&contexts_epoch, __ATOMIC_ACQUIRE);
    /* Asked again now and then all the same: a path the shim does not see
     * (a driver-private one) would otherwise charge another device for good. */
    if (current.epoch == epoch && ++current.uses < RECHECK_LAUNCHES) {
        *ctx = current.ctx;
        return CUDA_SUCCESS;
    }
    CUresult rc = vgl_real.cuCtxGetCurrent(ctx);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (current.epoch == epoch && current.ctx != *ctx) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "the current context changed from %p to %p by a call the "
                        "shim does not see; up to %d launches were charged to the former's device",
                        (void *)current.ctx, (void *)*ctx, RECHECK_LAUNCHES);
    }
    current.ctx = *ctx;
    current.epoch = epoch;
    current.uses = 0;
    return rc;
}

/* ---- per-process measurement state ------------------------------------------------------ */

/* Launches of one stream between two events. */
struct run {
    uint32_t stream;                /* index in the tracker's streams */
    CUevent start;                  /* NULL: the run began where the stream's previous one ended */
    CUevent end;
    int64_t charged_ns;
    uint32_t launches;
    bool known;                     /* every launch was charged a measured cost */
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

/* A context's runs not yet read back. */
struct tracker {
    CUcontext ctx;
    uint32_t device;
    CUevent reference;              /* NULL: not recorded yet */
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
    pthread_mutex_t lock;           /* guards all of it */
    uint32_t ntrackers;
    struct tracker trackers[CONTEXTS];
    struct {
        const void *key;
        int64_t ns;                 /* what a launch is charged: the least of the two windows' */
        int64_t window_ns;          /* the least of the current window */
        int64_t earlier_ns;         /* the least of the window before */
        uint64_t window_from;       /* when the current window began (CLOCK_MONOTONIC) */
    } costs[COSTS];                 /* by launch target (function or graph), hashed */
} launches = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The parent's events and measurements are not the child's. */
static void forget_in_child(void)
{
    __atomic_add_fetch(&contexts_epoch, 1, __ATOMIC_RELEASE);
    pthread_mutex_init(&launches.lock, NULL);
    launches.ntrackers = 0;
    memset(launches.trackers, 0, sizeof launches.trackers);
    memset(launches.costs, 0, sizeof launches.costs);
}
VGL_AFTER_FORK(forget_in_child)

static uint64_t clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* Under the lock: whether any device is limited, as of the region's generation now. */
static void refresh(void)
{
    if (!vgl_config.enabled || (!vgl_self.slot && !vgl_attach() && !vgl_self.region)) {
        /* Nothing to draw from (why was logged): launches go as they are. */
        __atomic_store_n(&unlimited_generation, without_budget, __ATOMIC_RELAXED);
        return;
    }
    /* A limit by UUID reaches a device once it is bound to its UUID. */
    vgl_devices_note_all();
    struct vgl_region *region = vgl_self.region;
    uint64_t generation = __atomic_load_n(&region->generation, __ATOMIC_ACQUIRE);
    /* A nested run looks at every launch: its outer regions' limits change
     * with generations of their own. */
    bool limited = vgl_self.nouter > 0;
    for (uint32_t i = 0; i < VGL_MAX_DEVICES; i++)
        limited = limited || vgl_throttle_share(&region->devices[i]);
    seen_generation = generation;
    __atomic_store_n(&unlimited_generation, limited ? 0 : generation, __ATOMIC_RELAXED);
    __atomic_store_n(&limits_generation, &region->generation, __ATOMIC_RELEASE);
}

/* Under the lock: the tracker of `ctx` (the current context, on `device`),
 * made on first use; NULL when there are too many. */
static struct tracker *tracker_for(CUcontext ctx, int device)
{
    for (uint32_t i = 0; i < launches.ntrackers; i++)
        if (launches.trackers[i].ctx == ctx)
            return &launches.trackers[i];
    if (launches.ntrackers == CONTEXTS) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "launches in context %p are not measured (more than %d "
                        "contexts); the compute share charges them what they are expected to take",
                        (void *)ctx, CONTEXTS);
        return NULL;
    }
    struct tracker *t = &launches.trackers[launches.ntrackers++];
    t->ctx = ctx;
    t->device = (uint32_t)device;
    return t;
}

/* Under the lock: the device of the current context, if the region accounts for it. */
static int launch_device(CUcontext *ctx)
{
    if (current_context(ctx) != CUDA_SUCCESS || !*ctx)
        return -1; /* the driver refuses the launch itself */
    for (uint32_t i = 0; i < launches.ntrackers; i++)
        if (launches.trackers[i].ctx == *ctx)
            return (int)launches.trackers[i].device;
    int device = vgl_current_device();
    if (device >= VGL_MAX_DEVICES) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_ERROR, &logged, "device %d is beyond the %d devices a region accounts "
                        "for; its launches are not limited", device, VGL_MAX_DEVICES);
        return -1;
    }
    return device;
}

static uint32_t cost_slot(const void *key)
{
    return (uint32_t)(((uintptr_t)key >> 4) * 0x9E3779B97F4A7C15ULL >> 56) % COSTS;
}

/* Under the lock: what a launch of `key` is known to cost; false: never measured. */
static bool known_cost(const void *key, int64_t *ns)
{
    uint32_t slot = cost_slot(key);
    bool known = launches.costs[slot].key == key;
    *ns = known ? launches.costs[slot].ns : FIRST_COST_NS;
    return known;
}

/* Under the lock: runs of `key` alone (one, or several overlapping on the
 * context's streams) took `per_launch_ns` a launch, their union's length
 * over their launches, read back at `now`.  Spans only grow with waiting
 * (behind other contexts' time slices, or with the stream idle), so the cost
 * is the least of recent runs: of this window and the one before
 * (COST_WINDOW_NS each), so that a kernel that became slower is charged so
 * within two windows.  (A cost that crept up towards each span instead
 * would, beside a busy neighbour whose slices stretch most spans, settle
 * near the stretched span.) */
static void learn_cost(const void *key, int64_t per_launch_ns, uint64_t now)
{
    __typeof__(launches.costs[0]) *c = &launches.costs[cost_slot(key)];
    if (c->key != key) {
        *c = (__typeof__(*c)){.key = key, .ns = per_launch_ns, .window_ns = per_launch_ns,
                              .earlier_ns = per_launch_ns, .window_from = now};
        return;
    }
    if (now - c->window_from >= COST_WINDOW_NS) {
        c->earlier_ns = c->window_ns;
        c->window_ns = per_launch_ns;
        c->window_from = now;
    } else if (per_launch_ns < c->window_ns) {
        c->window_ns = per_launch_ns;
    }
    c->ns = c->window_ns < c->earlier_ns ? c->window_ns : c->earlier_ns;
}

static void drop_event(CUevent e)
{
    if (e)
        vgl_real.cuEventDestroy_v2(e);
}

static void spare(struct tracker *t, CUevent e)
{
    if (!e)
        return;
    if (t->nspare < 2 * INFLIGHT)
        t->spare[t->nspare++] = e;
    else
        drop_event(e);
}

/* Under the lock: an event of `t`'s context (which is current), recorded on `stream`. */
static CUevent mark(struct tracker *t, CUstream stream)
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

static void add_busy(int device, int64_t ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    for (uint32_t i = 0, n = states(device, devs); i < n; i++)
        __atomic_add_fetch(&devs[i]->busy_ns, (uint64_t)ns, __ATOMIC_RELAXED);
}

/* Under the lock: the oldest run is settled at `measured_ns`. */
static void settle_oldest(struct tracker *t, int64_t measured_ns)
{
    struct run *r = &t->ring[t->head];
    settle((int)t->device, r->charged_ns, measured_ns);
    add_busy((int)t->device, measured_ns);
    spare(t, r->start);
    spare(t, r->end);
    t->head = (t->head + 1) % INFLIGHT;
    t->count--;
}

/* Under the lock: where `e` completed, from the reference event; false: not yet, or unknowable (*failed). */
static bool since_reference(struct tracker *t, CUevent e, int64_t *ns, bool *failed)
{
    float ms;
    CUresult rc = vgl_real.cuEventElapsedTime(&ms, t->reference, e);
    *failed = rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY;
    *ns = (int64_t)((double)ms * 1e6);
    return rc == CUDA_SUCCESS;
}

/* Under the lock: reads back the runs that are due and done, oldest first,
 * without waiting for any.  One whose events the driver no longer knows (its
 * context or stream was destroyed) counts as charged. */
static void harvest(struct tracker *t, uint64_t now)
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
                /* Asked again after half as long as it has been running
                 * late: a run queued behind much work costs few queries. */
                uint64_t late = now > r->closed_ns ? now - r->closed_ns : 0;
                r->due_ns = now + (late / 2 > 1000000 ? late / 2 : 1000000);
                return;
            }
            settle_oldest(t, r->charged_ns);
            continue;
        }
        s->last_end_ns = end;
        if (start > end)
            start = end;
        /* Overlapping runs (of the context's streams) teach together: a
         * kernel's cost is their union per launch, as the busy time they
         * are counted is their union.  (A stream's span alone holds its
         * siblings' kernels where they take turns.)  So a group teaches
         * once a run begins after all of it has ended. */
        if (t->group_launches && start >= t->covered_ns) {
            if (t->group_key)
                learn_cost(t->group_key, (t->covered_ns - t->group_start) / t->group_launches, now);
            t->group_launches = 0;
        }
        if (!t->group_launches) {
            t->group_key = r->key;
            t->group_start = start;
        } else if (t->group_key != r->key) {
            t->group_key = NULL;
        }
        t->group_launches += r->launches;
        /* The union: what this run adds to the context's busy time so far. */
        int64_t from = start > t->covered_ns ? start : t->covered_ns;
        int64_t busy = end > from ? end - from : 0;
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
            if (known_cost(r->key, &cost) && busy > cost * r->launches)
                busy = cost * r->launches;
        }
        VGL_LOG(VGL_LOG_DEBUG, "run on stream %u read back: %u launches charged %.3f ms, span %.3f ms, "
                "busy %.3f ms counted, allowance %.3f ms", r->stream, r->launches, r->charged_ns / 1e6,
                (end - start) / 1e6, busy / 1e6, t->allowance_ns / 1e6);
        settle_oldest(t, busy);
    }
}

/* Under the lock: closes the stream's open run with an event; the stream's
 * next run begins there if `chain`. */
static void close_run(struct tracker *t, uint32_t index, uint64_t now, bool chain)
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
        settle((int)t->device, r.charged_ns, r.charged_ns);
        spare(t, r.start);
        return;
    }
    r.due_ns = now + (uint64_t)r.charged_ns;
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

/* Under the lock: the stream's place in `t`, made on first use (taking that
 * of a stream with no open run when all are used); -1 when there is none. */
static int stream_index(struct tracker *t, CUstream stream)
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

/* ---- the gate around a launch ------------------------------------------------------- */

struct gate {
    int device;                     /* -1: the launch does not draw from the budget */
    struct tracker *tracker;        /* NULL: it drew, and is not measured */
    int stream;                     /* its stream's index in the tracker */
    int64_t charged_ns;
    bool known;
    const void *key;
};

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    nanosleep(&ts, NULL);
}

/* How long past its debt a launch of `cost_ns` sleeps: until the budget
 * holds RESUME_NS or RESUME_KERNELS of it, at most three quarters of what
 * the smallest share may keep. */
static int64_t resume_ns(int device, int64_t cost_ns)
{
    struct vgl_device_state *devs[VGL_MAX_CHAIN];
    uint32_t pct = 100;
    for (uint32_t i = 0, n = budgets(device, devs); i < n; i++) {
        uint32_t share = vgl_throttle_share(devs[i]);
        if (share && share < pct)
            pct = share;
    }
    int64_t hold = (int64_t)(VGL_BUDGET_WINDOW_NS * pct / 100 * 3 / 4);
    int64_t want = RESUME_KERNELS * cost_ns > RESUME_NS ? RESUME_KERNELS * cost_ns : RESUME_NS;
    if (want > hold)
        want = hold;
    return want * 100 / pct;
}

/* Waits for budget for a launch of `key` on `stream`, and opens a run on the
 * stream if none is.  A launch the driver will refuse anyway (no context), one
 * on a device with no share and one into a capturing stream (it runs when its
 * graph is launched) pass; one whose stream's capture state cannot be read
 * does not.  The capture state is read as a run opens: a stream that begins
 * capturing within a run is charged as if it ran (never waved through). */
static void gate_enter(struct gate *g, const void *key, CUstream stream)
{
    g->device = -1;
    g->tracker = NULL;
    pthread_mutex_lock(&launches.lock);
    const uint64_t *generation = __atomic_load_n(&limits_generation, __ATOMIC_RELAXED);
    if (generation == &without_budget || __atomic_load_n(generation, __ATOMIC_ACQUIRE) != seen_generation)
        refresh();
    CUcontext ctx = NULL;
    int device = unlimited() ? -1 : launch_device(&ctx);
    struct vgl_device_state *limited[VGL_MAX_CHAIN];
    if (device < 0 || !budgets(device, limited)) {
        pthread_mutex_unlock(&launches.lock);
        return;
    }
    uint64_t now = clock_ns();
    struct tracker *t = tracker_for(ctx, device);
    int index = -1;
    if (t) {
        harvest(t, now);
        index = stream_index(t, stream);
    }
    bool open = index >= 0 && t->streams[index].open;
    int64_t cost;
    bool known = known_cost(key, &cost);
    pthread_mutex_unlock(&launches.lock);

    if (!open) {
        /* A launch whose capture state cannot be read is charged as an
         * ordinary one: what the shim cannot determine is never waved through. */
        CUstreamCaptureStatus capture;
        CUresult captured = vgl_real.cuStreamIsCapturing(stream, &capture);
        if (captured == CUDA_SUCCESS && capture != CU_STREAM_CAPTURE_STATUS_NONE)
            return;
        if (captured != CUDA_SUCCESS) {
            static unsigned logged;
            vgl_log_bounded(VGL_LOG_WARN, &logged, "cuStreamIsCapturing failed (%d); the launch is charged "
                            "as an ordinary one", (int)captured);
        }
    }
    int64_t wait = admit(device, now, cost);
    if (wait > 0) {
        /* The process sleeps: its runs end here, so their spans hold no idle
         * time.  (A run kept open past the sleep would save an event and a
         * capture query, but its span would teach no cost: a cost first
         * learnt while sibling processes' slices stretched the span would
         * then be charged for good.) */
        pthread_mutex_lock(&launches.lock);
        for (uint32_t i = 0; t && i < t->nstreams; i++)
            close_run(t, i, now, false);
        pthread_mutex_unlock(&launches.lock);
        uint64_t until = now + (uint64_t)wait + (uint64_t)resume_ns(device, cost);
        VGL_LOG(VGL_LOG_DEBUG, "launch waits %.3f ms for budget (cost %.3f ms%s)", (until - now) / 1e6,
                cost / 1e6, known ? "" : ", not measured yet");
        for (;;) {
            uint64_t left = until > now ? until - now : 0;
            if (left)
                sleep_ns(left < MAX_SLEEP_NS ? (int64_t)left : MAX_SLEEP_NS);
            uint64_t woke = clock_ns();
            struct vgl_device_state *devs[VGL_MAX_CHAIN];
            for (uint32_t i = 0, n = states(device, devs); i < n; i++)
                __atomic_add_fetch(&devs[i]->throttled_ns, woke - now, __ATOMIC_RELAXED);
            now = woke;
            pthread_mutex_lock(&launches.lock);
            if (t)
                harvest(t, now);
            pthread_mutex_unlock(&launches.lock);
            if (now < until)
                continue;
            if ((wait = admit(device, now, cost)) <= 0)
                break;
            until = now + (uint64_t)wait;
        }
    }
    g->device = device;
    g->charged_ns = cost;
    g->known = known;
    if (!t || index < 0)
        return;
    pthread_mutex_lock(&launches.lock);
    struct stream_runs *s = &t->streams[index];
    if (s->stream == stream && !s->open) {
        if (!t->reference)
            t->reference = mark(t, stream);
        CUevent start = t->reference ? mark(t, stream) : NULL;
        if (start) {
            s->open = true;
            s->current = (struct run){.stream = (uint32_t)index, .start = start, .known = true};
        }
    }
    if (s->stream == stream && s->open) {
        g->tracker = t;
        g->stream = index;
        g->key = key;
    }
    pthread_mutex_unlock(&launches.lock);
}

/* After the driver call: a refused launch gives its charge back; one that
 * went joins its stream's run, which closes when it is long enough. */
static CUresult gate_leave(struct gate *g, CUresult rc)
{
    if (g->device < 0)
        return rc;
    if (rc != CUDA_SUCCESS) {
        settle(g->device, g->charged_ns, 0);
        return rc;
    }
    struct tracker *t = g->tracker;
    if (!t) {
        add_busy(g->device, g->charged_ns); /* not measured: as charged */
        return rc;
    }
    pthread_mutex_lock(&launches.lock);
    struct stream_runs *s = &t->streams[g->stream];
    if (!s->open) { /* closed meanwhile by another thread's wait: the launch is charged as it is */
        add_busy(g->device, g->charged_ns);
        pthread_mutex_unlock(&launches.lock);
        return rc;
    }
    struct run *r = &s->current;
    r->key = r->launches == 0 || r->key == g->key ? g->key : NULL;
    r->launches++;
    r->charged_ns += g->charged_ns;
    r->known = r->known && g->known;
    /* A kernel not measured yet is measured alone at once: until then each
     * of its launches is charged FIRST_COST_NS, whatever it takes. */
    int64_t run_ns = r->charged_ns / r->launches >= LONG_KERNEL_NS ? LONG_RUN_NS : RUN_NS;
    if (r->launches >= RUN_LAUNCHES || r->charged_ns >= run_ns || !r->known)
        close_run(t, (uint32_t)g->stream, clock_ns(), true);
    pthread_mutex_unlock(&launches.lock);
    return rc;
}

/* ---- the launch paths ------------------------------------------------------------------ */

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                       sharedMemBytes, hStream, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, hStream);
    return gate_leave(&g, vgl_real.cuLaunchKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                  blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                                            sharedMemBytes, hStream, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                       blockDimZ, sharedMemBytes, hStream, kernelParams, extra));
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()) || !config)
        return vgl_real.cuLaunchKernelEx(config, f, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, config->hStream);
    return gate_leave(&g, vgl_real.cuLaunchKernelEx(config, f, kernelParams, extra));
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    if (VGL_LIKELY(unlimited()) || !config)
        return vgl_real.cuLaunchKernelEx_ptsz(config, f, kernelParams, extra);
    struct gate g;
    gate_enter(&g, f, config->hStream ? config->hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchKernelEx_ptsz(config, f, kernelParams, extra));
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                  blockDimZ, sharedMemBytes, hStream, kernelParams);
    struct gate g;
    gate_enter(&g, f, hStream);
    return gate_leave(&g, vgl_real.cuLaunchCooperativeKernel(f, gridDimX, gridDimY, gridDimZ, blockDimX,
                                                             blockDimY, blockDimZ, sharedMemBytes, hStream,
                                                             kernelParams));
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_real.cuLaunchCooperativeKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                                                       blockDimZ, sharedMemBytes, hStream, kernelParams);
    struct gate g;
    gate_enter(&g, f, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_real.cuLaunchCooperativeKernel_ptsz(f, gridDimX, gridDimY, gridDimZ, blockDimX,
                                                                  blockDimY, blockDimZ, sharedMemBytes, hStream,
                                                                  kernelParams));
}

/* vgl_graph_launch charges the graph's memory nodes (graph_memory_hooks.c). */
CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch);
    struct gate g;
    gate_enter(&g, hGraphExec, hStream);
    return gate_leave(&g, vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch));
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    if (VGL_LIKELY(unlimited()))
        return vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch_ptsz);
    struct gate g;
    gate_enter(&g, hGraphExec, hStream ? hStream : STREAM_PER_THREAD);
    return gate_leave(&g, vgl_graph_launch(hGraphExec, hStream, vgl_real.cuGraphLaunch_ptsz));
}

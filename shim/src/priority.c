/* Priority between tenants on one GPU: while a container of a higher
 * priority has work on a device, the launches of lower ones wait (but for a
 * launch every 50 ms once held that long, so that they are never starved
 * outright), and while a higher one merely shares the device, lower ones
 * keep at most 0.5 ms of work in flight, so that a higher container's kernel
 * waits behind little of theirs.  Once the higher ones' work is done (0.5 ms
 * after it was expected to end), the lower ones launch again, each held to
 * its own share by throttle.c as before: priority only ever adds waiting.
 * What to do is decided by priority_model.c; this file is what it acts on.
 *
 * Who is higher comes from the node's board; whether they have work from
 * their beacons, which each container writes for itself at every launch:
 * until when the work it has launched is expected to keep each device busy
 * (its kernels' known costs, queued one after another).  The board, the
 * container's row and the beacons are beacons.c's, shared with elastic
 * memory.  A lower container's claim is believed only as far as an honest
 * one could have work in flight (priority_model.c), so it holds back no
 * container above it.
 *
 * How long a container's work lasts is its kernels' costs queued one after
 * another; beside a higher container the GPU's time slices stretch it, and
 * a lower one whose program queues far ahead would launch again, and again,
 * before its work is done.  So while a higher one shares the device, an
 * event recorded after one of the process's launches (its fence) has the
 * last word: once the estimate is a lookahead past the work before it and
 * the driver says it is not complete, launches wait for it.  One record and
 * one query every so often, and only beside a higher container.
 *
 * A process reads the others' beacons at most every
 * vgl_timings.beacon_reread_ns, under a lock of its own; nothing is locked
 * that another process holds.  Its own beacon is extended with a
 * compare-and-swap.  A tenant that damages it loses its own claims, nothing
 * else: its processes still wait for higher containers. */
#include <pthread.h>
#include <string.h>

#include "internal.h"

static struct {
    pthread_mutex_t lock;
    int state;                         /* 0: not looked at; 1: takes part; -1: does not */
    const struct vgl_board *board;
    struct vgl_beacon *own;            /* the container's beacon, or `unshared` */
    uint32_t rank;                     /* its row's priority's rank when last seen */
    struct {
        uint64_t read_ns;              /* 0: never */
        struct vgl_priority_view busy;
    } seen[VGL_MAX_DEVICES];           /* by the container's device index */
    struct vgl_priority_hold hold;
    struct {
        CUevent event;                 /* NULL: none made */
        CUcontext ctx;                 /* the context it was made in */
        uint64_t until_ns;             /* when the estimate said the work before it ends */
        bool armed;                    /* recorded, not seen complete yet */
        bool due;                      /* the launch let go records it */
    } fence[VGL_MAX_DEVICES];
} prio = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The claims of a process whose container's beacon cannot be written: they
 * reach no one, and its launches go through the same steps. */
static struct vgl_beacon unshared;

static void forget_in_child(void)
{
    /* The mapping stays valid in the child; only the lock may be held.  The
     * parent's events are of its contexts, which the child has not. */
    pthread_mutex_init(&prio.lock, NULL);
    memset(prio.fence, 0, sizeof prio.fence);
}
VGL_AFTER_FORK(forget_in_child)

/* Why the container takes no part, said. */
static void say_why_not(enum vgl_board_place place)
{
    const char *path = vgl_board_path();
    if (place == VGL_PLACE_NONE) {
        /* Asked for in the environment alone (HAMi's device plugin sets
         * CUDA_TASK_PRIORITY): no setter gave the container a row. */
        if (vgl_config.env.priority >= 0)
            vgl_log(VGL_LOG_WARN, "a priority was asked for (VGPULIMIT_PRIORITY or CUDA_TASK_PRIORITY), but "
                    "the container has no row in a priority board: only vgpulimit run and the OCI hook "
                    "give one; it takes no part in priorities");
        else if (vgl_self.region->priority)
            vgl_log(VGL_LOG_WARN, "the container's region records a priority but names no priority board "
                    "(was the region written?); it takes no part in priorities");
    } else if (place == VGL_PLACE_BAD_PATH) {
        vgl_log(VGL_LOG_WARN, "the region names no usable priority board (\"%s\"); priorities are ignored", path);
    } else if (place == VGL_PLACE_UNREADABLE) {
        vgl_log(VGL_LOG_WARN, "%s is not a priority board this process can read; priorities are ignored", path);
    } else if (place == VGL_PLACE_NO_ROW) {
        vgl_log(VGL_LOG_WARN, "the container has no row in the priority board %s (its row was freed, or "
                "another setter's board is named); it takes no part in priorities", path);
    } else if (vgl_config.env.priority >= 0) {
        /* A row for elastic memory alone. */
        vgl_log(VGL_LOG_WARN, "a priority was asked for (VGPULIMIT_PRIORITY or CUDA_TASK_PRIORITY), but "
                "the container's row in %s was given none by its setter; it takes no part in priorities", path);
    }
}

static int set_up(void)
{
    enum vgl_board_place place = vgl_board_place();
    const struct vgl_board_row *row = place == VGL_PLACE_ROW ? vgl_board_own_row(NULL) : NULL;
    if (!row || !(__atomic_load_n(&row->flags, __ATOMIC_RELAXED) & VGL_ROW_PRIORITY)) {
        say_why_not(row ? VGL_PLACE_ROW : place == VGL_PLACE_ROW ? VGL_PLACE_NO_ROW : place);
        return -1;
    }
    prio.rank = vgl_priority_rank(__atomic_load_n(&row->priority, __ATOMIC_RELAXED));
    const char *path, *why;
    prio.own = vgl_beacon_own(&path, &why);
    if (!prio.own) {
        vgl_log(VGL_LOG_WARN, "the container's beacon %s cannot be written (%s): containers below it no longer "
                "see its work, and it still waits for those above it", path, why);
        prio.own = &unshared;
    }
    prio.board = vgl_board_mapped();
    return 1;
}

bool vgl_priority_takes_part(void)
{
    int state = __atomic_load_n(&prio.state, __ATOMIC_ACQUIRE);
    if (VGL_LIKELY(state))
        return state > 0;
    pthread_mutex_lock(&prio.lock);
    if (!prio.state && vgl_self.region)
        __atomic_store_n(&prio.state, set_up(), __ATOMIC_RELEASE);
    state = prio.state;
    pthread_mutex_unlock(&prio.lock);
    return state > 0;
}

static const struct vgl_beacon_device *entry_for(const struct vgl_beacon *b, const uint8_t uuid[16])
{
    for (int d = 0; d < VGL_MAX_DEVICES; d++)
        if (memcmp(b->device[d].uuid, uuid, 16) == 0)
            return &b->device[d];
    return NULL;
}

/* The rank of the container's row now (a setter may have changed it), and
 * its index into *index.  A row no longer found keeps the rank it had: the
 * container waits for the same containers as before.  Under prio.lock. */
static uint32_t own_rank(uint32_t *index)
{
    const struct vgl_board_row *r = vgl_board_own_row(index);
    if (r)
        prio.rank = vgl_priority_rank(__atomic_load_n(&r->priority, __ATOMIC_RELAXED));
    return prio.rank;
}

/* The other containers' work on container device `device` (UUID `uuid`), as
 * their beacons said at most vgl_timings.beacon_reread_ns ago.  Under prio.lock. */
static struct vgl_priority_view others_busy(int device, const uint8_t uuid[16], uint64_t now_ns)
{
    if (prio.seen[device].read_ns && now_ns - prio.seen[device].read_ns < vgl_timings.beacon_reread_ns)
        return prio.seen[device].busy;
    uint32_t own;
    uint32_t rank = own_rank(&own);
    struct vgl_priority_view o = {0, 0, false};
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++) {
        const struct vgl_board_row *r = &prio.board->row[i];
        uint64_t key = __atomic_load_n(&r->key, __ATOMIC_ACQUIRE);
        if (!key || i == own || !(__atomic_load_n(&r->flags, __ATOMIC_RELAXED) & VGL_ROW_PRIORITY))
            continue;
        uint32_t other = vgl_priority_rank(__atomic_load_n(&r->priority, __ATOMIC_RELAXED));
        if (other == rank)
            continue;
        struct vgl_beacon b;
        bool readable = vgl_beacon_read(i, key, &b);
        const struct vgl_beacon_device *e = readable ? entry_for(&b, uuid) : NULL;
        /* A lower container whose beacon says nothing (its tenant truncated
         * it, or wrote something else there) may have all that an honest one
         * could in flight: losing its claims gains it nothing.  A higher one's
         * silence only takes its priority away from itself. */
        uint64_t claimed = e && e->launches ? e->busy_until_ns : !readable && other < rank ? UINT64_MAX : 0;
        if (!claimed)
            continue;
        uint64_t *until = other > rank ? &o.higher_ns : &o.lower_ns;
        uint64_t t = claimed < now_ns + vgl_timings.beacon_ahead_ns ? claimed : now_ns + vgl_timings.beacon_ahead_ns;
        *until = t > *until ? t : *until;
        o.higher_shares = o.higher_shares || other > rank;
    }
    prio.seen[device].read_ns = now_ns;
    prio.seen[device].busy = o;
    return o;
}

/* Whether the process's fence on `device` is overdue: the estimate said
 * its work ended a lookahead ago, and the driver says it has not.  Under
 * prio.lock. */
static bool fence_behind(int device, uint64_t now_ns)
{
    if (!prio.fence[device].armed || now_ns < prio.fence[device].until_ns + vgl_timings.priority_lookahead_ns)
        return false;
    if (vgl_real.cuEventQuery(prio.fence[device].event) == CUDA_ERROR_NOT_READY)
        return true;
    prio.fence[device].armed = false; /* complete, or its context gone */
    return false;
}

int64_t vgl_priority_admit(int device, uint64_t now_ns, int64_t cost_ns, bool quiet)
{
    const uint8_t *uuid = vgl_self.region->devices[device].uuid;
    if (vgl_uuid_none(uuid))
        return 0; /* its UUID not known yet: no one else's beacon can be matched */
    struct vgl_beacon_device *own = &prio.own->device[device];
    pthread_mutex_lock(&prio.lock);
    struct vgl_priority_view v = others_busy(device, uuid, now_ns);
    int64_t wait = vgl_priority_wait(&v, __atomic_load_n(&own->busy_until_ns, __ATOMIC_RELAXED), now_ns,
                                     !quiet && v.higher_shares && fence_behind(device, now_ns), &prio.hold);
    if (wait <= 0) /* a launch held meanwhile in another thread leaves this one's record due */
        prio.fence[device].due = !quiet && v.higher_shares && !prio.fence[device].armed;
    pthread_mutex_unlock(&prio.lock);
    if (wait > 0)
        return wait;
    /* Admitted: the container's work (all its processes') now lasts longer. */
    if (memcmp(own->uuid, uuid, sizeof own->uuid) != 0)
        memcpy(own->uuid, uuid, sizeof own->uuid);
    uint64_t until = __atomic_load_n(&own->busy_until_ns, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&own->busy_until_ns, &until, vgl_priority_until(&v, until, now_ns, cost_ns),
                                        true, __ATOMIC_RELEASE, __ATOMIC_RELAXED))
        ;
    __atomic_add_fetch(&own->launches, 1, __ATOMIC_RELEASE);
    return 0;
}

void vgl_priority_launched(int device, CUstream stream, bool went, bool quiet)
{
    pthread_mutex_lock(&prio.lock);
    if (prio.fence[device].due && went && !quiet && !prio.fence[device].armed) {
        CUcontext ctx = NULL;
        if (vgl_real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx) {
            if (prio.fence[device].event && prio.fence[device].ctx != ctx) {
                vgl_real.cuEventDestroy_v2(prio.fence[device].event);
                prio.fence[device].event = NULL;
            }
            if (!prio.fence[device].event &&
                vgl_real.cuEventCreate(&prio.fence[device].event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
                prio.fence[device].event = NULL;
            prio.fence[device].ctx = ctx;
            if (prio.fence[device].event && vgl_real.cuEventRecord(prio.fence[device].event, stream) == CUDA_SUCCESS) {
                prio.fence[device].armed = true;
                prio.fence[device].until_ns = __atomic_load_n(&prio.own->device[device].busy_until_ns,
                                                              __ATOMIC_RELAXED);
            }
        }
    }
    prio.fence[device].due = false;
    pthread_mutex_unlock(&prio.lock);
}

void vgl_priority_yielded(int device, uint64_t ns)
{
    for (uint32_t i = 0; i < vgl_links(); i++)
        __atomic_add_fetch(&vgl_link_at(i).region->yielded_ns[device], ns, __ATOMIC_RELAXED);
}

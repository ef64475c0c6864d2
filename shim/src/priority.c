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
 * Who is higher comes from the node's board (vgpulimit/board.h), mapped
 * read-only; whether they have work from their beacons, which each
 * container writes for itself at every launch: until when the work it has
 * launched is expected to keep each device busy (its kernels' known costs,
 * queued one after another).  The container's own priority is its board row,
 * not its region or environment, which the tenant may write.
 *
 * Other containers' beacons are read, never mapped: each is its tenant's
 * file, and one truncated under a mapping would kill its readers with
 * SIGBUS.  A process reads them at most every REREAD_NS (one pread each),
 * under a lock of its own; nothing is locked that another process holds.
 * Its own beacon is mapped and extended with a compare-and-swap. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "vgpulimit/board.h"

/* Other containers' beacons are read again after this long. */
#define REREAD_NS 100000
/* A beacon is believed this far ahead at most: its tenant writes it (and
 * the sums below must not wrap). */
#define AHEAD_NS 1000000000ULL

struct other {
    uint64_t key;                      /* the row's, when `fd` was opened */
    int fd;                            /* its beacon, read-only; -1: none (or not a beacon) */
};


static struct {
    pthread_mutex_t lock;
    int state;                         /* 0: not looked at; 1: takes part; -1: does not */
    const struct vgl_board *board;
    struct vgl_beacon *own;
    uint32_t row;
    uint64_t key;
    char dir[VGL_PARENT_LEN];
    struct other others[VGL_BOARD_ROWS];
    struct {
        uint64_t read_ns;              /* 0: never */
        struct vgl_priority_view busy;
    } seen[VGL_MAX_DEVICES];           /* by the container's device index */
    struct vgl_priority_hold hold;
} prio = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void forget_in_child(void)
{
    /* The mapping and the descriptors stay valid in the child; only the lock may be held. */
    pthread_mutex_init(&prio.lock, NULL);
}
VGL_AFTER_FORK(forget_in_child)

static const void *map_file(const char *path, size_t size, bool writable)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size)
        map = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    close(fd);
    return map == MAP_FAILED ? NULL : map;
}

/* The path of the beacon named `name` (a row's, NUL-terminated within
 * VGL_BEACON_NAME_LEN) in the board's directory. */
static void beacon_path(const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%.*s", prio.dir, VGL_BEACON_NAME_LEN - 1, name);
}

/* The container's own beacon, mapped for writing; NULL if it cannot be. */
static struct vgl_beacon *map_own_beacon(const char *name)
{
    char path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
    beacon_path(name, path, sizeof path);
    void *map = (void *)map_file(path, sizeof(struct vgl_beacon), true);
    if (map && vgl_beacon_check(map, sizeof(struct vgl_beacon)) != 0) {
        munmap(map, sizeof(struct vgl_beacon));
        return NULL;
    }
    return map;
}

/* The region that names the container's board: the outermost that names
 * one (a nested run's own region may not). */
static const struct vgl_region *board_region(void)
{
    for (uint32_t i = vgl_links(); i-- > 0;) {
        const struct vgl_region *r = vgl_link_at(i).region;
        if (r && __atomic_load_n(&r->board[0], __ATOMIC_RELAXED))
            return r;
    }
    return NULL;
}

static int set_up(void)
{
    const struct vgl_region *region = board_region();
    if (!region) {
        /* Asked for in the environment alone (HAMi's device plugin sets
         * CUDA_TASK_PRIORITY): no setter gave the container a row. */
        if (vgl_self.region->priority)
            vgl_log(VGL_LOG_WARN, "a priority was asked for (VGPULIMIT_PRIORITY or CUDA_TASK_PRIORITY), but "
                    "the container has no row in a priority board: only vgpulimit run and the OCI hook "
                    "give one; it takes no part in priorities");
        return -1;
    }
    char path[VGL_PARENT_LEN];
    memcpy(path, region->board, sizeof path);
    path[sizeof path - 1] = '\0';
    prio.row = region->board_row;
    prio.key = region->board_key;
    char *slash = strrchr(path, '/');
    if (path[0] != '/' || !slash || prio.row >= VGL_BOARD_ROWS) {
        vgl_log(VGL_LOG_WARN, "the region names no usable priority board (\"%s\"); priorities are ignored", path);
        return -1;
    }
    snprintf(prio.dir, sizeof prio.dir, "%.*s", (int)(slash - path), path);
    const struct vgl_board *board = map_file(path, sizeof *board, false);
    if (!board || vgl_board_check(board, sizeof *board) != 0) {
        vgl_log(VGL_LOG_WARN, "%s is not a priority board this process can read; priorities are ignored", path);
        if (board)
            munmap((void *)board, sizeof *board);
        return -1;
    }
    const struct vgl_board_row *row = &board->row[prio.row];
    if (__atomic_load_n(&row->key, __ATOMIC_RELAXED) != prio.key ||
        !(prio.own = map_own_beacon(row->beacon))) {
        vgl_log(VGL_LOG_WARN, "the container's row %u of %s is not its own, or its beacon cannot be "
                "written; priorities are ignored", prio.row, path);
        munmap((void *)board, sizeof *board);
        return -1;
    }
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++)
        prio.others[i].fd = -1;
    prio.board = board;
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

/* Row i's beacon as it is now, into *out: false if it cannot be read (gone,
 * or not a beacon).  Opened anew when the row changed hands.  Under prio.lock. */
static bool read_beacon(uint32_t i, uint64_t key, struct vgl_beacon *out)
{
    struct other *o = &prio.others[i];
    if (o->key != key) {
        if (o->fd >= 0)
            close(o->fd);
        char name[VGL_BEACON_NAME_LEN], path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
        memcpy(name, prio.board->row[i].beacon, sizeof name);
        name[sizeof name - 1] = '\0';
        beacon_path(name, path, sizeof path);
        /* O_NONBLOCK: a FIFO a tenant put in its beacon's place blocks no one. */
        o->fd = strchr(name, '/') ? -1 : open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat st;
        if (o->fd >= 0 && (fstat(o->fd, &st) != 0 || !S_ISREG(st.st_mode))) {
            close(o->fd);
            o->fd = -1;
        }
        o->key = key;
    }
    return o->fd >= 0 && pread(o->fd, out, sizeof *out, 0) == (ssize_t)sizeof *out &&
           vgl_beacon_check(out, sizeof *out) == 0;
}

static const struct vgl_beacon_device *entry_for(const struct vgl_beacon *b, const uint8_t uuid[16])
{
    for (int d = 0; d < VGL_MAX_DEVICES; d++)
        if (memcmp(b->device[d].uuid, uuid, 16) == 0)
            return &b->device[d];
    return NULL;
}

/* The other containers' work on container device `device` (UUID `uuid`), as
 * their beacons said at most REREAD_NS ago.  Under prio.lock. */
static struct vgl_priority_view others_busy(int device, const uint8_t uuid[16], uint64_t now_ns)
{
    if (prio.seen[device].read_ns && now_ns - prio.seen[device].read_ns < REREAD_NS)
        return prio.seen[device].busy;
    uint32_t rank = vgl_priority_rank(__atomic_load_n(&prio.board->row[prio.row].priority, __ATOMIC_RELAXED));
    struct vgl_priority_view o = {0, 0, false};
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++) {
        const struct vgl_board_row *r = &prio.board->row[i];
        uint64_t key = __atomic_load_n(&r->key, __ATOMIC_ACQUIRE);
        if (!key || i == prio.row)
            continue;
        uint32_t other = vgl_priority_rank(__atomic_load_n(&r->priority, __ATOMIC_RELAXED));
        struct vgl_beacon b;
        if (other == rank || !read_beacon(i, key, &b))
            continue;
        const struct vgl_beacon_device *e = entry_for(&b, uuid);
        if (!e || !e->launches)
            continue;
        uint64_t *until = other > rank ? &o.higher_ns : &o.lower_ns;
        uint64_t t = e->busy_until_ns < now_ns + AHEAD_NS ? e->busy_until_ns : now_ns + AHEAD_NS;
        *until = t > *until ? t : *until;
        o.higher_shares = o.higher_shares || other > rank;
    }
    prio.seen[device].read_ns = now_ns;
    prio.seen[device].busy = o;
    return o;
}

int64_t vgl_priority_admit(int device, uint64_t now_ns, int64_t cost_ns)
{
    const uint8_t *uuid = vgl_self.region->devices[device].uuid;
    static const uint8_t none[16];
    if (memcmp(uuid, none, sizeof none) == 0)
        return 0; /* its UUID not known yet: no one else's beacon can be matched */
    struct vgl_beacon_device *own = &prio.own->device[device];
    pthread_mutex_lock(&prio.lock);
    struct vgl_priority_view v = others_busy(device, uuid, now_ns);
    int64_t wait = vgl_priority_wait(&v, __atomic_load_n(&own->busy_until_ns, __ATOMIC_RELAXED), now_ns,
                                     &prio.hold);
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

void vgl_priority_yielded(int device, uint64_t ns)
{
    for (uint32_t i = 0; i < vgl_links(); i++)
        __atomic_add_fetch(&vgl_link_at(i).region->yielded_ns[device], ns, __ATOMIC_RELAXED);
}

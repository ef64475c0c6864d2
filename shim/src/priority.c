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
 * found by its region file (the one the hook mounted, or the one its
 * supervisor made), never by what its region or environment say, which the
 * tenant may write.  A lower container's claim is believed only as far as
 * an honest one could have work in flight (priority_model.c), so it holds
 * back no container above it.
 *
 * Other containers' beacons are read, never mapped: each is its tenant's
 * file, and one truncated under a mapping would kill its readers with
 * SIGBUS.  A process reads them at most every vgl_timings.beacon_reread_ns (one pread each),
 * under a lock of its own; nothing is locked that another process holds.
 * Its own beacon is mapped, guarded as the region is (region_guard.c), and
 * extended with a compare-and-swap.  A tenant that damages it loses its own
 * claims, nothing else: its processes still wait for higher containers. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "vgpulimit/board.h"
#include "vgpulimit/paths.h"


struct other {
    uint64_t key;                      /* the row's, when `fd` was opened */
    int fd;                            /* its beacon, read-only; -1: none (or not a beacon) */
};


static struct {
    pthread_mutex_t lock;
    int state;                         /* 0: not looked at; 1: takes part; -1: does not */
    const struct vgl_board *board;
    struct vgl_beacon *own;            /* the container's beacon, or `unshared` */
    uint64_t region_dev, region_ino;   /* the region file the container's row names */
    uint32_t row;                      /* where that row was last seen */
    uint32_t rank;                     /* and its priority's rank then */
    char dir[VGL_PARENT_LEN];
    struct other others[VGL_BOARD_ROWS];
    struct {
        uint64_t read_ns;              /* 0: never */
        struct vgl_priority_view busy;
    } seen[VGL_MAX_DEVICES];           /* by the container's device index */
    struct vgl_priority_hold hold;
} prio = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* The claims of a process whose container's beacon cannot be written: they
 * reach no one, and its launches go through the same steps. */
static struct vgl_beacon unshared;

static void forget_in_child(void)
{
    /* The mapping and the descriptors stay valid in the child; only the lock may be held. */
    pthread_mutex_init(&prio.lock, NULL);
}
VGL_AFTER_FORK(forget_in_child)

void *vgl_map_file(const char *path, size_t size, bool writable)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *map = MAP_FAILED;
    int err = EBADF;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size) {
        map = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
        err = errno;
    }
    close(fd);
    errno = err;
    return map == MAP_FAILED ? NULL : map;
}

/* The path of the beacon named `name` (vgl_beacon_name's) in the board's directory. */
static void beacon_path(const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%.*s", prio.dir, VGL_BEACON_NAME_LEN - 1, name);
}

/* The container's own beacon, mapped for writing and guarded; else
 * `unshared`, said once. */
static struct vgl_beacon *map_own_beacon(const char *name)
{
    char path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
    beacon_path(name, path, sizeof path);
    struct vgl_beacon *map = vgl_map_file(path, sizeof *map, true);
    const char *why = map ? NULL : errno == EBADF ? "it is not a file of a beacon's size" : strerror(errno);
    if (map && vgl_beacon_check(map, sizeof *map) != 0)
        why = "it is not a beacon";
    else if (map && vgl_guard_mapping(map, sizeof *map) != 0)
        why = "too many files are mapped to guard one more";
    if (!why)
        return map;
    if (map)
        munmap(map, sizeof *map);
    vgl_log(VGL_LOG_WARN, "the container's beacon %s cannot be written (%s): containers below it no longer "
            "see its work, and it still waits for those above it", path, why);
    return &unshared;
}

bool vgl_board_locate(char board[VGL_PARENT_LEN], struct stat *region, uint32_t *link)
{
    *link = vgl_links() - 1; /* the hook's region is the outermost */
    char path[sizeof vgl_config.region_path], named[sizeof vgl_config.region_path] = "";
    if (vgl_config.authoritative) {
        if (access(VGL_CONTAINER_BOARD, F_OK) != 0)
            return false; /* the hook gave no row: the container has no priority */
        snprintf(board, VGL_PARENT_LEN, "%s", VGL_CONTAINER_BOARD);
        snprintf(named, sizeof named, "%s", VGL_CONTAINER_REGION);
    } else {
        board[0] = '\0';
        memcpy(path, vgl_config.region_path, sizeof path);
        for (uint32_t i = 0; i < vgl_links(); i++) {
            /* Copies: the header is in a mapping every process of the container may write. */
            const struct vgl_region *r = vgl_link_at(i).region;
            if (__atomic_load_n(&r->board[0], __ATOMIC_RELAXED)) {
                memcpy(board, r->board, VGL_PARENT_LEN);
                board[VGL_PARENT_LEN - 1] = '\0';
                memcpy(named, path, sizeof named);
                *link = i;
            }
            memcpy(path, r->parent, VGL_PARENT_LEN);
            path[VGL_PARENT_LEN - 1] = '\0';
        }
        if (!board[0])
            return false;
    }
    if (stat(named, region) != 0) {
        vgl_log(VGL_LOG_WARN, "the container's region %s cannot be looked at (%s); it takes no part in "
                "priorities or elastic memory", named, strerror(errno));
        return false;
    }
    return true;
}

static int set_up(void)
{
    char path[VGL_PARENT_LEN];
    struct stat region;
    uint32_t link;
    if (!vgl_board_locate(path, &region, &link)) {
        /* Asked for in the environment alone (HAMi's device plugin sets
         * CUDA_TASK_PRIORITY): no setter gave the container a row. */
        if (vgl_config.env.priority >= 0)
            vgl_log(VGL_LOG_WARN, "a priority was asked for (VGPULIMIT_PRIORITY or CUDA_TASK_PRIORITY), but "
                    "the container has no row in a priority board: only vgpulimit run and the OCI hook "
                    "give one; it takes no part in priorities");
        else if (vgl_self.region->priority)
            vgl_log(VGL_LOG_WARN, "the container's region records a priority but names no priority board "
                    "(was the region written?); it takes no part in priorities");
        return -1;
    }
    char *slash = strrchr(path, '/');
    if (path[0] != '/' || !slash) {
        vgl_log(VGL_LOG_WARN, "the region names no usable priority board (\"%s\"); priorities are ignored", path);
        return -1;
    }
    snprintf(prio.dir, sizeof prio.dir, "%.*s", (int)(slash - path), path);
    const struct vgl_board *board = vgl_map_file(path, sizeof *board, false);
    if (!board || vgl_board_check(board, sizeof *board) != 0) {
        vgl_log(VGL_LOG_WARN, "%s is not a priority board this process can read; priorities are ignored", path);
        if (board)
            munmap((void *)board, sizeof *board);
        return -1;
    }
    prio.region_dev = (uint64_t)region.st_dev;
    prio.region_ino = (uint64_t)region.st_ino;
    int row = vgl_board_find(board, prio.region_dev, prio.region_ino, NULL);
    if (row < 0) {
        vgl_log(VGL_LOG_WARN, "the container has no row in the priority board %s (its row was freed, or "
                "another setter's board is named); it takes no part in priorities", path);
        munmap((void *)board, sizeof *board);
        return -1;
    }
    if (!(__atomic_load_n(&board->row[row].flags, __ATOMIC_RELAXED) & VGL_ROW_PRIORITY)) {
        /* A row for elastic memory alone. */
        if (vgl_config.env.priority >= 0)
            vgl_log(VGL_LOG_WARN, "a priority was asked for (VGPULIMIT_PRIORITY or CUDA_TASK_PRIORITY), but "
                    "the container's row in %s was given none by its setter; it takes no part in priorities", path);
        munmap((void *)board, sizeof *board);
        return -1;
    }
    prio.row = (uint32_t)row;
    prio.rank = vgl_priority_rank(__atomic_load_n(&board->row[row].priority, __ATOMIC_RELAXED));
    char name[VGL_BEACON_NAME_LEN];
    vgl_beacon_name(__atomic_load_n(&board->row[row].key, __ATOMIC_ACQUIRE), name);
    prio.own = map_own_beacon(name);
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
        vgl_beacon_name(key, name);
        beacon_path(name, path, sizeof path);
        /* O_NONBLOCK: a FIFO a tenant put in its beacon's place blocks no one. */
        o->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
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

/* The rank of the container's row now (a setter may have changed it).  A
 * row no longer found keeps the rank it had: the container waits for the
 * same containers as before.  Under prio.lock. */
static uint32_t own_rank(void)
{
    const struct vgl_board_row *r = &prio.board->row[prio.row];
    if (__atomic_load_n(&r->region_ino, __ATOMIC_RELAXED) != prio.region_ino ||
        __atomic_load_n(&r->region_dev, __ATOMIC_RELAXED) != prio.region_dev) {
        int row = vgl_board_find(prio.board, prio.region_dev, prio.region_ino, NULL);
        if (row < 0)
            return prio.rank;
        prio.row = (uint32_t)row;
        r = &prio.board->row[row];
    }
    prio.rank = vgl_priority_rank(__atomic_load_n(&r->priority, __ATOMIC_RELAXED));
    return prio.rank;
}

/* The other containers' work on container device `device` (UUID `uuid`), as
 * their beacons said at most vgl_timings.beacon_reread_ns ago.  Under prio.lock. */
static struct vgl_priority_view others_busy(int device, const uint8_t uuid[16], uint64_t now_ns)
{
    if (prio.seen[device].read_ns && now_ns - prio.seen[device].read_ns < vgl_timings.beacon_reread_ns)
        return prio.seen[device].busy;
    uint32_t rank = own_rank();
    struct vgl_priority_view o = {0, 0, false};
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++) {
        const struct vgl_board_row *r = &prio.board->row[i];
        uint64_t key = __atomic_load_n(&r->key, __ATOMIC_ACQUIRE);
        if (!key || i == prio.row || !(__atomic_load_n(&r->flags, __ATOMIC_RELAXED) & VGL_ROW_PRIORITY))
            continue;
        uint32_t other = vgl_priority_rank(__atomic_load_n(&r->priority, __ATOMIC_RELAXED));
        if (other == rank)
            continue;
        struct vgl_beacon b;
        bool readable = read_beacon(i, key, &b);
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

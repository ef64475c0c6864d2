/* Elastic memory (docs/memory.md): a container is guaranteed its request and
 * may borrow above it, up to its cap, what no other container on the GPU
 * uses or is guaranteed; an allocation that would be refused may wait for
 * memory.  What to decide is elastic_model.c's; this file reads what it
 * decides on and acts.
 *
 * Node-wide facts come from the node's board (vgpulimit/board.h), mapped
 * read-only: each container's guarantee (its request, else its cap) as its
 * setter wrote it, found by the region file, never by what a tenant can
 * write.  Use and waiting come from the beacons, each written by its own
 * container: claims, believed only as far as a lie costs the liar.  A
 * container that says it uses more than it does leaves less of its own
 * guarantee held for it; one that says it uses less holds more, which only
 * others' borrowing pays.  Physical use is the driver's (cuMemGetInfo).
 *
 * Waiting sleeps on futexes: each container bumps the word `frees` in its
 * beacon's entry for a device when its memory there is freed, and wakes its
 * sleepers; a waiter reads every container's word (pread, as priority.c
 * reads beacons), tries its allocation again, and sleeps on all the words at
 * once (futex_waitv) only if they are still what it read: a free between the
 * read and the sleep is never missed.  Others' beacons are mapped read-only
 * for the futex addresses alone and never read through the mapping, so a
 * tenant that truncates its own beacon costs a reader a failed futex call,
 * not its life.  Frees by processes outside any row (another user's, a
 * plain-capped container of the OCI hook without a row) are seen at the next
 * recheck, every vgl_timings.memory_recheck_ns.
 *
 * Who waits is said in each waiting process's own slot, and the beacon's
 * waits are derived from the live slots and believed only while a waiter
 * holds their byte locked (waits.c): a waiter killed as it waits holds no
 * one back. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449 /* Linux 5.16, the same number on every architecture */
#endif
#ifndef FUTEX2_SIZE_U32
#define FUTEX2_SIZE_U32 0x02
#endif

/* The kernel's struct futex_waitv (linux/futex.h from 5.16; not in older headers). */
struct waitv {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};

struct other {
    uint64_t key;                  /* the row's, when `fd` was opened */
    int fd;                        /* its beacon, read-only; -1: none */
    const struct vgl_beacon *map;  /* the same, mapped for futex addresses only; NULL: none */
};

static struct {
    pthread_mutex_t lock;
    int state;                     /* 0: not looked at; 1: takes part; -1: does not */
    const struct vgl_board *board;
    struct vgl_beacon *own;
    int own_fd;                    /* the same, open for reading: its waits' bytes are locked
                                      through it (waits.c); -1: none */
    uint32_t held[VGL_MAX_DEVICES]; /* this process's allocations waiting on each device: the
                                       device's byte is locked while one is */
    struct vgl_memory_wait *waits; /* this process's waits, a list through `next` */
    uint64_t region_dev, region_ino;
    uint32_t row;
    uint32_t link;                 /* the process's link whose region the row is for */
    char dir[VGL_PARENT_LEN];
    struct other others[VGL_BOARD_ROWS];
    uint32_t named[VGL_MAX_DEVICES]; /* the beacon's entry of the device has its UUID (atomic) */
    uint64_t waits_seen;           /* the board's generation when last read, and (bit 0) whether
                                      some row on it has a memory wait; one word, so never torn */
} el = {.lock = PTHREAD_MUTEX_INITIALIZER, .own_fd = -1};

/* The child waits for nothing; its own descriptor of the beacon holds none
 * of the parent's locks, which die with the parent. */
static void forget_in_child(void)
{
    pthread_mutex_init(&el.lock, NULL);
    if (el.own_fd >= 0) {
        int fresh = vgl_reopen(el.own_fd, O_RDONLY);
        close(el.own_fd);
        el.own_fd = fresh;
    }
    memset(el.held, 0, sizeof el.held);
    el.waits = NULL;
}
VGL_AFTER_FORK(forget_in_child)

static struct vgl_region *own_region(void) { return vgl_link_at(el.link).region; }

static void beacon_path(const char *name, char *out, size_t len)
{
    snprintf(out, len, "%s/%.*s", el.dir, VGL_BEACON_NAME_LEN - 1, name);
}

/* The container's beacon, mapped for writing and guarded; NULL (said) if it cannot be. */
static struct vgl_beacon *map_own_beacon(const char *name)
{
    char path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
    beacon_path(name, path, sizeof path);
    struct vgl_beacon *map = vgl_map_file(path, sizeof *map, true);
    if (map && vgl_beacon_check(map, sizeof *map) == 0 && vgl_guard_mapping(map, sizeof *map) == 0) {
        el.own_fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        return map;
    }
    if (map)
        munmap(map, sizeof *map);
    vgl_log(VGL_LOG_WARN, "the container's beacon %s cannot be written: its use is not known to other "
            "containers (which then hold all of its guarantee for it) and its frees wake no waiter", path);
    return NULL;
}

static int set_up(void)
{
    char path[VGL_PARENT_LEN];
    struct stat region;
    if (!vgl_board_locate(path, &region, &el.link))
        return -1;
    char *slash = strrchr(path, '/');
    if (path[0] != '/' || !slash)
        return -1;
    snprintf(el.dir, sizeof el.dir, "%.*s", (int)(slash - path), path);
    const struct vgl_board *board = vgl_map_file(path, sizeof *board, false);
    if (!board || vgl_board_check(board, sizeof *board) != 0) {
        vgl_log(VGL_LOG_WARN, "%s is not a board this process can read; elastic memory (requests, waits) "
                "is off: allocations are held to the cap alone", path);
        if (board)
            munmap((void *)board, sizeof *board);
        return -1;
    }
    int row = vgl_board_find(board, (uint64_t)region.st_dev, (uint64_t)region.st_ino, NULL);
    if (row < 0 || !(__atomic_load_n(&board->row[row].flags, __ATOMIC_RELAXED) & VGL_ROW_MEMORY)) {
        munmap((void *)board, sizeof *board);
        return -1;
    }
    el.region_dev = (uint64_t)region.st_dev;
    el.region_ino = (uint64_t)region.st_ino;
    el.row = (uint32_t)row;
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++)
        el.others[i].fd = -1;
    char name[VGL_BEACON_NAME_LEN];
    vgl_beacon_name(__atomic_load_n(&board->row[row].key, __ATOMIC_ACQUIRE), name);
    el.own = map_own_beacon(name);
    el.board = board;
    return 1;
}

bool vgl_elastic_takes_part(void)
{
    int state = __atomic_load_n(&el.state, __ATOMIC_ACQUIRE);
    if (VGL_LIKELY(state))
        return state > 0;
    pthread_mutex_lock(&el.lock);
    if (!el.state && vgl_self.region)
        __atomic_store_n(&el.state, set_up(), __ATOMIC_RELEASE);
    state = el.state;
    pthread_mutex_unlock(&el.lock);
    return state > 0;
}

/* The container's row now: a setter may have moved it.  NULL: gone. */
static const struct vgl_board_row *own_row(void)
{
    const struct vgl_board_row *r = &el.board->row[__atomic_load_n(&el.row, __ATOMIC_RELAXED)];
    if (__atomic_load_n(&r->region_ino, __ATOMIC_RELAXED) == el.region_ino &&
        __atomic_load_n(&r->region_dev, __ATOMIC_RELAXED) == el.region_dev)
        return r;
    int row = vgl_board_find(el.board, el.region_dev, el.region_ino, NULL);
    if (row < 0)
        return NULL;
    __atomic_store_n(&el.row, (uint32_t)row, __ATOMIC_RELAXED); /* read without the lock by vgl_elastic_admit */
    return &el.board->row[row];
}

static const uint8_t NO_UUID[16];

/* What `r` guarantees the device of `uuid`, numbered `index` in its
 * container (-1: unknown there), on a device of `total` bytes. */
static uint64_t guarantee_of(const struct vgl_board_row *r, int index, const uint8_t uuid[16], uint64_t total)
{
    struct vgl_mem_limit g = {0};
    bool known = memcmp(uuid, NO_UUID, 16) != 0;
    for (int d = 0; d < VGL_MAX_DEVICES && known; d++)
        if (memcmp(r->guarantee_by_uuid[d].uuid, uuid, 16) == 0) {
            g.bytes = __atomic_load_n(&r->guarantee_by_uuid[d].guarantee.bytes, __ATOMIC_RELAXED);
            g.ppm = __atomic_load_n(&r->guarantee_by_uuid[d].guarantee.ppm, __ATOMIC_RELAXED);
            index = -1;
            break;
        }
    if (index >= 0) {
        g.bytes = __atomic_load_n(&r->guarantee[index].bytes, __ATOMIC_RELAXED);
        g.ppm = __atomic_load_n(&r->guarantee[index].ppm, __ATOMIC_RELAXED);
    }
    uint64_t bytes = vgl_cap_bytes(&g, total);
    return bytes == UINT64_MAX ? 0 : bytes;
}

/* The container's own request on `device` (of `total` bytes) in bytes:
 * what its row guarantees, at most its `cap`. */
static uint64_t own_request(int device, uint64_t total, uint64_t cap)
{
    const struct vgl_board_row *r = own_row();
    if (!r)
        return cap; /* its row was freed (its setter is gone): held to its cap alone */
    uint64_t g = guarantee_of(r, device, vgl_self.region->devices[device].uuid, total);
    return g < cap ? g : cap;
}

/* Row i's beacon as it is now, into *out (false: unreadable), opened and
 * mapped anew when the row changed hands.  Under el.lock. */
static bool read_beacon(uint32_t i, uint64_t key, struct vgl_beacon *out)
{
    struct other *o = &el.others[i];
    if (o->key != key) {
        if (o->fd >= 0)
            close(o->fd);
        if (o->map)
            munmap((void *)o->map, sizeof *o->map);
        o->map = NULL;
        char name[VGL_BEACON_NAME_LEN], path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
        vgl_beacon_name(key, name);
        beacon_path(name, path, sizeof path);
        /* O_NONBLOCK: a FIFO a tenant put in its beacon's place blocks no one. */
        o->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        struct stat st;
        if (o->fd >= 0 && (fstat(o->fd, &st) != 0 || !S_ISREG(st.st_mode) ||
                           (uint64_t)st.st_size != sizeof(struct vgl_beacon))) {
            close(o->fd);
            o->fd = -1;
        }
        if (o->fd >= 0) {
            void *map = mmap(NULL, sizeof *o->map, PROT_READ, MAP_SHARED, o->fd, 0);
            o->map = map == MAP_FAILED ? NULL : map;
        }
        o->key = key;
    }
    return o->fd >= 0 && pread(o->fd, out, sizeof *out, 0) == (ssize_t)sizeof *out &&
           vgl_beacon_check(out, sizeof *out) == 0;
}

static int entry_index(const struct vgl_beacon *b, const uint8_t uuid[16])
{
    for (int d = 0; d < VGL_MAX_DEVICES; d++)
        if (memcmp(b->device[d].uuid, uuid, 16) == 0)
            return d;
    return -1;
}

/* What the other containers on the device of `uuid` hold: their unused
 * guarantees.  With `w`, also their wake words (for a sleep) and whether a
 * waiter of theirs goes before `me` (*first false).  Under el.lock. */
static uint64_t look_at_others(const uint8_t uuid[16], uint64_t total, const struct vgl_waiter *me,
                               bool *first, struct vgl_memory_wait *w)
{
    struct vgl_elastic_other held[VGL_BOARD_ROWS];
    struct vgl_waiter ahead[VGL_BOARD_ROWS];
    uint32_t n = 0, waiting = 0;
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++) {
        const struct vgl_board_row *r = &el.board->row[i];
        uint64_t key = __atomic_load_n(&r->key, __ATOMIC_ACQUIRE);
        uint32_t flags = __atomic_load_n(&r->flags, __ATOMIC_RELAXED);
        if (!key || i == el.row || !(flags & VGL_ROW_MEMORY))
            continue;
        struct vgl_beacon b;
        bool readable = read_beacon(i, key, &b);
        int d = readable ? entry_index(&b, uuid) : -1;
        /* Silent (no beacon, or no word of this device): its guarantee by
         * UUID is held for it whole; one by index names no device yet. */
        held[n].guarantee_bytes = guarantee_of(r, d, uuid, total);
        held[n].used_bytes = d >= 0 ? b.device[d].used_bytes : 0;
        n++;
        if (d < 0)
            continue;
        if (w && el.others[i].map && w->words < VGL_BOARD_ROWS) {
            w->word[w->words] = &el.others[i].map->device[d].frees;
            w->seen[w->words++] = b.device[d].frees;
        }
        /* A waiter that died holds its byte no longer (-errno: cannot be asked, believed). */
        if (me && b.device[d].waiters && b.device[d].oldest_wait_ns &&
            vgl_waits_held(el.others[i].fd, (uint32_t)d)) {
            uint32_t priority = __atomic_load_n(&r->priority, __ATOMIC_RELAXED);
            ahead[waiting].rank = flags & VGL_ROW_PRIORITY ? vgl_priority_rank(priority)
                                                           : vgl_priority_rank(VGL_PRIORITY_NORMAL);
            ahead[waiting++].since_ns = b.device[d].oldest_wait_ns;
        }
    }
    if (me)
        *first = vgl_elastic_first(me, ahead, waiting);
    return vgl_elastic_held_for_others(held, n);
}

/* The driver's free memory on `device`, which must be the current one: false if it cannot be asked. */
static bool physical_free(int device, uint64_t *free_bytes)
{
    size_t free = 0, total = 0;
    CUdevice current;
    if (vgl_real.cuCtxGetDevice(&current) != CUDA_SUCCESS || current != device ||
        vgl_real.cuMemGetInfo_v2(&free, &total) != CUDA_SUCCESS)
        return false;
    *free_bytes = free;
    return true;
}

int vgl_elastic_admit(int device, uint64_t bytes, uint64_t total, uint64_t cap, bool count)
{
    if (VGL_LIKELY(!vgl_elastic_takes_part()))
        return 0;
    struct vgl_region *region = own_region();
    uint64_t used = __atomic_load_n(&region->devices[device].used_bytes, __ATOMIC_RELAXED);
    /* Within its request, as a plain cap always is: no lock, and no one else looked at. */
    const struct vgl_board_row *r = &el.board->row[__atomic_load_n(&el.row, __ATOMIC_RELAXED)];
    if (__atomic_load_n(&r->region_ino, __ATOMIC_RELAXED) == el.region_ino &&
        __atomic_load_n(&r->region_dev, __ATOMIC_RELAXED) == el.region_dev &&
        used <= guarantee_of(r, device, vgl_self.region->devices[device].uuid, total))
        return 0;
    pthread_mutex_lock(&el.lock);
    uint64_t request = own_request(device, total, cap);
    bool fits = used <= request;
    if (!fits) {
        uint64_t free;
        uint64_t held = look_at_others(vgl_self.region->devices[device].uuid, total, NULL, NULL, NULL);
        fits = physical_free(device, &free) && vgl_elastic_may_use(used, bytes, request, free, held);
    }
    pthread_mutex_unlock(&el.lock);
    if (fits)
        return 0;
    if (count)
        __atomic_add_fetch(&region->devices[device].borrow_refusals, 1, __ATOMIC_RELAXED);
    return -ENOMEM;
}

/* Whether some row on the board has a memory wait: else no one sleeps on
 * a wake word, and a free need not call the kernel.  Read again when the
 * board changed; threads that read it at once write the same answer. */
static bool anyone_waits(void)
{
    uint64_t generation = __atomic_load_n(&el.board->generation, __ATOMIC_ACQUIRE);
    uint64_t seen = __atomic_load_n(&el.waits_seen, __ATOMIC_RELAXED);
    if (seen >> 1 == generation)
        return seen & 1;
    bool any = false;
    for (uint32_t i = 0; i < VGL_BOARD_ROWS && !any; i++)
        any = __atomic_load_n(&el.board->row[i].key, __ATOMIC_RELAXED) &&
              __atomic_load_n(&el.board->row[i].memory_wait_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&el.waits_seen, generation << 1 | any, __ATOMIC_RELAXED);
    return any;
}

/* Where no row has a wait, no one sleeps on the word (a waiter's own row
 * has one), and a free costs no more than the load that says so. */
static void wake(struct vgl_beacon_device *entry)
{
    if (!anyone_waits())
        return;
    __atomic_add_fetch(&entry->frees, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &entry->frees, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void vgl_elastic_changed(int device, uint64_t freeing, bool released)
{
    if (VGL_LIKELY(!vgl_elastic_takes_part()) || !el.own || device < 0 || device >= VGL_MAX_DEVICES)
        return;
    struct vgl_beacon_device *entry = &el.own->device[device];
    if (VGL_UNLIKELY(!__atomic_load_n(&el.named[device], __ATOMIC_ACQUIRE))) {
        /* Once, by one thread, when the device's UUID is known (the first attach binds it). */
        pthread_mutex_lock(&el.lock);
        if (!el.named[device] && memcmp(vgl_self.region->devices[device].uuid, NO_UUID, sizeof NO_UUID) != 0) {
            memcpy(entry->uuid, vgl_self.region->devices[device].uuid, sizeof entry->uuid);
            __atomic_store_n(&el.named[device], 1, __ATOMIC_RELEASE);
        }
        pthread_mutex_unlock(&el.lock);
    }
    uint64_t used = __atomic_load_n(&own_region()->devices[device].used_bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&entry->used_bytes, used > freeing ? used - freeing : 0, __ATOMIC_RELEASE);
    if (released)
        wake(entry);
}

void vgl_elastic_attached(void)
{
    if (VGL_LIKELY(!vgl_elastic_takes_part()))
        return;
    /* Others hold its guarantee on a device from when its beacon names the device. */
    for (int d = 0; d < VGL_MAX_DEVICES; d++)
        if (memcmp(vgl_self.region->devices[d].uuid, NO_UUID, sizeof NO_UUID) != 0)
            vgl_elastic_changed(d, 0, false);
}

/* -- waiting ------------------------------------------------------------------------------------ */

static struct vgl_slot *own_slot(void) { return vgl_link_at(el.link).slot; }

/* The container's beacon says what its live slots say of waits on the device. */
static void publish(int device)
{
    if (el.own)
        vgl_waits_publish(el.own, own_region(), (uint32_t)device);
}

/* The process's slots (one per region it counts in) say how many of its
 * allocations wait on `device`, and since when the oldest.  Under el.lock. */
static void mark_slots(int device)
{
    uint32_t n = 0;
    uint64_t oldest = 0;
    for (const struct vgl_memory_wait *w = el.waits; w; w = w->next)
        if (w->device == device) {
            n++;
            if (!oldest || w->since_ns < oldest)
                oldest = w->since_ns;
        }
    for (uint32_t i = 0; i < vgl_links(); i++) {
        struct vgl_slot *slot = vgl_link_at(i).slot;
        if (!slot)
            continue;
        __atomic_store_n(&slot->wait_since_ns[device], oldest, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->waiting[device], n, __ATOMIC_RELEASE);
    }
}

static void start(struct vgl_memory_wait *w, int device, uint64_t bytes, uint64_t total, uint64_t cap,
                  uint64_t wait_ns)
{
    uint64_t now = vgl_node_clock_ns();
    /* Without a row, no other container's waiters are known: none to queue behind. */
    bool within = true;
    if (vgl_elastic_takes_part()) {
        uint64_t used = __atomic_load_n(&own_region()->devices[device].used_bytes, __ATOMIC_RELAXED);
        pthread_mutex_lock(&el.lock);
        uint64_t request = own_request(device, total, cap);
        pthread_mutex_unlock(&el.lock);
        within = bytes <= request && used <= request - bytes;
    }
    *w = (struct vgl_memory_wait){.device = device, .within_request = within, .since_ns = now,
                                  .deadline_ns = now + wait_ns, .total_bytes = total};
    pthread_mutex_lock(&el.lock);
    w->next = el.waits;
    el.waits = w;
    mark_slots(device);
    /* Locked before the beacon says it waits: a reader believes no claim without it. */
    if (el.own && el.own_fd >= 0 && el.held[device]++ == 0)
        vgl_share_byte(el.own_fd, vgl_waits_byte((uint32_t)device));
    pthread_mutex_unlock(&el.lock);
    publish(device);
}

void vgl_elastic_wait_end(struct vgl_memory_wait *w, bool timed_out)
{
    if (w->device < 0)
        return;
    int device = w->device;
    uint64_t waited = vgl_node_clock_ns() - w->since_ns;
    pthread_mutex_lock(&el.lock);
    for (struct vgl_memory_wait **at = &el.waits; *at; at = &(*at)->next)
        if (*at == w) {
            *at = w->next;
            break;
        }
    mark_slots(device);
    if (el.own && el.own_fd >= 0 && --el.held[device] == 0)
        vgl_release_byte(el.own_fd, vgl_waits_byte((uint32_t)device));
    pthread_mutex_unlock(&el.lock);
    for (uint32_t i = 0; i < vgl_links(); i++) {
        struct vgl_device_state *dev = &vgl_link_at(i).region->devices[device];
        __atomic_add_fetch(&dev->waited_ns, waited, __ATOMIC_RELAXED);
        if (timed_out)
            __atomic_add_fetch(&dev->wait_timeouts, 1, __ATOMIC_RELAXED);
    }
    if (el.own) {
        publish(device);
        /* Those behind it in line look again. */
        wake(&el.own->device[device]);
    }
    w->device = -1;
}

/* The wake words of every container on the device as they are now, into
 * `w`, and whether this waiter goes first. */
static bool arm(struct vgl_memory_wait *w)
{
    int device = w->device;
    uint64_t total = w->total_bytes;
    w->words = 0;
    if (el.own) {
        w->word[w->words] = &el.own->device[device].frees;
        w->seen[w->words++] = __atomic_load_n(&el.own->device[device].frees, __ATOMIC_SEQ_CST);
    }
    bool first = true;
    if (vgl_elastic_takes_part()) {
        pthread_mutex_lock(&el.lock);
        const struct vgl_board_row *r = own_row();
        uint32_t priority = r ? __atomic_load_n(&r->priority, __ATOMIC_RELAXED) : VGL_PRIORITY_NORMAL;
        bool ranked = r && (__atomic_load_n(&r->flags, __ATOMIC_RELAXED) & VGL_ROW_PRIORITY);
        struct vgl_waiter me = {vgl_priority_rank(ranked ? priority : VGL_PRIORITY_NORMAL), w->since_ns};
        look_at_others(vgl_self.region->devices[device].uuid, total, &me, &first, w);
        pthread_mutex_unlock(&el.lock);
    }
    /* The container's other processes that wait, the dead left out (and
     * reclaimed), as the beacon then says too. */
    uint32_t own_waits;
    bool dead = false;
    uint64_t own_oldest = vgl_waits_oldest(own_region(), (uint32_t)device, own_slot(), &own_waits, &dead);
    if (dead)
        vgl_region_reclaim(own_region());
    publish(device);
    w->armed = true;
    /* Within its request it is owed the memory: it waits for no one. */
    return w->within_request || (first && (!own_oldest || own_oldest >= w->since_ns));
}

/* Sleeps until a wake word changes or `until_ns` (the node's clock). */
static void sleep_on(const struct vgl_memory_wait *w, uint64_t until_ns)
{
    struct waitv v[VGL_BOARD_ROWS];
    for (uint32_t i = 0; i < w->words; i++)
        v[i] = (struct waitv){.val = w->seen[i], .uaddr = (uint64_t)(uintptr_t)w->word[i], .flags = FUTEX2_SIZE_U32};
    /* The node's clock is CLOCK_MONOTONIC of the initial time namespace;
     * the kernel takes an absolute timeout on this namespace's, which
     * differs by a constant: the deadline is moved by it. */
    uint64_t local = vgl_node_to_own_ns(until_ns);
    struct timespec at = {(time_t)(local / 1000000000u), (long)(local % 1000000000u)};
    if (w->words && (syscall(SYS_futex_waitv, v, w->words, 0, &at, CLOCK_MONOTONIC) >= 0 || errno == EAGAIN ||
                     errno == ETIMEDOUT || errno == EINTR))
        return;
    /* No futex_waitv (a kernel before 5.16), or a beacon truncated under its
     * mapping: a short sleep, then the caller looks again. */
    uint64_t now = vgl_clock_ns(CLOCK_MONOTONIC);
    uint64_t ns = local > now ? local - now : 0;
    if (ns > vgl_timings.memory_poll_ns)
        ns = vgl_timings.memory_poll_ns;
    struct timespec pause = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    nanosleep(&pause, NULL);
}

bool vgl_elastic_wait(struct vgl_memory_wait *w, int device, uint64_t bytes, uint64_t total, uint64_t cap)
{
    if (device < 0 || device >= VGL_MAX_DEVICES || !vgl_self.slot)
        return false;
    if (w->device < 0) {
        /* The container's own region's: a nested run may wait otherwise than the run it is in. */
        uint64_t wait_ns = __atomic_load_n(&vgl_self.region->memory_wait_ns, __ATOMIC_RELAXED);
        if (!wait_ns)
            return false;
        start(w, device, bytes, total, cap, wait_ns < VGL_MAX_WAIT_NS ? wait_ns : VGL_MAX_WAIT_NS);
    }
    for (;;) {
        uint64_t now = vgl_node_clock_ns();
        if (now >= w->deadline_ns) {
            vgl_elastic_wait_end(w, true);
            return false;
        }
        if (w->armed) {
            uint64_t until = now + vgl_timings.memory_recheck_ns;
            sleep_on(w, until < w->deadline_ns ? until : w->deadline_ns);
            w->armed = false;
        }
        if (arm(w))
            return true;
    }
}

bool vgl_elastic_view_free(int device, uint64_t total, uint64_t cap, uint64_t used, uint64_t free,
                           uint64_t *free_bytes)
{
    if (VGL_LIKELY(!vgl_elastic_takes_part()) || device < 0 || device >= VGL_MAX_DEVICES)
        return false;
    pthread_mutex_lock(&el.lock);
    uint64_t request = own_request(device, total, cap);
    uint64_t held = look_at_others(vgl_self.region->devices[device].uuid, total, NULL, NULL, NULL);
    pthread_mutex_unlock(&el.lock);
    *free_bytes = vgl_elastic_free(cap, used, request, free, held);
    return true;
}

/* The region file: create, map, validate, claim a slot, reclaim the dead.
 *
 * Every process of a container maps the same file.  Slot claims, limit
 * changes and reclaims happen under the region lock, a process-shared robust
 * mutex, so a process killed at any instruction leaves no lock held: the
 * next locker is told (EOWNERDEAD) and repairs what the lock guards.  The
 * byte counts change without it (ledger.c).  Readers (status views) read
 * without locks and may see a moment-old value, never a blocked one. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "vgpulimit/board.h"

static const char MAGIC[8] = "VGPULIM";

_Static_assert(sizeof(pthread_mutex_t) <= sizeof(struct vgl_lock), "vgl_lock too small");
_Static_assert(sizeof(((struct vgl_slot *)0)->used_bytes) / sizeof(uint64_t) == VGL_MAX_DEVICES,
               "slot byte counts per device");
_Static_assert(sizeof(((struct vgl_region *)0)->devices) / sizeof(struct vgl_device_state) ==
                   VGL_MAX_DEVICES, "region devices");
_Static_assert(sizeof(((struct vgl_region *)0)->slots) / sizeof(struct vgl_slot) == VGL_MAX_SLOTS,
               "region slots");
_Static_assert(sizeof(((struct vgl_slot *)0)->comm) == VGL_COMM_LEN, "slot comm");

struct region_init {
    const struct vgl_mem_limit *limits;
    const uint32_t *cores_pct;
    const struct vgl_uuid_limit *by_uuid;
    const struct vgl_mem_limit *requests;
    uint64_t memory_wait_ns;
    uint32_t flags;
    const char *parent;
};

static int init_region(void *map, void *arg)
{
    struct vgl_region *region = map;
    const struct region_init *how = arg;
    const struct vgl_mem_limit *limits = how->limits;
    const uint32_t *cores_pct = how->cores_pct;
    const char *parent = how->parent;
    uint32_t flags = how->flags;
    if (how->by_uuid)
        memcpy(region->by_uuid, how->by_uuid, sizeof region->by_uuid);
    if (parent)
        strcpy(region->parent, parent);
    memcpy(region->magic, MAGIC, sizeof MAGIC);
    region->version = VGL_REGION_VERSION;
    region->header_size = sizeof *region;
    region->file_size = sizeof *region;
    region->generation = 1;
    region->flags = flags;
    int err = vgl_robust_init((pthread_mutex_t *)(void *)region->lock.opaque);
    for (uint32_t i = 0; i < VGL_MAX_DEVICES && !err; i++) {
        struct vgl_device_state *dev = &region->devices[i];
        if (limits)
            dev->limit = limits[i];
        if (cores_pct)
            dev->cores_pct = cores_pct[i];
        if (how->requests)
            dev->request = how->requests[i];
    }
    region->memory_wait_ns = how->memory_wait_ns;
    return err;
}

int vgl_region_create(const char *path, const struct vgl_mem_limit *limits,
                      const uint32_t *cores_pct, uint32_t flags, const char *parent)
{
    return vgl_region_create_with_uuids(path, limits, cores_pct, NULL, flags, parent);
}

int vgl_region_create_with_uuids(const char *path, const struct vgl_mem_limit *limits,
                                 const uint32_t *cores_pct, const struct vgl_uuid_limit *by_uuid,
                                 uint32_t flags, const char *parent)
{
    return vgl_region_create_elastic(path, limits, cores_pct, by_uuid, NULL, 0, flags, parent);
}

int vgl_region_create_elastic(const char *path, const struct vgl_mem_limit *limits,
                              const uint32_t *cores_pct, const struct vgl_uuid_limit *by_uuid,
                              const struct vgl_mem_limit *requests, uint64_t memory_wait_ns,
                              uint32_t flags, const char *parent)
{
    if (parent && strlen(parent) >= VGL_PARENT_LEN)
        return -ENAMETOOLONG;
    if (memory_wait_ns > VGL_MAX_WAIT_NS)
        return -EINVAL;
    /* Of two creators exactly one wins: the other is told -EEXIST. */
    struct region_init how = {limits, cores_pct, by_uuid, requests, memory_wait_ns, flags, parent};
    mode_t mode = flags & VGL_REGION_GROUP_SHARED ? 0660 : 0600;
    return vgl_create_linked(path, mode, sizeof(struct vgl_region), init_region, &how, NULL);
}

/* No device, nor a process's share of one, comes near a pebibyte: a larger
 * byte count was not written by vgpulimit. */
#define PLAUSIBLE_BYTES (1ULL << 50)
/* Nor does a process have more threads (Linux's threads-max is below 2^22). */
#define PLAUSIBLE_WAITS (1U << 22)

/* Values that vgpulimit never writes.  A region holding one was written by
 * something else, so none of its numbers can be trusted: it is refused
 * whole as garbled, not clamped into numbers that only look right.  Each
 * test holds of every field at every moment (no sums across fields), so a
 * region being updated while it is read still passes. */
static bool plausible_limit(const struct vgl_mem_limit *l)
{
    return !(l->bytes && l->ppm) && l->bytes <= INT64_MAX && l->ppm <= 1000000;
}

static bool plausible(const struct vgl_region *region)
{
    if (region->memory_wait_ns > VGL_MAX_WAIT_NS)
        return false;
    const char *parent = region->parent;
    if (memchr(parent, '\0', VGL_PARENT_LEN) == NULL || (parent[0] && parent[0] != '/'))
        return false;
    const char *board = region->board;
    if (memchr(board, '\0', VGL_PARENT_LEN) == NULL || (board[0] && board[0] != '/') ||
        region->priority > VGL_PRIORITY_LOW || region->board_row >= VGL_BOARD_ROWS)
        return false;
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++) {
        const struct vgl_device_state *dev = &region->devices[d];
        if ((dev->limit.bytes && dev->limit.ppm) || dev->limit.bytes > INT64_MAX ||
            dev->limit.ppm > 1000000 || dev->cores_pct > 100 || dev->cores_policy > VGL_CORES_NONE ||
            dev->used_bytes > PLAUSIBLE_BYTES || dev->total_bytes > PLAUSIBLE_BYTES ||
            !plausible_limit(&dev->request) || dev->uuid_kind > VGL_UUID_KIND_MIG)
            return false;
    }
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++) {
        const struct vgl_uuid_limit *u = &region->by_uuid[d];
        if ((u->limit.bytes && u->limit.ppm) || u->limit.bytes > INT64_MAX || u->limit.ppm > 1000000 ||
            u->cores_pct > 100 || u->flags > (VGL_UUID_MEMORY | VGL_UUID_CORES | VGL_UUID_REQUEST | VGL_UUID_MIG) ||
            !plausible_limit(&u->request))
            return false;
    }
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++) {
        const struct vgl_slot *slot = &region->slots[i];
        if (slot->state != VGL_SLOT_FREE && slot->state != VGL_SLOT_LIVE &&
            slot->state != VGL_SLOT_DEAD)
            return false;
        if (slot->state == VGL_SLOT_FREE)
            continue;
        if (slot->pid <= 0 || slot->host_pid < 0 || (slot->flags & ~(uint32_t)VGL_SLOT_LOCKED) ||
            slot->reserved)
            return false;
        for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
            if (slot->used_bytes[d] > PLAUSIBLE_BYTES || slot->waiting[d] > PLAUSIBLE_WAITS)
                return false;
    }
    return true;
}

int vgl_region_check(const void *image, uint64_t size)
{
    const char *bytes = image;
    if (size < sizeof MAGIC || memcmp(bytes, MAGIC, sizeof MAGIC) != 0)
        return -EPROTO;
    uint32_t version;
    if (size < offsetof(struct vgl_region, version) + sizeof version)
        return -EBADF;
    memcpy(&version, bytes + offsetof(struct vgl_region, version), sizeof version);
    if (version != VGL_REGION_VERSION)
        return -EPROTONOSUPPORT;
    if (size != sizeof(struct vgl_region))
        return -EBADF;
    const struct vgl_region *region = image;
    if (region->header_size != sizeof *region || region->file_size != sizeof *region)
        return -EBADMSG;
    return plausible(region) ? 0 : -EBADMSG;
}

int vgl_region_open(const char *path, struct vgl_region **out)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct stat st;
    int err = 0;
    if (fstat(fd, &st) < 0)
        err = -errno;
    else if (!S_ISREG(st.st_mode))
        err = -EPROTO;
    if (!err && (uint64_t)st.st_size != sizeof(struct vgl_region)) {
        /* Not to be mapped: its header only says why (foreign, another version, truncated). */
        char head[offsetof(struct vgl_region, header_size)];
        ssize_t n = pread(fd, head, sizeof head, 0);
        err = n < 0 ? -errno : vgl_region_check(head, (uint64_t)n);
    }
    void *map = MAP_FAILED;
    if (!err) {
        map = mmap(NULL, sizeof(struct vgl_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
            err = -errno;
        else
            /* A truncation between the fstat and this read kills us with
             * SIGBUS: the caller's guard (region_guard.c) starts after. */
            err = vgl_region_check(map, (uint64_t)st.st_size);
    }
    if (!err && (st.st_mode & S_IWOTH))
        err = -EPERM; /* anyone could rewrite its limits */
    if (err) {
        close(fd);
        if (map != MAP_FAILED)
            munmap(map, sizeof(struct vgl_region));
        return err;
    }
    vgl_owner_keep(map, fd); /* for the lock of the slot this process may claim */
    *out = map;
    return 0;
}

int vgl_region_read_parent(const char *path, char *out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct vgl_region *copy = malloc(sizeof *copy);
    ssize_t n = copy ? pread(fd, copy, sizeof *copy, 0) : -1;
    int err = !copy ? -ENOMEM : n < 0 ? -errno : vgl_region_check(copy, (uint64_t)n);
    /* A file of the right size that grew while read: the size check is the one that counts. */
    struct stat st;
    if (!err && (fstat(fd, &st) < 0 || (uint64_t)st.st_size != sizeof *copy))
        err = -EBADF;
    if (!err)
        strcpy(out, copy->parent);
    free(copy);
    close(fd);
    return err;
}

void vgl_region_close(struct vgl_region *region)
{
    if (region) {
        vgl_owner_forget(region);
        munmap(region, sizeof *region);
    }
}

const char *vgl_region_magic(void) { return MAGIC; }

const char *vgl_region_strerror(int err)
{
    switch (err) {
    case -EPROTO:
        return "not a vgpulimit region file (wrong magic)";
    case -EPROTONOSUPPORT:
        return "a region file of another vgpulimit version (layout version differs); "
               "restart the container with one version";
    case -EBADF:
        return "truncated or resized region file";
    case -EBADMSG:
        return "garbled region file (it holds values that vgpulimit never writes)";
    case -ENOENT:
        return "no such file";
    case -EACCES:
        return "permission denied";
    case -EPERM:
        return "writable by every user, so anyone could change its limits; refusing it "
               "(chmod o-w, or let vgpulimit create it)";
    case -EEXIST:
        return "a region file already exists there";
    case -ENOSPC:
        return "every process slot of the region is taken";
    case -ETIMEDOUT:
        return "its lock was held past its bound (a process stopped while holding it, or a lock word "
               "written by something other than vgpulimit); nothing was changed, try again";
    case -ENOTRECOVERABLE:
        return "its lock is unusable (its bytes were written by something other than vgpulimit); "
               "make a new region";
    default:
        return strerror(-err);
    }
}

/* A slot freed holds no wait: a process killed as it waited leaves none behind. */
static void slot_forget_waits(struct vgl_slot *slot)
{
    for (uint32_t dev = 0; dev < VGL_MAX_DEVICES; dev++) {
        __atomic_store_n(&slot->waiting[dev], 0, __ATOMIC_RELAXED);
        __atomic_store_n(&slot->wait_since_ns[dev], 0, __ATOMIC_RELAXED);
    }
}

/* Returns a slot's bytes to the device totals. */
static void slot_release_all(struct vgl_region *region, struct vgl_slot *slot)
{
    for (uint32_t dev = 0; dev < VGL_MAX_DEVICES; dev++)
        if (__atomic_load_n(&slot->used_bytes[dev], __ATOMIC_RELAXED))
            vgl_ledger_release(region, slot, dev, slot->used_bytes[dev]);
}

/* Gives back what the dead slots hold and frees them, under the region
 * lock: how many.  Those that died in the middle of a change are dropped by
 * a recount (ledger.c); when none can be made now, they stay for the next
 * reclaim. */
static int free_dead(struct vgl_region *region)
{
    bool torn = false;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS && !torn; i++)
        torn = region->slots[i].state == VGL_SLOT_DEAD &&
               __atomic_load_n(&region->slots[i].busy, __ATOMIC_ACQUIRE);
    if (torn)
        vgl_ledger_recount(region);
    int freed = 0;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++) {
        struct vgl_slot *slot = &region->slots[i];
        if (slot->state != VGL_SLOT_DEAD || __atomic_load_n(&slot->busy, __ATOMIC_ACQUIRE))
            continue;
        slot_release_all(region, slot);
        slot_forget_waits(slot);
        __atomic_store_n(&slot->state, VGL_SLOT_FREE, __ATOMIC_RELEASE);
        freed++;
    }
    return freed;
}

int64_t vgl_region_start_time_shift(void)
{
    return vgl_start_time_shift();
}

int vgl_region_attach(struct vgl_region *region, int32_t pid, int32_t host_pid, struct vgl_slot **out)
{
    uint64_t start = vgl_proc_start_time(pid);
    for (int attempt = 0; attempt < 2; attempt++) {
        struct vgl_slot *found = NULL;
        int err = vgl_ledger_lock(region);
        if (err)
            return err;
        /* The same process again, after exec: the driver dropped its memory
         * with the old image, whose slot goes as a dead one's (its other
         * threads were ended wherever they were, in a change maybe). */
        for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++) {
            struct vgl_slot *slot = &region->slots[i];
            if (slot->state == VGL_SLOT_LIVE && vgl_owner_same(slot, pid, start))
                __atomic_store_n(&slot->state, VGL_SLOT_DEAD, __ATOMIC_RELEASE);
        }
        free_dead(region);
        for (uint32_t i = 0; i < VGL_MAX_SLOTS && !found; i++)
            if (region->slots[i].state == VGL_SLOT_FREE && !region->slots[i].busy)
                found = &region->slots[i];
        if (found) {
            slot_release_all(region, found); /* what a thread counted after its process detached */
            slot_forget_waits(found);
            found->pid = pid;
            found->host_pid = host_pid;
            found->start_time = start;
            vgl_owner_claim(region, found);
            vgl_proc_comm_self(found->comm);
            __atomic_store_n(&found->state, VGL_SLOT_LIVE, __ATOMIC_RELEASE);
        }
        vgl_ledger_unlock(region);
        if (found) {
            *out = found;
            return 0;
        }
        if (vgl_region_reclaim(region) <= 0)
            break;
    }
    return -ENOSPC;
}

void vgl_region_detach(struct vgl_region *region, struct vgl_slot *slot)
{
    slot_release_all(region, slot);
    /* Even with the lock broken: a claim takes only a free slot, and this one
     * is not free until this store. */
    bool locked = vgl_ledger_lock(region) == 0;
    vgl_owner_release(region, slot);
    slot_forget_waits(slot);
    __atomic_store_n(&slot->state, VGL_SLOT_FREE, __ATOMIC_RELEASE);
    if (locked)
        vgl_ledger_unlock(region);
}

uint32_t vgl_region_lock_holder(struct vgl_region *region)
{
    return vgl_robust_owner((pthread_mutex_t *)(void *)region->lock.opaque);
}

int vgl_region_reclaim(struct vgl_region *region)
{
    int err = vgl_ledger_lock(region);
    if (err)
        return err;
    /* Marked first: a reclaimer that dies on the way leaves the next one
     * slots it need not ask about (their pids may name others by then). */
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++) {
        struct vgl_slot *slot = &region->slots[i];
        if (slot->state == VGL_SLOT_LIVE && !vgl_owner_running(region, slot))
            __atomic_store_n(&slot->state, VGL_SLOT_DEAD, __ATOMIC_RELEASE);
    }
    int reclaimed = free_dead(region);
    vgl_ledger_unlock(region);
    return reclaimed;
}

int vgl_region_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap)
{
    int err = vgl_region_reserve_quietly(region, slot, device, bytes, cap);
    if (err == -ENOMEM)
        __atomic_add_fetch(&region->devices[device].oom_refusals, 1, __ATOMIC_RELAXED);
    return err;
}

int vgl_region_reserve_quietly(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                               uint64_t bytes, uint64_t cap)
{
    int err = vgl_ledger_reserve(region, slot, device, bytes, cap);
    if (err == -ENOMEM && vgl_region_reclaim(region) > 0)
        err = vgl_ledger_reserve(region, slot, device, bytes, cap);
    return err;
}

int vgl_region_renew(struct vgl_region *region, const struct vgl_mem_limit *limits,
                     const uint32_t *cores_pct)
{
    vgl_region_reclaim(region);
    if (vgl_ledger_lock(region) != 0)
        return 0;
    bool held = false;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS && !held; i++)
        held = __atomic_load_n(&region->slots[i].state, __ATOMIC_ACQUIRE) == VGL_SLOT_LIVE;
    if (!held) {
        for (uint32_t i = 0; i < VGL_MAX_DEVICES; i++) {
            struct vgl_device_state *dev = &region->devices[i];
            __atomic_store_n(&dev->limit.bytes, limits[i].bytes, __ATOMIC_RELAXED);
            __atomic_store_n(&dev->limit.ppm, limits[i].ppm, __ATOMIC_RELAXED);
            __atomic_store_n(&dev->cores_pct, cores_pct[i], __ATOMIC_RELAXED);
            /* The next process binds the devices again, limits by UUID included. */
            memset(dev->uuid, 0, sizeof dev->uuid);
            dev->uuid_kind = VGL_UUID_KIND_UNKNOWN;
        }
        __atomic_add_fetch(&region->generation, 1, __ATOMIC_RELEASE);
    }
    vgl_ledger_unlock(region);
    return !held;
}

int vgl_region_set_limits(struct vgl_region *region, uint32_t device,
                          const struct vgl_mem_limit *limit, uint32_t cores_pct)
{
    if (device >= VGL_MAX_DEVICES || cores_pct > 100)
        return -EINVAL;
    int err = vgl_ledger_lock(region);
    if (err)
        return err;
    struct vgl_device_state *dev = &region->devices[device];
    __atomic_store_n(&dev->limit.bytes, limit->bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&dev->limit.ppm, limit->ppm, __ATOMIC_RELAXED);
    __atomic_store_n(&dev->cores_pct, cores_pct, __ATOMIC_RELAXED);
    __atomic_add_fetch(&region->generation, 1, __ATOMIC_RELEASE);
    vgl_ledger_unlock(region);
    return 0;
}

int vgl_region_set_request(struct vgl_region *region, uint32_t device, const struct vgl_mem_limit *request)
{
    if (device >= VGL_MAX_DEVICES || !plausible_limit(request))
        return -EINVAL;
    int err = vgl_ledger_lock(region);
    if (err)
        return err;
    struct vgl_device_state *dev = &region->devices[device];
    __atomic_store_n(&dev->request.bytes, request->bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&dev->request.ppm, request->ppm, __ATOMIC_RELAXED);
    __atomic_add_fetch(&region->generation, 1, __ATOMIC_RELEASE);
    vgl_ledger_unlock(region);
    return 0;
}

int vgl_region_set_memory_wait(struct vgl_region *region, uint64_t wait_ns)
{
    if (wait_ns > VGL_MAX_WAIT_NS)
        return -EINVAL;
    __atomic_store_n(&region->memory_wait_ns, wait_ns, __ATOMIC_RELAXED);
    __atomic_add_fetch(&region->generation, 1, __ATOMIC_RELEASE);
    return 0;
}

/* Who waits for memory (elastic.c, docs/memory.md).
 *
 * A count that every waiter raises and lowers in a shared file is left
 * raised by a waiter killed in between, for as long as the file lives: a
 * phantom that others queue behind.  So a process says that it waits in its
 * own slot of the region (how many of its allocations wait on each device,
 * and since when the oldest), which goes when the slot is reclaimed like the
 * bytes the process held; the views add up the live slots.
 *
 * Other containers learn of a container's waits from its beacon: the number
 * of waiting allocations and the oldest's start, on each device.  Those are
 * derived from the live slots, written by whichever process of the container
 * changes them and repaired by its supervisor; and every process with an
 * allocation waiting on a device holds a shared lock on that device's byte of
 * the beacon, which the kernel drops when the process dies.  A reader
 * believes the beacon's waits only while the byte is locked: a waiter that
 * was killed holds no one back from the instant it died, before anyone has
 * written the beacon again. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

uint64_t vgl_waits_oldest(const struct vgl_region *region, uint32_t device, const struct vgl_slot *except,
                          uint32_t *count, bool *dead)
{
    uint64_t oldest = 0;
    uint32_t n = 0;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++) {
        const struct vgl_slot *s = &region->slots[i];
        if (s == except || __atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != VGL_SLOT_LIVE)
            continue;
        uint32_t waiting = __atomic_load_n(&s->waiting[device], __ATOMIC_ACQUIRE);
        uint64_t since = __atomic_load_n(&s->wait_since_ns[device], __ATOMIC_RELAXED);
        if (!waiting)
            continue;
        if (!vgl_owner_running(region, s)) {
            *dead = true;
            continue;
        }
        n += waiting;
        if (since && (!oldest || since < oldest))
            oldest = since;
    }
    *count = n;
    return oldest;
}

/* Enough for every writer but one to give way: each try follows a change of
 * the slots by another writer, who then writes too. */
enum { PUBLISH_TRIES = 8 };

void vgl_waits_publish(struct vgl_beacon *beacon, struct vgl_region *region, uint32_t device)
{
    struct vgl_beacon_device *entry = &beacon->device[device];
    bool reclaimed = false;
    for (int i = 0; i < PUBLISH_TRIES; i++) {
        uint32_t n;
        bool dead = false;
        uint64_t oldest = vgl_waits_oldest(region, device, NULL, &n, &dead);
        if (dead && !reclaimed) {
            reclaimed = true;
            vgl_region_reclaim(region);
        }
        if (__atomic_load_n(&entry->waiters, __ATOMIC_SEQ_CST) == n &&
            __atomic_load_n(&entry->oldest_wait_ns, __ATOMIC_SEQ_CST) == oldest)
            return;
        __atomic_store_n(&entry->oldest_wait_ns, oldest, __ATOMIC_SEQ_CST);
        __atomic_store_n(&entry->waiters, n, __ATOMIC_SEQ_CST);
    }
}

off_t vgl_waits_byte(uint32_t device)
{
    return (off_t)(offsetof(struct vgl_beacon, device) + device * sizeof(struct vgl_beacon_device) +
                   offsetof(struct vgl_beacon_device, waiters));
}

int vgl_waits_held(int fd, uint32_t device)
{
    return vgl_byte_held(fd, vgl_waits_byte(device));
}

/* The beacon at `path`, mapped and guarded (its container's processes may
 * truncate it under us: a lost page reads as zeros, which are no beacon) and
 * checked: `act` on it, then unmapped.  0, or -errno. */
static int with_beacon(const char *path, void (*act)(struct vgl_beacon *, void *), void *arg)
{
    /* O_NONBLOCK: a FIFO in the beacon's place blocks no setter. */
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -errno;
    struct stat st;
    int err = fstat(fd, &st) < 0 ? -errno : !S_ISREG(st.st_mode) ? -EPROTO
                                          : (uint64_t)st.st_size != sizeof(struct vgl_beacon) ? -EBADF : 0;
    void *map = err ? MAP_FAILED : mmap(NULL, sizeof(struct vgl_beacon), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (!err && map == MAP_FAILED)
        err = -errno;
    if (err)
        return err;
    err = vgl_guard_mapping(map, sizeof(struct vgl_beacon));
    if (!err)
        err = vgl_beacon_check(map, sizeof(struct vgl_beacon));
    if (!err)
        act(map, arg);
    vgl_unguard_mapping(map);
    munmap(map, sizeof(struct vgl_beacon));
    return err;
}

static void repair(struct vgl_beacon *beacon, void *region)
{
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        vgl_waits_publish(beacon, region, d);
}

int vgl_beacon_repair(const char *path, struct vgl_region *region)
{
    return with_beacon(path, repair, region);
}

static void wake(struct vgl_beacon *beacon, void *unused)
{
    (void)unused;
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++) {
        struct vgl_beacon_device *entry = &beacon->device[d];
        if (vgl_uuid_none(entry->uuid))
            continue;
        __atomic_add_fetch(&entry->frees, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, &entry->frees, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

int vgl_beacon_wake(const char *path)
{
    return with_beacon(path, wake, NULL);
}

/* A slot's owner: whether the process a slot names still runs, asked from
 * any pid namespace.
 *
 * A slot's pid names its process only in the slot's pid namespace.  Two
 * containers of one pod may share a region, each with pids of its own (both
 * have a pid 2): there the slot's process holds an open-file-description
 * lock on the slot's first byte in the region file, which the kernel drops
 * when the process dies, whoever asks.  Such a lock belongs to the open file
 * description, which a forked child shares: the child gets one of its own
 * (reopened through /proc/self/fd) at once, so that a dead parent's lock does
 * not live on in it.
 *
 * This process's descriptors, one per region it mapped, are kept here (a
 * small table: the shim maps VGL_MAX_CHAIN regions; a region past the table
 * is mapped with no descriptor, and its slot says it holds no lock). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define HELD_MAX 64

static struct {
    const struct vgl_region *region;
    int fd;
    /* The slots this process image claimed (vgl_owner_claim) and holds. */
    uint64_t mine[VGL_MAX_SLOTS / 64];
} held[HELD_MAX];
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_handlers = PTHREAD_ONCE_INIT;

static void before_fork(void) { pthread_mutex_lock(&held_lock); }
static void after_fork_in_parent(void) { pthread_mutex_unlock(&held_lock); }

int vgl_reopen(int fd, int flags)
{
    char path[32] = "/proc/self/fd/";
    char digits[12];
    int n = 0;
    do
        digits[n++] = (char)('0' + fd % 10);
    while ((fd /= 10) > 0 && n < (int)sizeof digits);
    size_t at = 14;
    while (n > 0)
        path[at++] = digits[--n];
    path[at] = '\0';
    return open(path, flags | O_CLOEXEC);
}

static void after_fork_in_child(void)
{
    for (int i = 0; i < HELD_MAX; i++) {
        if (!held[i].region)
            continue;
        int fresh = vgl_reopen(held[i].fd, O_RDWR);
        close(held[i].fd);
        held[i].fd = fresh; /* -1: no /proc; this process's slot will hold no lock */
        memset(held[i].mine, 0, sizeof held[i].mine); /* the parent's */
    }
    pthread_mutex_unlock(&held_lock);
}

static void register_fork_handlers(void) { pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child); }

void vgl_owner_keep(const struct vgl_region *region, int fd)
{
    pthread_once(&fork_handlers, register_fork_handlers);
    pthread_mutex_lock(&held_lock);
    int i = 0;
    while (i < HELD_MAX && held[i].region)
        i++;
    if (i < HELD_MAX) {
        held[i].region = region, held[i].fd = fd;
        memset(held[i].mine, 0, sizeof held[i].mine);
    }
    pthread_mutex_unlock(&held_lock);
    if (i == HELD_MAX)
        close(fd);
}

void vgl_owner_forget(const struct vgl_region *region)
{
    pthread_mutex_lock(&held_lock);
    for (int i = 0; i < HELD_MAX; i++) {
        if (held[i].region == region) {
            if (held[i].fd >= 0)
                close(held[i].fd);
            held[i].region = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&held_lock);
}

static int fd_of(const struct vgl_region *region)
{
    int fd = -1;
    pthread_mutex_lock(&held_lock);
    for (int i = 0; i < HELD_MAX && fd < 0; i++)
        if (held[i].region == region)
            fd = held[i].fd;
    pthread_mutex_unlock(&held_lock);
    return fd;
}

static off_t byte_of(const struct vgl_region *region, const struct vgl_slot *slot)
{
    return (off_t)((const char *)slot - (const char *)region);
}

/* Marks (`set`), unmarks or asks (`set` < 0) whether this image claimed `slot`. */
static bool mine(const struct vgl_region *region, const struct vgl_slot *slot, int set)
{
    size_t n = (size_t)(slot - region->slots);
    bool was = false;
    pthread_mutex_lock(&held_lock);
    for (int i = 0; i < HELD_MAX; i++) {
        if (held[i].region != region)
            continue;
        uint64_t bit = 1ULL << (n % 64), *word = &held[i].mine[n / 64];
        was = (*word & bit) != 0;
        if (set > 0)
            *word |= bit;
        else if (set == 0)
            *word &= ~bit;
        break;
    }
    pthread_mutex_unlock(&held_lock);
    return was;
}

static uint64_t own_pid_ns(void)
{
    static uint64_t ns;
    static pid_t of;
    pid_t me = getpid();
    if (__atomic_load_n(&of, __ATOMIC_ACQUIRE) != me) {
        __atomic_store_n(&ns, vgl_pid_ns_of("/proc/self/ns/pid"), __ATOMIC_RELAXED);
        __atomic_store_n(&of, me, __ATOMIC_RELEASE);
    }
    return __atomic_load_n(&ns, __ATOMIC_RELAXED);
}

void vgl_owner_claim(const struct vgl_region *region, struct vgl_slot *slot)
{
    int fd = fd_of(region);
    slot->pid_ns = own_pid_ns();
    /* The lock stands for this process image: a slot claimed for another
     * pid (the Python binding may) goes by that pid alone. */
    bool self = slot->pid == (int32_t)getpid();
    slot->flags = self && fd >= 0 && vgl_hold_byte(fd, byte_of(region, slot)) == 0 ? VGL_SLOT_LOCKED : 0;
    slot->reserved = 0;
    if (slot->flags & VGL_SLOT_LOCKED)
        mine(region, slot, 1);
}

void vgl_owner_release(const struct vgl_region *region, struct vgl_slot *slot)
{
    int fd = fd_of(region);
    if (fd >= 0 && (slot->flags & VGL_SLOT_LOCKED))
        vgl_release_byte(fd, byte_of(region, slot));
    mine(region, slot, 0);
}

bool vgl_owner_same(const struct vgl_slot *slot, int32_t pid, uint64_t start_time)
{
    uint64_t ns = own_pid_ns();
    return slot->pid == pid && slot->start_time == start_time && (!slot->pid_ns || !ns || slot->pid_ns == ns);
}

/* The lock says more than the pid, wherever it can be asked: it goes with
 * the process image that took it.  The region's descriptor is O_CLOEXEC, as
 * the driver's device files are, so an exec drops the lock just as it drops
 * the device memory of the image before (docs/facts.md §1): the pid runs on, with
 * the same start time, but what the slot counted is gone.  A slot whose lock
 * cannot be asked about is judged by its pid where that means something. */
bool vgl_owner_running(const struct vgl_region *region, const struct vgl_slot *slot)
{
    int fd = fd_of(region);
    /* A lock of our own open file is not seen by our own query: the slot
     * this image claimed for itself goes by its pid. */
    if (!mine(region, slot, -1) && (slot->flags & VGL_SLOT_LOCKED) && fd >= 0) {
        int held = vgl_byte_held(fd, byte_of(region, slot));
        if (held >= 0)
            return held != 0;
    }
    uint64_t ns = own_pid_ns();
    if (!slot->pid_ns || !ns || slot->pid_ns == ns)
        return vgl_proc_running(slot->pid, slot->start_time);
    return true; /* cannot tell: never take what may be a live process's bytes */
}

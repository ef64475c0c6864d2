/* Clocks read in nanoseconds, and the one clock every process on the node
 * agrees on.
 *
 * A time namespace (Linux 5.6: `unshare --time`, an OCI runtime's
 * timeOffsets) shifts what its processes read from CLOCK_MONOTONIC (and its
 * _COARSE and _RAW forms) and CLOCK_BOOTTIME, and the starttime their /proc
 * shows, by offsets fixed when it was made.  A container may have one, so a
 * time that one process writes for others to compare with their own clock
 * (a budget's last refill, a beacon, the simulated GPU's timeline) is kept on
 * the initial namespace's monotonic clock: ours less our namespace's offset.
 * CLOCK_REALTIME is no way out: it is not shifted, but jumps when it is set. */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"

/* The inode of the initial time namespace (PROC_TIME_INIT_INO). */
#define INIT_TIME_NS 0xEFFFFFFAu

uint64_t vgl_clock_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* This process's offsets, read once: a process enters another time namespace
 * only at exec (which starts it afresh) or when a fork's child lands in the
 * one its parent made for its children (forgotten at fork, below). */
static struct vgl_time_offsets cached;
static int known;          /* 0: not read yet; 1: `cached` holds them */
static int fork_watched;

static void forget_in_child(void)
{
    __atomic_store_n(&known, 0, __ATOMIC_RELAXED);
}

/* The inode of the namespace at `link` (identity.c, which calls this file, has
 * the same for pid namespaces); 0: unknown. */
static uint64_t ns_inode(const char *link)
{
    struct stat st;
    return stat(link, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* /proc/self/timens_offsets: a line per clock, "monotonic SECS NSECS" and
 * "boottime SECS NSECS". */
static void parse_offsets(const char *text, struct vgl_time_offsets *out)
{
    for (const char *line = text; *line; line += strcspn(line, "\n") + (line[strcspn(line, "\n")] != 0)) {
        int64_t *field = strncmp(line, "monotonic ", 10) == 0 ? &out->monotonic_ns
                         : strncmp(line, "boottime ", 9) == 0 ? &out->boottime_ns
                                                               : NULL;
        if (!field)
            continue;
        const char *p = line + strcspn(line, " ");
        char *end, *after;
        long long secs = strtoll(p, &end, 10);
        long nsecs = strtol(end, &after, 10);
        /* Bounded so that the product fits; the kernel's offsets are far within. */
        if (end != p && after != end && secs > -(1LL << 33) && secs < (1LL << 33) && nsecs >= 0 &&
            nsecs < 1000000000)
            *field = (int64_t)secs * 1000000000 + nsecs;
    }
}

static struct vgl_time_offsets read_offsets(void)
{
    struct vgl_time_offsets got = {0, 0};
    /* The file shows the namespace this process's children get: its own but
     * in a process that called unshare(CLONE_NEWTIME) and has not exec'd
     * since.  The initial namespace, ours then or not, has none. */
    if (ns_inode("/proc/self/ns/time") == INIT_TIME_NS)
        return got;
    /* No such file (before Linux 5.6, or no /proc): no time namespaces. */
    int fd = open("/proc/self/timens_offsets", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return got;
    char buf[256];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return got;
    buf[n] = '\0';
    parse_offsets(buf, &got);
    return got;
}

struct vgl_time_offsets vgl_time_offsets(void)
{
    if (__builtin_expect(!__atomic_load_n(&known, __ATOMIC_ACQUIRE), 0)) {
        int watched = 0;
        if (__atomic_compare_exchange_n(&fork_watched, &watched, 1, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED))
            pthread_atfork(NULL, NULL, forget_in_child);
        /* Threads that race here read the same file and store the same values. */
        struct vgl_time_offsets got = read_offsets();
        __atomic_store_n(&cached.monotonic_ns, got.monotonic_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&cached.boottime_ns, got.boottime_ns, __ATOMIC_RELAXED);
        __atomic_store_n(&known, 1, __ATOMIC_RELEASE);
    }
    return (struct vgl_time_offsets){__atomic_load_n(&cached.monotonic_ns, __ATOMIC_RELAXED),
                                     __atomic_load_n(&cached.boottime_ns, __ATOMIC_RELAXED)};
}

uint64_t vgl_node_clock_ns(void)
{
    return vgl_clock_ns(CLOCK_MONOTONIC) - (uint64_t)vgl_time_offsets().monotonic_ns;
}

uint64_t vgl_node_to_own_ns(uint64_t node_ns)
{
    return node_ns + (uint64_t)vgl_time_offsets().monotonic_ns;
}

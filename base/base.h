/* The neutral base: what the shim and the simulated driver both need and
 * neither owns.  Linking it brings no CUDA, no hooks and no region: simgpu,
 * the test bench, shares no code with what it tests above this line.
 * Prototypes grouped by defining file; 0 or a negative errno unless said. */
#ifndef VGL_BASE_H
#define VGL_BASE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

/* clock.c — `clock` (CLOCK_MONOTONIC, ..._COARSE where a read must be cheap,
 * CLOCK_REALTIME for the driver's timestamps) in nanoseconds. */
uint64_t vgl_clock_ns(clockid_t clock);
/* What this process's time namespace adds to CLOCK_MONOTONIC and to
 * CLOCK_BOOTTIME (and so to the starttimes its /proc shows); 0 and 0 in the
 * initial one. */
struct vgl_time_offsets {
    int64_t monotonic_ns;
    int64_t boottime_ns;
};
struct vgl_time_offsets vgl_time_offsets(void);
/* CLOCK_MONOTONIC as the initial time namespace reads it: the clock every
 * process on the node agrees on, for every time that one process writes and
 * another compares with its own. */
uint64_t vgl_node_clock_ns(void);
/* A time on that clock as this process's CLOCK_MONOTONIC reads it (to sleep until it). */
uint64_t vgl_node_to_own_ns(uint64_t node_ns);

/* identity.c — a process over time and across pid namespaces. */

/* The kernel's inode number of the initial pid namespace (PROC_PID_INIT_INO,
 * fixed since Linux 3.8). */
#define VGL_INIT_PID_NS 0xEFFFFFFCu
/* The inode of the pid namespace at `ns_link` (/proc/<pid>/ns/pid); 0: unknown. */
uint64_t vgl_pid_ns_of(const char *ns_link);
/* The NSpid line of a /proc/<pid>/status: the pid in the namespace of that
 * /proc first, then in each namespace down to the process's own.  Returns how
 * many there are (0: unreadable). */
int vgl_nspid(const char *status_path, int32_t *first, int32_t *last);
/* This process's pid as the host knows it (and as the NVIDIA driver reports
 * it), or 0 when it cannot know it: a container with a /proc of its own. */
int32_t vgl_host_pid_self(void);
/* /proc/<pid>/stat's starttime as the initial time namespace reads it: with
 * the pid, a process's identity over time (a reused pid has another), the
 * same whichever time namespace it or the reader is in.  0 when it cannot be
 * read. */
uint64_t vgl_proc_start_time(int32_t pid);
/* Whether the process `pid` that started at `start_time` (0: unknown) still
 * runs: 0 once it has exited, even before its parent reaps it (its memory is
 * already back with the driver), and when the pid now names another process.
 * A pid we cannot inspect (hidepid) counts as running.  Only for a pid of the
 * caller's own pid namespace: see vgl_hold_byte for the others. */
int vgl_proc_running(int32_t pid, uint64_t start_time);
/* What this process's time namespace adds to a starttime its /proc shows, in
 * clock ticks (vgl_proc_start_time takes it off).  Exact when the offset is
 * a whole number of ticks (1/100 s), as every tool that sets one writes it. */
int64_t vgl_start_time_shift(void);
/* This process's command name (/proc/self/comm), NUL-terminated, in 16 bytes. */
void vgl_proc_comm_self(char comm[16]);
/* Liveness that crosses pid namespaces: a process holds an open-file-description
 * lock on one byte of a shared file (`fd` opened by itself, not inherited) for
 * as long as it lives; the kernel drops it when the process dies, whatever
 * namespace the one asking is in.  vgl_hold_byte: 0 or -errno;
 * vgl_byte_held: 1 held, 0 free, -errno unknown.  vgl_share_byte: the same
 * held by several processes at once (a read lock: `fd` open for reading),
 * held while one of them lives. */
int vgl_hold_byte(int fd, off_t at);
int vgl_share_byte(int fd, off_t at);
int vgl_release_byte(int fd, off_t at);
int vgl_byte_held(int fd, off_t at);

/* robust.c — a process-shared robust mutex in a shared mapping: a process
 * killed while holding it leaves it to the next locker, who is told. */

int vgl_robust_init(pthread_mutex_t *mutex);
/* 0: locked; 1: locked, and the last holder died holding it (repair what it
 * guards, then pthread_mutex_consistent); -errno: not locked.  It waits at
 * most `wait_ns`: -ETIMEDOUT when a live holder keeps it that long (stopped,
 * or a lock word written by other code to name a live thread).  A word that
 * names no possible thread is taken as a dead owner's (1), and `*repaired`
 * (when not NULL) says so. */
int vgl_robust_lock_within(pthread_mutex_t *mutex, uint64_t wait_ns, bool *repaired);
/* The thread id the lock word names as its holder (in the holder's pid
 * namespace); 0: none. */
uint32_t vgl_robust_owner(pthread_mutex_t *mutex);

/* create.c — a shared file made whole before anyone can open it. */

/* Creates `path` (`mode`) of `size` bytes, initialised through a mapping by
 * `init` (0 or -errno), under a temporary name linked into place: nobody
 * ever maps a half-made file, and of two creators exactly one wins (the other
 * gets -EEXIST).  With `fd_out`, the open descriptor (O_RDWR) is handed over. */
int vgl_create_linked(const char *path, mode_t mode, size_t size, int (*init)(void *map, void *arg),
                      void *arg, int *fd_out);

/* number.c — numbers as people write them. */

/* The longest memory wait (vgl_parse_wait, the region's memory_wait_ns): 1 h. */
#define VGL_MAX_WAIT_NS 3600000000000ull

/* A decimal number "123" or "12.5" as whole and up to 9 fraction digits. */
struct vgl_decimal {
    uint64_t whole;
    uint64_t nano; /* the fraction, in 10^-9 */
    bool has_point;
};
/* Parses a decimal at `s`: returns where it ends, or NULL with `*err` set. */
const char *vgl_parse_decimal(const char *s, struct vgl_decimal *out, int *err);
/* Copies `text` without surrounding blanks and leading zeros before another
 * digit ("0030" is 30, "000" 0, "0.5" 0.5) into `buf` of `len` bytes. */
int vgl_trimmed(const char *text, char *buf, size_t len);
#define VGL_SIZE_FORMS                                                                           \
    "bytes (1073741824), binary units (4Gi, 4GiB, 512Mi; k/m/g/t in lower case as HAMi and "      \
    "Docker: 3000m = 3000 MiB), decimal units (4G, 4GB = 4*10^9)"
/* A size in bytes with an optional unit (VGL_SIZE_FORMS), no
 * fraction of a byte, above 0 and below 2^63: 0, -EINVAL or -ERANGE. */
int vgl_parse_size(const char *text, uint64_t *bytes);
/* The parsed number `d` with unit `suffix` in bytes, as vgl_parse_size. */
int vgl_size_of(const struct vgl_decimal *d, const char *suffix, uint64_t *bytes);

#endif

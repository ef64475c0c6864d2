/* A process over time and across pid namespaces.
 *
 * A pid names a process only in one pid namespace and only until it is
 * reused: with /proc/<pid>/stat's starttime it names one process for good,
 * within its namespace.  Across namespaces (two containers of one pod sharing
 * a file, each with its own pids) a pid means nothing, so a process also
 * holds a lock the kernel drops when it dies (vgl_hold_byte). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"

uint64_t vgl_pid_ns_of(const char *ns_link)
{
    struct stat st;
    return stat(ns_link, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

int vgl_nspid(const char *status_path, int32_t *first, int32_t *last)
{
    char buf[8192];
    int fd = open(status_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *s = strstr(buf, "\nNSpid:");
    if (!s)
        return 0;
    s += strlen("\nNSpid:");
    int count = 0;
    for (;;) {
        while (*s == ' ' || *s == '\t')
            s++;
        char *end;
        long pid = strtol(s, &end, 10);
        if (end == s || pid <= 0 || pid > INT32_MAX)
            return count;
        if (count++ == 0)
            *first = (int32_t)pid;
        *last = (int32_t)pid;
        s = end;
    }
}

/* In the host's pid namespace our pid is the host's.  Below it, NSpid's first
 * entry is the pid in the namespace of the mounted /proc: the host's when that
 * /proc is the host's (its pid 1 lives in the initial namespace). */
int32_t vgl_host_pid_self(void)
{
    if (vgl_pid_ns_of("/proc/self/ns/pid") == VGL_INIT_PID_NS)
        return (int32_t)getpid();
    int32_t first, last;
    if (vgl_nspid("/proc/self/status", &first, &last) > 1 &&
        vgl_pid_ns_of("/proc/1/ns/pid") == VGL_INIT_PID_NS)
        return first;
    return 0;
}

int64_t vgl_start_time_shift(void)
{
    /* starttime is the boottime at which the process started, shifted by the
     * reader's offset, in ticks (USER_HZ divides a second). */
    long hz = sysconf(_SC_CLK_TCK);
    int64_t per_tick = 1000000000 / (hz > 0 && hz <= 1000000000 ? hz : 100);
    int64_t offset = vgl_time_offsets().boottime_ns;
    return offset / per_tick - (offset % per_tick < 0);
}

/* /proc/<pid>/stat's state letter and starttime (in the initial time
 * namespace: vgl_proc_start_time); false if unreadable. */
static bool read_stat(int32_t pid, char *state, uint64_t *start_time)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    /* comm may hold spaces and parentheses: fields resume after the last ')'.
     * p starts on the blank before field 3 (state); starttime is field 22. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ' || !p[2])
        return false;
    p++;
    *state = p[1];
    for (int field = 3; field < 22 && p; field++)
        p = strchr(p + 1, ' ');
    if (!p)
        return false;
    /* A time namespace's boottime offset would make a process another to
     * a reader on another clock (every view found it gone): taken off. */
    int64_t start = (int64_t)strtoull(p + 1, NULL, 10) - vgl_start_time_shift();
    *start_time = start > 0 ? (uint64_t)start : 0;
    return true;
}

uint64_t vgl_proc_start_time(int32_t pid)
{
    char state;
    uint64_t start;
    return read_stat(pid, &state, &start) ? start : 0;
}

int vgl_proc_running(int32_t pid, uint64_t start_time)
{
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 0;
    char state;
    uint64_t start;
    if (!read_stat(pid, &state, &start))
        return 1; /* hidepid: kill() is all we know */
    if (state == 'Z' || state == 'X')
        return 0;
    return start_time == 0 || start == start_time;
}

void vgl_proc_comm_self(char comm[16])
{
    memset(comm, 0, 16);
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, comm, 15);
    close(fd);
    if (n > 0 && comm[n - 1] == '\n')
        comm[n - 1] = '\0';
}

static int byte_lock(int fd, off_t at, int cmd, short type, struct flock *fl)
{
    *fl = (struct flock){.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    return fcntl(fd, cmd, fl) == 0 ? 0 : -errno;
}

int vgl_hold_byte(int fd, off_t at)
{
    struct flock fl;
    return byte_lock(fd, at, F_OFD_SETLK, F_WRLCK, &fl);
}

int vgl_share_byte(int fd, off_t at)
{
    struct flock fl;
    return byte_lock(fd, at, F_OFD_SETLK, F_RDLCK, &fl);
}

int vgl_release_byte(int fd, off_t at)
{
    struct flock fl;
    return byte_lock(fd, at, F_OFD_SETLK, F_UNLCK, &fl);
}

int vgl_byte_held(int fd, off_t at)
{
    struct flock fl;
    int err = byte_lock(fd, at, F_OFD_GETLK, F_WRLCK, &fl);
    return err ? err : fl.l_type != F_UNLCK;
}

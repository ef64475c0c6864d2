/* simgpu's pids: the pid the driver reports for a process.
 *
 * The NVIDIA driver is not pid-namespace aware: NVML names every process by
 * its pid in the initial pid namespace (the host's), wherever the caller runs,
 * so a container that compares those pids with its own may take another
 * tenant's process for one of its own.  simgpu must name processes the same
 * way, but it runs inside them, so each records itself (struct sim_pid, made
 * by sim_state_self in state.c): its pid namespace, its pid there, and its
 * host pid when it can know it: when it is in the initial namespace, or when
 * its /proc is the host's (NSpid's first entry).  A process in a namespace
 * with a /proc of its own cannot know its host pid; a lister then reports
 * what the driver would, as far as it can:
 *   - a lister in the initial namespace, whose /proc is the host's, finds the
 *     process there: the one whose /proc/<pid>/ns/pid is that namespace and
 *     whose NSpid ends with that pid;
 *   - any other lister reports a stand-in that is never a real pid: above
 *     the kernel's ceiling on pid_max (PID_MAX_LIMIT), the same for the same
 *     process in every lister, so that no one takes it for a pid of theirs. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "pids.h"
#include "base.h"

/* Every process of another pid namespace, as the host's /proc shows it. */
static void sim_scan_host(struct sim_host_pids *host)
{
    DIR *dir = opendir("/proc");
    if (!dir)
        return;
    uint32_t room = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end || pid <= 0 || pid > INT32_MAX)
            continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%ld/status", pid);
        int32_t first, last;
        if (vgl_nspid(path, &first, &last) < 2)
            continue; /* in the initial namespace: it knew its own pid */
        snprintf(path, sizeof path, "/proc/%ld/ns/pid", pid);
        struct sim_pid found = {.ns = vgl_pid_ns_of(path), .pid = last, .host_pid = (int32_t)pid};
        if (!found.ns)
            continue; /* gone, or not ours to inspect */
        if (host->count == room) {
            room = room ? 2 * room : 64;
            struct sim_pid *more = realloc(host->procs, room * sizeof *more);
            if (!more)
                break;
            host->procs = more;
        }
        host->procs[host->count++] = found;
    }
    closedir(dir);
}

/* Above PID_MAX_LIMIT and within int32_t; one (namespace, pid) pair each
 * (splitmix64's finaliser spreads them). */
static uint32_t sim_stand_in(const struct sim_pid *who)
{
    uint64_t x = who->ns * 0x9E3779B97F4A7C15ULL ^ (uint32_t)who->pid;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return SIM_PID_MAX_LIMIT + 1 + (uint32_t)(x % ((uint64_t)INT32_MAX - SIM_PID_MAX_LIMIT));
}

uint32_t sim_driver_pid(const struct sim_pid *who, struct sim_host_pids *host)
{
    if (who->host_pid > 0)
        return (uint32_t)who->host_pid;
    if (!host->scanned) {
        host->scanned = true;
        if (vgl_pid_ns_of("/proc/self/ns/pid") == VGL_INIT_PID_NS)
            sim_scan_host(host); /* our /proc is the host's */
    }
    for (uint32_t i = 0; i < host->count; i++)
        if (host->procs[i].ns == who->ns && host->procs[i].pid == who->pid)
            return (uint32_t)host->procs[i].host_pid;
    return sim_stand_in(who);
}

void sim_host_pids_free(struct sim_host_pids *host)
{
    free(host->procs);
    *host = (struct sim_host_pids){0};
}

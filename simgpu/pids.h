/* simgpu's pids (pids.c): the pid the driver reports for a process. */
#ifndef SIMGPU_PIDS_H
#define SIMGPU_PIDS_H

#include <stdbool.h>
#include <stdint.h>

/* A process as the kernel knows it.  The driver names processes by their pid
 * in the initial pid namespace (the host's) wherever the caller runs; simgpu
 * runs inside the process, which may not know that pid (pids.c). */
struct sim_pid {
    uint64_t ns;                    /* inode of /proc/<pid>/ns/pid; 0: unknown */
    int32_t pid;                    /* in that namespace: as the process sees itself */
    int32_t host_pid;               /* in the initial namespace; 0: the process cannot know it */
};

#define SIM_PID_MAX_LIMIT 4194304   /* the kernel's PID_MAX_LIMIT: no pid is above it */
/* The pid the driver reports for `who` (see pids.c): its host pid; found in
 * /proc when the process could not know it and our /proc is the host's; else
 * a stand-in above SIM_PID_MAX_LIMIT.  `host` keeps one scan of /proc for a
 * whole listing: zeroed before, given to sim_host_pids_free after.  Never
 * under the file's mutex: the scan reads every process's status. */
struct sim_host_pids {
    bool scanned;
    uint32_t count;
    struct sim_pid *procs;          /* malloc'd: the processes of other pid namespaces */
};
uint32_t sim_driver_pid(const struct sim_pid *who, struct sim_host_pids *host);
void sim_host_pids_free(struct sim_host_pids *host);

#endif

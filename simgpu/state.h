/* simgpu's internals shared by libcuda.so.1 and libnvidia-ml.so.1.
 *
 * Both libraries link the `simgpustate` static library, so each carries its own
 * copy of this code and its own mapping of the state file; what they share is the
 * file, never process memory.  Everything here is hidden: the only exported names
 * are the driver and NVML symbols, each marked SIM_EXPORT.
 *
 * Prototypes are grouped by the file that defines them. */
#ifndef SIMGPU_STATE_H
#define SIMGPU_STATE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* The one way a driver or NVML symbol is exported. */
#define SIM_EXPORT __attribute__((visibility("default")))

enum {
    SIM_MAX_DEVICES = 16,
    SIM_UUID_LEN = 16,
};

/* ---- The state file: one per simulated machine, shared by every process -----
 *
 * Mapped MAP_SHARED by every process that uses simgpu; created complete (in a
 * temporary file linked into place) so that a reader never sees a half-made one.
 * Fixed-width fields only; any change to the layout bumps SIM_STATE_VERSION,
 * which is also part of the default file name, so a newer simgpu never opens an
 * older file by default.  The reserved fields are zero and kept for the kernel
 * timeline (simulated GPU time shared by all processes), which a later version
 * adds without moving anything. */

enum {
    SIM_STATE_VERSION = 1,
    SIM_MAX_PROCS = 1024,
    SIM_COMM_LEN = 16,
};

#define SIM_STATE_MAGIC "SIMGPU1" /* 7 characters and the NUL: 8 bytes */

enum sim_proc_state {
    SIM_PROC_FREE = 0,
    SIM_PROC_LIVE = 1,
};

enum sim_proc_flags {
    /* The process holds an open-file-description lock on the first byte of its
     * entry for as long as it lives: how a process in another pid namespace,
     * which cannot check the pid, tells whether the entry's owner is alive. */
    SIM_PROC_LOCKED = 1u << 0,
};

/* A process-shared, robust pthread mutex; the padding fixes its size on every
 * architecture. */
struct sim_file_lock {
    union {
        pthread_mutex_t mutex;
        uint8_t opaque[64];
    } u;
};

struct sim_file_device {
    uint64_t total_bytes;           /* device memory */
    uint64_t used_bytes;            /* = the sum of the live entries' used_bytes[this device] */
    uint64_t reserved[30];          /* zero: the device's kernel timeline goes here */
};

struct sim_file_proc {
    uint32_t state;                 /* enum sim_proc_state */
    int32_t pid;                    /* as the process sees itself */
    uint64_t start_time;            /* /proc/<pid>/stat field 22: a reused pid is not this process */
    uint64_t pidns;                 /* inode of /proc/self/ns/pid; 0: unknown */
    uint32_t context_mask;          /* bit d: the process holds a context on device d */
    uint32_t flags;                 /* enum sim_proc_flags */
    uint64_t used_bytes[SIM_MAX_DEVICES];
    char comm[SIM_COMM_LEN];        /* /proc/<pid>/comm, NUL-terminated */
    uint64_t reserved[8];           /* zero: the process's kernel time goes here */
};

struct sim_file {
    char magic[8];                  /* SIM_STATE_MAGIC */
    uint32_t version;               /* SIM_STATE_VERSION */
    uint32_t device_count;          /* the configuration the file was made for */
    uint64_t file_size;             /* sizeof(struct sim_file) */
    uint64_t memory_bytes;          /* per device, as configured */
    uint32_t max_procs;             /* SIM_MAX_PROCS */
    uint32_t pad;
    uint64_t reserved[11];          /* zero */
    struct sim_file_lock lock;      /* guards everything below */
    struct sim_file_device devices[SIM_MAX_DEVICES];
    struct sim_file_proc procs[SIM_MAX_PROCS];
};

/* ---- config.c: the simulated machine, from the environment ---------------- */

struct sim_config {
    uint32_t device_count;             /* SIMGPU_DEVICES, 1-16 */
    uint64_t memory_bytes;             /* SIMGPU_MEMORY, per device */
    int driver_version;                /* SIMGPU_DRIVER_VERSION, e.g. 13000 */
    bool trace;                        /* SIMGPU_TRACE=1: log cuGetProcAddress requests */
    char state_path[4096];             /* SIMGPU_STATE, or the default path */
    bool state_path_default;           /* not named by the user: no symlink is followed */
};

/* The configuration, read once per library (thread-safe).  NULL when a variable
 * holds a bad value; the reason has then been written to stderr, once. */
const struct sim_config *sim_config(void);

/* The fixed identity of device `index`: the same in every process and in both
 * libraries, so cuDeviceGetUuid and nvmlDeviceGetUUID agree. */
void sim_device_uuid(uint32_t index, uint8_t out[SIM_UUID_LEN]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (40 characters and a NUL). */
void sim_device_uuid_string(uint32_t index, char out[41]);
uint32_t sim_device_pci_bus(uint32_t index);
const char *sim_device_name(void);

/* One line on stderr, prefixed "simgpu: ". */
void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- state.c: the machine-wide state file ---------------------------------- */

/* One process's use of the simulated machine, as NVML reports it. */
struct sim_proc_info {
    int32_t pid;
    uint64_t used_bytes;
};

/* Maps the state file named by the config, creating it if needed.  Idempotent
 * and thread-safe; 0, -EINVAL (a file made for another configuration, or not a
 * simgpu state file; the reason is logged) or another -errno. */
int sim_state_open(const struct sim_config *cfg);

/* Charges `bytes` on `device` to the calling process: 0, or -ENOMEM when the
 * device (all processes together) has not that much free, after memory held by
 * dead processes has been returned.  Pre-condition: sim_state_open succeeded. */
int sim_state_charge(uint32_t device, uint64_t bytes);
/* Returns bytes charged by sim_state_charge. */
void sim_state_uncharge(uint32_t device, uint64_t bytes);
/* Marks whether the calling process holds a context on `device` (NVML lists
 * processes with a context even before they allocate). */
int sim_state_set_context(uint32_t device, bool active);
/* Used and total bytes of `device`, after dead processes are reaped. */
int sim_state_mem_info(uint32_t device, uint64_t *used_bytes, uint64_t *total_bytes);
/* The processes with a context or memory on `device`: fills up to `max` entries
 * of `out` (which may be NULL when `max` is 0) and returns how many there are in
 * all (which may exceed `max`), or -errno. */
int sim_state_processes(uint32_t device, struct sim_proc_info *out, uint32_t max);
/* Forgets this process's place in the file without touching it: for a child
 * after fork, whose memory and contexts are not its parent's. */
void sim_state_forget_self(void);

#endif

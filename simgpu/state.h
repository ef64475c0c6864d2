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
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "log.h"
#include "pids.h"

/* The one way a driver or NVML symbol is exported. */
/* noinline: an entry point called by another keeps its own frame, so that
 * calls.c can tell the driver's own calls from its callers'. */
#define SIM_EXPORT __attribute__((visibility("default"), noinline))

enum {
    /* Real machines can show CUDA more than 16 GPUs, so simgpu can too
     * (past the 16 a vgpulimit region counts).  At most 32: a bit per device
     * in context_mask and in vmm.c's access masks. */
    SIM_MAX_DEVICES = 32,
    SIM_MAX_CONCURRENT = 128,       /* SIMGPU_CONCURRENT_KERNELS at most */
    SIM_UUID_LEN = 16,
};

/* ---- The state file: one per simulated machine, shared by every process -----
 *
 * Mapped MAP_SHARED by every process that uses simgpu; created complete (in a
 * temporary file linked into place) so that a reader never sees a half-made one.
 * Fixed-width fields only; any change to the layout bumps SIM_STATE_VERSION,
 * which is also part of the default file name, so a newer simgpu never opens an
 * older file by default.  The reserved fields are zero; each device's kernel
 * timeline (simulated GPU time shared by all processes) follows the process
 * table. */

enum {
    SIM_STATE_VERSION = 10,         /* 8: memory shared between processes (shared); 9: MIG instances
                                       are devices of their own (mig_layout); 10: checkpoints (ckpt_*) */
    SIM_MAX_PROCS = 1024,
    SIM_COMM_LEN = 16,
    SIM_TIMELINE_SLOTS = 4096,      /* work items (kernels, markers) of one device not yet done, and
                                       the recently done whose times events read */
    SIM_SERVED = 32,                /* contexts whose last time slice a device remembers */
    SIM_SAMPLES = 128,              /* utilisation samples a device keeps */
    SIM_SAMPLE_PROCS = 16,          /* processes a sample tells apart; the rest count as busy only */
    SIM_MAX_SHARED = 1024,          /* allocations shared between processes, machine-wide */
    SIM_MAX_IPC_EVENTS = 256,       /* events shared between processes (cuIpcGetEventHandle) */
};

/* The length of a utilisation sample (real GPUs: between 1/6 s and 1 s). */
#define SIM_SAMPLE_NS 100000000ULL

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
    uint64_t driver_bytes;          /* what the driver keeps for itself: SIMGPU_RESERVED */
    uint64_t reserved[29];          /* zero */
};

struct sim_file_proc {
    uint32_t state;                 /* enum sim_proc_state */
    uint32_t flags;                 /* enum sim_proc_flags */
    struct sim_pid who;
    uint64_t start_time;            /* /proc/<pid>/stat field 22: a reused pid is not this process */
    uint32_t context_mask;          /* bit d: the process holds a context on device d */
    uint32_t pad;
    uint64_t used_bytes[SIM_MAX_DEVICES];
    char comm[SIM_COMM_LEN];        /* /proc/<pid>/comm, NUL-terminated */
    uint64_t shared_held;           /* shared allocations it holds (shared.c): it stays listed while > 0 */
    /* The checkpoint API (checkpoint.c): another process posts a request, the
     * process's own checkpoint thread carries it out.  Both seqs are futex words. */
    uint32_t ckpt_state;            /* CUprocessState */
    uint32_t ckpt_request;          /* bumped by the caller that posts a request */
    uint32_t ckpt_done;             /* = ckpt_request once the request is carried out, or given up */
    uint32_t ckpt_op;               /* enum sim_ckpt_op */
    uint32_t ckpt_timeout_ms;       /* a lock's */
    int32_t ckpt_result;            /* CUresult of the last request */
    int32_t ckpt_tid;               /* the checkpoint thread; 0: none (no context yet) */
    uint32_t pad2;
    uint64_t reserved[2];           /* zero: the process's kernel time goes here */
};

/* The engines of a device that run work: the SMs run kernels, and each copy
 * engine one copy at a time, beside the kernels (copies.c of the driver
 * says which engine a copy or memset takes). */
enum sim_engine {
    SIM_ENGINE_SM = 0,
    SIM_ENGINE_H2D,                 /* copies from host memory to the device */
    SIM_ENGINE_D2H,                 /* copies from the device to host memory */
    SIM_ENGINE_D2D,                 /* copies within the device, and memsets */
    SIM_ENGINES,
};

/* An item of work on a device's timeline, in one stream of one context of
 * one process: a kernel or a copy (left_ns > 0 when queued; `engine` says
 * which), or a marker (an event record, or a stream's wait for another
 * item: `after`). */
struct sim_work {
    uint64_t ticket;                /* its place in the device's order of submission, from 1 */
    uint64_t ctx;                   /* the context (its address in its process) */
    uint64_t stream;                /* the stream (an address in its process) */
    uint64_t left_ns;               /* GPU time it has still to run */
    uint64_t after;                 /* a ticket that must be done before it starts; 0: none */
    uint64_t done_ns;               /* when it completed; 0: not yet */
    struct sim_pid who;             /* the submitting process */
    uint32_t engine;                /* enum sim_engine */
    uint32_t pad;
};

/* One sample period of a device: how long it ran kernels, and whose. */
struct sim_sample {
    uint64_t end_ns;                /* the period is [end_ns - SIM_SAMPLE_NS, end_ns) */
    uint64_t busy_ns;
    uint32_t nprocs;
    uint32_t pad;
    struct {
        struct sim_pid who;
        uint64_t busy_ns;
    } procs[SIM_SAMPLE_PROCS];
};

/* A device's work, simulated forward whenever a process looks (timeline.c). */
struct sim_timeline {
    uint64_t clock_ns;              /* simulated up to here */
    uint64_t busy_ns;               /* time during which some kernel ran, since the file was made */
    uint64_t head;                  /* the oldest ticket not done */
    uint64_t next;                  /* the next ticket to give; work[t % SLOTS] holds ticket t */
    struct sim_pid active_who;      /* the context holding the device's time slice */
    uint64_t active_ctx;            /* 0: none */
    uint64_t slice_end_ns;
    struct sim_sample current;      /* the period in progress; end_ns 0: none yet */
    uint32_t sample_head;           /* samples[sample_head]: the oldest kept */
    uint32_t sample_count;
    struct sim_sample samples[SIM_SAMPLES];
    struct {
        struct sim_pid who;
        uint64_t ctx;
        uint64_t at_ns;             /* when its last slice began */
    } served[SIM_SERVED];
    struct sim_work work[SIM_TIMELINE_SLOTS];
};

/* An allocation that processes share (shared.c): its bytes are a file of
 * the directory beside the state file, and it is charged to one process at a
 * time, the owner, as NVIDIA's kernel driver charges shared memory to the
 * client that owns it and passes the ownership to another holder when the
 * owner lets go ("Choose the new owner", memDestructCommon in
 * open-gpu-kernel-modules). */
struct sim_file_shared {
    uint64_t id;                    /* 0: a free slot */
    uint64_t size;                  /* charged: to `owner`, or to the device alone */
    uint64_t file_dev, file_ino;    /* its file: how an exported descriptor is recognised */
    uint32_t device;
    int32_t owner;                  /* the process entry charged for it; -1: none (only exported descriptors hold it) */
    uint64_t holders[SIM_MAX_PROCS / 64]; /* bit i: process entry i holds it (a handle, a mapping) */
};

/* An event another process may open (cuIpcGetEventHandle): its last record,
 * as every process that has it reads it. */
struct sim_file_event {
    uint64_t id;                    /* 0: a free slot */
    int32_t owner;                  /* the entry of the process that made it */
    uint32_t state;                 /* enum sim_event_state of the driver (work.h) */
    uint32_t device;
    uint32_t pad;
    uint64_t ticket;                /* its last record's marker on the device's timeline */
};

struct sim_shared_table {
    uint64_t last_id;
    uint64_t orphan_bytes[SIM_MAX_DEVICES]; /* of allocations no process holds (owner -1) */
    struct sim_file_shared v[SIM_MAX_SHARED];
    struct sim_file_event events[SIM_MAX_IPC_EVENTS];
};

struct sim_file {
    char magic[8];                  /* SIM_STATE_MAGIC */
    uint32_t version;               /* SIM_STATE_VERSION */
    uint32_t device_count;          /* units (sim_config.unit_count): GPUs without MIG, MIG instances */
    uint64_t file_size;             /* sizeof(struct sim_file) */
    uint64_t memory_bytes;          /* per device, as configured */
    uint32_t max_procs;             /* SIM_MAX_PROCS */
    uint32_t pad;
    uint64_t driver_bytes;          /* per device, as configured (SIMGPU_RESERVED) */
    uint64_t mig_layout;            /* sim_config.mig_layout */
    uint64_t reserved[9];           /* zero */
    struct sim_file_lock lock;      /* guards everything below */
    struct sim_file_device devices[SIM_MAX_DEVICES];
    struct sim_file_proc procs[SIM_MAX_PROCS];
    struct sim_timeline timelines[SIM_MAX_DEVICES];
    struct sim_shared_table shared;
};

/* ---- profiles.c: the boards simgpu can be ------------------------------------ */

/* A real GPU model, as its driver shows it (profiles.c says which figures are
 * measured and which approximate). */
struct sim_profile {
    const char *key;                /* SIMGPU_PROFILE's name for it */
    const char *name;               /* cuDeviceGetName, nvmlDeviceGetName */
    uint64_t memory_bytes;          /* the total the driver reports */
    uint32_t sms;
    int cc_major, cc_minor;         /* compute capability */
    uint64_t context_bytes;         /* a fresh primary context's device memory */
    uint64_t reserved_bytes;        /* kept by the driver itself: NVML v2's `reserved` */
    uint32_t process_samples;       /* nvmlDeviceGetProcessUtilization's size-query count */
    uint32_t pci_device_id;         /* nvmlPciInfo's: device id << 16 | vendor 0x10DE */
    uint32_t pci_subsystem_id;
    struct {
        uint8_t bus, device;        /* function 0 */
    } slots[8];                     /* the first eight boards' PCI addresses, in domain 0 */
    uint32_t clock_khz, memory_clock_khz, memory_bus_bits;
    uint32_t l2_bytes, shared_per_sm, shared_per_block_optin, threads_per_sm;
    uint32_t link_gbps;             /* a copy between host and device, each way, GB/s */
    uint32_t device_copy_gbps;      /* a copy within the device, or a memset, GB/s */
    uint32_t bar1_mib;              /* the BAR1 aperture, which MIG devices share by memory slices */
};

/* The profile SIMGPU_PROFILE names (NULL: none), and the default one. */
const struct sim_profile *sim_profile_named(const char *key);
const struct sim_profile *sim_profile_default(void);
/* "h100-80gb, h200-141gb, ...": every key, for messages; returns the length. */
size_t sim_profile_keys(char *out, size_t size);

/* ---- mig.c: MIG instances (SIMGPU_MIG) -------------------------------------- */

enum {
    SIM_MIG_MAX_INSTANCES = 7,      /* a GPU's 7 compute slices: at most 7 instances */
    SIM_MIG_SLOTS = 8,              /* memory slices, where placements are counted */
    SIM_WHOLE_GPU = 0xFFFFFFFFu,    /* sim_unit.instance of a GPU without MIG */
};

/* A GPU-instance profile of one GPU model, as mig_profiles.json gives it
 * (mig_profiles.h, generated from that file at build time). */
struct sim_mig_profile {
    const char *name;               /* "3g.40gb" */
    uint32_t id;                    /* the driver's profile id: nvmlGpuInstanceProfileInfo_t.id */
    uint32_t nvml_enum;             /* NVML_GPU_INSTANCE_PROFILE_*: GetGpuInstanceProfileInfo's argument */
    uint32_t compute_slices, memory_slices, memory_mib, sms, copy_engines, max_count;
    uint32_t placement_count;
    uint8_t placements[SIM_MIG_SLOTS]; /* legal first memory slices */
    bool media_extensions;          /* +me */
};

struct sim_mig_model {
    const char *model;              /* "H100 80GB" */
    const char *const *names;       /* NULL-terminated; among them the simgpu profile's key */
    uint32_t compute_slices, memory_slices, profile_count;
    const struct sim_mig_profile *profiles;
};

/* A GPU instance with its one compute instance, which spans it (what
 * mig-parted and HAMi create). */
struct sim_mig_instance {
    const struct sim_mig_profile *profile;
    uint32_t start;                 /* first memory slice */
    uint32_t gi_id, ci_id;
    uint32_t unit;                  /* its place in the state file (sim_config.units) */
};

struct sim_gpu_mig {
    bool enabled;
    uint32_t count;                 /* instances, in the order created: their MIG device index */
    struct sim_mig_instance instances[SIM_MIG_MAX_INSTANCES];
};

/* Where memory and time are kept: a GPU without MIG, or one MIG instance. */
struct sim_unit {
    uint32_t gpu;                   /* the machine's index of the GPU, or of the instance's parent */
    uint32_t instance;              /* index into sim_config.mig[gpu].instances, or SIM_WHOLE_GPU */
    uint32_t sms;
    uint64_t memory_bytes;
    uint64_t reserved_bytes;        /* what the driver keeps of it */
};

/* The MIG model of a board; NULL: it has no MIG. */
const struct sim_mig_model *sim_mig_model(const struct sim_profile *board);
/* SIMGPU_MIG's `text` into mig[0..device_count); false with one line in
 * `message` naming what is wrong. */
bool sim_mig_parse(const char *text, const struct sim_profile *board, uint32_t device_count,
                   struct sim_gpu_mig mig[], char *message, size_t size);

/* ---- config.c: the simulated machine, from the environment ---------------- */

/* The NVML entry points of nvml_api.def, numbered. */
enum sim_nvml_fn {
#define SIM_NVML(name, params, args, count) SIM_NVML_FN_##name,
#include "nvml_api.def"
#undef SIM_NVML
    SIM_NVML_FNS
};

enum {
    SIM_NVML_SCRIPT_MAX = 16,       /* answers SIMGPU_NVML_ANSWER may give one function */
    SIM_NVML_REAL = -1,             /* an answer: what simgpu answers unscripted */
};

/* One of the answers SIMGPU_NVML_ANSWER gives a function, call after call. */
struct sim_nvml_answer {
    int32_t code;                   /* an nvmlReturn_t, or SIM_NVML_REAL */
    bool set_count;                 /* INSUFFICIENT_SIZE=N: also sets the count out-argument */
    uint32_t count;                 /* that N */
};

struct sim_nvml_script {
    uint32_t n;                     /* 0: the function is not scripted */
    struct sim_nvml_answer answers[SIM_NVML_SCRIPT_MAX]; /* the last repeats */
};

/* nvml_script.c: SIMGPU_NVML_ANSWER's text into one script per function of
 * nvml_api.def; false with one line in `message` saying what is wrong. */
bool sim_nvml_scripts_parse(const char *value, struct sim_nvml_script scripts[SIM_NVML_FNS], char *message,
                            size_t size);

struct sim_config {
    const struct sim_profile *profile; /* SIMGPU_PROFILE: what the devices are */
    uint32_t device_count;             /* SIMGPU_DEVICES, 1-SIM_MAX_DEVICES */
    uint64_t memory_bytes;             /* SIMGPU_MEMORY, per device */
    uint32_t sms[SIM_MAX_DEVICES];     /* SIMGPU_SMS: streaming multiprocessors of each device */
    uint64_t context_overhead_bytes;   /* SIMGPU_CONTEXT_OVERHEAD, per process and device */
    uint64_t reserved_bytes;           /* SIMGPU_RESERVED: what the driver keeps of each device */
    int driver_version;                /* SIMGPU_DRIVER_VERSION, e.g. 13000 */
    uint64_t kernel_ns;                /* SIMGPU_KERNEL_US: a kernel's default duration */
    uint64_t launch_ns;                /* SIMGPU_LAUNCH_US: the CPU time of a launch */
    uint32_t concurrent_kernels;       /* SIMGPU_CONCURRENT_KERNELS, 1-SIM_MAX_CONCURRENT */
    uint64_t timeslice_ns;             /* SIMGPU_TIMESLICE_US */
    uint64_t link_bytes_per_s;         /* SIMGPU_COPY_GBPS: each direction between host and device */
    uint64_t device_bytes_per_s;       /* SIMGPU_DEVICE_COPY_GBPS: copies within a device, memsets */
    bool eager_modules;                /* CUDA_MODULE_LOADING=EAGER: code loads with its module */
    bool trace;                        /* SIMGPU_TRACE=1: log cuGetProcAddress requests */
    char fail[256];                    /* SIMGPU_FAIL: entry points that fail, comma-separated, or "" */
    struct sim_nvml_script nvml_scripts[SIM_NVML_FNS]; /* SIMGPU_NVML_ANSWER, by enum sim_nvml_fn */
    char calls_path[4096];             /* SIMGPU_CALLS: where to append the count of calls, or "" */
    char state_path[4096];             /* SIMGPU_STATE, or the default path */
    bool state_path_default;           /* not named by the user: no symlink is followed */
    struct sim_gpu_mig mig[SIM_MAX_DEVICES]; /* SIMGPU_MIG: each GPU's instances */
    uint64_t mig_layout;               /* a hash of every GPU's instances; 0: MIG off everywhere */
    bool mig_monitor;                  /* SIMGPU_MIG_MONITOR=all: MIG-wide NVML queries are allowed */
    uint32_t unit_count;               /* GPUs without MIG and MIG instances: the state file's devices */
    struct sim_unit units[SIM_MAX_DEVICES];
    uint32_t gpu_unit[SIM_MAX_DEVICES]; /* a GPU without MIG: its unit */
};

/* The configuration, read once per library (thread-safe).  NULL when a variable
 * holds a bad value; the reason has then been written to stderr, once. */
const struct sim_config *sim_config(void);

/* ---- units.c: the devices' fixed identity ----------------------------------- */

/* The fixed identity of device `index`: the same in every process and in both
 * libraries, so cuDeviceGetUuid and nvmlDeviceGetUUID agree. */
void sim_device_uuid(uint32_t index, uint8_t out[SIM_UUID_LEN]);
/* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (40 characters and a NUL). */
void sim_device_uuid_string(uint32_t index, char out[41]);
/* The unit's MIG instance; NULL for a whole GPU. */
const struct sim_mig_instance *sim_unit_instance(const struct sim_config *cfg, uint32_t unit);
/* cuDeviceGetName's and nvmlDeviceGetName's: "<board> MIG 3g.40gb" for an instance. */
void sim_unit_name(const struct sim_config *cfg, uint32_t unit, char *out, size_t size);
/* A unit's UUID: its GPU's, or its instance's MIG UUID (fixed by the GPU,
 * the profile and the placement, so stable for a layout); the text is
 * "GPU-..." or "MIG-..." (40 characters and a NUL). */
void sim_unit_uuid(const struct sim_config *cfg, uint32_t unit, uint8_t out[SIM_UUID_LEN]);
void sim_unit_uuid_string(const struct sim_config *cfg, uint32_t unit, char out[41]);
/* Where device `index` sits on PCI (function 0): the profile's slots, each
 * further eight boards in the next domain. */
struct sim_pci_address {
    uint32_t domain, bus, device;
};
struct sim_pci_address sim_device_pci(const struct sim_config *cfg, uint32_t index);

/* ---- state.c: the machine-wide state file ---------------------------------- */

/* One process's use of the simulated machine, as NVML reports it. */
struct sim_proc_info {
    struct sim_pid who;
    uint32_t pid;                   /* as the driver reports it: sim_driver_pid(who) */
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
 * processes with a context even before they allocate), charging or giving
 * back the context's `overhead` (the configuration's context size: the same
 * both ways). */
int sim_state_set_context(uint32_t device, bool active, uint64_t overhead);
/* A device's memory, after dead processes are reaped: what processes hold
 * (allocations, contexts, modules), what the driver keeps for itself, and
 * the total; free is total - reserved - used. */
struct sim_mem_info {
    uint64_t used_bytes;
    uint64_t reserved_bytes;
    uint64_t total_bytes;
};
int sim_state_mem_info(uint32_t device, struct sim_mem_info *out);
/* The processes with a context or memory on `device`: fills up to `max` entries
 * of `out` (which may be NULL when `max` is 0) and returns how many there are in
 * all (which may exceed `max`), or -errno. */
int sim_state_processes(uint32_t device, struct sim_proc_info *out, uint32_t max);
/* Forgets this process's place in the file without touching it: for a child
 * after fork, whose memory and contexts are not its parent's. */
void sim_state_forget_self(void);
/* This process (pre-condition: the file's mutex is held). */
struct sim_pid sim_state_self(void);

/* For shared.c (under the file's mutex): this process's entry, claimed if
 * need be (-errno when the table is full); the file's own path; entry
 * `entry` no longer holds `s` (whose charge passes on, or whose bytes go
 * back); and where the bytes of shared allocation `id` are. */
int sim_state_self_entry(struct sim_file *f);
const char *sim_state_path(void);
void sim_state_shared_drop(struct sim_file *f, struct sim_file_shared *s, int entry);
void sim_state_shared_file(uint64_t id, char *out, size_t size);

/* For timeline.c: the mapped file with its mutex held (a dead holder's leftovers
 * repaired), or NULL when it is not open or the mutex is unusable. */
struct sim_file *sim_state_lock_file(void);
void sim_state_unlock_file(struct sim_file *f);

/* ---- timeline.c: simulated GPU time, shared by every process ---------------- */

/* CLOCK_MONOTONIC of the initial time namespace in ns: the clock of every
 * timeline, the same in all processes whatever their time namespace. */
uint64_t sim_now_ns(void);
/* Sleeps (never spins) until sim_now_ns() >= deadline_ns. */
void sim_sleep_until(uint64_t deadline_ns);
/* Queues an item (ticket, done_ns and who are filled in) on `device`: 0 and
 * its ticket; -EAGAIN when the device holds SIM_TIMELINE_SLOTS items not done,
 * with *wake_ns when the next may be (retry then); -errno. */
int sim_timeline_submit(uint32_t device, struct sim_work *item, uint64_t *ticket, uint64_t *wake_ns);
/* Whether `ticket` (and, if ctx is not 0, every earlier item of that context
 * of the calling process) is done: 1 with *done_ns (0 when the time is no
 * longer kept), or 0 with *wake_ns, the earliest it may be; -errno. */
int sim_timeline_done(uint32_t device, uint64_t ticket, uint64_t ctx, uint64_t *done_ns, uint64_t *wake_ns);
/* Sleeps until sim_timeline_done says done; 0 with *done_ns, or -errno. */
int sim_timeline_wait(uint32_t device, uint64_t ticket, uint64_t ctx, uint64_t *done_ns);
/* The share of the last second in which the device ran kernels, in percent. */
int sim_timeline_utilization(uint32_t device, unsigned int *percent);

/* A process's use of a device during one sample period. */
struct sim_proc_sample {
    struct sim_pid who;
    uint32_t pid;                   /* as the driver reports it: sim_driver_pid(who) */
    unsigned int sm_percent;
    uint64_t timestamp_us;          /* CLOCK_REALTIME at the end of the period */
};
/* The samples of periods that ended after `since_us` (CLOCK_REALTIME us; 0:
 * all kept), one per process that ran kernels in a period: fills up to `max` of
 * `out` and returns how many there are (or -errno). */
int sim_timeline_samples(uint32_t device, uint64_t since_us, struct sim_proc_sample *out, uint32_t max);

/* ---- shared.c: device memory shared between processes ------------------- */

/* What the calling process holds of a shared allocation. */
struct sim_shared_ref {
    uint64_t id;
    uint32_t device;
    uint64_t size;
    int fd;                         /* its file, opened by this process (a description of its own) */
};
/* A new shared allocation of `size` bytes on `device`, held by the calling
 * process and charged to it: `charge` false when the bytes are charged to it
 * already (a cuMemAlloc allocation being exported).  0, -ENOMEM when the
 * device is full, or another -errno. */
int sim_shared_create(uint32_t device, uint64_t size, bool charge, struct sim_shared_ref *out);
/* The calling process holds `id` (legacy IPC), or the allocation that the
 * exported descriptor `fd` is of (id 0): 0, or -ENOENT when it is gone. */
int sim_shared_join(uint64_t id, int fd, struct sim_shared_ref *out);
/* The calling process lets go of what sim_shared_create or _join gave it
 * (closes ref->fd).  The charge passes to another holder, or the bytes go
 * back once no process and no exported descriptor holds them. */
void sim_shared_leave(const struct sim_shared_ref *ref);
/* A descriptor to hand to another process (cuMemExportToShareableHandle):
 * it holds the allocation for as long as it, or a duplicate of it, is open
 * anywhere; -errno. */
int sim_shared_export(const struct sim_shared_ref *ref);
/* A number no other call on this machine gets (an exported pool's name). */
uint64_t sim_shared_new_id(void);
/* Interprocess events.  A new one's id (0 when the table is full), made by
 * the calling process and gone with it or with sim_ipc_event_free. */
uint64_t sim_ipc_event_new(void);
void sim_ipc_event_free(uint64_t id);
/* Its last record, written by whichever process records it; -ENOENT: gone. */
int sim_ipc_event_set(uint64_t id, uint32_t state, uint32_t device, uint64_t ticket);
int sim_ipc_event_get(uint64_t id, uint32_t *state, uint32_t *device, uint64_t *ticket);

/* ---- state.c: checkpoint requests between processes (checkpoint.c) ---------- */

enum sim_ckpt_op {
    SIM_CKPT_LOCK = 1,
    SIM_CKPT_CHECKPOINT,
    SIM_CKPT_RESTORE,
    SIM_CKPT_UNLOCK,
};
/* A request posted to the process that `pid` names (as the caller sees it).
 * 0 and the ticket to wait on; -ESRCH: no process with a checkpoint thread
 * (no CUDA context); -EBUSY: another request to it is in progress; -EPERM:
 * it is not in the state `op` needs. */
struct sim_ckpt_ticket {
    int entry;
    struct sim_pid who;
    uint64_t start_time;
    uint32_t seq;
};
int sim_state_ckpt_post(int32_t pid, uint32_t op, uint32_t timeout_ms, struct sim_ckpt_ticket *t);
/* Waits until the request is carried out: 0 and its CUresult; -ESRCH when
 * the process is gone; -ETIMEDOUT past `deadline_ns` (sim_now_ns's clock; UINT64_MAX:
 * none), the request then given up: marked done with `result` unchanged and
 * the process's state as it was, so that the next request may be posted. */
int sim_state_ckpt_wait(const struct sim_ckpt_ticket *t, uint64_t deadline_ns, int32_t *result);
/* The state and checkpoint thread of the process `pid` names; -ESRCH. */
int sim_state_ckpt_get(int32_t pid, uint32_t *state, int32_t *tid);
/* For the process's own checkpoint thread: waits (at most `wait_ms`) for a
 * request to this process: 1 with it and the state it finds the process in,
 * 0 with none; it also records `tid` in the entry. */
struct sim_ckpt_request {
    uint32_t seq, op, timeout_ms, state;
};
int sim_state_ckpt_next(int32_t tid, uint32_t wait_ms, struct sim_ckpt_request *r);
/* The request `seq` is carried out: the process is now in `state`.  False
 * when its caller gave it up meanwhile (the state is then left as it was:
 * the thread undoes what it did). */
bool sim_state_ckpt_finish(uint32_t seq, uint32_t state, int32_t result);
/* Names `tid` as this process's checkpoint thread: the entry its first
 * context makes says so, and others may then post requests to it. */
void sim_state_ckpt_register(int32_t tid);
/* Takes every byte the process holds off the devices (its entry then shows
 * none): into `out` per device.  -EOPNOTSUPP when it holds memory shared
 * with other processes. */
int sim_state_ckpt_release(uint64_t out[SIM_MAX_DEVICES]);
/* Charges `bytes` back, all or nothing: -ENOMEM when a device has no room. */
int sim_state_ckpt_recharge(const uint64_t bytes[SIM_MAX_DEVICES]);

#endif

/* The environment contract, read by one reader (shim/src/environment.c): the
 * shim calls it on its own environment, the Python package (the supervisor,
 * the OCI hook) on the environment it is about to hand a process, so every
 * variable means the same everywhere.
 *
 * Precedence, the same for memory and cores, strongest first:
 *   VGPULIMIT_<X>_<i>  >  VGPULIMIT_<X>  >  HAMi's <Y>_<i>  >  HAMi's <Y>
 * (within one source, a device's own value beats the one for every device;
 * a value for a device by its UUID, VGPULIMIT_<X>_GPU-<uuid>, beats them all;
 * our variable beats HAMi's for the same device).  Two sources that disagree
 * on a device are reported by a warning line naming both; the stronger
 * applies.  Flags (`vgpulimit run`) and annotations (the OCI hook) rank above
 * every variable; the Python side layers them on this result.
 *
 * This header is also fed to cffi (src/vgpulimit/_cffi_build.py): its body
 * holds no macros, and array sizes are literals. */
#ifndef VGPULIMIT_ENVIRONMENT_H
#define VGPULIMIT_ENVIRONMENT_H

#include <stdint.h>

#include "vgpulimit/limits.h"

/* The compute policy (VGPULIMIT_CORES_POLICY > HAMi's GPU_CORE_UTILIZATION_POLICY)
 * is one for all devices.
 *
 * Below every variable of HAMi's, KAI's GPU_PORTION (a fraction such as 0.5)
 * caps each device's memory at that share of it: KAI always sets it, and its
 * CUDA_DEVICE_MEMORY_LIMIT only where the node carries its GPU memory label.
 *
 * Where a device's value came from, weakest first: a stronger one replaces it. */
enum vgl_env_source {
    VGL_ENV_UNSET = 0,
    VGL_ENV_PORTION = 1,       /* KAI's GPU_PORTION (memory only) */
    VGL_ENV_HAMI = 2,          /* CUDA_DEVICE_MEMORY_LIMIT, CUDA_DEVICE_SM_LIMIT */
    VGL_ENV_HAMI_DEVICE = 3,   /* CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT_<i> */
    VGL_ENV_OURS = 4,          /* VGPULIMIT_MEMORY, VGPULIMIT_CORES */
    VGL_ENV_OURS_DEVICE = 5,   /* VGPULIMIT_MEMORY_<i>, VGPULIMIT_CORES_<i> */
};

enum {
    VGL_ENV_MAX_LINES = 8,
    VGL_ENV_LINE_LEN = 320,
    /* The longest name read: VGPULIMIT_MEMORY_REQUEST_ and a UUID is 65. */
    VGL_ENV_NAME_LEN = 96,
};

struct vgl_env_origin {
    uint32_t source;           /* enum vgl_env_source */
    char name[96];             /* the variable, e.g. "VGPULIMIT_MEMORY_1"; VGL_ENV_NAME_LEN */
    char text[64];             /* its value as written (cut at 63 bytes) */
};

struct vgl_env {
    struct vgl_mem_limit memory[16];       /* VGL_MAX_DEVICES; both fields 0: none */
    uint32_t cores_pct[16];                /* 0: none */
    struct vgl_env_origin memory_from[16];
    struct vgl_env_origin cores_from[16];
    struct vgl_uuid_limit by_uuid[16];     /* VGPULIMIT_MEMORY_GPU-<uuid>, VGPULIMIT_CORES_GPU-<uuid>,
                                              VGPULIMIT_MEMORY_REQUEST_GPU-<uuid>:
                                              beat every variable by index for that device */
    char region_path[4096];                /* "": none named */
    char region_from[64];                  /* VGPULIMIT_REGION, CUDA_DEVICE_MEMORY_SHARED_CACHE,
                                              or CONTAINER_VGPU_MOUNT (KAI's isolator) */
    uint32_t region_dir_len;               /* > 0: the region's directory may be made, from
                                              region_path[region_dir_len] on (KAI's layout) */
    int32_t log_level;                     /* 0 error .. 3 debug; -1: not set */
    int32_t cores_policy;                  /* enum vgl_cores_policy; -1: not set */
    struct vgl_env_origin cores_policy_from;
    int32_t priority;                      /* enum vgl_priority (VGPULIMIT_PRIORITY > HAMi's
                                              CUDA_TASK_PRIORITY); -1: not set */
    struct vgl_env_origin priority_from;
    struct vgl_mem_limit request[16];      /* VGPULIMIT_MEMORY_REQUEST[_<i>]: the guarantee, at most
                                              the limit; both fields 0: none (the limit) */
    struct vgl_env_origin request_from[16];
    uint64_t memory_wait_ns;               /* VGPULIMIT_MEMORY_WAIT */
    int32_t memory_wait_set;               /* 1: the variable is set (and valid) */
    uint32_t pad;
    struct vgl_env_origin memory_wait_from;
    uint32_t asks;                         /* a limit or region variable is present */
    uint32_t control_disabled;             /* HAMi's CUDA_DISABLE_CONTROL=true: enforce nothing */
    uint32_t mps;                          /* CUDA_MPS_PIPE_DIRECTORY is set: an MPS client */
    uint32_t errors;                       /* variables that cannot be used: fail closed */
    uint32_t lines;                        /* lines below, at most VGL_ENV_MAX_LINES */
    uint32_t line_is_error[8];
    char line[8][320];                     /* one message each, without a newline */
};

/* One limit kind, as a row of shim/src/limit_kinds.def (which says what each
 * field is): the Python side reads the rows through vgl_limit_kind, so both
 * go by the one compiled table.  "" where a kind has no such name. */
struct vgl_limit_kind {
    const char *id;
    const char *what;
    const char *ours;
    const char *hami;
    const char *kai;
    const char *flag;
    uint32_t per_device;
    uint32_t by_uuid;
    const char *annotation;
    const char *parser;
    const char *hami_parser;
    const char *region_field;
    const char *board_field;
    const char *example;
    const char *hami_example;
    const char *help;
    const char *device_help;
};

/* The kind at `index`, in the table's order; NULL past the last. */
const struct vgl_limit_kind *vgl_limit_kind(uint32_t index);

/* Reads `envp` (NULL-terminated "NAME=value" strings, as environ).  Never
 * fails: what cannot be used is counted in `errors` and said in `line`. */
void vgl_env_read(char **envp, struct vgl_env *out);

/* The Slurm job a process is in, by its cgroups (`text`: /proc/self/cgroup's
 * lines), which the job's processes cannot change: a path component
 * "job_<id>" below one whose name starts with "slurm", as Slurm's cgroup
 * plugins make them (v1: /slurm/uid_<u>/job_<id>/step_<s>; v2:
 * /system.slice/slurmstepd.scope/job_<id>/step_<s>/...).  0 and the id in
 * `job` (at most `len` - 1 digits); -ENOENT: in no job; -EINVAL: in two
 * (none is trusted). */
int vgl_env_slurm_job(const char *text, char *job, unsigned long len);

#endif

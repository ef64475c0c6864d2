/* The one parser of limits: the shim reads the environment with it, the Python
 * package (CLI, OCI annotations) calls the same code through cffi.  cffi reads
 * this header too, so its body holds no macros. */
#ifndef VGPULIMIT_LIMITS_H
#define VGPULIMIT_LIMITS_H

#include <stdint.h>

/* A memory limit as the user gave it: absolute, or a share of the device. */
struct vgl_mem_limit {
    uint64_t bytes; /* 0 = not absolute */
    uint32_t ppm;   /* share of the device in millionths; 0 = not relative */
    uint32_t pad;
};

/* Memory: bytes, a size with a unit, a percentage or a fraction of the device.
 * 0, or -EINVAL (not a size) / -ERANGE (too large, or zero). */
int vgl_parse_memory(const char *text, struct vgl_mem_limit *out);
/* Compute share: "30" or "30%", 1-100. */
int vgl_parse_cores(const char *text, uint32_t *out_pct);
/* What a compute share means while the device has time no one else wants. */
enum vgl_cores_policy {
    VGL_CORES_HARD = 0,        /* never past the share (the default) */
    VGL_CORES_BORROW = 1,      /* past it while other tenants leave the device idle */
    VGL_CORES_NONE = 2,        /* no compute limit at all */
};
/* Compute policy: hard, borrow or none, or HAMi-core's FORCE, DEFAULT or
 * DISABLE (either case).  0, or -EINVAL. */
int vgl_parse_cores_policy(const char *text, uint32_t *out_policy);
/* The priority between tenants on one GPU (board.h): while a container of a
 * higher priority has work on the device, lower ones hold back.  Normal is
 * 0 so that a region or a board row nobody gave one is normal. */
enum vgl_priority {
    VGL_PRIORITY_NORMAL = 0,
    VGL_PRIORITY_HIGH = 1,
    VGL_PRIORITY_LOW = 2,
};
/* Priority: high, normal or low (either case).  0, or -EINVAL. */
int vgl_parse_priority(const char *text, uint32_t *out_priority);
/* HAMi-core's CUDA_TASK_PRIORITY: 0 is high, 1 is low.  0, or -EINVAL. */
int vgl_parse_hami_priority(const char *text, uint32_t *out_priority);
/* Higher for a higher priority, so that ranks compare as priorities do. */
uint32_t vgl_priority_rank(uint32_t priority);
/* How long an allocation that would be refused waits for memory (the
 * memory wait, docs/memory.md): a whole or decimal number with a unit, ms,
 * s, m or h ("500ms", "2s", "1.5m"), or 0 for no wait; at most 1 h.  Into
 * nanoseconds: 0, or -EINVAL (no unit, a sign, junk) / -ERANGE (too long). */
int vgl_parse_wait(const char *text, uint64_t *out_ns);
/* The accepted forms, for error messages. */
const char *vgl_wait_forms(void);
const char *vgl_memory_forms(void);
const char *vgl_cores_forms(void);
const char *vgl_cores_policy_forms(void);
const char *vgl_priority_forms(void);
const char *vgl_hami_priority_forms(void);

/* A byte count for people, into `buf`: exact in the largest binary unit that
 * holds it whole ("1 GiB", "3000 MiB"), else to one decimal ("1.5 GiB"). */
const char *vgl_format_bytes(uint64_t bytes, char *buf, uint32_t len);

/* A limit given for one device by its UUID, not its index: a device plugin
 * knows the UUIDs it hands a container, not how CUDA in the container will
 * number them.  The shim applies it to whichever CUDA ordinal the driver
 * says has that UUID (shim/src/devices.c). */
enum vgl_uuid_limit_flags {
    VGL_UUID_MEMORY = 1,       /* `limit` applies */
    VGL_UUID_CORES = 2,        /* `cores_pct` applies */
    VGL_UUID_REQUEST = 4,      /* `request` applies */
    /* The UUID was given as a MIG device's (MIG-...), not a GPU's: its 16
     * bytes do not say, and the views and lines print it as it was given.
     * Set with one of the above, never alone. */
    VGL_UUID_MIG = 8,
};
struct vgl_uuid_limit {
    uint8_t uuid[16];          /* all zero: an unused entry */
    struct vgl_mem_limit limit;
    uint32_t cores_pct;
    uint32_t flags;            /* enum vgl_uuid_limit_flags */
    struct vgl_mem_limit request;  /* the memory request (the guarantee), at most `limit` */
};
/* "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6" (the whole UUID, as nvidia-smi
 * -L and NVML print it, either case), or a MIG device's "MIG-..." of the same
 * form, into 16 bytes: 0, -EINVAL (not that form) or -ERANGE (all zeros: the
 * form, but no device's, and the bytes the region keeps for "none").  The
 * bytes do not say which kind: a GPU's and a MIG device's UUIDs differ as any
 * two do (the flag VGL_UUID_MIG, and vgl_device_state.uuid_kind, say it). */
int vgl_parse_uuid(const char *text, uint8_t out[16]);
/* The same 16 bytes as text, in lower case as NVML prints it (41 bytes with
 * the NUL).  The one formatter: the shim's device mapping, the region's
 * views (vgpulimit.limits.format_uuid) and `vgpulimit verify` use it. */
void vgl_format_uuid(const uint8_t uuid[16], char out[41]);
/* The same as a MIG device's UUID: "MIG-..." (what NVML answers tells which). */
void vgl_format_mig_uuid(const uint8_t uuid[16], char out[41]);

/* The cap in bytes for a device of `total_bytes` (never above it); UINT64_MAX: none. */
uint64_t vgl_cap_bytes(const struct vgl_mem_limit *limit, uint64_t total_bytes);

#endif

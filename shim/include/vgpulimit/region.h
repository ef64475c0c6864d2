/* The region file: the ABI shared by every process of a container (through the
 * shim) and the supervisor and views (through the Python binding).
 *
 * One file per container, mapped MAP_SHARED.  Fixed-width fields only; the
 * layout is pinned by tests/c/region_layout.c and tests/test_core.py.  Any
 * change to it bumps VGL_REGION_VERSION.
 *
 * This header is also the cffi declaration of the binding: src/vgpulimit/
 * _cffi_build.py feeds it to cffi with its preprocessor lines removed, so the
 * body holds no macros — constants are enums. */
#ifndef VGPULIMIT_REGION_H
#define VGPULIMIT_REGION_H

#include <stdint.h>

#include "vgpulimit/limits.h"

enum {
    VGL_REGION_VERSION = 10,
    VGL_MAX_DEVICES = 16,
    VGL_MAX_SLOTS = 1024,
    VGL_COMM_LEN = 16,
    VGL_PARENT_LEN = 256,
    /* A region and the regions it is nested in, at most: deeper chains are
     * refused (a chain a tenant wrote to loop ends here too). */
    VGL_MAX_CHAIN = 4,
};

/* Who made a region (vgl_region.flags). */
enum vgl_region_flags {
    VGL_REGION_GROUP_SHARED = 1,     /* mode 0660 rather than 0600 */
    /* Made by the shim from limits in the environment alone: no setter
     * stands behind it, so it holds only while a process does.  One that no
     * live process holds is re-made with the limits of the next process's
     * environment, rather than keep the limits of the last. */
    VGL_REGION_FROM_ENVIRONMENT = 2,
};

enum vgl_slot_state {
    VGL_SLOT_FREE = 0,
    VGL_SLOT_LIVE = 1,
    /* Its process is gone (or exec'd: the new image has another slot), its
     * bytes not yet given back to the devices' totals (ledger.c). */
    VGL_SLOT_DEAD = 2,
};

enum vgl_slot_flags {
    /* Its process holds a lock on the slot's first byte in the region file
     * (region.c): the kernel drops it when the process dies, so a process of
     * another pid namespace, where the slot's pid means nothing, can tell. */
    VGL_SLOT_LOCKED = 1,
};

/* What a device's UUID is (vgl_device_state.uuid_kind): its 16 bytes do not
 * say, and a view must print the UUID the driver gives the device. */
enum vgl_uuid_kind {
    VGL_UUID_KIND_UNKNOWN = 0,       /* not seen yet, or NVML could not say */
    VGL_UUID_KIND_GPU = 1,           /* GPU-<uuid> */
    VGL_UUID_KIND_MIG = 2,           /* MIG-<uuid>: a MIG device */
};

/* Storage for a process-shared robust pthread mutex; opaque to readers. */
struct vgl_lock {
    uint8_t opaque[64];
};

struct vgl_device_state {
    struct vgl_mem_limit limit;  /* both fields 0: no cap */
    uint32_t cores_pct;          /* compute share, 1-100; 0: no cap */
    uint32_t frozen;             /* 1 while the ledger is recounted (ledger.c): changes wait */
    uint64_t total_bytes;        /* device memory as the driver reports it; 0 until seen */
    uint64_t used_bytes;         /* >= the sum of the live and dead slots' used_bytes[this
                                    device]; equal to it while no change is under way and no
                                    process that died in one awaits a reclaim (ledger.c) */
    uint64_t oom_refusals;       /* allocations refused at the cap */
    uint64_t throttled_ns;       /* time the container's launches waited for compute budget */
    uint64_t busy_ns;            /* GPU time the container's kernels took, as measured; views
                                    divide its growth by wall time for the achieved share */
    int64_t budget_ns;           /* compute controller (throttle.c): GPU time the container may
                                    still start; negative: owed by launches that ran over */
    uint64_t budget_at_ns;       /* the budget's last refill, on the node's clock (CLOCK_MONOTONIC
                                    of the initial time namespace); 0: not started */
    uint32_t cores_policy;       /* enum vgl_cores_policy (limits.h) */
    uint32_t uuid_kind;          /* enum vgl_uuid_kind of `uuid`, written with it (or later,
                                    once NVML says) */
    uint64_t lend_until_ns;      /* until when (on the node's clock) a borrowing container may
                                    run past its share (no other tenant was busy); 0: not now */
    uint8_t uuid[16];            /* the UUID of the device CUDA numbers so in the container,
                                    written under the lock by the first process that sees it
                                    (which then applies a limit given for that UUID, below);
                                    all zero until then */
    /* Elastic memory (docs/memory.md).  What others go by is the container's
     * row in the node's board (board.h); these are its setter's values, for
     * the container's own processes without a row, and for the views. */
    struct vgl_mem_limit request; /* the guarantee, at most the limit; both fields 0: the limit */
    uint64_t waited_ns;          /* time allocations spent waiting for memory, in all */
    uint64_t wait_timeouts;      /* waits that ended in a refusal */
    uint64_t borrow_refusals;    /* allocations past the request refused for others' guarantees */
};

/* A process's place in the region.  Slots never move once claimed, so a
 * process may keep a pointer to its own. */
struct vgl_slot {
    uint32_t state;              /* enum vgl_slot_state */
    int32_t pid;                 /* as the container sees it */
    int32_t host_pid;            /* 0: unknown */
    uint32_t busy;               /* changes of used_bytes under way (ledger.c), one per thread */
    uint64_t start_time;         /* /proc/<pid>/stat starttime as the initial time namespace
                                    reads it: a reused pid is not the dead one */
    uint64_t pid_ns;             /* inode of the pid namespace `pid` is in; 0: unknown */
    uint32_t flags;              /* enum vgl_slot_flags */
    uint32_t reserved;           /* 0 */
    uint64_t used_bytes[16];     /* per device; 16 = VGL_MAX_DEVICES (cffi needs a literal) */
    char comm[16];
    /* Waiting for memory (elastic.c), per device.  Kept in the process's own
     * slot, never in a count shared with others, so that the dead hold no
     * wait: what waits in a container is the sum over its live slots. */
    uint64_t wait_since_ns[16];  /* when the process's oldest waiting allocation began to wait
                                    (the node's CLOCK_MONOTONIC); 0: none waits */
    uint32_t waiting[16];        /* the process's allocations waiting for memory now */
};

struct vgl_region {
    char magic[8];               /* "VGPULIM" and a NUL */
    uint32_t version;            /* VGL_REGION_VERSION */
    uint32_t header_size;        /* sizeof(struct vgl_region) */
    uint64_t file_size;
    uint64_t generation;         /* bumped on every change of limits */
    uint64_t flags;              /* enum vgl_region_flags */
    /* The region of the enclosing `vgpulimit run` (a nested run's region) as
     * its processes see its path; empty: none.  A process of this region
     * reserves its bytes and compute time in that one too, so a nested run
     * may only tighten the limits it runs under. */
    char parent[256];            /* VGL_PARENT_LEN, NUL-terminated */
    struct vgl_lock lock;        /* guards slot claims, limit changes and ledger recounts */
    struct vgl_device_state devices[16];  /* VGL_MAX_DEVICES */
    struct vgl_slot slots[1024];          /* VGL_MAX_SLOTS */
    /* Limits given by device UUID (limits.h), for a device whatever CUDA
     * calls it; copied into devices[i] when device i's UUID is first written
     * there, so devices[] is what every reader and the ledger go by. */
    struct vgl_uuid_limit by_uuid[16];    /* VGL_MAX_DEVICES */
    /* The container's priority (enum vgl_priority), as its setter gave it,
     * for the views.  What every container goes by, its own included, is its
     * row in the node's board (board.h), which no tenant can write. */
    uint32_t priority;
    uint32_t board_row;          /* the container's row in the board, with board[0], for the
                                    views: the shim and setters find the row by the region file */
    uint64_t board_key;          /* that row's key: a row taken since by another is not its */
    char board[256];             /* the node's priority board as the container sees its path
                                    (under `vgpulimit run`, where the shim looks for it);
                                    "": the container takes no part in priorities */
    uint64_t yielded_ns[16];     /* per device: time launches held back for containers of a
                                    higher priority (priority.c) */
    uint64_t memory_wait_ns;     /* how long an allocation that would be refused waits for
                                    memory; 0: it is refused at once */
    uint32_t board_flags;        /* what the container's row takes part in (enum
                                    vgl_board_row_flags), for the views */
    uint32_t pad4;
};

/* region.c — every function returns 0 or a negative errno unless it says otherwise. */

/* Creates the file at `path` (mode 0600, or 0660 with VGL_REGION_GROUP_SHARED
 * in `flags`), nested in the region at `parent` (NULL: none), fully
 * initialised before it becomes visible: -EEXIST if one is there,
 * -ENAMETOOLONG if `parent` does not fit. */
int vgl_region_create(const char *path, const struct vgl_mem_limit *limits,
                      const uint32_t *cores_pct, uint32_t flags, const char *parent);
/* The same, with limits by UUID (`by_uuid`: VGL_MAX_DEVICES entries, or NULL). */
int vgl_region_create_with_uuids(const char *path, const struct vgl_mem_limit *limits,
                                 const uint32_t *cores_pct, const struct vgl_uuid_limit *by_uuid,
                                 uint32_t flags, const char *parent);
/* The same, with memory requests by index (`requests`: VGL_MAX_DEVICES
 * entries, or NULL; by UUID in `by_uuid`) and the memory wait. */
int vgl_region_create_elastic(const char *path, const struct vgl_mem_limit *limits,
                              const uint32_t *cores_pct, const struct vgl_uuid_limit *by_uuid,
                              const struct vgl_mem_limit *requests, uint64_t memory_wait_ns,
                              uint32_t flags, const char *parent);
/* The parent path written in the header of the region file at `path` (read,
 * not mapped), into `out` (VGL_PARENT_LEN bytes; "" for none): 0, or the
 * errors of vgl_region_open. */
int vgl_region_read_parent(const char *path, char *out);
/* Maps and validates an existing file.  -EPROTO: not a region (magic);
 * -EPROTONOSUPPORT: another layout version; -EBADF: truncated or wrong size;
 * -EBADMSG: garbled (see vgl_region_check). */
int vgl_region_open(const char *path, struct vgl_region **out);
/* Validates `size` bytes of a region file (read into memory, or mapped; as
 * aligned as the struct), reading no byte past them: 0, or the errors of
 * vgl_region_open.  Garbled means a header whose own sizes are wrong, or a
 * value that vgpulimit never writes. */
int vgl_region_check(const void *image, uint64_t size);
void vgl_region_close(struct vgl_region *region);
/* One line saying what a negative result of create/open means for `path`. */
const char *vgl_region_strerror(int err);
/* The 8 bytes every region file starts with ("VGPULIM" and a NUL). */
const char *vgl_region_magic(void);

/* What this process's time namespace adds to every starttime its /proc
 * shows, in clock ticks: a reader of /proc takes it off before it compares
 * one with a slot's start_time.  0 in the initial time namespace. */
int64_t vgl_region_start_time_shift(void);

/* Claims a free slot for `pid` (host_pid 0 if unknown). */
int vgl_region_attach(struct vgl_region *region, int32_t pid, int32_t host_pid,
                      struct vgl_slot **out);
/* Releases the slot and returns its bytes to the ledger. */
void vgl_region_detach(struct vgl_region *region, struct vgl_slot *slot);
/* Frees the slots of processes that no longer exist; returns how many, or
 * the error of the region lock (-ETIMEDOUT: held past its bound). */
int vgl_region_reclaim(struct vgl_region *region);
/* The thread the region lock's word names as its holder (in the holder's
 * pid namespace), for a line about a lock held past its bound; 0: none. */
uint32_t vgl_region_lock_holder(struct vgl_region *region);
/* When no live process holds the region, sets every device's limits to
 * these (a region made from an environment, re-made for the next one):
 * 1; 0 when a live process holds it, and nothing changed. */
int vgl_region_renew(struct vgl_region *region, const struct vgl_mem_limit *limits,
                     const uint32_t *cores_pct);
/* An allocation's reservation (vgl_ledger_reserve): short of room, the
 * bytes of processes that died are taken back first; a refusal is counted. */
int vgl_region_reserve(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                       uint64_t bytes, uint64_t cap);
/* Records that the container's device `device` has `uuid`, of `kind` (enum
 * vgl_uuid_kind; the first process to see it does), and applies a limit
 * given for that UUID: 1 when it wrote the UUID, 0 when it was there already
 * (its kind written if it was unknown), -EEXIST when the device has another
 * UUID there (a process of the container numbers devices otherwise),
 * -EINVAL for a device past VGL_MAX_DEVICES. */
int vgl_region_bind_device(struct vgl_region *region, uint32_t device, const uint8_t uuid[16], uint32_t kind);
/* Sets (or, with flags 0, removes) the limit of the device with `uuid`,
 * and of the device bound to it if there is one; bumps the generation.
 * -ENOSPC: VGL_MAX_DEVICES UUIDs have limits already. */
int vgl_region_set_uuid_limit(struct vgl_region *region, const struct vgl_uuid_limit *limit);
/* Sets device `device`'s limits and bumps the generation. */
int vgl_region_set_limits(struct vgl_region *region, uint32_t device,
                          const struct vgl_mem_limit *limit, uint32_t cores_pct);
/* Sets device `device`'s memory request (both fields 0: none, the limit)
 * and bumps the generation. */
int vgl_region_set_request(struct vgl_region *region, uint32_t device, const struct vgl_mem_limit *request);
/* Sets how long allocations wait for memory (at most 1 h) and bumps the generation. */
int vgl_region_set_memory_wait(struct vgl_region *region, uint64_t wait_ns);

/* region_guard.c — a region file truncated under its mapping.  The shim and
 * the supervisor map the file that every process of a container may write. */

/* Guards a mapping from vgl_region_open in this process: touching a page
 * that the file no longer holds gets a private page of zeros instead of a
 * fatal SIGBUS, and marks the region broken.  0, or -EMFILE: too many guarded. */
int vgl_region_guard(struct vgl_region *region);
/* Before vgl_region_close. */
void vgl_region_unguard(struct vgl_region *region);
/* 1 once a page of the guarded `region` was lost (its numbers are no longer
 * shared with anyone), else 0.  Touches its last page: guarded regions only. */
int vgl_region_broken(const struct vgl_region *region);

/* ledger.c — the per-device byte count, exact under races. */

/* Reserves `bytes` on `device` for `slot` if they fit under `cap`: 0,
 * -ENOMEM when they do not, or the error of an unusable region lock. */
int vgl_ledger_reserve(struct vgl_region *region, struct vgl_slot *slot,
                       uint32_t device, uint64_t bytes, uint64_t cap);
void vgl_ledger_release(struct vgl_region *region, struct vgl_slot *slot,
                        uint32_t device, uint64_t bytes);

#endif

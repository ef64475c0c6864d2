/* Hidden prototypes of the shim, grouped by the file that defines them.
 * Nothing here is exported: the only exported names are the hooked driver
 * symbols and dlsym (vgpulimit.map, generated from hooks.def). */
#ifndef VGPULIMIT_INTERNAL_H
#define VGPULIMIT_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "base.h"
#include "vgpulimit/board.h"
#include "vgpulimit/cuda_abi.h"
#include "vgpulimit/environment.h"
#include "vgpulimit/limits.h"
#include "vgpulimit/nvml_abi.h"
#include "vgpulimit/paths.h"
#include "vgpulimit/region.h"
#include "log.h"
#include "timings.h"

/* For code that runs inside dlsym: a sanitizer's runtime looks its
 * interceptors up with dlsym before its shadow memory exists, so in a
 * sanitizer build of the shim that code must not be instrumented. */
#define VGL_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
/* Runs `fn` in the child after every fork.  Each module forgets what was its
 * parent's itself: the child is a process of its own, with no CUDA state, and
 * a lock some other thread held at the fork is held by no one in it. */
#define VGL_AFTER_FORK(fn)                                                                         \
    __attribute__((constructor)) static void fn##_at_fork(void) { pthread_atfork(NULL, NULL, fn); }

/* slot_owner.c — whether a slot's process runs, asked from any pid namespace. */
/* Keeps `fd` (this process's own descriptor of the file mapped at `region`,
 * handed over) for the slot locks; forgotten (closed) when it is unmapped. */
void vgl_owner_keep(const struct vgl_region *region, int fd);
void vgl_owner_forget(const struct vgl_region *region);
/* Marks `slot` as this process's: its pid namespace, and its lock when it
 * can be taken.  Before the slot is made live. */
void vgl_owner_claim(const struct vgl_region *region, struct vgl_slot *slot);
void vgl_owner_release(const struct vgl_region *region, struct vgl_slot *slot);
/* Whether `slot` names this very process image (pid, start time, namespace). */
bool vgl_owner_same(const struct vgl_slot *slot, int32_t pid, uint64_t start_time);
/* Whether the slot's process still runs; true when that cannot be told. */
bool vgl_owner_running(const struct vgl_region *region, const struct vgl_slot *slot);
/* A descriptor of `fd`'s file with an open file description of its own
 * (`flags`: O_RDONLY or O_RDWR), so that a lock on it is this process's
 * alone: for a forked child, async-signal-safe.  -1: none (no /proc). */
int vgl_reopen(int fd, int flags);

/* waits.c (also board.h) — who waits for memory.  Each process says so in its
 * own slot; what a container's beacon says is derived from its live slots. */
/* The container's waits on `device` (count and oldest start, 0: none), from
 * the live slots of `region` but `except`; *dead: a slot of a process that
 * is gone said it waits (left out; a reclaim frees it). */
uint64_t vgl_waits_oldest(const struct vgl_region *region, uint32_t device, const struct vgl_slot *except,
                          uint32_t *count, bool *dead);
/* Writes the waits of the region's live slots on `device` into the beacon
 * (reclaiming the dead first if one is seen).  Any process of the container
 * may do it at once: each writes what it read and reads again until both
 * agree, so the last to write leaves what the slots say. */
void vgl_waits_publish(struct vgl_beacon *beacon, struct vgl_region *region, uint32_t device);
/* The byte of a beacon that a process with an allocation waiting on `device`
 * holds a shared lock on (vgl_share_byte), and whether one holds it now
 * (`fd`: the beacon, open for reading): 1, 0, or -errno (cannot be asked). */
off_t vgl_waits_byte(uint32_t device);
int vgl_waits_held(int fd, uint32_t device);

/* region_guard.c (also region.h) — a mapping of a file that a tenant may
 * truncate under it: a lost page becomes a private page of zeros instead of
 * a fatal SIGBUS.  0, or -EMFILE: too many guarded. */
int vgl_guard_mapping(void *start, uint64_t size);
/* Before the mapping at `start` is unmapped. */
void vgl_unguard_mapping(void *start);

/* region.c (also region.h) */
/* vgl_region_reserve without counting a refusal (the tries of a wait). */
int vgl_region_reserve_quietly(struct vgl_region *region, struct vgl_slot *slot, uint32_t device,
                               uint64_t bytes, uint64_t cap);

/* ledger.c (also region.h) */
/* What a refusal for a lock held past its bound says of `region`'s lock. */
#define VGL_LOCK_HELD_FMT "the region lock of %s was held for more than %d s by thread %u (a process " \
    "stopped while holding it, or a lock word written by something other than vgpulimit)"
#define VGL_LOCK_HELD_ARGS(path, region) (path), (int)(vgl_timings.lock_wait_ns / 1000000000ULL), \
    (unsigned)vgl_region_lock_holder(region)
/* Takes the region lock (it guards slot claims, limit changes and
 * recounts): 0, or -errno when it is unusable or held past vgl_timings.lock_wait_ns
 * (-ETIMEDOUT), and was not taken.  A holder
 * that died may have left the totals half recounted: then, or when a device
 * is left frozen, they are recounted first. */
int vgl_ledger_lock(struct vgl_region *region);
void vgl_ledger_unlock(struct vgl_region *region);
/* Under the region lock: sets every device's total to the sum of the slots'
 * counts, with every change held off meanwhile; the counts of a dead slot
 * (VGL_SLOT_DEAD) that was in the middle of a change (busy) are dropped
 * first, and its busy cleared.  False when a change under way did not end
 * in time: nothing was written (ledger.c says why). */
bool vgl_ledger_recount(struct vgl_region *region);

/* config.c — the configuration, decided once at load. */
struct vgl_config {
    bool enabled;        /* a region or a limit applies to this process */
    bool broken;         /* a variable could not be used: fail closed */
    bool authoritative;  /* the region was set up by the runtime, not the process, or
                            is nested in the runtime's: its chain must end there */
    bool slurm_job;      /* the region is the Slurm job's, found by the process's cgroup */
    bool said_ignored;   /* the environment's limits were said to be ignored, once */
    size_t own_dir_len;  /* > 0: region_path is the shim's own, in a directory this long */
    struct vgl_env env;  /* the environment as the one reader read it */
    char region_path[4096];
};
extern struct vgl_config vgl_config;
void vgl_config_load(void);
/* Whether `dir` may hold this user's own regions: a directory (not a link)
 * of this user's, writable by no one else, as XDG_RUNTIME_DIR must be.  0;
 * -ENOENT; -ENOTDIR; -EPERM: another user's; -EACCES: writable by others;
 * its owner and mode in `*owner`, `*mode` when it is a directory. */
int vgl_private_dir(const char *dir, uint32_t *owner, uint32_t *mode);

/* init.c — per-process state of the shim. */
struct vgl_link {
    struct vgl_region *region;
    struct vgl_slot *slot;
};
struct vgl_self {
    struct vgl_region *region; /* NULL until the first call that needs it */
    struct vgl_slot *slot;     /* set last, once every link has its slot */
    /* The regions the process's own is nested in (a nested `vgpulimit run`),
     * nearest first: each counts what the process uses, under its own limits.
     * Mapped with the region, fixed from then on. */
    uint32_t nouter;
    struct vgl_link outer[VGL_MAX_CHAIN - 1];
    int32_t pid;
};
extern struct vgl_self vgl_self;
/* The regions the process counts in: its own (link 0), then those it is nested in. */
static inline uint32_t vgl_links(void) { return 1 + vgl_self.nouter; }
static inline struct vgl_link vgl_link_at(uint32_t i)
{
    return i ? vgl_self.outer[i - 1] : (struct vgl_link){vgl_self.region, vgl_self.slot};
}
/* Maps the region and claims this process's slot, once.  False: fail closed. */
bool vgl_attach(void);
/* Maps the region without claiming a slot (for views: NVML, cuMemGetInfo).
 * False when it cannot be mapped (logged). */
bool vgl_map_region(void);

/* real_driver.c — the C library's dlsym, and the real libcuda / libnvidia-ml, found once. */
extern void *(*vgl_real_dlsym)(void *handle, const char *name);
VGL_NO_SANITIZE void vgl_resolve_real_dlsym(void);
/* The library's handle, opened once (kept open); NULL when it is absent. */
void *vgl_real_cuda_library(void);
void *vgl_real_nvml_library(void);
/* Why libnvidia-ml could not be loaded ("" when it was). */
const char *vgl_real_nvml_error(void);

/* hooks.c — the hook table expanded. */
#define CU_HOOK(symbol, base, version, pt, params, args) typedef CUresult(*vgl_pfn_##symbol) params;
#define CU_CALL CU_HOOK
#define NVML_HOOK(symbol, params, args) typedef nvmlReturn_t(*vgl_pfn_##symbol) params;
#define NVML_CALL NVML_HOOK
#include "hooks.def"

/* The real library functions, typed.  Each starts as a stub that resolves its
 * library on first use, so no call pays for a once-guard. */
struct vgl_real {
#define CU_HOOK(symbol, base, version, pt, params, args) vgl_pfn_##symbol symbol;
#define CU_CALL CU_HOOK
#define NVML_HOOK(symbol, params, args) vgl_pfn_##symbol symbol;
#define NVML_CALL NVML_HOOK
#include "hooks.def"
};
extern struct vgl_real vgl_real;

/* An entry of the table: its name, the base name clients ask cuGetProcAddress
 * for, the wrapper we hand out (NULL for a function we only call), where its
 * real pointer lives, and the stub that pointer holds until resolved. */
struct vgl_hook {
    const char *name;
    const char *base;
    void *wrapper;
    void **real;
    void *lazy;
};
/* The hook whose name is `name`, or NULL (a scan: dlsym and cuGetProcAddress
 * look names up at start, not per call). */
const struct vgl_hook *vgl_hook_by_name(const char *name);
/* Maps a pointer the real library handed out for `name` to our wrapper of
 * that same variant; returns `real` itself when it is not one we hook (and
 * warns when `name` is hooked, yet the pointer is none we know). */
void *vgl_wrap_real_pointer(const char *name, void *real);
/* Resolves every real pointer of a library's hooks, once; false if the
 * library is absent. */
bool vgl_resolve_cuda(void);
bool vgl_resolve_nvml(void);
/* Whether NVML is loaded and initialised for the shim's own use (tried once);
 * if not, one phrase saying why. */
bool vgl_nvml_started(void);
const char *vgl_nvml_not_started(void);

/* allocations.c — this process's live device allocations, by kind of handle. */
enum vgl_allocation_kind {
    VGL_ALLOC_POINTER, /* cuMemAlloc*, cuMemAllocPitch*, cuMemAllocManaged */
    VGL_ALLOC_VMM,     /* cuMemCreate handles */
    VGL_ALLOC_MAPPING, /* cuMemMap address ranges: bytes mapped, linked to their handle */
    VGL_ALLOC_ARRAY,   /* CUarray and CUmipmappedArray */
    VGL_ALLOC_POOL,    /* memory pools: what their reserve was charged */
    VGL_ALLOC_OPENED,  /* cuIpcOpenMemHandle pointers (refs: their opens) */
    VGL_ALLOC_IMPORTED, /* cuMemPoolImportPointer pointers: their size, linked to their pool */
    VGL_ALLOC_POOL_IMPORTS, /* per pool: what its live imported pointers add up to (refs: how many) */
    VGL_ALLOC_KINDS
};
/* What one handle was charged. */
struct vgl_allocation {
    uint64_t key;  /* 0: empty (no kind of handle is 0) */
    uint64_t bytes;
    uint64_t link; /* a key of another kind this one refers to (a mapping's handle) */
    int32_t device;
    int32_t refs;  /* holders of the charge: a VMM handle's own, and each mapping of it */
};
/* Records what `key` was charged, with one holder, or replaces what a
 * record of it says, keeping its holders; `link`: a key of another kind it
 * refers to, or 0. */
bool vgl_allocations_put(enum vgl_allocation_kind kind, uint64_t key, int32_t device, uint64_t bytes,
                         uint64_t link);
bool vgl_allocations_get(enum vgl_allocation_kind kind, uint64_t key, int32_t *device, uint64_t *bytes);
/* What the record of `key` says; false when there is none. */
bool vgl_allocations_find(enum vgl_allocation_kind kind, uint64_t key, struct vgl_allocation *out);
/* Removes `key` and says what it was charged; false when it is not ours. */
bool vgl_allocations_take(enum vgl_allocation_kind kind, uint64_t key, struct vgl_allocation *out);
/* Puts back what vgl_allocations_take removed, as it was. */
bool vgl_allocations_restore(enum vgl_allocation_kind kind, const struct vgl_allocation *a);
/* Adds `delta` holders to `key`; removes it when none is left.  Returns the
 * holders left (0: removed, its charge is the caller's to return), -1: unknown. */
int vgl_allocations_hold(enum vgl_allocation_kind kind, uint64_t key, int delta, int32_t *device,
                         uint64_t *bytes);

/* accounting.c — the ledger around driver calls, for every allocation family. */
/* Device of the current context, or -1. */
int vgl_current_device(void);
/* The device's memory as the driver reports it (asked once); 0: unknown. */
uint64_t vgl_device_total(int device);
/* The process uses `device` (makes a context or allocates there): the region
 * records the device's size, which the views take for "used", and binds it
 * to its UUID (once per process). */
void vgl_device_used(int device);
/* The cap of a device of `total` bytes, read live from the region and those
 * it is nested in (the tightest); UINT64_MAX: none; 0 while the
 * configuration or a region is broken. */
uint64_t vgl_device_cap(int device, uint64_t total);
/* The cap of `region`'s device alone, read live. */
uint64_t vgl_region_cap(const struct vgl_region *region, int device, uint64_t total);
/* Reserves `bytes` on `device` in the process's region and each it is nested
 * in, under each one's cap (`forced`: under none, for memory the driver
 * already holds): 0, or -ENOMEM with nothing reserved, and which region
 * refused in *refused (0: its own; i: vgl_self.outer[i - 1]; may be NULL);
 * -ETIMEDOUT when a region's lock was needed and held past its bound.  A
 * refusal is counted in the region's oom_refusals when `count`. */
int vgl_reserve(uint32_t device, uint64_t bytes, bool forced, bool count, uint32_t *refused);
/* The bytes this process ever asked vgl_reserve for on `device`, refused
 * ones too: what it reserved between two readings is at most their difference. */
uint64_t vgl_reserved_ever(int device);
/* A change to this process's charges around a driver call (each charge
 * of charge.c is one). */
void vgl_charges_enter(void);
void vgl_charges_leave(void);
/* Whether no change was under way when the mark was taken, and none began
 * since: then the ledger and the driver agree on the process's allocations. */
uint64_t vgl_charges_mark(void);
bool vgl_charges_quiet_since(uint64_t mark);

/* Returns `bytes` on `device` to the process's region and each it is nested
 * in: memory the driver freed (waiters are woken, elastic.c). */
void vgl_release(uint32_t device, uint64_t bytes);
/* The same for a reservation the driver never filled: nothing was freed. */
void vgl_release_unused(uint32_t device, uint64_t bytes);
/* Brings a charge of `charged` bytes on `device` to `reserved`, what the
 * driver says a pool of it holds: whatever the cap says, for the driver
 * already holds that memory (memory pools, graph memory). */
void vgl_follow_reserve(uint32_t device, uint64_t charged, uint64_t reserved);
/* Whether this process's limits can be enforced: its configuration is
 * usable, its regions are whole, and its slot is claimed (done here if not
 * yet), and the limits it was given by UUID name its devices (named_devices.c).
 * The one check before anything is counted; false: fail closed. */
bool vgl_ready(void);
/* Whether a region file lost pages under our mapping (region_guard.c):
 * nothing can be accounted any more.  Said once. */
bool vgl_region_lost(void);
/* The capped view of a device whose driver reports (free, total): total
 * becomes the cap, free what the container has left under it, used its
 * usage.  False: no cap, leave the driver's numbers. */
struct vgl_view {
    uint64_t free_bytes, total_bytes, used_bytes;
};
bool vgl_capped_view(int device, struct vgl_view *v);

/* charge.c — a charge around one driver call. */
/* A reservation; `device` < 0 when nothing was charged. */
struct vgl_charge {
    int device;
    uint64_t bytes;
    const char *call; /* for the refusal's log line */
    int refused_on;   /* the device of a refusal that memory freed may mend (a cap, others'
                         guarantees, a full device); -1: none */
};
/* Reserves `bytes` on `device` (-1: the current context's) before the driver
 * is called.  CUDA_ERROR_OUT_OF_MEMORY when they do not fit (logged);
 * CUDA_SUCCESS with c->device < 0 when there is no current context: the
 * driver will say so itself. */
CUresult vgl_charge_begin(const char *call, int device, uint64_t bytes, struct vgl_charge *c);
/* The size of the allocation an import made at `ptr` (an opened IPC pointer,
 * an imported pool pointer), as the driver says it; 0, said in one line, when
 * it will not say: the caller then lets the import go, never holds it
 * uncounted. */
size_t vgl_import_size(const char *call, CUdeviceptr_v2 ptr);
/* Moves the reservation to what the driver actually took.  Growth must fit
 * under the cap unless `force` (memory the driver already holds); false: it
 * did not, and nothing changed. */
bool vgl_charge_settle(struct vgl_charge *c, uint64_t actual, bool force);
/* After the driver call: on success the charge is recorded under (kind,
 * key), on failure returned. */
void vgl_charge_end(struct vgl_charge *c, CUresult rc, enum vgl_allocation_kind kind, uint64_t key);
/* Returns a reservation that nothing came of. */
void vgl_charge_cancel(struct vgl_charge *c);
/* After vgl_charge_begin refused, or vgl_charge_end returned the charge of
 * an allocation the driver refused (`rc`): true when the allocation is to be
 * tried again, after waiting for memory (the container's memory wait); false
 * when it ends with `rc`.  Called with no lock held: a wait would hold it. */
bool vgl_charge_retry(struct vgl_charge *c, CUresult rc);
/* An empty charge on `device`, for memory the driver took beyond what was
 * reserved (a pool's growth), to be settled with `force`. */
void vgl_charge_open(struct vgl_charge *c, const char *call, int device);
/* Ends a charge whose bytes stay counted, recorded by the caller itself. */
void vgl_charge_keep(struct vgl_charge *c);
/* Returning a charge when its memory is freed, in two steps around the
 * driver's call: the record is taken out before it (the driver may hand the
 * freed handle to another thread at once, which records it anew), and the
 * bytes are returned after it, or the record put back if the driver refused. */
struct vgl_uncharge {
    enum vgl_allocation_kind kind;
    bool held; /* a record was taken */
    struct vgl_allocation a;
};
void vgl_uncharge_begin(enum vgl_allocation_kind kind, uint64_t key, struct vgl_uncharge *u);
void vgl_uncharge_end(struct vgl_uncharge *u, CUresult rc);
/* overhead.c — the driver's own cost for a process (context, modules, rounding). */
/* Charges what NVML shows for this process on `device` beyond its
 * allocations, before `bytes` more are reserved: looks at most every 200 ms,
 * or every time when that would leave the container near its cap.  Needs the
 * slot, and a current context on `device` where the process must find
 * itself in the driver's list. */
void vgl_overhead_check(int device, uint64_t bytes);
/* The same, now (a context was just made or undone). */
void vgl_overhead_check_now(int device);
/* False when the driver's cost for this process on `device` cannot be read
 * (no NVML) while a cap applies there: its allocations and contexts are then
 * refused, never let past the cap uncounted. */
bool vgl_overhead_countable(int device);

/* devices.c — the container's devices as NVML numbers them. */
/* Container index i (CUDA's ordinal, the region's device i) is NVML's handle[i],
 * the driver's index nvml_index[i]. */
struct vgl_visible {
    unsigned int count;
    nvmlDevice_t handle[VGL_MAX_DEVICES];       /* a GPU's, or a MIG device's */
    unsigned int nvml_index[VGL_MAX_DEVICES];   /* the GPU's; a MIG device's parent's */
    nvmlDevice_t parent[VGL_MAX_DEVICES];       /* a MIG device's GPU; NULL for a GPU */
};
/* False while NVML cannot say (not initialised). */
bool vgl_visible_devices(struct vgl_visible *out);
/* The container's index of an NVML device, or -1: not one of its devices, or
 * unknown.  The GPU of a container's MIG device counts as that device: tools
 * that take nvmlDeviceGetHandleByIndex's GPU see the instance they were given. */
int vgl_container_device(nvmlDevice_t device);
/* The handle the driver answers for `device` in the container: the container's
 * MIG device for its GPU (whose own memory and process queries need MIG
 * monitoring rights a container lacks), else `device` itself. */
nvmlDevice_t vgl_container_handle(nvmlDevice_t device);
/* Binds CUDA device `device` to its UUID in the region (once per process):
 * for the views, and to apply a limit given for that UUID.  False: not yet
 * (no region, or CUDA cannot say). */
bool vgl_device_note(int device);
/* The same for every device CUDA has, once it is initialised (then no more). */
void vgl_devices_note_all(void);
/* What NVML makes of a UUID CUDA gave (enum vgl_uuid_kind: a GPU's, a MIG
 * device's, or unknown when NVML cannot say), and for a MIG device its GPU's
 * handle into `parent` (NULL where not found; `parent` may be NULL). */
uint32_t vgl_uuid_kind_of(const uint8_t uuid[16], nvmlDevice_t *parent);
/* A device's UUID as the driver names it, by its kind (GPU- when unknown). */
void vgl_format_device_uuid(const uint8_t uuid[16], uint32_t kind, char out[41]);

/* named_devices.c — limits given by UUID for devices the process does not see. */
/* Whether the limits given by UUID leave this process capped as asked:
 * checked once CUDA is initialised (it says then, once, what names no device
 * the process sees); false when they must be refused: a GPU in MIG mode named
 * instead of its MIG device, or nothing capped at all though limits were
 * given.  True until it can be checked. */
bool vgl_named_devices_hold(void);

/* nvml_utilization_hooks.c — what the real NVML says of other tenants. */
/* Whether a process outside the container ran kernels on container device
 * `device` in the last `window_us` (the driver's per-process samples); true
 * also when NVML cannot say (a borrowing container then keeps its share). */
bool vgl_others_busy(int device, unsigned long long window_us);

/* throttle.c — a container's compute budget on one device (region.h's budget
 * fields), drawn by every launch path.  No clock, no driver: testable alone. */
/* The share a device's launches are held to, in percent; 0: none (no cap, or 100). */
uint32_t vgl_throttle_share(const struct vgl_device_state *dev);
/* Refills the budget up to `now_ns` and, unless it is owing, takes `cost_ns`
 * (the launch's expected GPU time) from it: 0, the launch may start; else how
 * many ns to wait before asking again. */
int64_t vgl_throttle_admit(struct vgl_device_state *dev, uint64_t now_ns, int64_t cost_ns);
/* How long until the clock has paid what the container owes (0: nothing), charging nothing. */
int64_t vgl_throttle_owed(struct vgl_device_state *dev, uint64_t now_ns);
/* A launch charged `charged_ns` was measured at `measured_ns`: the difference is settled. */
void vgl_throttle_settle(struct vgl_device_state *dev, int64_t charged_ns, int64_t measured_ns);
/* A borrowing container runs a launch of `cost_ns` past its share: its debt is forgiven. */
void vgl_throttle_lend(struct vgl_device_state *dev, int64_t cost_ns);

/* pool_hooks.c */
/* After a free of a pointer imported into a pool (its VGL_ALLOC_IMPORTED
 * record, taken out before the driver was asked): the pool's charge follows
 * what the free left it, or the record is put back if the driver refused. */
void vgl_pool_import_freed(const struct vgl_allocation *imported, CUresult rc);

/* graph_memory_hooks.c */
/* Launches `exec` with `launch` (cuGraphLaunch or its _ptsz variant): when its
 * graph has alloc nodes, charged the growth of the graph memory pool, and
 * refused with CUDA_ERROR_OUT_OF_MEMORY when that may pass the cap. */
CUresult vgl_graph_launch(CUgraphExec exec, CUstream stream, CUresult (*launch)(CUgraphExec, CUstream));

/* share.c — the budgets a launch on a device draws from: the process's
 * region's and each it is nested in. */
/* Whether any of them holds a share on `device`. */
bool vgl_share_limits(int device);
/* 0: every budget admitted a launch of `cost_ns` and was charged it; else how
 * many ns to wait before asking again, nothing charged. */
int64_t vgl_share_admit(int device, uint64_t now_ns, int64_t cost_ns);
/* How long until every budget has been paid what it is owed (0: none is owed). */
int64_t vgl_share_owed(int device, uint64_t now_ns);
/* How long past its debt a launch of `cost_ns` sleeps, so that launches go in bursts. */
int64_t vgl_share_resume_ns(int device, int64_t cost_ns);
/* Launches charged `charged_ns` took `used_ns` of GPU time: the difference is
 * settled, and the time counted as the container's. */
void vgl_share_used(int device, int64_t charged_ns, int64_t used_ns);
/* A launch waited `ns` for budget. */
void vgl_share_waited(int device, uint64_t ns);

/* beacons.c — the node's board and the containers' beacons, as a container's
 * processes see them: for priorities and elastic memory. */
/* `path` mapped, if it is a regular file of `size` bytes; NULL and errno if not. */
void *vgl_map_file(const char *path, size_t size, bool writable);
/* What the process found of the container's place on the node's board. */
enum vgl_board_place {
    VGL_PLACE_NONE,        /* no board is named (or the region file cannot be looked at) */
    VGL_PLACE_BAD_PATH,    /* the board named is no absolute path */
    VGL_PLACE_UNREADABLE,  /* the file named is no board this process can read */
    VGL_PLACE_NO_ROW,      /* the board has no row for the container's region file */
    VGL_PLACE_ROW,         /* it has: the functions below may be called */
};
/* Looked at once, the first time it is asked with a region mapped (else NONE, and asked again). */
enum vgl_board_place vgl_board_place(void);
/* The board's path, for what is said of it. */
const char *vgl_board_path(void);
/* Which of the process's links the container's row is for. */
uint32_t vgl_board_link(void);
/* The board, mapped read-only. */
const struct vgl_board *vgl_board_mapped(void);
/* The container's row now (a setter may have moved it); NULL: gone.  Its
 * index, or the last one seen when gone, into *index (may be NULL). */
const struct vgl_board_row *vgl_board_own_row(uint32_t *index);
/* The container's beacon, mapped for writing and guarded (when first asked
 * for); NULL when it cannot be, and why into *why.  Its path into *path. */
struct vgl_beacon *vgl_beacon_own(const char **path, const char **why);
/* The same, open for reading (its waits' bytes are locked through it), once
 * vgl_beacon_own has answered; -1: none. */
int vgl_beacon_own_fd(void);
/* The beacon of row `row`, keyed `key`, as it is now, into *out: false if it
 * cannot be read (gone, not a regular file of a beacon's size, not a beacon). */
bool vgl_beacon_read(uint32_t row, uint64_t key, struct vgl_beacon *out);
/* The address of its wake word for `device`, for the kernel's futex alone
 * (never read through it); NULL: none. */
const uint32_t *vgl_beacon_frees_word(uint32_t row, uint64_t key, uint32_t device);
/* Whether a waiter of its holds the byte of its waits on `device` (waits.c):
 * 1 yes, 0 no, -errno: cannot be asked. */
int vgl_beacon_waits_held(uint32_t row, uint64_t key, uint32_t device);

/* priority_model.c — what a launch does about priorities, from what the
 * other containers' beacons say.  No clock, no files: testable alone. */
/* What the other containers on a device have launched there (the node's clock, vgl_node_clock_ns). */
struct vgl_priority_view {
    uint64_t higher_ns;             /* until when the work of those above lasts; 0: none has any */
    uint64_t lower_ns;              /* ... of those below, as they claim it */
    bool higher_shares;             /* one above has launched on the device */
};
/* A process's launches held back (the caller's lock guards it). */
struct vgl_priority_hold {
    uint64_t held_since_ns;         /* 0: none is held */
    uint64_t last_floor_ns;         /* the last launch let go as the floor */
};
/* 0: a launch may go now; else how many ns to wait before asking again
 * (at most vgl_timings.priority_max_wait_ns).  `own_until_ns`: until when the
 * container's own launched work lasts, by its kernels' costs; `behind`: the
 * driver says the process's work is not done where that estimate, a
 * lookahead ago, said it would be. */
int64_t vgl_priority_wait(const struct vgl_priority_view *v, uint64_t own_until_ns, uint64_t now_ns,
                          bool behind, struct vgl_priority_hold *hold);
/* Until when the container's work lasts once a launch of `cost_ns` goes now. */
uint64_t vgl_priority_until(const struct vgl_priority_view *v, uint64_t own_until_ns, uint64_t now_ns,
                            int64_t cost_ns);

/* priority.c — priority between tenants on one device (vgpulimit/board.h). */
/* Whether the container has a row in the node's priority board (looked at
 * once, when the region is mapped). */
bool vgl_priority_takes_part(void);
/* 0: a launch of `cost_ns` on `device` may go now (and is written in the
 * container's beacon); else how many ns to wait, for a container of a higher
 * priority, before asking again.  Only while vgl_priority_takes_part(). */
int64_t vgl_priority_admit(int device, uint64_t now_ns, int64_t cost_ns, bool quiet);
/* After the driver's call for a launch vgl_priority_admit let go on
 * `stream` (current context): `went`, the driver took it.  `quiet` (as
 * vgl_busy_enter's: a stream capture is open): the driver is asked nothing. */
void vgl_priority_launched(int device, CUstream stream, bool went, bool quiet);
/* A launch on `device` waited `ns` for higher priorities. */
void vgl_priority_yielded(int device, uint64_t ns);

/* elastic_model.c — elastic memory's decisions (docs/memory.md), with no
 * files, clocks or driver: testable alone (tests/c/elastic_model_test.c). */
/* Another container on the device: what the board guarantees it, and what it uses. */
struct vgl_elastic_other {
    uint64_t guarantee_bytes;
    uint64_t used_bytes;
};
/* Memory guaranteed to the others and not in use by them: the sum of their
 * guarantees less their use, each counted from 0 upward. */
uint64_t vgl_elastic_held_for_others(const struct vgl_elastic_other *others, uint32_t n);
/* Whether `bytes`, which bring the container's use to `used_after`, may be
 * used: always within its `request`; past it only if the device has them
 * free beyond what is held for others (`physical_free`: the driver's free,
 * before these bytes are taken). */
bool vgl_elastic_may_use(uint64_t used_after, uint64_t bytes, uint64_t request, uint64_t physical_free,
                         uint64_t held_for_others);
/* What a container's views report free under its `cap`: what it may take
 * now without waiting.  Up to the rest of its request, what the device has
 * free; past it, what the device has free beyond what is held for others;
 * never past its cap.  With the request at the cap, this is the capped
 * view without elastic memory: the cap less the use, at most the device's free. */
uint64_t vgl_elastic_free(uint64_t cap, uint64_t used, uint64_t request, uint64_t physical_free,
                          uint64_t held_for_others);
/* A waiting allocation: its container's priority rank (higher first) and
 * when it began to wait. */
struct vgl_waiter {
    uint32_t rank;
    uint64_t since_ns;
};
/* Whether `me` is served before every one of `others`: a higher rank
 * first, then the older (an equal claim does not hold it back). */
bool vgl_elastic_first(const struct vgl_waiter *me, const struct vgl_waiter *others, uint32_t n);

/* elastic.c — elastic memory: the guarantee on the board, borrowing above
 * it, waiting for memory (docs/memory.md). */
/* Whether the container has a row for elastic memory in the node's board. */
bool vgl_elastic_takes_part(void);
/* After `bytes` were reserved on `device` (of `total` bytes, the process's
 * cap there `cap`) in the ledger, before the driver is asked: 0 when they may be used; -ENOMEM when the part past the
 * container's request needs memory that others use or are guaranteed
 * (counted; the caller returns the reservation). */
int vgl_elastic_admit(int device, uint64_t bytes, uint64_t total, uint64_t cap, bool count);
/* The process attached: its container's beacon names every device it has
 * bound, so that others hold its guarantee there before it allocates. */
void vgl_elastic_attached(void);
/* The container's use of `device` changed: its beacon says so (less
 * `freeing`, bytes about to be freed), and a release wakes the node's waiters. */
void vgl_elastic_changed(int device, uint64_t freeing, bool released);
/* A thread's wait for memory, across the tries of one allocation. */
struct vgl_memory_wait {
    int device;                     /* -1: not waiting */
    bool armed;                     /* `seen` holds the wake words as they were before the last try */
    bool within_request;            /* its bytes are within the container's request: not queued */
    uint64_t since_ns, deadline_ns; /* the node's clock */
    uint64_t total_bytes;           /* the device's */
    uint32_t words;
    uint32_t seen[VGL_BOARD_ROWS];  /* each row's wake word, the container's own included */
    const uint32_t *word[VGL_BOARD_ROWS];
    struct vgl_memory_wait *next;   /* the process's next wait (elastic.c) */
};
/* An allocation of `bytes` on `device` was refused: true to try it again
 * (memory may be there now), false when no wait is set or the wait is over
 * (then the wait is ended and counted as a timeout). */
bool vgl_elastic_wait(struct vgl_memory_wait *w, int device, uint64_t bytes, uint64_t total, uint64_t cap);
/* The allocation a wait was for is done: granted, or refused (`timed_out`). */
void vgl_elastic_wait_end(struct vgl_memory_wait *w, bool timed_out);
/* The capped view's free on `device` (vgl_elastic_free), given the
 * container's `cap` and `used` and the driver's `physical_free`: false
 * when the container takes no part. */
bool vgl_elastic_view_free(int device, uint64_t total, uint64_t cap, uint64_t used, uint64_t physical_free,
                           uint64_t *free_bytes);

/* cost_model.c — what a launch costs on the GPU, from measurements fed to it,
 * and how often to measure.  No driver, no clock, no lock: testable alone
 * (tests/c/cost_model_test.c); the caller holds its own lock. */
enum { VGL_COSTS = 256 };           /* launch targets whose cost a process remembers */
struct vgl_cost {
    const void *key;                /* a function or a graph */
    int64_t ns;                     /* what a launch is charged: the least of the two windows'; 0: being measured */
    int64_t window_ns;              /* the least of the current window */
    int64_t earlier_ns;             /* the least of the window before */
    uint64_t window_from;           /* when the current window began */
    uint32_t window_samples;        /* its measurements */
    int64_t last[2];                /* its last two measurements (not unions of runs), for the median of three */
    uint64_t measuring_ns;          /* ns 0: when its first measurement began */
    uint32_t measured;              /* measurements so far, counted up to the first few */
    uint32_t pending;               /* launches held back until the first few measurements */
    int64_t pending_charged_ns;     /* ... what they were charged */
    int device;                     /* ... on this device */
};
struct vgl_costs {
    struct vgl_cost slot[VGL_COSTS]; /* by key, hashed: a key may take another's place */
};
/* Launches charged charged_ns, all told, that are settled at used_ns. */
struct vgl_settlement {
    int device;
    int64_t charged_ns, used_ns;
};
/* What a launch of `key` is known to cost (*ns); false: never measured (*ns
 * is vgl_timings.first_cost_ns). */
bool vgl_cost_known(const struct vgl_costs *costs, const void *key, int64_t *ns);
/* Whether a launch of `key`, never measured, is measured (else another
 * launch's first measurement is under way).  *evicted: launches of a key
 * whose place it took. */
bool vgl_cost_measure_first(struct vgl_costs *costs, const void *key, int device, uint64_t now_ns,
                            struct vgl_settlement *evicted);
/* A launch of `key` charged `charged_ns`, measured or not: true, it is held
 * back, to be settled at the kernel's cost once that has been measured a few
 * times; false: settle it now. */
bool vgl_cost_held_back(struct vgl_costs *costs, const void *key, int64_t charged_ns);
/* Where a measurement was read. */
enum vgl_clock {
    VGL_ON_GPU,                     /* between two events, one launch: never too short */
    VGL_ON_HOST,                    /* from where its launch returned (vgl_interval_start): may be cut short */
    VGL_OVER_RUNS,                  /* a union of runs per launch (several streams): may hold idle gaps */
};
/* A measurement: a launch of `key` took `per_launch_ns`, read as `clock` says.  Returns whether the
 * cost moved up (1), down (-1) by more than an eighth, or held (0).
 * *settled: launches held back for the kernel's first few measurements (or
 * of a key whose place it took). */
int vgl_cost_learn(struct vgl_costs *costs, const void *key, int64_t per_launch_ns, enum vgl_clock clock,
                   uint64_t now_ns, struct vgl_settlement *settled);
void vgl_costs_forget(struct vgl_costs *costs);
/* Where a launch's interval begins on the GPU's clock: at its start event's
 * time `event_ns`, or, if that event had completed when the host looked at
 * `recorded_ns` (0: it had not), as much later as the host took from then to
 * the launch's return, `returned_ns` (both vgl_node_clock_ns). */
int64_t vgl_interval_start(int64_t event_ns, uint64_t recorded_ns, uint64_t returned_ns);
/* The least a launch call took, the driver's CPU time undisturbed, over two cost windows. */
struct vgl_call_time {
    int64_t window_ns, earlier_ns;
    uint64_t window_from;           /* 0: no call timed yet */
};
/* A measured launch was called at `called_ns` and returned at `returned_ns`
 * (vgl_node_clock_ns): where its kernel had reached the GPU as far as a
 * measurement may count, for vgl_interval_start.  That is `returned_ns`, or
 * earlier by as much as the call took longer than the least of recent ones:
 * a thread descheduled in it, after the driver had queued the kernel, would
 * count the kernel short (0: not timed, `returned_ns` as it is). */
uint64_t vgl_call_returned(struct vgl_call_time *calls, uint64_t called_ns, uint64_t returned_ns);
/* How often a context's launches are measured. */
struct vgl_cadence {
    uint32_t since;                 /* launches since the last measurement */
    uint64_t sampled_ns;            /* ... taken then */
    uint32_t every;                 /* launches before the next */
    uint32_t held;                  /* measurements in a row that moved no cost up */
};
/* Whether the next launch, of a kernel known to cost `cost_ns` (0: not
 * known), is measured (vgl_node_clock_ns `now_ns`). */
bool vgl_cadence_due(const struct vgl_cadence *c, uint64_t now_ns, int64_t cost_ns);
void vgl_cadence_skipped(struct vgl_cadence *c);
void vgl_cadence_sampled(struct vgl_cadence *c, uint64_t now_ns);
/* A kernel not measured yet was launched: measurements follow one another. */
void vgl_cadence_unknown(struct vgl_cadence *c);
/* A measurement moved a cost as vgl_cost_learn returned. */
void vgl_cadence_learnt(struct vgl_cadence *c, int moved);

/* The union of a context's runs, read back as times from one reference event. */
struct vgl_union {
    int64_t covered_ns;             /* busy time is counted up to here */
    int64_t allowance_ns;           /* what runs are known to cost and were not counted */
    int64_t group_start;            /* where the runs since covered_ns last jumped ahead began */
    uint32_t group_launches;        /* their launches (0: none) */
    const void *group_key;          /* the one target they launched, or NULL for several */
    int64_t group_gpu_start;        /* where they began on the GPU's clock alone: their lesson counts from there */
};
/* One run of launches on a stream: where it began and ended, from the reference. */
struct vgl_span {
    int64_t start_ns, end_ns;
    int64_t charged_ns;
    uint32_t launches;
    bool known;                     /* every launch was charged a measured cost */
    const void *key;                /* the one target launched, or NULL for several */
    /* Where its start event completed: start_ns, or earlier where start_ns
     * was moved to its launch's return on the host's clock (a launch timed
     * alone on an idle stream), which a descheduled thread makes late. */
    int64_t gpu_start_ns;
};
/* A group of overlapping runs that launched `key` (NULL: several) took per_launch_ns a launch. */
struct vgl_lesson {
    const void *key;
    int64_t per_launch_ns;
};
/* A run read back: the busy time it adds (at most what its launches are
 * known to cost, if known).  *taught: it began after the group before it had
 * ended, which took *lesson a launch. */
int64_t vgl_union_add(struct vgl_union *u, const struct vgl_span *r, struct vgl_lesson *lesson, bool *taught);
/* The group read back so far ends (nothing of it is still to be read): false
 * if there was none, else what it took a launch. */
bool vgl_union_close(struct vgl_union *u, struct vgl_lesson *lesson);
/* A new reference: times start again from 0 (after vgl_union_close). */
void vgl_union_restart(struct vgl_union *u);
/* busy_time.c's runs: whether one of `launches` charged `charged_ns` (all
 * told, one at least) is long enough to close. */
bool vgl_run_full(int64_t charged_ns, uint32_t launches);
/* Whether runs closed on a context of `streams` follow one another (each
 * stream's next beginning where its last ended), from a reference event
 * recorded `reference_age_ns` ago. */
bool vgl_runs_follow(uint32_t streams, uint64_t reference_age_ns);
/* Whether a measurement of a launch (its cost `cost_ns`, `known` or not)
 * asks if its start event completed at once, its stream idle. */
bool vgl_idle_asked(bool known, int64_t cost_ns);
/* When a run closed at `closed_ns` is first asked whether it is done. */
uint64_t vgl_run_due(bool known, int64_t charged_ns, uint64_t closed_ns);
/* When a run closed at `closed_ns`, and not done at `now_ns`, is asked again. */
uint64_t vgl_run_poll(bool known, uint64_t closed_ns, uint64_t now_ns);

/* busy_time.c — the GPU time a process's kernels take, measured in samples.
 * The gate (launch_hooks.c) calls, for each launch, in this order:
 * vgl_busy_enter, vgl_busy_wait while it waits for budget, vgl_busy_begin
 * once admitted, the driver, vgl_busy_leave.  struct vgl_launch is what they
 * keep of it: the gate reads device, cost_ns and known; only busy_time.c
 * writes it.  What it asks of the driver is passed in, as throttle.c is given
 * its clock; what each call settled is handed back, for the gate to give the
 * share (vgl_share_used): busy_time.c calls neither the driver nor the share,
 * and is tested alone with a fake (tests/c/busy_time_test.c). */
/* The driver's events and the node's clock, as busy_time.c uses them: each
 * answers as the cuEvent* call of its name (the driver's, launch_hooks.c). */
struct vgl_events {
    CUresult (*create)(CUevent *event);                         /* cuEventCreate, CU_EVENT_DEFAULT */
    CUresult (*record)(CUevent event, CUstream stream);         /* cuEventRecord */
    CUresult (*query)(CUevent event);                           /* cuEventQuery */
    CUresult (*elapsed)(float *ms, CUevent start, CUevent end); /* cuEventElapsedTime */
    CUresult (*destroy)(CUevent event);                         /* cuEventDestroy */
    uint64_t (*now_ns)(void);                                   /* vgl_node_clock_ns */
};
/* Launches one call settled: what they were charged and took, summed by
 * device, one entry each (n of them). */
struct vgl_settlements {
    uint32_t n;
    struct vgl_settlement at[VGL_MAX_DEVICES];
};
struct vgl_tracker;
/* One launch, from vgl_busy_enter to vgl_busy_leave. */
struct vgl_launch {
    int device;
    bool asked;                     /* it asked to be resumed (vgl_resume_ask) */
    const void *key;                /* what it launches: a function or a graph */
    CUstream stream;
    int64_t cost_ns;                /* what it is charged */
    bool known;                     /* that is a measured cost */
    bool measured;                  /* it joins a run of its stream */
    bool timed;                     /* ... on several streams, one that times it alone */
    uint64_t called_ns;             /* measured, first in its run: the clock just before the driver's call */
    struct vgl_tracker *tracker;    /* its context's; NULL: not measured */
    int index;                      /* its stream's in the tracker; -1: none */
};
/* The device of a context whose launches are measured; -1: none is. */
int vgl_busy_device(CUcontext ctx);
/* Before a launch of `key` on `stream` in `ctx` (current, on `device`): what
 * it is charged.  `ev`: the context's events (its first launch's are kept).
 * `quiet`: a stream capture is open, and the shim's own event queries could
 * end it (measurements are neither read nor taken).  Each call sets *out to
 * what it settled. */
void vgl_busy_enter(struct vgl_launch *l, const struct vgl_events *ev, CUcontext ctx, int device, const void *key,
                    CUstream stream, uint64_t now_ns, bool quiet, struct vgl_settlements *out);
/* While it waits for budget: reads back what is done; `sleeps` first ends the
 * process's runs, so that their spans hold no sleep (unless `quiet`). */
void vgl_busy_wait(struct vgl_launch *l, uint64_t now_ns, bool sleeps, bool quiet, struct vgl_settlements *out);
/* Admitted: opens a run on its stream if a sample is due (alone, on one
 * stream: its first event, and whether that completed at once). */
void vgl_busy_begin(struct vgl_launch *l, uint64_t now_ns, bool quiet, struct vgl_settlements *out);
/* After the driver call: a refused launch gives its charge back; one that
 * went joins its run (alone: ends it), or is settled at its kernel's cost
 * now, or held back with its kernel's first launches.  `quiet`: as above (a
 * run stays open rather than end with an event). */
void vgl_busy_leave(struct vgl_launch *l, bool launched, bool quiet, struct vgl_settlements *out);
/* `stream` is about to be destroyed: its open run ends now, its event
 * recorded while the stream is there (a measurement ended later, from
 * another thread, would record it on a destroyed stream). */
void vgl_busy_stream_ends(CUstream stream, struct vgl_settlements *out);
/* A stream capture is about to begin: the runs of `ctx` (current) end now,
 * their events recorded before it rather than into it. */
void vgl_busy_quiesce(CUcontext ctx, struct vgl_settlements *out);

/* context_hooks.c — the calling thread's current context, as launches ask it. */
/* The driver's answer, kept per thread until a hooked call may change it. */
CUresult vgl_current_context(CUcontext *ctx);
/* After a call that may have changed the calling thread's current context
 * (or, `everywhere`, ended a context some thread has current): asked again.
 * Returns `rc`, the call's result. */
CUresult vgl_context_changed(bool everywhere, CUresult rc);

/* The exported wrappers: the driver's own names and signatures. */
#define CU_HOOK(symbol, base, version, pt, params, args) \
    __attribute__((visibility("default"))) CUresult symbol params;
#define NVML_HOOK(symbol, params, args) \
    __attribute__((visibility("default"))) nvmlReturn_t symbol params;
#include "hooks.def"

#endif

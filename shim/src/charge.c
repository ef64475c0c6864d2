/* A charge around one driver call: reserve in the ledger before the driver
 * is asked, settle to what the driver actually took, return it on failure or
 * free.  The hooks of every allocation family (memory_hooks.c, pool_hooks.c,
 * vmm_hooks.c, array_hooks.c, graph_memory_hooks.c) go through here; the
 * driver's own cost for the process is charged first (overhead.c). */
#include <errno.h>

#include "internal.h"

/* The thread's wait for memory, across the tries of its allocation
 * (vgl_charge_retry).  Read at every allocation: in the static TLS block
 * (the shim is preloaded, never dlopened), not found by a call each time. */
static __thread struct vgl_memory_wait waiting __attribute__((tls_model("initial-exec"))) = {.device = -1};

/* `link`: the region whose cap refused (0 the process's own, then those it is
 * nested in); < 0: no limit could be enforced at all. */
static void log_refusal(const char *call, int device, uint64_t bytes, int link)
{
    static unsigned refusals;
    char asked[32], capped[32], used[32];
    if (link < 0 || device < 0 || vgl_region_lost()) {
        /* The reason was logged once, when it arose. */
        vgl_log_bounded(VGL_LOG_INFO, &refusals, "%s of %s refused: vgpulimit cannot enforce its "
                        "limits (see the error above)", call, vgl_format_bytes(bytes, asked, sizeof asked));
        return;
    }
    const struct vgl_region *region = vgl_link_at((uint32_t)link).region;
    vgl_log_bounded(VGL_LOG_WARN, &refusals, "%s of %s refused on device %d: cap %s, %s in use by "
                    "%s", call, vgl_format_bytes(bytes, asked, sizeof asked), device,
                    vgl_format_bytes(vgl_region_cap(region, device, vgl_device_total(device)), capped, sizeof capped),
                    vgl_format_bytes(region->devices[device].used_bytes, used, sizeof used),
                    link ? "the run this one is nested in" : "the container");
}

static CUresult begin(const char *call, int device, uint64_t bytes, struct vgl_charge *c)
{
    c->bytes = bytes;
    c->call = call;
    c->refused_on = -1;
    if (!vgl_ready()) {
        log_refusal(call, -1, bytes, -1);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (device < 0)
        device = vgl_current_device();
    if (device < 0)
        return CUDA_SUCCESS;
    if (device >= VGL_MAX_DEVICES) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_ERROR, &logged, "device %d is beyond the %d devices a region "
                        "accounts for; its allocations are refused", device, VGL_MAX_DEVICES);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* An allocation that would not fit is near the cap: the driver's figure
     * is read afresh before it is refused. */
    vgl_overhead_check(device, bytes);
    if (VGL_UNLIKELY(!vgl_overhead_countable(device))) {
        log_refusal(call, -1, bytes, -1);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint32_t refused;
    /* A refusal is counted once, at the first try; a wait's tries are not. */
    bool first = waiting.device < 0;
    int err = vgl_reserve((uint32_t)device, bytes, false, first, &refused);
    uint64_t total = err || VGL_LIKELY(!vgl_elastic_takes_part()) ? 0 : vgl_device_total(device);
    if (total && vgl_elastic_admit(device, bytes, total, vgl_device_cap(device, total), first) < 0) {
        vgl_release_unused((uint32_t)device, bytes);
        if (first) {
            static unsigned said;
            char asked[32];
            vgl_log_bounded(VGL_LOG_WARN, &said, "%s of %s refused on device %d: past the container's memory "
                            "request, and the device has no memory free that no other container is guaranteed",
                            call, vgl_format_bytes(bytes, asked, sizeof asked), device);
        }
        c->refused_on = device;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* A region may have been lost during the reservation itself: then it
     * counted into zeros that only we see (no need to return it there). */
    if (err == -ETIMEDOUT) {
        static unsigned said;
        char asked[32];
        vgl_log_bounded(VGL_LOG_ERROR, &said, "%s of %s refused: " VGL_LOCK_HELD_FMT, call,
                        vgl_format_bytes(bytes, asked, sizeof asked),
                        VGL_LOCK_HELD_ARGS(refused ? "the region this one is nested in" : vgl_config.region_path,
                                           vgl_link_at(refused).region));
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (err < 0 || VGL_UNLIKELY(vgl_region_lost())) {
        if (first)
            log_refusal(call, device, bytes, err < 0 ? (int)refused : -1);
        c->refused_on = err == -ENOMEM && !vgl_region_lost() ? device : -1;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->device = device;
    return CUDA_SUCCESS;
}

size_t vgl_import_size(const char *call, CUdeviceptr_v2 ptr)
{
    CUdeviceptr_v2 base;
    size_t size = 0;
    if (vgl_real.cuMemGetAddressRange_v2(&base, &size, ptr) == CUDA_SUCCESS && size)
        return size;
    static unsigned said;
    vgl_log_bounded(VGL_LOG_ERROR, &said, "%s refused: the driver does not say the size of the memory "
                    "imported, so it cannot be counted against the cap", call);
    return 0;
}

CUresult vgl_charge_begin(const char *call, int device, uint64_t bytes, struct vgl_charge *c)
{
    c->device = -1;
    c->refused_on = -1;
    vgl_charges_enter();
    CUresult rc = begin(call, device, bytes, c);
    if (c->device < 0)
        vgl_charges_leave();
    return rc;
}

bool vgl_charge_settle(struct vgl_charge *c, uint64_t actual, bool force)
{
    if (c->device < 0 || actual == c->bytes)
        return true;
    uint32_t device = (uint32_t)c->device;
    if (actual < c->bytes) {
        vgl_release_unused(device, c->bytes - actual);
    } else {
        uint32_t refused;
        if (vgl_reserve(device, actual - c->bytes, force, true, &refused) < 0) {
            log_refusal(c->call, c->device, actual, (int)refused);
            return false;
        }
    }
    c->bytes = actual;
    return true;
}

void vgl_charge_end(struct vgl_charge *c, CUresult rc, enum vgl_allocation_kind kind, uint64_t key)
{
    if (c->device < 0)
        return;
    /* The device is full: a wait may mend it (vgl_charge_retry). */
    c->refused_on = rc == CUDA_ERROR_OUT_OF_MEMORY ? c->device : -1;
    /* The driver refused (or we could not record it, so a free could never
     * return it: then the memory stays used but uncounted, which is the
     * lesser harm than counting it forever). */
    if (rc != CUDA_SUCCESS || !vgl_allocations_put(kind, key, c->device, c->bytes, 0))
        vgl_release_unused((uint32_t)c->device, c->bytes);
    else if (vgl_elastic_takes_part())
        vgl_elastic_changed(c->device, 0, false);
    c->device = -1;
    vgl_charges_leave();
}

bool vgl_charge_retry(struct vgl_charge *c, CUresult rc)
{
    if (VGL_LIKELY(waiting.device < 0) && (rc != CUDA_ERROR_OUT_OF_MEMORY || c->refused_on < 0))
        return false;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && c->refused_on >= 0) {
        uint64_t total = vgl_device_total(c->refused_on);
        return vgl_elastic_wait(&waiting, c->refused_on, c->bytes, total, vgl_device_cap(c->refused_on, total));
    }
    /* Done: granted, or refused for a reason no wait mends. */
    vgl_elastic_wait_end(&waiting, rc == CUDA_ERROR_OUT_OF_MEMORY);
    return false;
}

void vgl_charge_open(struct vgl_charge *c, const char *call, int device)
{
    vgl_charges_enter();
    *c = (struct vgl_charge){.device = device, .bytes = 0, .call = call};
}

void vgl_charge_keep(struct vgl_charge *c)
{
    if (c->device < 0)
        return;
    c->device = -1;
    vgl_charges_leave();
}

void vgl_charge_cancel(struct vgl_charge *c)
{
    if (c->device < 0)
        return;
    vgl_release_unused((uint32_t)c->device, c->bytes);
    c->device = -1;
    vgl_charges_leave();
}

void vgl_uncharge_begin(enum vgl_allocation_kind kind, uint64_t key, struct vgl_uncharge *u)
{
    u->kind = kind;
    vgl_charges_enter();
    u->held = vgl_self.slot && vgl_allocations_take(kind, key, &u->a);
    /* Before the driver frees it: others never see the container use less
     * than it does, and so never hold less of its guarantee than is unused. */
    if (u->held && vgl_elastic_takes_part())
        vgl_elastic_changed(u->a.device, u->a.bytes, false);
}

void vgl_uncharge_end(struct vgl_uncharge *u, CUresult rc)
{
    /* Refused, the memory is still held: so is its charge.  (Out of memory
     * to put the record back, the charge is returned all the same: a free
     * could never find it again.) */
    if (u->held && (rc == CUDA_SUCCESS || !vgl_allocations_restore(u->kind, &u->a)))
        vgl_release((uint32_t)u->a.device, u->a.bytes);
    u->held = false;
    vgl_charges_leave();
}


/* Limits given by UUID, kept in the region: the first process to see a
 * device binds it to its UUID (devices.c), and the device then takes the
 * limits given for that UUID, under the region lock (ledger.c) like every
 * other change of limits. */
#include <errno.h>
#include <string.h>

#include "internal.h"

static bool no_uuid(const uint8_t uuid[16])
{
    static const uint8_t zero[16];
    return memcmp(uuid, zero, sizeof zero) == 0;
}

/* Under the lock: device `d` takes what is given for its UUID. */
static void apply_uuid_limit(struct vgl_region *region, uint32_t d, const struct vgl_uuid_limit *u)
{
    struct vgl_device_state *dev = &region->devices[d];
    if (u->flags & VGL_UUID_MEMORY) {
        __atomic_store_n(&dev->limit.bytes, u->limit.bytes, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->limit.ppm, u->limit.ppm, __ATOMIC_RELAXED);
    }
    if (u->flags & VGL_UUID_CORES)
        __atomic_store_n(&dev->cores_pct, u->cores_pct, __ATOMIC_RELAXED);
    if (u->flags & VGL_UUID_REQUEST) {
        __atomic_store_n(&dev->request.bytes, u->request.bytes, __ATOMIC_RELAXED);
        __atomic_store_n(&dev->request.ppm, u->request.ppm, __ATOMIC_RELAXED);
    }
    __atomic_add_fetch(&region->generation, 1, __ATOMIC_RELEASE);
}

int vgl_region_bind_device(struct vgl_region *region, uint32_t device, const uint8_t uuid[16], uint32_t kind)
{
    if (device >= VGL_MAX_DEVICES || no_uuid(uuid) || kind > VGL_UUID_KIND_MIG)
        return -EINVAL;
    struct vgl_device_state *dev = &region->devices[device];
    if (memcmp(dev->uuid, uuid, sizeof dev->uuid) == 0) {
        /* A process that could not ask NVML bound it without its kind. */
        uint32_t unknown = VGL_UUID_KIND_UNKNOWN;
        if (kind != VGL_UUID_KIND_UNKNOWN)
            __atomic_compare_exchange_n(&dev->uuid_kind, &unknown, kind, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED);
        return 0;
    }
    int rc = vgl_ledger_lock(region);
    if (rc)
        return rc;
    if (no_uuid(dev->uuid)) {
        memcpy(dev->uuid, uuid, sizeof dev->uuid);
        __atomic_store_n(&dev->uuid_kind, kind, __ATOMIC_RELAXED);
        for (uint32_t i = 0; i < VGL_MAX_DEVICES; i++)
            if (region->by_uuid[i].flags && memcmp(region->by_uuid[i].uuid, uuid, 16) == 0)
                apply_uuid_limit(region, device, &region->by_uuid[i]);
        rc = 1;
    } else if (memcmp(dev->uuid, uuid, sizeof dev->uuid) != 0) {
        rc = -EEXIST;
    }
    vgl_ledger_unlock(region);
    return rc;
}

int vgl_region_set_uuid_limit(struct vgl_region *region, const struct vgl_uuid_limit *limit)
{
    if (no_uuid(limit->uuid) || limit->cores_pct > 100 || limit->flags == VGL_UUID_MIG ||
        limit->flags > (VGL_UUID_MEMORY | VGL_UUID_CORES | VGL_UUID_REQUEST | VGL_UUID_MIG))
        return -EINVAL;
    int rc = vgl_ledger_lock(region);
    if (rc)
        return rc;
    rc = -ENOSPC;
    struct vgl_uuid_limit *free_entry = NULL;
    for (uint32_t i = 0; i < VGL_MAX_DEVICES && rc == -ENOSPC; i++) {
        struct vgl_uuid_limit *u = &region->by_uuid[i];
        if (u->flags && memcmp(u->uuid, limit->uuid, 16) == 0) {
            *u = *limit;
            rc = 0;
        } else if (!u->flags && !free_entry) {
            free_entry = u;
        }
    }
    if (rc == -ENOSPC && free_entry && limit->flags) {
        *free_entry = *limit;
        rc = 0;
    } else if (rc == -ENOSPC && !limit->flags) {
        rc = 0; /* nothing to remove */
    }
    for (uint32_t d = 0; d < VGL_MAX_DEVICES && rc == 0; d++)
        if (memcmp(region->devices[d].uuid, limit->uuid, 16) == 0)
            apply_uuid_limit(region, d, limit);
    __atomic_add_fetch(&region->generation, 1, __ATOMIC_RELEASE);
    vgl_ledger_unlock(region);
    return rc;
}

/* Limits given by UUID that name no device this process sees.
 *
 * A limit by UUID applies to the CUDA ordinal whose UUID it is (devices.c
 * binds them), so one that names no device of the process caps nothing, and
 * must say so (docs/mig.md):
 *   - a GPU in MIG mode, named by its own UUID (the line nvidia-smi -L prints
 *     first), while the process sees one of its MIG devices: CUDA never shows
 *     such a GPU, only its MIG devices (docs/mig-facts.md §1.3), so the limit cannot be
 *     meant for anything else here.  Refused, naming the MIG devices to use:
 *     a cap spread over instances of other sizes would mean another thing on
 *     each;
 *   - any other device: a container's environment may name several devices,
 *     one per process or per step, so this is a warning -- unless nothing at
 *     all is capped while limits were given, which is refused.
 * Refused means fail closed: the process's allocations are refused (charge.c
 * asks vgl_ready, which asks here).  Checked once, when CUDA can say which
 * devices the process has. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

enum { UNCHECKED = 0, HOLD = 1, REFUSED = 2 };
enum { WHAT = VGL_UUID_MEMORY | VGL_UUID_CORES | VGL_UUID_REQUEST };

static int state = UNCHECKED;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* The process's devices, as CUDA numbers them. */
struct seen {
    unsigned count;
    uint8_t uuid[VGL_MAX_DEVICES][16];
    uint32_t kind[VGL_MAX_DEVICES];
    nvmlDevice_t parent[VGL_MAX_DEVICES]; /* a MIG device's GPU; NULL: none, or unknown */
};

static bool see(struct seen *s)
{
    int count;
    if (vgl_real.cuDeviceGetCount(&count) != CUDA_SUCCESS || count < 0)
        return false;
    s->count = count < VGL_MAX_DEVICES ? (unsigned)count : VGL_MAX_DEVICES;
    for (unsigned i = 0; i < s->count; i++) {
        CUuuid uuid;
        if (vgl_real.cuDeviceGetUuid_v2(&uuid, (int)i) != CUDA_SUCCESS)
            return false;
        memcpy(s->uuid[i], uuid.bytes, 16);
        s->kind[i] = vgl_uuid_kind_of(s->uuid[i], &s->parent[i]);
    }
    return true;
}

static bool is_gpu(nvmlDevice_t gpu, const uint8_t uuid[16])
{
    char text[NVML_DEVICE_UUID_BUFFER_SIZE];
    uint8_t bytes[16];
    return gpu && vgl_real.nvmlDeviceGetUUID(gpu, text, sizeof text) == NVML_SUCCESS &&
           vgl_parse_uuid(text, bytes) == 0 && memcmp(bytes, uuid, 16) == 0;
}

/* "MIG-a (this process's), MIG-b, ...": the MIG devices of `gpu`, into `out`. */
static void list_mig_devices(nvmlDevice_t gpu, const uint8_t mine[16], char *out, size_t len)
{
    unsigned max = 0;
    size_t n = 0;
    out[0] = '\0';
    if (!vgl_real.nvmlDeviceGetMaxMigDeviceCount || !vgl_real.nvmlDeviceGetMigDeviceHandleByIndex ||
        vgl_real.nvmlDeviceGetMaxMigDeviceCount(gpu, &max) != NVML_SUCCESS)
        max = 0;
    for (unsigned m = 0; m < max && n + 1 < len; m++) {
        nvmlDevice_t mig;
        char text[NVML_DEVICE_UUID_BUFFER_SIZE];
        uint8_t bytes[16];
        if (vgl_real.nvmlDeviceGetMigDeviceHandleByIndex(gpu, m, &mig) != NVML_SUCCESS ||
            vgl_real.nvmlDeviceGetUUID(mig, text, sizeof text) != NVML_SUCCESS || vgl_parse_uuid(text, bytes))
            continue;
        bool own = memcmp(bytes, mine, 16) == 0;
        int w = snprintf(out + n, len - n, "%s%s%s", n ? ", " : "", text, own ? " (this process's)" : "");
        n = w < 0 ? len : n + (size_t)w;
    }
}

enum named { SEEN, ITS_GPU, UNSEEN };

/* What the entry `u` of the region's table names: a device seen, the GPU of
 * seen MIG device *which, or nothing seen. */
static enum named named(const struct seen *s, const struct vgl_uuid_limit *u, unsigned *which)
{
    for (unsigned i = 0; i < s->count; i++)
        if (memcmp(s->uuid[i], u->uuid, 16) == 0)
            return SEEN;
    for (*which = 0; *which < s->count; ++*which)
        if (s->kind[*which] == VGL_UUID_KIND_MIG && is_gpu(s->parent[*which], u->uuid))
            return ITS_GPU;
    return UNSEEN;
}

static void seen_list(const struct seen *s, char *out, size_t len)
{
    size_t n = 0;
    out[0] = '\0';
    for (unsigned i = 0; i < s->count && n + 1 < len; i++) {
        char text[41];
        vgl_format_device_uuid(s->uuid[i], s->kind[i], text);
        int w = snprintf(out + n, len - n, "%s%s", i ? ", " : "", text);
        n = w < 0 ? len : n + (size_t)w;
    }
}

static int check(const struct vgl_region *region, const struct seen *s)
{
    unsigned asked = 0, applied = 0;
    bool refused = false;
    char given[41], seen[256];
    seen_list(s, seen, sizeof seen);
    for (unsigned e = 0; e < VGL_MAX_DEVICES; e++) {
        struct vgl_uuid_limit u = region->by_uuid[e];
        if (!(u.flags & WHAT))
            continue;
        asked++;
        unsigned i;
        enum named what = named(s, &u, &i);
        (u.flags & VGL_UUID_MIG ? vgl_format_mig_uuid : vgl_format_uuid)(u.uuid, given);
        if (what == SEEN) {
            applied++;
        } else if (what == UNSEEN) {
            vgl_log(VGL_LOG_WARN, "the limits given for %s apply to no device of this process, which sees %s",
                    given, s->count ? seen : "none");
        } else {
            char migs[512];
            list_mig_devices(s->parent[i], s->uuid[i], migs, sizeof migs);
            vgl_log(VGL_LOG_ERROR, "the limits given for %s would cap nothing: that GPU is in MIG mode, and "
                    "CUDA shows its MIG devices, never the GPU; give them for its MIG device instead (%s); "
                    "device memory allocations are refused", given, migs);
            refused = true;
        }
    }
    bool capped = applied > 0;
    for (unsigned i = 0; i < s->count && !capped; i++) {
        const struct vgl_device_state *dev = &region->devices[i];
        capped = dev->limit.bytes || dev->limit.ppm || dev->cores_pct;
    }
    if (asked && !capped && !refused) {
        vgl_log(VGL_LOG_ERROR, "none of the limits given by UUID applies to a device of this process "
                "(it sees %s), and nothing else caps it; device memory allocations are refused",
                s->count ? seen : "none");
        refused = true;
    }
    return refused ? REFUSED : HOLD;
}

bool vgl_named_devices_hold(void)
{
    int now = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (VGL_LIKELY(now != UNCHECKED))
        return now == HOLD;
    pthread_mutex_lock(&lock);
    struct seen s = {0};
    now = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (now == UNCHECKED && vgl_self.region && see(&s)) {
        now = check(vgl_self.region, &s);
        __atomic_store_n(&state, now, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
    return now != REFUSED;
}

static void forget_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
}
VGL_AFTER_FORK(forget_in_child)

/* The container's devices as NVML numbers them.
 *
 * The region counts device i as CUDA numbers it inside the container (after
 * CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER).  NVML ignores both and numbers
 * every GPU of the machine in PCI order, so its handles are mapped onto
 * CUDA's ordinals here:
 *   - by UUID, once CUDA is initialised in the process: ordinal i is the NVML
 *     device whose UUID cuDeviceGetUuid_v2 gives for i (a GPU's, or a MIG
 *     device's).  This is exact.
 *   - before that, from CUDA_VISIBLE_DEVICES as CUDA would read it: UUIDs
 *     ("GPU-…", a unique prefix is enough) exactly, indices in NVML's PCI
 *     order (CUDA's own order with CUDA_DEVICE_ORDER=PCI_BUS_ID, and on a
 *     machine of identical GPUs); the list ends at the first entry CUDA would
 *     reject (unknown), and a device listed twice leaves none.  Unset: every
 *     device.
 * A GPU in MIG mode is no CUDA device: CUDA shows one of its MIG devices (its
 * first), and a process one MIG device at most; a list of MIG UUIDs ("MIG-…",
 * a unique prefix is enough) gives the first that names one (docs/mig-facts.md §1.3,
 * simgpu/devices.c).  A MIG device's NVML index is its parent's, the GPU
 * nvmlDeviceGetHandleByIndex gives in such a container.
 * The shim never calls cuInit for this: a process that initialises CUDA
 * before fork() cannot use CUDA in the child, which is why frameworks ask
 * NVML first. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The real libraries' functions, spelt apart from the hooks of the same names
 * (nvml_device_hooks.c calls into this file): every call here goes to the
 * real library, never to a hook, and no reader (nor a call graph) should
 * take it for one. */
#define REAL(fn) (vgl_real.fn)

enum { UUID_TEXT_LEN = 41 }; /* "GPU-" + 36 + NUL, as vgl_format_uuid writes it */

static struct {
    pthread_mutex_t lock;
    struct vgl_visible devices;
    bool known;
    bool from_cuda; /* final: CUDA's own numbering */
    bool mig_bound; /* a MIG device named in CUDA_VISIBLE_DEVICES is bound to its UUID */
} cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Device i of `out` is `handle`: a GPU, or a MIG device (its parent found). */
static bool set_device(struct vgl_visible *out, unsigned i, nvmlDevice_t handle, bool mig)
{
    out->handle[i] = handle;
    out->parent[i] = NULL;
    if (mig && (!REAL(nvmlDeviceGetDeviceHandleFromMigDeviceHandle) ||
                REAL(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)(handle, &out->parent[i]) != NVML_SUCCESS))
        return false;
    return REAL(nvmlDeviceGetIndex)(mig ? out->parent[i] : handle, &out->nvml_index[i]) == NVML_SUCCESS;
}

/* False while CUDA is not initialised (cuDeviceGetCount says so without
 * initialising anything) or a UUID has no NVML device. */
static bool from_cuda(struct vgl_visible *out)
{
    int count;
    if (REAL(cuDeviceGetCount)(&count) != CUDA_SUCCESS || count < 0)
        return false;
    out->count = 0;
    for (int i = 0; i < count && i < VGL_MAX_DEVICES; i++) {
        CUuuid uuid;
        char text[UUID_TEXT_LEN];
        nvmlDevice_t handle;
        if (REAL(cuDeviceGetUuid_v2)(&uuid, i) != CUDA_SUCCESS)
            return false;
        vgl_format_uuid((const uint8_t *)uuid.bytes, text);
        bool mig = REAL(nvmlDeviceGetHandleByUUID)(text, &handle) != NVML_SUCCESS;
        if (mig) {
            vgl_format_mig_uuid((const uint8_t *)uuid.bytes, text);
            if (REAL(nvmlDeviceGetHandleByUUID)(text, &handle) != NVML_SUCCESS)
                return false;
        }
        if (!set_device(out, (unsigned)i, handle, mig))
            return false;
        out->count++;
    }
    return true;
}

/* GPU `index`'s MIG device `mig_index`, if it has one there. */
static bool mig_device(unsigned index, unsigned mig_index, nvmlDevice_t *mig)
{
    nvmlDevice_t gpu;
    return REAL(nvmlDeviceGetMigDeviceHandleByIndex) &&
           REAL(nvmlDeviceGetHandleByIndex_v2)(index, &gpu) == NVML_SUCCESS &&
           REAL(nvmlDeviceGetMigDeviceHandleByIndex)(gpu, mig_index, mig) == NVML_SUCCESS;
}

/* How many MIG device indices GPU `index` has; 0: it is not in MIG mode. */
static unsigned mig_slots(unsigned index)
{
    nvmlDevice_t gpu;
    unsigned current = 0, pending, max = 0;
    if (!REAL(nvmlDeviceGetMigMode) || !REAL(nvmlDeviceGetMaxMigDeviceCount) ||
        REAL(nvmlDeviceGetHandleByIndex_v2)(index, &gpu) != NVML_SUCCESS ||
        REAL(nvmlDeviceGetMigMode)(gpu, &current, &pending) != NVML_SUCCESS || current != 1 ||
        REAL(nvmlDeviceGetMaxMigDeviceCount)(gpu, &max) != NVML_SUCCESS)
        return 0;
    return max;
}

/* The one MIG device whose UUID starts with `prefix` (len bytes). */
static bool mig_by_uuid_prefix(const char *prefix, size_t len, unsigned count, nvmlDevice_t *found)
{
    int matches = 0;
    for (unsigned i = 0; i < count; i++)
        for (unsigned m = 0, slots = mig_slots(i); m < slots; m++) {
            nvmlDevice_t mig;
            char text[NVML_DEVICE_UUID_BUFFER_SIZE];
            if (mig_device(i, m, &mig) && REAL(nvmlDeviceGetUUID)(mig, text, sizeof text) == NVML_SUCCESS &&
                strncmp(text, prefix, len) == 0) {
                *found = mig;
                matches++;
            }
        }
    return matches == 1;
}

/* The NVML index whose UUID starts with `prefix` (len bytes), if exactly one does. */
static int by_uuid_prefix(const char *prefix, size_t len, unsigned count)
{
    int found = -1;
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t handle;
        char text[NVML_DEVICE_UUID_BUFFER_SIZE];
        if (REAL(nvmlDeviceGetHandleByIndex_v2)(i, &handle) != NVML_SUCCESS ||
            REAL(nvmlDeviceGetUUID)(handle, text, sizeof text) != NVML_SUCCESS)
            return -1;
        if (strncmp(text, prefix, len) == 0) {
            if (found >= 0)
                return -1; /* ambiguous: CUDA refuses it too */
            found = (int)i;
        }
    }
    return found;
}

/* One CUDA_VISIBLE_DEVICES entry → NVML index, or -1 where CUDA would stop. */
static int entry_index(const char *entry, size_t len, unsigned count)
{
    while (len && (*entry == ' ' || *entry == '\t')) {
        entry++;
        len--;
    }
    while (len && (entry[len - 1] == ' ' || entry[len - 1] == '\t'))
        len--;
    if (len > 4 && strncmp(entry, "GPU-", 4) == 0)
        return by_uuid_prefix(entry, len, count);
    if (len == 0 || len > 4)
        return -1;
    unsigned index = 0;
    for (size_t i = 0; i < len; i++) {
        if (entry[i] < '0' || entry[i] > '9')
            return -1;
        index = index * 10 + (unsigned)(entry[i] - '0');
    }
    return index < count ? (int)index : -1;
}

/* Adds GPU `index` to `out`: itself, or in MIG mode its first MIG device,
 * unless the process has one (`has_mig`). */
static bool add_gpu(struct vgl_visible *out, unsigned index, bool *has_mig)
{
    nvmlDevice_t handle;
    unsigned slots = mig_slots(index);
    if (!slots) {
        if (REAL(nvmlDeviceGetHandleByIndex_v2)(index, &handle) != NVML_SUCCESS)
            return false;
        return set_device(out, out->count++, handle, false);
    }
    for (unsigned m = 0; m < slots && !*has_mig; m++)
        if (mig_device(index, m, &handle)) {
            *has_mig = true;
            return set_device(out, out->count++, handle, true);
        }
    return true;
}

static bool from_environment(struct vgl_visible *out)
{
    unsigned count;
    if (REAL(nvmlDeviceGetCount_v2)(&count) != NVML_SUCCESS)
        return false;
    /* Read now, not at load: like CUDA at cuInit, this honours a value the
     * program set for itself before it first asked. */
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    int indices[VGL_MAX_DEVICES];
    unsigned n = 0;
    bool has_mig = false;
    out->count = 0;
    if (list && strncmp(list, "MIG-", 4) == 0) {
        nvmlDevice_t mig;
        size_t len = strcspn(list, ",");
        return !mig_by_uuid_prefix(list, len, count, &mig) || set_device(out, out->count++, mig, true);
    }
    if (!list) {
        for (; n < count && n < VGL_MAX_DEVICES; n++)
            indices[n] = (int)n;
    } else {
        for (const char *p = list; n < VGL_MAX_DEVICES;) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            int index = entry_index(p, len, count);
            for (unsigned j = 0; j < n && index >= 0; j++)
                if (indices[j] == index)
                    n = 0, index = -1; /* listed twice: CUDA sees no device (simgpu/devices.c) */
            if (index < 0)
                break;
            indices[n++] = index;
            if (!end)
                break;
            p = end + 1;
        }
    }
    for (unsigned i = 0; i < n; i++)
        if (!add_gpu(out, (unsigned)indices[i], &has_mig))
            return false;
    return true;
}

/* Binds the ordinal to its UUID, which applies a limit given by UUID, in the
 * process's region and in each it is nested in. */
static void bind_uuid(int device, const uint8_t uuid[16], uint32_t kind)
{
    for (uint32_t i = 0; i < vgl_links(); i++) {
        struct vgl_region *link = vgl_link_at(i).region;
        if (vgl_region_bind_device(link, (uint32_t)device, uuid, kind) == -EEXIST) {
            static unsigned said;
            char mine[UUID_TEXT_LEN], theirs[UUID_TEXT_LEN];
            vgl_format_device_uuid(uuid, kind, mine);
            vgl_format_device_uuid(link->devices[device].uuid, link->devices[device].uuid_kind, theirs);
            vgl_log_bounded(VGL_LOG_WARN, &said, "device %d is %s here but %s to other processes of the "
                            "container (CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER differ); it is counted "
                            "as theirs", device, mine, theirs);
        }
    }
}

uint32_t vgl_uuid_kind_of(const uint8_t uuid[16], nvmlDevice_t *parent)
{
    char text[UUID_TEXT_LEN];
    nvmlDevice_t found, gpu = NULL;
    if (!vgl_nvml_started())
        return VGL_UUID_KIND_UNKNOWN;
    vgl_format_uuid(uuid, text);
    uint32_t kind = VGL_UUID_KIND_GPU;
    if (REAL(nvmlDeviceGetHandleByUUID)(text, &found) != NVML_SUCCESS) {
        vgl_format_mig_uuid(uuid, text);
        if (REAL(nvmlDeviceGetHandleByUUID)(text, &found) != NVML_SUCCESS)
            return VGL_UUID_KIND_UNKNOWN;
        kind = VGL_UUID_KIND_MIG;
        if (parent && REAL(nvmlDeviceGetDeviceHandleFromMigDeviceHandle) &&
            REAL(nvmlDeviceGetDeviceHandleFromMigDeviceHandle)(found, &gpu) != NVML_SUCCESS)
            gpu = NULL;
    }
    if (parent)
        *parent = gpu;
    return kind;
}

void vgl_format_device_uuid(const uint8_t uuid[16], uint32_t kind, char out[41])
{
    if (kind == VGL_UUID_KIND_MIG)
        vgl_format_mig_uuid(uuid, out);
    else
        vgl_format_uuid(uuid, out); /* unknown: as NVML names most devices */
}

/* A MIG UUID in CUDA_VISIBLE_DEVICES names the container's one device
 * exactly: its limit by UUID applies before CUDA is initialised, for tools
 * that never initialise it (nvidia-smi, nvitop). */
static bool bind_named_mig(const struct vgl_visible *visible)
{
    char text[NVML_DEVICE_UUID_BUFFER_SIZE];
    uint8_t uuid[16];
    if (visible->count != 1 || !visible->parent[0])
        return true; /* nothing to bind */
    if (!vgl_map_region())
        return false; /* no region yet: the next look tries again */
    if (REAL(nvmlDeviceGetUUID)(visible->handle[0], text, sizeof text) == NVML_SUCCESS &&
        vgl_parse_uuid(text, uuid) == 0)
        bind_uuid(0, uuid, VGL_UUID_KIND_MIG);
    return true;
}

bool vgl_visible_devices(struct vgl_visible *out)
{
    pthread_mutex_lock(&cache.lock);
    if (!cache.from_cuda) {
        struct vgl_visible fresh;
        /* Until CUDA is initialised the environment's answer stands; one cheap
         * cuDeviceGetCount per call tells when it is. */
        if (from_cuda(&fresh)) {
            cache.devices = fresh;
            cache.known = cache.from_cuda = true;
            for (unsigned i = 0; i < fresh.count; i++)
                vgl_device_note((int)i);
        } else if (!cache.known && from_environment(&fresh)) {
            cache.devices = fresh;
            cache.known = true;
        }
        if (cache.known && !cache.from_cuda && !cache.mig_bound)
            cache.mig_bound = bind_named_mig(&cache.devices);
    }
    bool known = cache.known;
    if (known)
        *out = cache.devices;
    pthread_mutex_unlock(&cache.lock);
    return known;
}

int vgl_container_device(nvmlDevice_t device)
{
    struct vgl_visible visible;
    if (!vgl_visible_devices(&visible))
        return -1;
    for (unsigned i = 0; i < visible.count; i++)
        if (visible.handle[i] == device || visible.parent[i] == device)
            return (int)i;
    return -1;
}

nvmlDevice_t vgl_container_handle(nvmlDevice_t device)
{
    struct vgl_visible visible;
    if (device && vgl_visible_devices(&visible))
        for (unsigned i = 0; i < visible.count; i++)
            if (visible.parent[i] == device)
                return visible.handle[i];
    return device;
}

bool vgl_device_note(int device)
{
    static bool noted[VGL_MAX_DEVICES];
    if (device < 0 || device >= VGL_MAX_DEVICES || __atomic_load_n(&noted[device], __ATOMIC_RELAXED))
        return true;
    struct vgl_region *region = __atomic_load_n(&vgl_self.region, __ATOMIC_ACQUIRE);
    CUuuid uuid;
    if (!region || REAL(cuDeviceGetUuid_v2)(&uuid, device) != CUDA_SUCCESS)
        return false;
    bind_uuid(device, (const uint8_t *)uuid.bytes, vgl_uuid_kind_of((const uint8_t *)uuid.bytes, NULL));
    __atomic_store_n(&noted[device], true, __ATOMIC_RELAXED);
    return true;
}

void vgl_devices_note_all(void)
{
    static bool all;
    int count;
    /* Before cuInit there is nothing to note; CUDA asks again when it is. */
    if (__atomic_load_n(&all, __ATOMIC_RELAXED) || REAL(cuDeviceGetCount)(&count) != CUDA_SUCCESS)
        return;
    bool noted = true;
    for (int i = 0; i < count && i < VGL_MAX_DEVICES; i++)
        noted = vgl_device_note(i) && noted;
    __atomic_store_n(&all, noted, __ATOMIC_RELAXED);
}

/* simgpu's devices: count, names, UUIDs, memory, PCI bus ids and attributes,
 * from the configured profile (config.c), numbered as CUDA numbers them.
 *
 * Inside libcuda a device is the machine's index (NVML's, the state file's);
 * a CUdevice is CUDA's ordinal, which the real driver derives in cuInit from
 * two variables, and NVML ignores both (nvml.c keeps the machine's order):
 *
 *   CUDA_DEVICE_ORDER     PCI_BUS_ID: by PCI bus id, the machine's order.
 *                         FASTEST_FIRST (the default, and any other value): the
 *                         fastest first; here the one with more SMs
 *                         (SIMGPU_SMS), ties by bus id.
 *   CUDA_VISIBLE_DEVICES  unset: every device in that order.  Else the devices
 *                         listed, in the order listed, as indices into that
 *                         order or as UUIDs ("GPU-...", any prefix that names
 *                         one device).  The list ends at the first entry that
 *                         names no device (-1, 7 on a 4-device machine, an
 *                         ambiguous prefix, an index in a list of UUIDs or the
 *                         reverse); an index is read as strtoul would ("1gpu"
 *                         is 1); a device listed twice before that end makes
 *                         the list empty; so does "".  A list of MIG UUIDs
 *                         ("MIG-...", a unique prefix is enough) gives the
 *                         first that names an instance, and no other.
 *                         No device left: cuInit fails with CUDA_ERROR_NO_DEVICE.
 *
 * A GPU in MIG mode is no CUDA device itself: CUDA shows one of its instances
 * (the first of its layout, mig.c), and a process sees one MIG instance at
 * most, whatever else it is given ("regardless of how many MIG devices are
 * created (or made available to a container), a single CUDA process can only
 * enumerate a single MIG device": NVIDIA's MIG user guide, as quoted in
 * pytorch/pytorch#130181; two MIG UUIDs give device_count() 1,
 * pytorch/pytorch PR#92315).  Which instance an index or GPU UUID of a MIG
 * parent gives is an [inf]: the first.
 *
 * The rules are the CUDA Programming Guide's ("CUDA Environment Variables",
 * 5.2.1.1: order of the sequence, the end at an invalid index, UUID prefixes,
 * "" for none) and, where it is silent (duplicates, strtoul, mixed lists),
 * those PyTorch mirrors from the driver to count devices without initialising
 * CUDA (torch/cuda/__init__.py, _parse_visible_devices: "Repeated ordinal
 * results in empty set", "Negative value aborts the sequence";
 * _transform_uuid_to_ordinals: "Duplicates result in empty set"). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

/* Set by cuInit, read-only afterwards. */
static struct {
    uint32_t count;
    uint32_t unit[SIM_MAX_DEVICES]; /* ordinal -> the unit: a GPU's index, or a MIG instance's (mig.c) */
} sim_visible;

/* The machine's devices in CUDA_DEVICE_ORDER. */
static uint32_t sim_cuda_order(const struct sim_config *cfg, uint32_t order[SIM_MAX_DEVICES])
{
    const char *how = getenv("CUDA_DEVICE_ORDER");
    bool by_bus = how && strcmp(how, "PCI_BUS_ID") == 0;
    uint32_t n = cfg->device_count;
    for (uint32_t i = 0; i < n; i++)
        order[i] = i;
    /* Insertion sort, stable: equal speeds keep the bus order. */
    for (uint32_t i = 1; i < n && !by_bus; i++)
        for (uint32_t j = i; j > 0 && cfg->sms[order[j]] > cfg->sms[order[j - 1]]; j--) {
            uint32_t t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    return n;
}

/* The leading digits of an entry, as strtoul reads them; -1: none, or a sign. */
static long sim_entry_index(const char *entry, size_t len)
{
    while (len && (*entry == ' ' || *entry == '\t')) {
        entry++;
        len--;
    }
    if (len && *entry == '+') {
        entry++;
        len--;
    }
    long v = -1;
    for (size_t i = 0; i < len && entry[i] >= '0' && entry[i] <= '9' && v < 100000; i++)
        v = (v < 0 ? 0 : v * 10) + (entry[i] - '0');
    return v;
}

/* The machine's index of the one device whose UUID starts with the entry; -1: none, or several. */
static long sim_entry_uuid(const struct sim_config *cfg, const char *entry, size_t len)
{
    long found = -1;
    for (uint32_t d = 0; d < cfg->device_count; d++) {
        char uuid[41];
        sim_device_uuid_string(d, uuid);
        if (len <= 40 && strncmp(uuid, entry, len) == 0) {
            if (found >= 0)
                return -1;
            found = d;
        }
    }
    return found;
}

/* The unit of the one MIG instance whose UUID starts with the entry; -1: none, or several. */
static long sim_entry_mig(const struct sim_config *cfg, const char *entry, size_t len)
{
    long found = -1;
    for (uint32_t u = 0; u < cfg->unit_count; u++) {
        char uuid[41];
        sim_unit_uuid_string(cfg, u, uuid);
        if (sim_unit_instance(cfg, u) && len <= 40 && strncmp(uuid, entry, len) == 0) {
            if (found >= 0)
                return -1;
            found = u;
        }
    }
    return found;
}

/* Adds GPU d's unit (a MIG parent's first instance, unless the process has
 * one already). */
static void sim_add_gpu(const struct sim_config *cfg, uint32_t d, uint32_t *n, bool *has_mig)
{
    const struct sim_gpu_mig *mig = &cfg->mig[d];
    if (!mig->enabled) {
        sim_visible.unit[(*n)++] = cfg->gpu_unit[d];
    } else if (mig->count && !*has_mig) {
        sim_visible.unit[(*n)++] = mig->instances[0].unit;
        *has_mig = true;
    }
}

CUresult sim_devices_enumerate(const struct sim_config *cfg)
{
    uint32_t order[SIM_MAX_DEVICES], listed[SIM_MAX_DEVICES];
    uint32_t total = sim_cuda_order(cfg, order), n = 0, count = 0;
    bool has_mig = false;
    const char *list = getenv("CUDA_VISIBLE_DEVICES");
    if (!list) {
        for (uint32_t i = 0; i < total; i++)
            sim_add_gpu(cfg, order[i], &n, &has_mig);
    } else if (strncmp(list, "MIG-", 4) == 0) {
        /* One MIG device per process: the first entry that names one. */
        size_t len = strcspn(list, ",");
        long u = sim_entry_mig(cfg, list, len);
        if (u >= 0)
            sim_visible.unit[n++] = (uint32_t)u;
    } else {
        bool uuids = strncmp(list, "GPU-", 4) == 0;
        for (const char *p = list; *p;) {
            const char *comma = strchr(p, ',');
            size_t len = comma ? (size_t)(comma - p) : strlen(p);
            long d = -1;
            if (uuids && strncmp(p, "GPU-", 4) == 0)
                d = sim_entry_uuid(cfg, p, len);
            else if (!uuids && (d = sim_entry_index(p, len)) >= 0)
                d = d < (long)total ? (long)order[d] : -1;
            if (d < 0)
                break;
            for (uint32_t i = 0; i < count; i++)
                if (listed[i] == (uint32_t)d)
                    count = 0, d = -1; /* listed twice: nothing is visible */
            if (d < 0)
                break;
            listed[count++] = (uint32_t)d;
            if (!comma)
                break;
            p = comma + 1;
        }
        for (uint32_t i = 0; i < count; i++)
            sim_add_gpu(cfg, listed[i], &n, &has_mig);
    }
    sim_visible.count = n;
    return n ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CUresult sim_device_index(CUdevice dev, uint32_t *index)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || (uint32_t)dev >= sim_visible.count)
        return CUDA_ERROR_INVALID_DEVICE;
    *index = sim_visible.unit[dev];
    return CUDA_SUCCESS;
}

CUdevice sim_device_ordinal(uint32_t index)
{
    for (uint32_t i = 0; i < sim_visible.count; i++)
        if (sim_visible.unit[i] == index)
            return (CUdevice)i;
    return -1;
}

CUresult sim_check_device(CUdevice dev)
{
    uint32_t index;
    return sim_device_index(dev, &index);
}

CUresult cuDeviceGetCount(int *count)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = (int)sim_visible.count;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    SIM_CALLED();
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = sim_check_device(ordinal);
    if (res == CUDA_SUCCESS)
        *device = ordinal;
    return res;
}

/* A MIG instance's name is its board's and its profile's, "NVIDIA H100 80GB
 * HBM3 MIG 3g.40gb", as NVML gives it. */
CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    sim_unit_name(sim_driver_config(), index, name, (size_t)len);
    return CUDA_SUCCESS;
}

/* The first call gives a MIG instance's parent GPU: the MIG UUID came with _v2
 * (CUDA 11.4), which "returns its MIG UUID" (the driver API's reference). */
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    uint8_t bytes[SIM_UUID_LEN];
    sim_device_uuid(sim_driver_config()->units[index].gpu, bytes);
    memcpy(uuid->bytes, bytes, sizeof uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    uint8_t bytes[SIM_UUID_LEN];
    sim_unit_uuid(sim_driver_config(), index, bytes);
    memcpy(uuid->bytes, bytes, sizeof uuid->bytes);
    return CUDA_SUCCESS;
}

/* A MIG instance's own memory: its profile's. */
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = (size_t)sim_driver_config()->units[index].memory_bytes;
    return CUDA_SUCCESS;
}

/* The 32-bit call of CUDA 2.0: sizes of 4 GiB and more read as UINT_MAX. */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    SIM_CALLED();
    size_t total;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = cuDeviceTotalMem_v2(&total, dev);
    if (res == CUDA_SUCCESS)
        *bytes = total > UINT_MAX ? UINT_MAX : (unsigned int)total;
    return res;
}

CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_config *cfg = sim_driver_config();
    struct sim_pci_address pci = sim_device_pci(cfg, cfg->units[index].gpu);
    snprintf(pciBusId, (size_t)len, "%04X:%02X:%02X.0", pci.domain, pci.bus, pci.device);
    return CUDA_SUCCESS;
}

/* The profile's values, and what every board simgpu simulates shares, except
 * that features whose entry points simgpu lacks (managed memory, memory
 * pools) read 0, so that clients which check before use take their other
 * path.  Its copy engines are simgpu's three (copies.c). */
static bool sim_attribute(CUdevice_attribute attrib, uint32_t index, int *out)
{
    const struct sim_config *cfg = sim_driver_config();
    const struct sim_profile *p = cfg->profile;
    struct sim_pci_address pci = sim_device_pci(cfg, cfg->units[index].gpu);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *out = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *out = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *out = 1024; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *out = 64; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *out = INT_MAX; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *out = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *out = 65535; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *out = 48 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *out = 64 * 1024; return true;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *out = 32; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *out = INT_MAX; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *out = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *out = (int)p->clock_khz; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: *out = 512; return true;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *out = (int)cfg->units[index].sms; return true;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *out = 0; return true; /* default: shared */
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *out = (int)pci.bus; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *out = (int)pci.device; return true; /* the slot */
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *out = (int)p->memory_clock_khz; return true;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *out = (int)p->memory_bus_bits; return true;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *out = (int)p->l2_bytes; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *out = (int)p->threads_per_sm; return true;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *out = 3; return true;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *out = (int)pci.domain; return true;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *out = 32; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *out = p->cc_major; return true;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *out = p->cc_minor; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *out = (int)p->shared_per_sm; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: *out = 65536; return true;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: *out = 0; return true;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: *out = 1; return true;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *out = (int)p->shared_per_block_optin; return true;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *out = 0; return true;
    }
    return false;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    SIM_CALLED();
    uint32_t index;
    CUresult res = sim_device_index(dev, &index);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_attribute(attrib, index, pi) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

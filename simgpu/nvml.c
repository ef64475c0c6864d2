/* simgpu's libnvidia-ml.so.1: NVML over the same machine-wide state file as
 * the driver, so that a monitor in one process sees the memory and processes of
 * every process that uses the simulated GPU.
 *
 * Processes are named as the NVIDIA driver names them, by their pid in the
 * host's pid namespace, wherever the caller runs; a process in a container
 * whose host pid nobody here can know gets a stand-in above PID_MAX_LIMIT,
 * never a pid of the container's own (pids.c).
 *
 * Functions answer NVML_ERROR_UNINITIALIZED until nvmlInit (nvmlInit is
 * counted: each needs its nvmlShutdown). */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "nvml.h"

/* The driver branch that ships CUDA 13.0; fixed whatever SIMGPU_DRIVER_VERSION says. */
#define SIM_NVML_DRIVER_VERSION "580.95.05"

/* A GPU's handle, or a MIG device's (a unit with an instance, mig.c). */
struct nvmlDevice_st {
    uint32_t index;                 /* the GPU's; a MIG device's parent's */
    uint32_t unit;                  /* a MIG device's unit; SIM_WHOLE_GPU for a GPU */
};

static struct {
    pthread_mutex_t mutex;          /* guards init and shutdown */
    unsigned int refcount;          /* read without the mutex: atomic */
    const struct sim_config *cfg;
    struct nvmlDevice_st devices[SIM_MAX_DEVICES];
    struct nvmlDevice_st migs[SIM_MAX_DEVICES]; /* by unit; those of MIG instances are handed out */
} sim_nvml = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static bool sim_nvml_ready(void)
{
    return __atomic_load_n(&sim_nvml.refcount, __ATOMIC_ACQUIRE) > 0;
}

/* A bad configuration or state file has been explained on stderr already. */
nvmlReturn_t sim_nvmlInitWithFlags(unsigned int flags)
{
    (void)flags; /* NO_GPUS / NO_ATTACH change nothing here */
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&sim_nvml.mutex);
    if (sim_nvml.refcount == 0) {
        const struct sim_config *cfg = sim_config();
        if (!cfg || sim_state_open(cfg) != 0) {
            ret = NVML_ERROR_UNKNOWN;
        } else {
            sim_nvml.cfg = cfg;
            for (uint32_t i = 0; i < SIM_MAX_DEVICES; i++) {
                sim_nvml.devices[i] = (struct nvmlDevice_st){.index = i, .unit = SIM_WHOLE_GPU};
                sim_nvml.migs[i] = (struct nvmlDevice_st){.index = cfg->units[i].gpu, .unit = i};
            }
        }
    }
    if (ret == NVML_SUCCESS)
        __atomic_store_n(&sim_nvml.refcount, sim_nvml.refcount + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_nvml.mutex);
    return ret;
}

nvmlReturn_t sim_nvmlInit_v2(void)
{
    return sim_nvmlInitWithFlags(0);
}

nvmlReturn_t sim_nvmlInit(void)
{
    return sim_nvmlInitWithFlags(0);
}

nvmlReturn_t sim_nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&sim_nvml.mutex);
    if (sim_nvml.refcount == 0)
        ret = NVML_ERROR_UNINITIALIZED;
    else
        __atomic_store_n(&sim_nvml.refcount, sim_nvml.refcount - 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_nvml.mutex);
    return ret;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    }
    return "Unknown Error";
}

/* Copies `text` whole into a buffer of `length`, or says it does not fit. */
static nvmlReturn_t sim_nvml_string(const char *text, char *out, unsigned int length)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return sim_nvml_string(SIM_NVML_DRIVER_VERSION, version, length);
}

/* "<CUDA major>.<driver version>", as NVML prints it. */
nvmlReturn_t sim_nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    char text[64];
    snprintf(text, sizeof text, "%d.%s", sim_nvml.cfg->driver_version / 1000, SIM_NVML_DRIVER_VERSION);
    return sim_nvml_string(text, version, length);
}

nvmlReturn_t sim_nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = sim_nvml.cfg->driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return sim_nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t sim_nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = sim_nvml.cfg->device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return sim_nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t sim_nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= sim_nvml.cfg->device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &sim_nvml.devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return sim_nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* GPU UUIDs, MIG UUIDs, and the legacy MIG form of drivers before R470,
 * "MIG-GPU-<parent UUID>/<GI>/<CI>", which NVML still takes (docs/mig-facts.md
 * §1.3). */
nvmlReturn_t sim_nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_config *cfg = sim_nvml.cfg;
    for (uint32_t i = 0; i < cfg->device_count; i++) {
        char text[41];
        sim_device_uuid_string(i, text);
        if (strcmp(text, uuid) == 0) {
            *device = &sim_nvml.devices[i];
            return NVML_SUCCESS;
        }
    }
    for (uint32_t u = 0; u < cfg->unit_count; u++) {
        const struct sim_mig_instance *in = sim_unit_instance(cfg, u);
        if (!in)
            continue;
        char text[41], parent[41], legacy[96];
        sim_unit_uuid_string(cfg, u, text);
        sim_device_uuid_string(cfg->units[u].gpu, parent);
        snprintf(legacy, sizeof legacy, "MIG-%s/%u/%u", parent, in->gi_id, in->ci_id);
        if (strcmp(text, uuid) == 0 || strcmp(legacy, uuid) == 0) {
            *device = &sim_nvml.migs[u];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* NVML accepts the domain in 4 or 8 digits, in either case. */
nvmlReturn_t sim_nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int domain, bus, dev, function;
    char end;
    if (sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &dev, &function, &end) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < sim_nvml.cfg->device_count; i++) {
        struct sim_pci_address at = sim_device_pci(sim_nvml.cfg, i);
        if (domain == at.domain && bus == at.bus && dev == at.device && function == 0) {
            *device = &sim_nvml.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t sim_nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return sim_nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

static bool sim_nvml_in(nvmlDevice_t device, const struct nvmlDevice_st *array, uint32_t count)
{
    uintptr_t p = (uintptr_t)device, first = (uintptr_t)&array[0];
    return p >= first && p < first + count * sizeof *device && (p - first) % sizeof *device == 0;
}

nvmlReturn_t sim_nvml_handle(nvmlDevice_t device, struct sim_nvml_target *out)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    const struct sim_config *cfg = sim_nvml.cfg;
    if (sim_nvml_in(device, sim_nvml.devices, cfg->device_count)) {
        const struct sim_gpu_mig *mig = &cfg->mig[device->index];
        *out = (struct sim_nvml_target){.gpu = device->index, .unit = cfg->gpu_unit[device->index],
                                        .mig_parent = mig->enabled};
        return NVML_SUCCESS;
    }
    if (sim_nvml_in(device, sim_nvml.migs, cfg->unit_count) && sim_unit_instance(cfg, device->unit)) {
        const struct sim_unit *u = &cfg->units[device->unit];
        *out = (struct sim_nvml_target){.gpu = u->gpu, .unit = device->unit,
                                        .mig = sim_unit_instance(cfg, device->unit), .mig_index = u->instance};
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

nvmlDevice_t sim_nvml_gpu_handle(uint32_t gpu)
{
    return &sim_nvml.devices[gpu];
}

nvmlDevice_t sim_nvml_mig_handle(uint32_t unit)
{
    return &sim_nvml.migs[unit];
}

/* What a board's query answers on a MIG device: its parent answers for the
 * board [inf: nvitop and nvidia-smi show N/A for a MIG device's clocks, fans,
 * power and PCI]. */
nvmlReturn_t sim_nvml_device(nvmlDevice_t device, uint32_t *index)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (t.mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *index = t.gpu;
    return NVML_SUCCESS;
}

/* A MIG device's index is its own among its parent's (nvmlDeviceGetMigDeviceHandleByIndex's). */
nvmlReturn_t sim_nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = t.mig ? t.mig_index : t.gpu;
    return NVML_SUCCESS;
}

/* The N of /dev/nvidiaN, by which a runtime gives a container the GPU: the
 * driver numbers the device files in the order it found the boards, as the
 * index here. */
nvmlReturn_t sim_nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = i;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (t.mig)
        sim_unit_name(sim_nvml.cfg, t.unit, text, sizeof text);
    else
        snprintf(text, sizeof text, "%s", sim_nvml.cfg->profile->name);
    return sim_nvml_string(text, name, length);
}

nvmlReturn_t sim_nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    char text[41];
    if (t.mig)
        sim_unit_uuid_string(sim_nvml.cfg, t.unit, text);
    else
        sim_device_uuid_string(t.gpu, text);
    return sim_nvml_string(text, uuid, length);
}

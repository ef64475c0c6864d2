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
#include <stdlib.h>
#include <string.h>

#include "nvml.h"

/* The driver branch that ships CUDA 13.0; fixed whatever SIMGPU_DRIVER_VERSION says. */
#define SIM_NVML_DRIVER_VERSION "580.95.05"

/* NVML's "not applicable" for MIG instance ids. */
#define SIM_NVML_NO_INSTANCE 0xFFFFFFFFu

struct nvmlDevice_st {
    uint32_t index;
};

static struct {
    pthread_mutex_t mutex;          /* guards init and shutdown */
    unsigned int refcount;          /* read without the mutex: atomic */
    const struct sim_config *cfg;
    struct nvmlDevice_st devices[SIM_MAX_DEVICES];
} sim_nvml = {.mutex = PTHREAD_MUTEX_INITIALIZER};

/* ---- init ------------------------------------------------------------------------- */

static bool sim_nvml_ready(void)
{
    return __atomic_load_n(&sim_nvml.refcount, __ATOMIC_ACQUIRE) > 0;
}

/* A bad configuration or state file has been explained on stderr already. */
nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
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
            for (uint32_t i = 0; i < SIM_MAX_DEVICES; i++)
                sim_nvml.devices[i].index = i;
        }
    }
    if (ret == NVML_SUCCESS)
        __atomic_store_n(&sim_nvml.refcount, sim_nvml.refcount + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&sim_nvml.mutex);
    return ret;
}

nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInitWithFlags(0);
}

nvmlReturn_t nvmlShutdown(void)
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

/* ---- system ------------------------------------------------------------------------- */

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

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return sim_nvml_string(SIM_NVML_DRIVER_VERSION, version, length);
}

/* "<CUDA major>.<driver version>", as NVML prints it. */
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    char text[64];
    snprintf(text, sizeof text, "%d.%s", sim_nvml.cfg->driver_version / 1000, SIM_NVML_DRIVER_VERSION);
    return sim_nvml_string(text, version, length);
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = sim_nvml.cfg->driver_version;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* ---- devices --------------------------------------------------------------------------- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = sim_nvml.cfg->device_count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= sim_nvml.cfg->device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &sim_nvml.devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (uint32_t i = 0; i < sim_nvml.cfg->device_count; i++) {
        char text[41];
        sim_device_uuid_string(i, text);
        if (strcmp(text, uuid) == 0) {
            *device = &sim_nvml.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* "0000:18:00.0", as nvmlDeviceGetPciInfo writes it and cuDeviceGetPCIBusId
 * prints it. */
static void sim_nvml_bus_id(uint32_t index, char out[32])
{
    snprintf(out, 32, "00000000:%02X:00.0", sim_device_pci_bus(index));
}

/* NVML accepts the domain in 4 or 8 digits, in either case. */
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
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
        if (domain == 0 && bus == sim_device_pci_bus(i) && dev == 0 && function == 0) {
            *device = &sim_nvml.devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* The index behind a handle, if it is one of ours. */
static nvmlReturn_t sim_nvml_device(nvmlDevice_t device, uint32_t *index)
{
    if (!sim_nvml_ready())
        return NVML_ERROR_UNINITIALIZED;
    uintptr_t p = (uintptr_t)device, first = (uintptr_t)&sim_nvml.devices[0];
    if (p < first || p >= first + sim_nvml.cfg->device_count * sizeof *device ||
        (p - first) % sizeof *device != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = device->index;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!index)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = i;
    return NVML_SUCCESS;
}

/* The N of /dev/nvidiaN, by which a runtime gives a container the GPU: the
 * driver numbers the device files in the order it found the boards, as the
 * index here. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return nvmlDeviceGetIndex(device, minorNumber);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    return ret == NVML_SUCCESS ? sim_nvml_string(sim_device_name(), name, length) : ret;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    char text[41];
    sim_device_uuid_string(i, text);
    return sim_nvml_string(text, uuid, length);
}

/* ---- memory and processes ---------------------------------------------------------------- */

static bool sim_nvml_mem_info(uint32_t index, uint64_t *used, uint64_t *total)
{
    return sim_state_mem_info(index, used, total) == 0;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t used, total;
    if (!sim_nvml_mem_info(i, &used, &total))
        return NVML_ERROR_UNKNOWN;
    memory->total = total;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

/* No memory is reserved by the (simulated) driver itself, so `reserved` is 0. */
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    uint64_t used, total;
    if (!sim_nvml_mem_info(i, &used, &total))
        return NVML_ERROR_UNKNOWN;
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = total - used;
    return NVML_SUCCESS;
}

/* NVML's size protocol: with *infoCount too small (NULL `infos` and 0 included)
 * the answer is NVML_ERROR_INSUFFICIENT_SIZE and the count needed; with none to
 * list it is success and 0.  `fill(i, pid, bytes)` writes entry i. */
static nvmlReturn_t sim_nvml_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos,
                                       void (*fill)(void *infos, unsigned int i, const struct sim_proc_info *p))
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_proc_info *procs = calloc(SIM_MAX_PROCS, sizeof *procs);
    if (!procs)
        return NVML_ERROR_UNKNOWN;
    int n = sim_state_processes(index, procs, SIM_MAX_PROCS);
    if (n < 0) {
        ret = NVML_ERROR_UNKNOWN;
    } else if ((unsigned int)n > *infoCount) {
        *infoCount = (unsigned int)n;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (n > 0 && !infos) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        for (int i = 0; i < n; i++)
            fill(infos, (unsigned int)i, &procs[i]);
        *infoCount = (unsigned int)n;
    }
    free(procs);
    return ret;
}

static void sim_fill_v1(void *infos, unsigned int i, const struct sim_proc_info *p)
{
    nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + i;
    out->pid = (unsigned int)p->pid;
    out->usedGpuMemory = p->used_bytes;
}

static void sim_fill_v2(void *infos, unsigned int i, const struct sim_proc_info *p)
{
    nvmlProcessInfo_t *out = (nvmlProcessInfo_t *)infos + i;
    out->pid = (unsigned int)p->pid;
    out->usedGpuMemory = p->used_bytes;
    out->gpuInstanceId = SIM_NVML_NO_INSTANCE;
    out->computeInstanceId = SIM_NVML_NO_INSTANCE;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return sim_nvml_processes(device, infoCount, infos, sim_fill_v1);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return sim_nvml_processes(device, infoCount, infos, sim_fill_v2);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return sim_nvml_processes(device, infoCount, infos, sim_fill_v2);
}

/* No graphics on a simulated GPU: always an empty list. */
static nvmlReturn_t sim_nvml_no_processes(nvmlDevice_t device, unsigned int *infoCount)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

/* No MPS server runs on a simulated GPU. */
nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

static void sim_fill_detail(void *infos, unsigned int i, const struct sim_proc_info *p)
{
    nvmlProcessDetail_v1_t *out = (nvmlProcessDetail_v1_t *)infos + i;
    out->pid = (unsigned int)p->pid;
    out->usedGpuMemory = p->used_bytes;
    out->gpuInstanceId = SIM_NVML_NO_INSTANCE;
    out->computeInstanceId = SIM_NVML_NO_INSTANCE;
    out->usedGpuCcProtectedMemory = 0;
}

/* Its presence also tells nvitop that the _v3 lists have the v2 layout. */
nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_v1_t *plist)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!plist)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (plist->version != nvmlProcessDetailList_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    switch (plist->mode) {
    case NVML_PROCESS_MODE_COMPUTE:
        return sim_nvml_processes(device, &plist->numProcArrayEntries, plist->procArray, sim_fill_detail);
    case NVML_PROCESS_MODE_GRAPHICS:
    case NVML_PROCESS_MODE_MPS:
        plist->numProcArrayEntries = 0;
        return NVML_SUCCESS;
    }
    return NVML_ERROR_INVALID_ARGUMENT;
}

/* The share of the last second in which the device ran kernels, by every
 * process (timeline.c).  Memory traffic is not simulated: 0. */
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int percent;
    if (sim_timeline_utilization(index, &percent) != 0)
        return NVML_ERROR_UNKNOWN;
    utilization->gpu = percent;
    utilization->memory = 0;
    return NVML_SUCCESS;
}

/* One sample per process and sample period (SIM_SAMPLE_NS) that ended after
 * `lastSeenTimeStamp` (wall-clock us), as the driver keeps its sample buffer:
 * a first call with NULL (or too small a count) learns the count and gets
 * NVML_ERROR_INSUFFICIENT_SIZE; none newer is NVML_ERROR_NOT_FOUND. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    uint32_t room = utilization ? *processSamplesCount : 0;
    struct sim_proc_sample *samples = room ? calloc(room, sizeof *samples) : NULL;
    if (room && !samples)
        return NVML_ERROR_UNKNOWN;
    int n = sim_timeline_samples(index, lastSeenTimeStamp, samples, room);
    if (n < 0) {
        free(samples);
        return NVML_ERROR_UNKNOWN;
    }
    if (n == 0) {
        ret = NVML_ERROR_NOT_FOUND;
    } else if ((uint32_t)n > room) {
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else {
        for (int i = 0; i < n; i++)
            utilization[i] = (nvmlProcessUtilizationSample_t){
                .pid = (unsigned int)samples[i].pid,
                .timeStamp = samples[i].timestamp_us,
                .smUtil = samples[i].sm_percent,
            };
    }
    *processSamplesCount = (unsigned int)n;
    free(samples);
    return ret;
}

/* ---- what monitors ask besides ---------------------------------------------------------
 *
 * A simulated GPU has no sensors, clocks, fans or power rail: those answer
 * NVML_ERROR_NOT_SUPPORTED, as NVML does for what a board lacks, and monitors
 * show "N/A".  What is known is answered as an H100 SXM with MIG and the
 * display off, in the default compute mode, that has never had a memory
 * error. */

/* The device check, then "not supported". */
static nvmlReturn_t sim_nvml_unsupported(nvmlDevice_t device)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    return ret == NVML_SUCCESS ? NVML_ERROR_NOT_SUPPORTED : ret;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    sim_nvml_bus_id(i, pci->busId);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", sim_device_pci_bus(i));
    pci->domain = 0;
    pci->bus = sim_device_pci_bus(i);
    pci->device = 0;
    pci->pciDeviceId = 0x233010DEu;   /* H100 SXM5 80GB, vendor 0x10DE */
    pci->pciSubSystemId = 0x16C110DEu;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9; /* as cuDeviceGetAttribute says */
    *minor = 0;
    return NVML_SUCCESS;
}

/* Writes `value` to each non-NULL output of a known device. */
static nvmlReturn_t sim_nvml_answer(nvmlDevice_t device, unsigned int *out, unsigned int value)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    *out = value;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    return sim_nvml_answer(device, isMigDevice, 0);
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    nvmlReturn_t ret = sim_nvml_answer(device, currentMode, NVML_FEATURE_DISABLED);
    return ret == NVML_SUCCESS ? sim_nvml_answer(device, pendingMode, NVML_FEATURE_DISABLED) : ret;
}

nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
    return sim_nvml_answer(device, (unsigned int *)isActive, NVML_FEATURE_DISABLED);
}

nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    return sim_nvml_answer(device, (unsigned int *)display, NVML_FEATURE_DISABLED);
}

/* The state file outlives every client, which is what persistence mode keeps on a real driver. */
nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return sim_nvml_answer(device, (unsigned int *)mode, NVML_FEATURE_ENABLED);
}

/* NVML_COMPUTEMODE_DEFAULT: any number of processes may use the device. */
nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    return sim_nvml_answer(device, mode, 0);
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType,
                                         unsigned long long *eccCounts)
{
    (void)errorType;
    (void)counterType;
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!eccCounts)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eccCounts = 0;
    return NVML_SUCCESS;
}

/* The video engines never run: 0% over a one-second sampling period. */
static nvmlReturn_t sim_nvml_idle_engine(nvmlDevice_t device, unsigned int *utilization,
                                         unsigned int *samplingPeriodUs)
{
    nvmlReturn_t ret = sim_nvml_answer(device, utilization, 0);
    return ret == NVML_SUCCESS ? sim_nvml_answer(device, samplingPeriodUs, 1000000) : ret;
}

nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    return sim_nvml_idle_engine(device, utilization, samplingPeriodUs);
}

nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    return sim_nvml_idle_engine(device, utilization, samplingPeriodUs);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    (void)type;
    (void)clock;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    (void)type;
    (void)clock;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    (void)speed;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    (void)sensorType;
    (void)temp;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, struct nvmlTemperature_v1_st *temperature)
{
    (void)temperature;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    (void)power;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    (void)limit;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    (void)pState;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, unsigned int counter, unsigned int *value)
{
    (void)counter;
    (void)value;
    return sim_nvml_unsupported(device);
}

/* The Windows driver models: NVML answers "not supported" on Linux. */
nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    (void)current;
    (void)pending;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    (void)current;
    (void)pending;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, struct nvmlConfComputeMemSizeInfo_st *info)
{
    (void)info;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, struct nvmlBAR1Memory_st *bar1Memory)
{
    (void)bar1Memory;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    (void)serial;
    (void)length;
    return sim_nvml_unsupported(device);
}

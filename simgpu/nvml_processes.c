/* simgpu's NVML process lists: the processes with a context or memory on a
 * device, and the graphics and MPS lists, which are always empty. */
#include <stdlib.h>

#include "nvml.h"

/* NVML's "not applicable" for MIG instance ids. */
#define SIM_NVML_NO_INSTANCE 0xFFFFFFFFu

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

nvmlReturn_t sim_nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                  nvmlProcessInfo_v1_t *infos)
{
    return sim_nvml_processes(device, infoCount, infos, sim_fill_v1);
}

nvmlReturn_t sim_nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos)
{
    return sim_nvml_processes(device, infoCount, infos, sim_fill_v2);
}

nvmlReturn_t sim_nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
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

nvmlReturn_t sim_nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                   nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t sim_nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t sim_nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

/* No MPS server runs on a simulated GPU. */
nvmlReturn_t sim_nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_v1_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t sim_nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                        nvmlProcessInfo_t *infos)
{
    (void)infos;
    return sim_nvml_no_processes(device, infoCount);
}

nvmlReturn_t sim_nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
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
nvmlReturn_t sim_nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_v1_t *plist)
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

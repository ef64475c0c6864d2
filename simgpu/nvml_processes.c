/* simgpu's NVML process lists: the processes with a context or memory on a
 * device, and the graphics and MPS lists, which are always empty. */
#include <stdlib.h>

#include "nvml.h"

/* NVML's "not applicable" for MIG instance ids. */
#define SIM_NVML_NO_INSTANCE 0xFFFFFFFFu

/* An entry's GPU and compute instance. */
struct sim_nvml_ids {
    unsigned int gi, ci;
};

/* The processes of a device: a MIG device's are its instance's; a GPU in MIG
 * mode lists those of all its instances, only with MIG monitoring rights
 * (nvml.h: "aggregate only with privileges"), else NVML_ERROR_NO_PERMISSION.
 * Entries carry their instance's GPU and compute instance ids (NO_INSTANCE
 * without MIG).  Fills up to `max`; returns how many in all, or -1 (error in
 * *ret). */
static int sim_nvml_list(nvmlDevice_t device, struct sim_proc_info *procs, uint32_t max,
                         struct sim_nvml_ids *ids, nvmlReturn_t *ret)
{
    struct sim_nvml_target t;
    if ((*ret = sim_nvml_handle(device, &t)) != NVML_SUCCESS)
        return -1;
    const struct sim_config *cfg = sim_config();
    if (!t.mig_parent) {
        int n = sim_state_processes(t.unit, procs, max);
        for (int i = 0; i < n && (uint32_t)i < max; i++)
            ids[i] = t.mig ? (struct sim_nvml_ids){t.mig->gi_id, t.mig->ci_id}
                           : (struct sim_nvml_ids){SIM_NVML_NO_INSTANCE, SIM_NVML_NO_INSTANCE};
        *ret = n < 0 ? NVML_ERROR_UNKNOWN : NVML_SUCCESS;
        return n < 0 ? -1 : n;
    }
    if (!cfg->mig_monitor) {
        *ret = NVML_ERROR_NO_PERMISSION;
        return -1;
    }
    const struct sim_gpu_mig *mig = &cfg->mig[t.gpu];
    uint32_t total = 0;
    for (uint32_t i = 0; i < mig->count; i++) {
        uint32_t room = total < max ? max - total : 0;
        int n = sim_state_processes(mig->instances[i].unit, room ? procs + total : NULL, room);
        if (n < 0) {
            *ret = NVML_ERROR_UNKNOWN;
            return -1;
        }
        for (uint32_t k = total; k < total + (uint32_t)n && k < max; k++)
            ids[k] = (struct sim_nvml_ids){mig->instances[i].gi_id, mig->instances[i].ci_id};
        total += (uint32_t)n;
    }
    *ret = NVML_SUCCESS;
    return (int)total;
}

/* NVML's size protocol: with *infoCount too small (NULL `infos` and 0 included)
 * the answer is NVML_ERROR_INSUFFICIENT_SIZE and the count needed; with none to
 * list it is success and 0.  `fill(i, p, ids)` writes entry i. */
static nvmlReturn_t sim_nvml_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos,
                                       void (*fill)(void *infos, unsigned int i, const struct sim_proc_info *p,
                                                    struct sim_nvml_ids ids))
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_proc_info *procs = calloc(SIM_MAX_PROCS, sizeof *procs);
    struct sim_nvml_ids *ids = calloc(SIM_MAX_PROCS, sizeof *ids);
    int n = procs && ids ? sim_nvml_list(device, procs, SIM_MAX_PROCS, ids, &ret) : -1;
    if (!procs || !ids) {
        ret = NVML_ERROR_UNKNOWN;
    } else if (n < 0) {
        /* ret says why */
    } else if ((unsigned int)n > *infoCount) {
        *infoCount = (unsigned int)n;
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    } else if (n > 0 && !infos) {
        ret = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        for (int i = 0; i < n; i++)
            fill(infos, (unsigned int)i, &procs[i], ids[i]);
        *infoCount = (unsigned int)n;
    }
    free(procs);
    free(ids);
    return ret;
}

static void sim_fill_v1(void *infos, unsigned int i, const struct sim_proc_info *p, struct sim_nvml_ids ids)
{
    (void)ids;
    nvmlProcessInfo_v1_t *out = (nvmlProcessInfo_v1_t *)infos + i;
    out->pid = (unsigned int)p->pid;
    out->usedGpuMemory = p->used_bytes;
}

static void sim_fill_v2(void *infos, unsigned int i, const struct sim_proc_info *p, struct sim_nvml_ids ids)
{
    nvmlProcessInfo_t *out = (nvmlProcessInfo_t *)infos + i;
    out->pid = (unsigned int)p->pid;
    out->usedGpuMemory = p->used_bytes;
    out->gpuInstanceId = ids.gi;
    out->computeInstanceId = ids.ci;
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
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
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

static void sim_fill_detail(void *infos, unsigned int i, const struct sim_proc_info *p, struct sim_nvml_ids ids)
{
    nvmlProcessDetail_v1_t *out = (nvmlProcessDetail_v1_t *)infos + i;
    out->pid = (unsigned int)p->pid;
    out->usedGpuMemory = p->used_bytes;
    out->gpuInstanceId = ids.gi;
    out->computeInstanceId = ids.ci;
    out->usedGpuCcProtectedMemory = 0;
}

/* Its presence also tells nvitop that the _v3 lists have the v2 layout. */
nvmlReturn_t sim_nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device, nvmlProcessDetailList_v1_t *plist)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
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

/* simgpu's NVML MIG calls: a GPU's MIG devices, and the GPU-instance profiles
 * of its board (mig.c, from src/vgpulimit/mig/profiles.json), as nvml.h (API
 * v13) documents them (docs/mig-facts.md §1.4):
 *   - a GPU in MIG mode has up to its compute slices (7) MIG devices, at
 *     indices that may have holes: an index without one answers NOT_FOUND, so
 *     callers loop to the maximum;
 *   - calls meant for MIG devices answer NOT_SUPPORTED on a GPU, and those for
 *     GPUs INVALID_ARGUMENT on a MIG device (it is no parent);
 *   - profile info by NVML's enum: INVALID_ARGUMENT past the enum's end,
 *     NOT_SUPPORTED for a profile the board lacks, and for the versioned call
 *     when MIG is off;
 *   - the possible placements answer whether MIG is on or not, and are
 *     privileged: NO_PERMISSION under SIMGPU_MIG_MONITOR=none. */
#include <stdio.h>
#include <string.h>

#include "nvml.h"

/* A GPU (not a MIG device), and its board's MIG model (NULL: none). */
static nvmlReturn_t sim_nvml_gpu(nvmlDevice_t device, struct sim_nvml_target *t,
                                 const struct sim_mig_model **model)
{
    nvmlReturn_t ret = sim_nvml_handle(device, t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (t->mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *model = sim_mig_model(sim_config()->profile);
    return NVML_SUCCESS;
}

/* A MIG device. */
static nvmlReturn_t sim_nvml_mig(nvmlDevice_t device, struct sim_nvml_target *t)
{
    nvmlReturn_t ret = sim_nvml_handle(device, t);
    if (ret != NVML_SUCCESS)
        return ret;
    return t->mig ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

/* 0 when MIG is off or the board has none. */
nvmlReturn_t sim_nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    struct sim_nvml_target t;
    const struct sim_mig_model *model;
    nvmlReturn_t ret = sim_nvml_gpu(device, &t, &model);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = model && t.mig_parent ? model->compute_slices : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                     nvmlDevice_t *migDevice)
{
    struct sim_nvml_target t;
    const struct sim_mig_model *model;
    nvmlReturn_t ret = sim_nvml_gpu(device, &t, &model);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!migDevice || !model || !t.mig_parent || index >= model->compute_slices)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_gpu_mig *mig = &sim_config()->mig[t.gpu];
    if (index >= mig->count)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = sim_nvml_mig_handle(mig->instances[index].unit);
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(migDevice, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!t.mig || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = sim_nvml_gpu_handle(t.gpu);
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_mig(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = t.mig->gi_id;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_mig(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = t.mig->ci_id;
    return NVML_SUCCESS;
}

/* The instance's SMs, copy engines, slices and memory; the media engines are
 * not in the profile tables: 0. */
nvmlReturn_t sim_nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_mig(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_mig_profile *p = t.mig->profile;
    *attributes = (nvmlDeviceAttributes_t){.multiprocessorCount = p->sms, .sharedCopyEngineCount = p->copy_engines,
                                           .gpuInstanceSliceCount = p->compute_slices,
                                           .computeInstanceSliceCount = p->compute_slices,
                                           .memorySizeMB = p->memory_mib};
    return NVML_SUCCESS;
}

/* The profile of NVML's enum `profile` (or, by_id, of the driver's id) on
 * this GPU's board. */
static nvmlReturn_t sim_nvml_profile(nvmlDevice_t device, unsigned int profile, bool by_id, bool needs_mig,
                                     const struct sim_mig_profile **out)
{
    struct sim_nvml_target t;
    const struct sim_mig_model *model;
    nvmlReturn_t ret = sim_nvml_gpu(device, &t, &model);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!by_id && profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!model || (needs_mig && !t.mig_parent))
        return NVML_ERROR_NOT_SUPPORTED;
    for (uint32_t i = 0; i < model->profile_count; i++)
        if ((by_id ? model->profiles[i].id : model->profiles[i].nvml_enum) == profile) {
            *out = &model->profiles[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t sim_nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                     nvmlGpuInstanceProfileInfo_t *info)
{
    const struct sim_mig_profile *p;
    nvmlReturn_t ret = sim_nvml_profile(device, profile, false, false, &p);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    *info = (nvmlGpuInstanceProfileInfo_t){.id = p->id, .sliceCount = p->compute_slices,
                                           .instanceCount = p->max_count, .multiprocessorCount = p->sms,
                                           .copyEngineCount = p->copy_engines, .memorySizeMB = p->memory_mib};
    return NVML_SUCCESS;
}

/* The versioned struct, v2 or v3, named "MIG 3g.40gb" as nvidia-smi mig
 * -lgip prints it. */
static nvmlReturn_t sim_nvml_profile_info_v(const struct sim_mig_profile *p, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    snprintf(name, sizeof name, "MIG %s", p->name);
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        *info = (nvmlGpuInstanceProfileInfo_v2_t){.version = info->version, .id = p->id,
                                                  .sliceCount = p->compute_slices, .instanceCount = p->max_count,
                                                  .multiprocessorCount = p->sms, .copyEngineCount = p->copy_engines,
                                                  .memorySizeMB = p->memory_mib};
        memcpy(info->name, name, sizeof name);
        return NVML_SUCCESS;
    }
    if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        *v3 = (nvmlGpuInstanceProfileInfo_v3_t){.version = info->version, .id = p->id,
                                                .sliceCount = p->compute_slices, .instanceCount = p->max_count,
                                                .multiprocessorCount = p->sms, .copyEngineCount = p->copy_engines,
                                                .memorySizeMB = p->memory_mib};
        memcpy(v3->name, name, sizeof name);
        return NVML_SUCCESS;
    }
    return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
}

nvmlReturn_t sim_nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                      nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct sim_mig_profile *p;
    nvmlReturn_t ret = sim_nvml_profile(device, profile, false, true, &p);
    return ret == NVML_SUCCESS ? sim_nvml_profile_info_v(p, info) : ret;
}

nvmlReturn_t sim_nvmlDeviceGetGpuInstanceProfileInfoByIdV(nvmlDevice_t device, unsigned int profileId,
                                                          nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct sim_mig_profile *p;
    nvmlReturn_t ret = sim_nvml_profile(device, profileId, true, true, &p);
    return ret == NVML_SUCCESS ? sim_nvml_profile_info_v(p, info) : ret;
}

/* Every legal placement of the profile (the driver's id), free or not. */
nvmlReturn_t sim_nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device, unsigned int profileId,
                                                               nvmlGpuInstancePlacement_t *placements,
                                                               unsigned int *count)
{
    const struct sim_mig_profile *p;
    nvmlReturn_t ret = sim_nvml_profile(device, profileId, true, false, &p);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sim_config()->mig_monitor)
        return NVML_ERROR_NO_PERMISSION;
    if (!placements) {
        *count = p->placement_count;
        return NVML_SUCCESS;
    }
    if (*count < p->placement_count) {
        *count = p->placement_count;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (uint32_t i = 0; i < p->placement_count; i++)
        placements[i] = (nvmlGpuInstancePlacement_t){.start = p->placements[i], .size = p->memory_slices};
    *count = p->placement_count;
    return NVML_SUCCESS;
}

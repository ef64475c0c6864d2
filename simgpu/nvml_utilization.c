/* simgpu's NVML utilisation: how much of the time a device ran kernels,
 * in all and per process, from the devices' shared timelines (timeline.c). */
#include <stdlib.h>

#include "nvml.h"

/* The unit whose timeline answers for `device`.  Utilisation is "not supported
 * on MIG-enabled GPUs" (nvml.h), on the parent and its MIG devices alike. */
static nvmlReturn_t sim_nvml_timed_unit(nvmlDevice_t device, uint32_t *unit)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (t.mig || t.mig_parent)
        return NVML_ERROR_NOT_SUPPORTED;
    *unit = t.unit;
    return NVML_SUCCESS;
}

/* The share of the last second in which the device ran kernels, by every
 * process (timeline.c).  Memory traffic is not simulated: 0. */
nvmlReturn_t sim_nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_timed_unit(device, &index);
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

/* The driver's answer, as measured on an H200 (driver 580): the size query
 * (a NULL buffer, or a count below the driver's sample buffer) answers
 * NVML_ERROR_INSUFFICIENT_SIZE with that buffer's fixed count (the profile's
 * process_samples), idle or busy and whatever `lastSeenTimeStamp`; a buffer of
 * that room then gets NVML_ERROR_NOT_FOUND when no sample is newer than
 * `lastSeenTimeStamp` (wall-clock us), leaving the count as the caller gave
 * it, or one sample per process that ran kernels since: its latest period
 * (SIM_SAMPLE_NS), with *processSamplesCount the samples written.  "Too small"
 * is read strictly (below the buffer's count, not below the samples there are):
 * the driver's words allow both, and a caller that works here works on both. */
nvmlReturn_t sim_nvmlDeviceGetProcessUtilization(nvmlDevice_t device, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_timed_unit(device, &index);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    const uint32_t capacity = sim_config()->profile->process_samples;
    if (!utilization || *processSamplesCount < capacity) {
        *processSamplesCount = capacity;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    const uint32_t kept = SIM_SAMPLES * SIM_SAMPLE_PROCS;
    struct sim_proc_sample *samples = calloc(kept, sizeof *samples);
    if (!samples)
        return NVML_ERROR_UNKNOWN;
    int n = sim_timeline_samples(index, lastSeenTimeStamp, samples, kept);
    if (n < 0) {
        free(samples);
        return NVML_ERROR_UNKNOWN;
    }
    /* Oldest first: a later period of the same process replaces its earlier one. */
    uint32_t written = 0;
    for (uint32_t i = 0; i < (uint32_t)n && i < kept; i++) {
        uint32_t j = 0;
        while (j < written && utilization[j].pid != samples[i].pid)
            j++;
        if (j == written && written == capacity)
            continue;
        utilization[j] = (nvmlProcessUtilizationSample_t){
            .pid = samples[i].pid,
            .timeStamp = samples[i].timestamp_us,
            .smUtil = samples[i].sm_percent,
        };
        if (j == written)
            written++;
    }
    free(samples);
    if (written == 0)
        return NVML_ERROR_NOT_FOUND;
    *processSamplesCount = written;
    return NVML_SUCCESS;
}

/* simgpu's NVML utilisation: how much of the time a device ran kernels,
 * in all and per process, from the devices' shared timelines (timeline.c). */
#include <stdlib.h>

#include "nvml.h"

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

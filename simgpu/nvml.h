/* simgpu's libnvidia-ml.so.1: the NVML entry points it exports, with nvml.h's
 * signatures. */
#ifndef SIMGPU_NVML_H
#define SIMGPU_NVML_H

#include "state.h"
#include "vgpulimit/nvml_abi.h"

SIM_EXPORT nvmlReturn_t nvmlInit(void);
SIM_EXPORT nvmlReturn_t nvmlInit_v2(void);
SIM_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
SIM_EXPORT nvmlReturn_t nvmlShutdown(void);
SIM_EXPORT const char *nvmlErrorString(nvmlReturn_t result);
SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion);
SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                              nvmlProcessInfo_v1_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device, unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos);
SIM_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);

#endif

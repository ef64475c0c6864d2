/* simgpu's libnvidia-ml.so.1: the NVML entry points it exports, with nvml.h's
 * signatures.  Prototypes are grouped by the file that defines them. */
#ifndef SIMGPU_NVML_H
#define SIMGPU_NVML_H

#include "state.h"
#include "vgpulimit/nvml_abi.h"

/* Structures of functions simgpu only answers "not supported" to: never read. */
struct nvmlTemperature_v1_st;
struct nvmlConfComputeMemSizeInfo_st;
struct nvmlBAR1Memory_st;

/* Each row of nvml_api.def: the exported entry point (nvml_api.c), and
 * simgpu's answer behind it, defined in the file the row's section names. */
#define SIM_NVML(name, params, args, count) \
    SIM_EXPORT nvmlReturn_t name params;    \
    nvmlReturn_t sim_##name params;
#include "nvml_api.def"
#undef SIM_NVML

/* nvml.c */
SIM_EXPORT const char *nvmlErrorString(nvmlReturn_t result);

/* ---- hidden internals ------------------------------------------------------------ */

/* nvml.c */
/* The index behind `device`, a handle nvml.c gave out: the check every call on
 * a device starts with (NVML_ERROR_UNINITIALIZED before nvmlInit,
 * NVML_ERROR_INVALID_ARGUMENT for a handle not ours). */
nvmlReturn_t sim_nvml_device(nvmlDevice_t device, uint32_t *index);

#endif

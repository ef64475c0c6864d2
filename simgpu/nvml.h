/* simgpu's libnvidia-ml.so.1: the NVML entry points it exports, with nvml.h's
 * signatures.  Prototypes are grouped by the file that defines them. */
#ifndef SIMGPU_NVML_H
#define SIMGPU_NVML_H

#include "state.h"
#include "vgpulimit/nvml_abi.h"

/* Structures of functions simgpu only answers "not supported" to: never read. */
struct nvmlTemperature_v1_st;
struct nvmlConfComputeMemSizeInfo_st;

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
/* What a handle nvml.c gave out stands for: a GPU (a MIG parent or not), or a
 * MIG device. */
struct sim_nvml_target {
    uint32_t gpu;                   /* the GPU, or the MIG device's parent */
    uint32_t unit;                  /* where its memory and time are kept; SIM_WHOLE_GPU: a MIG parent */
    bool mig_parent;                /* a GPU in MIG mode */
    const struct sim_mig_instance *mig; /* a MIG device's instance; NULL: a GPU */
    uint32_t mig_index;             /* a MIG device's index among its parent's */
};
/* The check every call on a device starts with (NVML_ERROR_UNINITIALIZED
 * before nvmlInit, NVML_ERROR_INVALID_ARGUMENT for a handle not ours). */
nvmlReturn_t sim_nvml_handle(nvmlDevice_t device, struct sim_nvml_target *out);
/* The same for calls about the board itself: the GPU's index, and
 * NVML_ERROR_NOT_SUPPORTED for a MIG device. */
nvmlReturn_t sim_nvml_device(nvmlDevice_t device, uint32_t *index);
/* The handles nvml.c gives out: GPU `gpu`'s, and the MIG device of `unit`. */
nvmlDevice_t sim_nvml_gpu_handle(uint32_t gpu);
nvmlDevice_t sim_nvml_mig_handle(uint32_t unit);

#endif

/* simgpu's NVML answers about the board itself: what monitors ask besides
 * memory, processes and utilisation.
 *
 * A simulated GPU has no sensors, clocks, fans or power rail: those answer
 * NVML_ERROR_NOT_SUPPORTED, as NVML does for what a board lacks, and monitors
 * show "N/A".  What is known is answered as the profile's board (profiles.c)
 * with the display off, in the default compute mode, that has never had a
 * memory error, and MIG as SIMGPU_MIG sets it.  A MIG device answers none of
 * these but whether it is one (sim_nvml_device). */
#include <stdio.h>
#include <string.h>

#include "nvml.h"

/* The device check, then "not supported". */
static nvmlReturn_t sim_nvml_unsupported(nvmlDevice_t device)
{
    uint32_t index;
    nvmlReturn_t ret = sim_nvml_device(device, &index);
    return ret == NVML_SUCCESS ? NVML_ERROR_NOT_SUPPORTED : ret;
}

/* The profile's PCI ids and slots: "00000000:18:00.0" as NVML writes a bus id
 * (eight digits of domain), "0000:18:00.0" in the legacy field and
 * cuDeviceGetPCIBusId. */
nvmlReturn_t sim_nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_config *cfg = sim_config();
    struct sim_pci_address at = sim_device_pci(cfg, i);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", at.domain, at.bus, at.device);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", at.domain, at.bus, at.device);
    pci->domain = at.domain;
    pci->bus = at.bus;
    pci->device = at.device;
    pci->pciDeviceId = cfg->profile->pci_device_id;
    pci->pciSubSystemId = cfg->profile->pci_subsystem_id;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = sim_config()->profile->cc_major; /* as cuDeviceGetAttribute says */
    *minor = sim_config()->profile->cc_minor;
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

nvmlReturn_t sim_nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = t.mig != NULL;
    return NVML_SUCCESS;
}

/* SIMGPU_MIG's mode, never pending a change (simgpu has no reset); "not
 * supported" on a board without MIG (nvml.h). */
nvmlReturn_t sim_nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!sim_mig_model(sim_config()->profile))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int mode = sim_config()->mig[i].enabled ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    ret = sim_nvml_answer(device, currentMode, mode);
    return ret == NVML_SUCCESS ? sim_nvml_answer(device, pendingMode, mode) : ret;
}

nvmlReturn_t sim_nvmlDeviceGetDisplayActive(nvmlDevice_t device, nvmlEnableState_t *isActive)
{
    return sim_nvml_answer(device, (unsigned int *)isActive, NVML_FEATURE_DISABLED);
}

nvmlReturn_t sim_nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    return sim_nvml_answer(device, (unsigned int *)display, NVML_FEATURE_DISABLED);
}

/* The state file outlives every client, which is what persistence mode keeps on a real driver. */
nvmlReturn_t sim_nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return sim_nvml_answer(device, (unsigned int *)mode, NVML_FEATURE_ENABLED);
}

/* NVML_COMPUTEMODE_DEFAULT: any number of processes may use the device. */
nvmlReturn_t sim_nvmlDeviceGetComputeMode(nvmlDevice_t device, unsigned int *mode)
{
    return sim_nvml_answer(device, mode, 0);
}

nvmlReturn_t sim_nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, unsigned int errorType, unsigned int counterType,
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

/* The video engines never run: 0% over a one-second sampling period; "not
 * supported" in MIG mode, as all utilisation (nvml.h). */
static nvmlReturn_t sim_nvml_idle_engine(nvmlDevice_t device, unsigned int *utilization,
                                         unsigned int *samplingPeriodUs)
{
    uint32_t i;
    nvmlReturn_t ret = sim_nvml_device(device, &i);
    if (ret != NVML_SUCCESS)
        return ret;
    if (sim_config()->mig[i].enabled)
        return NVML_ERROR_NOT_SUPPORTED;
    ret = sim_nvml_answer(device, utilization, 0);
    return ret == NVML_SUCCESS ? sim_nvml_answer(device, samplingPeriodUs, 1000000) : ret;
}

nvmlReturn_t sim_nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    return sim_nvml_idle_engine(device, utilization, samplingPeriodUs);
}

nvmlReturn_t sim_nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *utilization,
                                             unsigned int *samplingPeriodUs)
{
    return sim_nvml_idle_engine(device, utilization, samplingPeriodUs);
}

nvmlReturn_t sim_nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    (void)type;
    (void)clock;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type, unsigned int *clock)
{
    (void)type;
    (void)clock;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    (void)speed;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensorType, unsigned int *temp)
{
    (void)sensorType;
    (void)temp;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetTemperatureV(nvmlDevice_t device, struct nvmlTemperature_v1_st *temperature)
{
    (void)temperature;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    (void)power;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    (void)limit;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetPerformanceState(nvmlDevice_t device, unsigned int *pState)
{
    (void)pState;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetPcieThroughput(nvmlDevice_t device, unsigned int counter, unsigned int *value)
{
    (void)counter;
    (void)value;
    return sim_nvml_unsupported(device);
}

/* The Windows driver models: NVML answers "not supported" on Linux. */
nvmlReturn_t sim_nvmlDeviceGetDriverModel(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    (void)current;
    (void)pending;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, unsigned int *current, unsigned int *pending)
{
    (void)current;
    (void)pending;
    return sim_nvml_unsupported(device);
}

nvmlReturn_t sim_nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device, struct nvmlConfComputeMemSizeInfo_st *info)
{
    (void)info;
    return sim_nvml_unsupported(device);
}

/* A MIG device's share of its board's BAR1 by memory slices, less a MiB:
 * 32767 MiB for an A100 80GB's 2g.20gb, as nvidia-smi printed it
 * (XuehaiPan/nvitop PR#8).  A whole GPU's is not simulated. */
nvmlReturn_t sim_nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory)
{
    struct sim_nvml_target t;
    nvmlReturn_t ret = sim_nvml_handle(device, &t);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!t.mig)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!bar1Memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    const struct sim_config *cfg = sim_config();
    uint64_t mib = (uint64_t)cfg->profile->bar1_mib * t.mig->profile->memory_slices / SIM_MIG_SLOTS - 1;
    *bar1Memory = (nvmlBAR1Memory_t){.bar1Total = mib << 20, .bar1Free = mib << 20, .bar1Used = 0};
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    (void)serial;
    (void)length;
    return sim_nvml_unsupported(device);
}

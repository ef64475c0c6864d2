/* nvidia-smi's default view, as an NVML client in C: the calls it makes, in
 * its order (driver and CUDA versions; per device its name, PCI bus id,
 * persistence mode, fan, temperature, performance state, power and its
 * limit, memory (v2), utilisation, compute mode; then the compute and
 * graphics processes), each answer that is not SUCCESS shown as N/A, as
 * nvidia-smi shows it.  A GPU in MIG mode adds nvidia-smi's "MIG devices"
 * table: each MIG device (the indices up to the maximum, skipping NOT_FOUND)
 * with its GPU and compute instance, memory and SMs; its processes carry
 * their instance ids.  The table is printed in nvidia-smi's words:
 *
 *   GPU 0: NAME  Bus-Id BUS  Memory-Usage USEDMiB / TOTALMiB  GPU-Util N%
 *   MIG 0/1: GI 1 CI 0  Memory-Usage USEDMiB / TOTALMiB  SM 60
 *   Process: PID  USED MiB
 *   Process: PID  GI 1 CI 0  USED MiB */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vgpulimit/nvml_abi.h"

static void *lib;

static void *fn(const char *name)
{
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "smi_view: %s missing\n", name);
        exit(2);
    }
    return f;
}

#define CALL(type, name) ((type)fn(name))
#define MiB (1024ull * 1024ull)

/* A field nvidia-smi shows: its value, or N/A for any other answer. */
static void field(const char *label, nvmlReturn_t rc, unsigned long long value, const char *unit)
{
    if (rc == NVML_SUCCESS)
        printf("  %s %llu%s", label, value, unit);
    else
        printf("  %s N/A", label);
}

typedef nvmlReturn_t (*uint_fn)(nvmlDevice_t, unsigned int *);

static void processes(nvmlDevice_t dev, const char *name)
{
    typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
    list_fn f = CALL(list_fn, name);
    unsigned int count = 0;
    nvmlReturn_t rc = f(dev, &count, NULL);
    nvmlProcessInfo_t *infos = NULL;
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE) {
        infos = calloc(count, sizeof *infos);
        rc = f(dev, &count, infos);
    }
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < count; i++) {
        if (infos[i].gpuInstanceId != 0xFFFFFFFFu)
            printf("Process: %u  GI %u CI %u  %llu MiB\n", infos[i].pid, infos[i].gpuInstanceId,
                   infos[i].computeInstanceId, infos[i].usedGpuMemory / MiB);
        else
            printf("Process: %u  %llu MiB\n", infos[i].pid, infos[i].usedGpuMemory / MiB);
    }
    free(infos);
}

/* nvidia-smi's MIG devices table, for a GPU in MIG mode. */
static void mig_devices(nvmlDevice_t dev, unsigned int gpu)
{
    unsigned int current = 0, pending = 0, max = 0;
    if (CALL(nvmlReturn_t(*)(nvmlDevice_t, unsigned int *, unsigned int *), "nvmlDeviceGetMigMode")(
            dev, &current, &pending) != NVML_SUCCESS || current != 1)
        return;
    if (CALL(uint_fn, "nvmlDeviceGetMaxMigDeviceCount")(dev, &max) != NVML_SUCCESS)
        return;
    for (unsigned int i = 0; i < max; i++) {
        nvmlDevice_t mig;
        nvmlReturn_t rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, unsigned int, nvmlDevice_t *),
                               "nvmlDeviceGetMigDeviceHandleByIndex")(dev, i, &mig);
        if (rc == NVML_ERROR_NOT_FOUND)
            continue;
        if (rc != NVML_SUCCESS)
            break;
        unsigned int gi = 0, ci = 0;
        printf("MIG %u/%u:", gpu, i);
        rc = CALL(uint_fn, "nvmlDeviceGetGpuInstanceId")(mig, &gi);
        field("GI", rc, gi, "");
        rc = CALL(uint_fn, "nvmlDeviceGetComputeInstanceId")(mig, &ci);
        field("CI", rc, ci, "");
        nvmlMemory_v2_t memory = {.version = nvmlMemory_v2};
        rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *), "nvmlDeviceGetMemoryInfo_v2")(mig, &memory);
        if (rc == NVML_SUCCESS)
            printf("  Memory-Usage %lluMiB / %lluMiB", memory.used / MiB, memory.total / MiB);
        else
            printf("  Memory-Usage N/A");
        nvmlDeviceAttributes_t attributes;
        rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlDeviceAttributes_t *), "nvmlDeviceGetAttributes_v2")(
            mig, &attributes);
        field("SM", rc, attributes.multiprocessorCount, "");
        printf("\n");
        processes(mig, "nvmlDeviceGetComputeRunningProcesses_v3");
    }
}

int main(void)
{
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "smi_view: %s\n", dlerror());
        return 2;
    }
    if (CALL(nvmlReturn_t(*)(void), "nvmlInit_v2")() != NVML_SUCCESS)
        return 3;
    char text[96];
    int cuda = 0;
    if (CALL(nvmlReturn_t(*)(char *, unsigned int), "nvmlSystemGetDriverVersion")(text, sizeof text) == NVML_SUCCESS)
        printf("Driver Version: %s", text);
    if (CALL(nvmlReturn_t(*)(int *), "nvmlSystemGetCudaDriverVersion")(&cuda) == NVML_SUCCESS)
        printf("  CUDA Version: %d.%d", cuda / 1000, cuda % 1000 / 10);
    printf("\n");
    unsigned int count = 0;
    if (CALL(nvmlReturn_t(*)(unsigned int *), "nvmlDeviceGetCount_v2")(&count) != NVML_SUCCESS)
        return 4;
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        if (CALL(nvmlReturn_t(*)(unsigned int, nvmlDevice_t *), "nvmlDeviceGetHandleByIndex_v2")(i, &dev) !=
            NVML_SUCCESS)
            return 5;
        char name[96] = "N/A";
        CALL(nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned int), "nvmlDeviceGetName")(dev, name, sizeof name);
        nvmlPciInfo_t pci;
        nvmlReturn_t rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlPciInfo_t *), "nvmlDeviceGetPciInfo_v3")(dev, &pci);
        printf("GPU %u: %s  Bus-Id %s", i, name, rc == NVML_SUCCESS ? pci.busId : "N/A");
        unsigned int value = 0;
        rc = CALL(uint_fn, "nvmlDeviceGetPersistenceMode")(dev, &value);
        field("Persistence-M", rc, value, "");
        rc = CALL(uint_fn, "nvmlDeviceGetFanSpeed")(dev, &value);
        field("Fan", rc, value, "%");
        rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, int, unsigned int *), "nvmlDeviceGetTemperature")(dev, 0, &value);
        field("Temp", rc, value, "C");
        rc = CALL(uint_fn, "nvmlDeviceGetPerformanceState")(dev, &value);
        field("Perf", rc, value, "");
        rc = CALL(uint_fn, "nvmlDeviceGetPowerUsage")(dev, &value);
        field("Pwr", rc, value / 1000, "W");
        rc = CALL(uint_fn, "nvmlDeviceGetPowerManagementLimit")(dev, &value);
        field("Cap", rc, value / 1000, "W");
        nvmlMemory_v2_t memory = {.version = nvmlMemory_v2};
        rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *), "nvmlDeviceGetMemoryInfo_v2")(dev, &memory);
        if (rc == NVML_SUCCESS)
            printf("  Memory-Usage %lluMiB / %lluMiB", memory.used / MiB, memory.total / MiB);
        else
            printf("  Memory-Usage N/A");
        nvmlUtilization_t util;
        rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlUtilization_t *), "nvmlDeviceGetUtilizationRates")(dev, &util);
        field("GPU-Util", rc, util.gpu, "%");
        rc = CALL(uint_fn, "nvmlDeviceGetComputeMode")(dev, &value);
        field("Compute-M", rc, value, "");
        printf("\n");
        mig_devices(dev, i);
        processes(dev, "nvmlDeviceGetComputeRunningProcesses_v3");
        processes(dev, "nvmlDeviceGetGraphicsRunningProcesses_v3");
    }
    CALL(nvmlReturn_t(*)(void), "nvmlShutdown")();
    return 0;
}

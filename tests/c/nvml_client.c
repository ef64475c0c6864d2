/* An NVML client in C, as nvidia-smi is one: dlopen("libnvidia-ml.so.1") and
 * dlsym every function, then each call the shim rewrites, with NVML's size
 * protocol (a NULL array first) and the arguments a careless client passes
 * (NULL pointers, an index past the end).  Prints one line per answer:
 *
 *   count N | device I UUID | memory I TOTAL USED FREE | memory_v2 I TOTAL RESERVED USED FREE
 *   procs I VARIANT RC COUNT [PID:BYTES ...] | util I RC GPU MEM | ... */
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
        fprintf(stderr, "nvml_client: %s missing\n", name);
        exit(2);
    }
    return f;
}

typedef nvmlReturn_t (*list_v2_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
typedef nvmlReturn_t (*list_v1_fn)(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);

static void list_v2(unsigned int index, nvmlDevice_t dev, const char *name)
{
    list_v2_fn f = (list_v2_fn)fn(name);
    unsigned int count = 0;
    nvmlReturn_t rc = f(dev, &count, NULL);
    nvmlProcessInfo_t *infos = calloc(count + 1, sizeof *infos);
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE)
        rc = f(dev, &count, infos);
    printf("procs %u %s %d %u", index, name, (int)rc, count);
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < count; i++)
        printf(" %u:%llu", infos[i].pid, infos[i].usedGpuMemory);
    printf("\n");
    free(infos);
    printf("nullcount %s %d\n", name, (int)f(dev, NULL, NULL));
}

static void list_v1(unsigned int index, nvmlDevice_t dev, const char *name)
{
    list_v1_fn f = (list_v1_fn)fn(name);
    nvmlProcessInfo_v1_t infos[64];
    unsigned int count = 64;
    nvmlReturn_t rc = f(dev, &count, infos);
    printf("procs %u %s %d %u", index, name, (int)rc, count);
    for (unsigned int i = 0; rc == NVML_SUCCESS && i < count; i++)
        printf(" %u:%llu", infos[i].pid, infos[i].usedGpuMemory);
    printf("\n");
}

int main(void)
{
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "nvml_client: %s\n", dlerror());
        return 2;
    }
    nvmlReturn_t (*init)(unsigned int) = (nvmlReturn_t(*)(unsigned int))fn("nvmlInitWithFlags");
    nvmlReturn_t (*count_fn)(unsigned int *) = (nvmlReturn_t(*)(unsigned int *))fn("nvmlDeviceGetCount_v2");
    nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *) =
        (nvmlReturn_t(*)(unsigned int, nvmlDevice_t *))fn("nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*by_uuid)(const char *, nvmlDevice_t *) =
        (nvmlReturn_t(*)(const char *, nvmlDevice_t *))fn("nvmlDeviceGetHandleByUUID");
    nvmlReturn_t (*by_bus)(const char *, nvmlDevice_t *) =
        (nvmlReturn_t(*)(const char *, nvmlDevice_t *))fn("nvmlDeviceGetHandleByPciBusId_v2");
    nvmlReturn_t (*get_index)(nvmlDevice_t, unsigned int *) =
        (nvmlReturn_t(*)(nvmlDevice_t, unsigned int *))fn("nvmlDeviceGetIndex");
    nvmlReturn_t (*get_uuid)(nvmlDevice_t, char *, unsigned int) =
        (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned int))fn("nvmlDeviceGetUUID");
    nvmlReturn_t (*mem)(nvmlDevice_t, nvmlMemory_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *))fn("nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mem2)(nvmlDevice_t, nvmlMemory_v2_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *))fn("nvmlDeviceGetMemoryInfo_v2");
    nvmlReturn_t (*util)(nvmlDevice_t, nvmlUtilization_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlUtilization_t *))fn("nvmlDeviceGetUtilizationRates");
    nvmlReturn_t (*detail)(nvmlDevice_t, nvmlProcessDetailList_v1_t *) =
        (nvmlReturn_t(*)(nvmlDevice_t, nvmlProcessDetailList_v1_t *))fn("nvmlDeviceGetRunningProcessDetailList");

    printf("uninitialised %d\n", (int)by_index(0, &(nvmlDevice_t){0}));
    if (init(0) != NVML_SUCCESS)
        return 3;
    unsigned int count = 0;
    nvmlReturn_t counted = count_fn(&count);
    printf("count %d %u\n", (int)counted, count);
    nvmlDevice_t past;
    printf("past_end %d\n", (int)by_index(count, &past));
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t dev;
        char uuid[NVML_DEVICE_UUID_BUFFER_SIZE], bus[32];
        unsigned int index = 99;
        if (by_index(i, &dev) != NVML_SUCCESS || get_uuid(dev, uuid, sizeof uuid) != NVML_SUCCESS)
            return 4;
        nvmlDevice_t again = NULL, on_bus = NULL;
        snprintf(bus, sizeof bus, "0000:%02X:00.0", 0x18 + i);
        nvmlReturn_t indexed = get_index(dev, &index), found = by_uuid(uuid, &again);
        nvmlReturn_t bused = by_bus(bus, &on_bus);
        printf("device %u %s index %d %u uuid %d %d bus %s %d\n", i, uuid, (int)indexed, index, (int)found,
               again == dev, bus, (int)bused);
        nvmlMemory_t m;
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        if (mem(dev, &m) == NVML_SUCCESS)
            printf("memory %u %llu %llu %llu\n", i, m.total, m.used, m.free);
        if (mem2(dev, &m2) == NVML_SUCCESS)
            printf("memory_v2 %u %llu %llu %llu %llu\n", i, m2.total, m2.reserved, m2.used, m2.free);
        printf("memory_null %d\n", (int)mem(dev, NULL));
        list_v1(i, dev, "nvmlDeviceGetComputeRunningProcesses");
        list_v2(i, dev, "nvmlDeviceGetComputeRunningProcesses_v2");
        list_v2(i, dev, "nvmlDeviceGetComputeRunningProcesses_v3");
        list_v2(i, dev, "nvmlDeviceGetGraphicsRunningProcesses_v3");
        list_v2(i, dev, "nvmlDeviceGetMPSComputeRunningProcesses_v3");
        nvmlProcessDetailList_v1_t list = {.version = nvmlProcessDetailList_v1, .mode = NVML_PROCESS_MODE_COMPUTE};
        nvmlReturn_t rc = detail(dev, &list);
        nvmlProcessDetail_v1_t entries[64];
        if (rc == NVML_ERROR_INSUFFICIENT_SIZE && list.numProcArrayEntries <= 64) {
            list.procArray = entries;
            rc = detail(dev, &list);
        }
        printf("detail %u %d %u\n", i, (int)rc, list.numProcArrayEntries);
        nvmlUtilization_t u;
        rc = util(dev, &u);
        printf("util %u %d %u %u\n", i, (int)rc, rc == NVML_SUCCESS ? u.gpu : 0, rc == NVML_SUCCESS ? u.memory : 0);
    }
    return 0;
}

/* Every NVML function the shim hooks, called once each as a careful client
 * calls it: a size query first where the function has one, then a buffer of
 * exactly the size the answer asked for (so that a sanitizer sees any read or
 * write past it), and every entry of a SUCCESS answer read.  Whatever a call
 * answers, the next one is made.  One line per function:
 *
 *   NAME RC [RC2 COUNT PARITY]   (RC2: the call after a size query)
 *
 * `nvml_answers init` initialises NVML first; `nvml_answers uninit` never
 * does (a careless client), so each call goes in with whatever handle it got. */
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
        fprintf(stderr, "nvml_answers: %s missing\n", name);
        exit(2);
    }
    return f;
}

#define CALL(type, name) ((type)fn(name))

/* Reads every entry, so that a count larger than the buffer is seen. */
static unsigned long long touch(const void *entries, size_t stride, unsigned int count)
{
    unsigned long long sum = 0;
    for (unsigned int i = 0; i < count; i++) {
        unsigned int pid;
        memcpy(&pid, (const unsigned char *)entries + i * stride, sizeof pid);
        sum += pid;
    }
    return sum;
}

typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned int *, void *);

static void list(nvmlDevice_t dev, const char *name, size_t stride)
{
    list_fn f = CALL(list_fn, name);
    unsigned int count = 0;
    nvmlReturn_t rc = f(dev, &count, NULL), rc2 = rc;
    unsigned long long sum = 0;
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE && count < 4096) {
        void *entries = malloc(count ? count * stride : 1);
        rc2 = f(dev, &count, entries);
        if (rc2 == NVML_SUCCESS)
            sum = touch(entries, stride, count);
        free(entries);
    }
    printf("%s %d %d %u %llu\n", name, (int)rc, (int)rc2, rc2 == NVML_SUCCESS ? count : 0, sum % 2);
}

static void detail_list(nvmlDevice_t dev)
{
    typedef nvmlReturn_t (*detail_fn)(nvmlDevice_t, nvmlProcessDetailList_v1_t *);
    detail_fn f = CALL(detail_fn, "nvmlDeviceGetRunningProcessDetailList");
    nvmlProcessDetailList_v1_t plist = {.version = nvmlProcessDetailList_v1, .mode = NVML_PROCESS_MODE_COMPUTE};
    nvmlReturn_t rc = f(dev, &plist), rc2 = rc;
    unsigned long long sum = 0;
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE && plist.numProcArrayEntries < 4096) {
        unsigned int count = plist.numProcArrayEntries;
        plist.procArray = malloc(count ? count * sizeof *plist.procArray : 1);
        rc2 = f(dev, &plist);
        if (rc2 == NVML_SUCCESS)
            sum = touch(plist.procArray, sizeof *plist.procArray, plist.numProcArrayEntries);
        free(plist.procArray);
    }
    printf("nvmlDeviceGetRunningProcessDetailList %d %d %u %llu\n", (int)rc, (int)rc2,
           rc2 == NVML_SUCCESS ? plist.numProcArrayEntries : 0, sum % 2);
}

static void process_utilization(nvmlDevice_t dev)
{
    typedef nvmlReturn_t (*util_fn)(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *,
                                    unsigned long long);
    util_fn f = CALL(util_fn, "nvmlDeviceGetProcessUtilization");
    unsigned int count = 0;
    nvmlReturn_t rc = f(dev, NULL, &count, 0), rc2 = rc;
    unsigned long long sum = 0;
    if (rc == NVML_ERROR_INSUFFICIENT_SIZE && count < 4096) {
        nvmlProcessUtilizationSample_t *samples = malloc(count ? count * sizeof *samples : 1);
        rc2 = f(dev, samples, &count, 0);
        if (rc2 == NVML_SUCCESS)
            sum = touch(samples, sizeof *samples, count);
        free(samples);
    }
    printf("nvmlDeviceGetProcessUtilization %d %d %u %llu\n", (int)rc, (int)rc2,
           rc2 == NVML_SUCCESS ? count : 0, sum % 2);
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "init") && strcmp(argv[1], "uninit"))) {
        fprintf(stderr, "usage: nvml_answers init|uninit\n");
        return 2;
    }
    lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "nvml_answers: %s\n", dlerror());
        return 2;
    }
    if (!strcmp(argv[1], "init"))
        printf("init %d\n", (int)CALL(nvmlReturn_t(*)(unsigned int), "nvmlInitWithFlags")(0));

    typedef nvmlReturn_t (*count_fn)(unsigned int *);
    typedef nvmlReturn_t (*index_fn)(unsigned int, nvmlDevice_t *);
    typedef nvmlReturn_t (*key_fn)(const char *, nvmlDevice_t *);
    unsigned int count = 0;
    printf("nvmlDeviceGetCount %d\n", (int)CALL(count_fn, "nvmlDeviceGetCount")(&count));
    printf("nvmlDeviceGetCount_v2 %d\n", (int)CALL(count_fn, "nvmlDeviceGetCount_v2")(&count));
    nvmlDevice_t dev = NULL, other = NULL;
    printf("nvmlDeviceGetHandleByIndex %d\n", (int)CALL(index_fn, "nvmlDeviceGetHandleByIndex")(0, &other));
    printf("nvmlDeviceGetHandleByIndex_v2 %d\n", (int)CALL(index_fn, "nvmlDeviceGetHandleByIndex_v2")(0, &dev));
    char uuid[NVML_DEVICE_UUID_BUFFER_SIZE] = "GPU-00000000-0000-0000-0000-000000000000";
    CALL(nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned int), "nvmlDeviceGetUUID")(dev, uuid, sizeof uuid);
    printf("nvmlDeviceGetHandleByUUID %d\n", (int)CALL(key_fn, "nvmlDeviceGetHandleByUUID")(uuid, &other));
    printf("nvmlDeviceGetHandleByPciBusId %d\n",
           (int)CALL(key_fn, "nvmlDeviceGetHandleByPciBusId")("0000:18:00.0", &other));
    printf("nvmlDeviceGetHandleByPciBusId_v2 %d\n",
           (int)CALL(key_fn, "nvmlDeviceGetHandleByPciBusId_v2")("00000000:18:00.0", &other));
    unsigned int index;
    printf("nvmlDeviceGetIndex %d\n",
           (int)CALL(nvmlReturn_t(*)(nvmlDevice_t, unsigned int *), "nvmlDeviceGetIndex")(dev, &index));

    nvmlMemory_t m;
    nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
    nvmlReturn_t rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_t *), "nvmlDeviceGetMemoryInfo")(dev, &m);
    printf("nvmlDeviceGetMemoryInfo %d\n", (int)rc);
    rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlMemory_v2_t *), "nvmlDeviceGetMemoryInfo_v2")(dev, &m2);
    printf("nvmlDeviceGetMemoryInfo_v2 %d\n", (int)rc);

    list(dev, "nvmlDeviceGetComputeRunningProcesses", sizeof(nvmlProcessInfo_v1_t));
    list(dev, "nvmlDeviceGetComputeRunningProcesses_v2", sizeof(nvmlProcessInfo_t));
    list(dev, "nvmlDeviceGetComputeRunningProcesses_v3", sizeof(nvmlProcessInfo_t));
    list(dev, "nvmlDeviceGetGraphicsRunningProcesses", sizeof(nvmlProcessInfo_v1_t));
    list(dev, "nvmlDeviceGetGraphicsRunningProcesses_v2", sizeof(nvmlProcessInfo_t));
    list(dev, "nvmlDeviceGetGraphicsRunningProcesses_v3", sizeof(nvmlProcessInfo_t));
    list(dev, "nvmlDeviceGetMPSComputeRunningProcesses", sizeof(nvmlProcessInfo_v1_t));
    list(dev, "nvmlDeviceGetMPSComputeRunningProcesses_v2", sizeof(nvmlProcessInfo_t));
    list(dev, "nvmlDeviceGetMPSComputeRunningProcesses_v3", sizeof(nvmlProcessInfo_t));
    detail_list(dev);

    nvmlUtilization_t u;
    rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, nvmlUtilization_t *), "nvmlDeviceGetUtilizationRates")(dev, &u);
    printf("nvmlDeviceGetUtilizationRates %d\n", (int)rc);
    process_utilization(dev);

    nvmlDevice_t mig = NULL;
    rc = CALL(nvmlReturn_t(*)(nvmlDevice_t, unsigned int, nvmlDevice_t *), "nvmlDeviceGetMigDeviceHandleByIndex")(
        dev, 0, &mig);
    printf("nvmlDeviceGetMigDeviceHandleByIndex %d\n", (int)rc);
    return 0;
}

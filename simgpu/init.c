/* simgpu's driver: initialisation (cuInit, the driver's version) and fork.
 *
 * The child of a fork starts uninitialised, with no context and no device
 * memory: what it inherited belongs to its parent.  It may call cuInit again.
 *
 * This file is above what it sets up and forks: it calls initialized.c (what
 * cuInit found, which every family reads), devices.c, contexts.c and the
 * families of device memory (memory.c, pools.c, graph_memory.c, vmm.c,
 * arrays.c), and none of them calls it. */
#include <errno.h>
#include <pthread.h>

#include "driver.h"

static struct {
    pthread_mutex_t mutex;          /* guards everything here, and initialized.c's writes */
    bool init_done;
    CUresult init_result;
} sim_drv = {.mutex = PTHREAD_MUTEX_INITIALIZER};

/* The lock order: this mutex, then contexts.c's, then the memory mutex. */
static void sim_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_drv.mutex);
    sim_contexts_atfork_prepare();
    sim_mem_atfork_prepare();
}

static void sim_atfork_parent(void)
{
    sim_mem_atfork_parent();
    sim_contexts_atfork_parent();
    pthread_mutex_unlock(&sim_drv.mutex);
}

/* The families of device memory forget theirs under the memory mutex, before
 * memory.c's handler forgets its table and lets the mutex go. */
static void sim_atfork_child(void)
{
    sim_pools_forget();
    sim_graph_memory_forget();
    sim_vmm_forget();
    sim_arrays_forget();
    sim_mem_atfork_child();
    sim_contexts_atfork_child();
    sim_drv.init_done = false;
    sim_set_initialized(false);
    pthread_mutex_unlock(&sim_drv.mutex);
}

__attribute__((constructor)) static void sim_driver_load(void)
{
    pthread_atfork(sim_atfork_prepare, sim_atfork_parent, sim_atfork_child);
}

CUresult cuInit(unsigned int Flags)
{
    SIM_CALLED();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_drv.mutex);
    if (!sim_drv.init_done) {
        const struct sim_config *cfg = sim_config();
        int rc = cfg ? sim_state_open(cfg) : -EINVAL;
        if (rc == 0) {
            sim_set_driver_config(cfg);
            /* Read here, as the real driver reads CUDA_VISIBLE_DEVICES: a
             * value the program set before cuInit counts. */
            sim_drv.init_result = sim_devices_enumerate(cfg);
        } else {
            sim_drv.init_result = rc == -EINVAL ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OPERATING_SYSTEM;
        }
        sim_drv.init_done = true;
        sim_set_initialized(sim_drv.init_result == CUDA_SUCCESS);
        if (sim_drv.init_result == CUDA_SUCCESS)
            sim_checkpoint_thread_start();
    }
    CUresult res = sim_drv.init_result;
    pthread_mutex_unlock(&sim_drv.mutex);
    return res;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    SIM_CALLED();
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    const struct sim_config *cfg = sim_config();
    if (!cfg)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = cfg->driver_version;
    return CUDA_SUCCESS;
}

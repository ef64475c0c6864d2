/* simgpu's driver, what nearly every entry point asks first: whether cuInit has
 * succeeded in this process generation, and the configuration it read.
 *
 * init.c writes both (cuInit, and the child of a fork); every other file only
 * reads them.  This file calls nothing of the driver's, so that the files
 * init.c calls (devices, contexts, memory) may read them too. */
#include "driver.h"

static struct {
    bool initialized;               /* atomic */
    const struct sim_config *cfg;
} sim_init;

bool sim_initialized(void)
{
    return __atomic_load_n(&sim_init.initialized, __ATOMIC_ACQUIRE);
}

const struct sim_config *sim_driver_config(void)
{
    return sim_init.cfg;
}

void sim_set_initialized(bool initialized)
{
    __atomic_store_n(&sim_init.initialized, initialized, __ATOMIC_RELEASE);
}

void sim_set_driver_config(const struct sim_config *cfg)
{
    sim_init.cfg = cfg;
}

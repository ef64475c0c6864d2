/* simgpu's kernel launches: cuLaunchKernel, cuLaunchKernelEx,
 * cuLaunchCooperativeKernel and their _ptsz variants.  A grid is checked as
 * the profile's board would (launch_rules.c, and here whether a cooperative
 * one fits at once); a kernel first loads what it needs into its context
 * (modules.c), then, after the launch's CPU time (launch_rules.c), runs for
 * its duration on its stream's lane, or is added to the graph its stream is
 * capturing (graphs.c).
 *
 * This file owns the cuLaunch* entry points; graphs.c, which it adds captured
 * kernels to, does not call it. */
#include "work.h"

enum {
    SIM_SM_BLOCKS = 32,             /* resident blocks per SM, on every board simgpu has */
};

/* A cooperative grid must be resident all at once. */
static bool sim_fits_at_once(const struct sim_grid *g, uint32_t device)
{
    const struct sim_config *cfg = sim_config();
    uint64_t threads = (uint64_t)g->bx * g->by * g->bz;
    uint64_t per_sm = cfg->profile->threads_per_sm / threads;
    if (per_sm > SIM_SM_BLOCKS)
        per_sm = SIM_SM_BLOCKS;
    return (uint64_t)g->gx * g->gy * g->gz <= per_sm * cfg->units[device].sms;
}

static CUresult sim_launch(CUfunction f, const struct sim_grid *grid, CUstream stream, bool per_thread,
                           void **params, void **extra, bool cooperative)
{
    uint64_t began = sim_launch_began();
    CUcontext current;
    CUresult res = sim_current_context(&current);
    if (res != CUDA_SUCCESS)
        return res;
    uint64_t duration;
    if (sim_kernel_duration(f, &duration) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_lane lane;
    res = sim_lane_of(stream, per_thread, &lane);
    if (res == CUDA_SUCCESS)
        res = sim_check_grid(grid, params, extra);
    if (res != CUDA_SUCCESS)
        return res;
    if (cooperative && !sim_fits_at_once(grid, current->device))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    res = sim_kernel_prepare(f, current);
    if (res != CUDA_SUCCESS)
        return res;
    CUgraph capture = sim_capturing(&lane);
    if (capture)
        return sim_graph_add(capture, duration, NULL);
    sim_launch_cpu(began);
    return sim_run(&lane, duration);
}

#define SIM_GRID {gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    SIM_CALLED();
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, false, kernelParams, extra, false);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    SIM_CALLED();
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, true, kernelParams, extra, false);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    SIM_CALLED();
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, false, kernelParams, NULL, true);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    SIM_CALLED();
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, true, kernelParams, NULL, true);
}

#undef SIM_GRID

/* Launch attributes are accepted and not read (a cooperative attribute does
 * not check that the grid fits). */
static CUresult sim_launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra,
                              bool per_thread)
{
    if (!config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_grid grid = {config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                            config->blockDimY, config->blockDimZ, config->sharedMemBytes};
    return sim_launch(f, &grid, config->hStream, per_thread, kernelParams, extra, false);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    SIM_CALLED();
    return sim_launch_ex(config, f, kernelParams, extra, false);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    SIM_CALLED();
    return sim_launch_ex(config, f, kernelParams, extra, true);
}


/* simgpu's rules of every launch, a kernel's (launches.c, and a kernel node's
 * in graphs.c) or a graph's (graphs.c): the grid the profile's board takes,
 * and the CPU time a launch costs its caller.
 *
 * A launch takes the calling thread's CPU for SIMGPU_LAUNCH_US (4 us: an
 * empty cuLaunchKernel took 4-5 us on an H200's driver), spent before its
 * kernel is queued, as a driver builds the launch before it rings the GPU.
 * So a program whose CPU is slower than its kernels leaves the GPU idle
 * between them (launch-bound, as eager PyTorch on small tensors is): each
 * kernel starts when it is queued, on the timeline (timeline.c).
 *
 * This file reads only the configuration and the clock: launches.c and
 * graphs.c both call it, and it calls neither. */
#include <limits.h>

#include "work.h"

CUresult sim_check_grid(const struct sim_grid *g, void **params, void **extra)
{
    if (!g->gx || !g->gy || !g->gz || !g->bx || !g->by || !g->bz || g->gy > 65535 || g->gz > 65535 ||
        g->gx > INT_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (g->bx > 1024 || g->by > 1024 || g->bz > 64 || (uint64_t)g->bx * g->by * g->bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (g->shared_bytes > sim_config()->profile->shared_per_block_optin || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

uint64_t sim_launch_began(void)
{
    const struct sim_config *cfg = sim_config();
    return cfg && cfg->launch_ns ? sim_now_ns() : 0;
}

void sim_launch_cpu(uint64_t began_ns)
{
    if (!began_ns)
        return; /* SIMGPU_LAUNCH_US=0: no time, and no clock read for it */
    uint64_t until = began_ns + sim_config()->launch_ns;
    /* Spun, not slept: the driver's work is CPU work, and a sleep that short
     * would take the scheduler's slack instead. */
    while (sim_now_ns() < until)
        continue;
}

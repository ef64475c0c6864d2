/* simgpu's frees of device memory by address: cuMemFree and cuMemFreeAsync.
 *
 * An address names an entry of memory.c's table, which may be any family's:
 * cuMemAlloc*'s (memory.c), a pool's (pools.c: cuda.h lets cuMemFree take
 * cuMemAllocAsync's pointers, and the CUDA programming guide cudaFreeAsync
 * cudaMalloc's) or a live graph allocation's (graph_memory.c).  This file owns
 * handing the entry back to the family that made it; it is above memory.c,
 * pools.c and graph_memory.c, and none of them calls it. */
#include "driver.h"

/* Frees the allocation whose base is `dptr`; CUDA_ERROR_INVALID_VALUE for any
 * other address, a virtual memory mapping's included.  A pool's or a graph's
 * goes back to its pool under the memory mutex that took its entry; cuMemAlloc*'s
 * pages and charge go back after it. */
static CUresult sim_free(CUdeviceptr dptr)
{
    struct sim_mem_entry found;
    sim_mem_lock();
    bool taken = sim_mem_take((uintptr_t)dptr, &found);
    if (taken && found.kind == SIM_MEM_POOL)
        sim_pool_free(found.owner, found.base);
    else if (taken && found.kind == SIM_MEM_GRAPH)
        sim_graph_memory_free(found.owner);
    sim_mem_unlock();
    if (!taken)
        return CUDA_ERROR_INVALID_VALUE;
    if (found.kind == SIM_MEM_LINEAR)
        sim_mem_unmap(&found);
    return CUDA_SUCCESS;
}

/* Only the base of a live allocation may be freed; 0 is a no-op. */
CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res == CUDA_ERROR_NOT_INITIALIZED)
        return res;
    if (dptr == 0)
        return CUDA_SUCCESS;
    if (res != CUDA_SUCCESS)
        return res;
    return sim_free(dptr);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    SIM_CALLED();
    return cuMemFree_v2(dptr);
}

/* Takes cuMemAlloc's pointers too: the CUDA programming guide lets
 * cudaFreeAsync free cudaMalloc's memory.  0 is a no-op, as for cuMemFree. */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    SIM_CALLED();
    CUresult res = sim_pool_stream_ready(hStream);
    if (res != CUDA_SUCCESS || dptr == 0)
        return res;
    return sim_free(dptr);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    SIM_CALLED();
    return cuMemFreeAsync(dptr, hStream);
}

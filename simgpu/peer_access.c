/* simgpu's peer access: whether one device can reach another's memory, and
 * the peers a context has enabled (cuCtxEnablePeerAccess).
 *
 * The simulated devices share one NVLink domain, as the GPUs of an HGX H100
 * board do: any two of them can reach each other's memory, a device never
 * counts as its own peer.  Every allocation lives in this process's address
 * space, so enabling access changes what is allowed, not what works. */
#include "driver.h"

enum { SIM_MAX_PEERS = 8 }; /* cuda.h: CUDA_ERROR_TOO_MANY_PEERS past the hardware's limit (8) */

CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    SIM_CALLED();
    uint32_t a, b;
    CUresult res = sim_device_index(dev, &a);
    if (res == CUDA_SUCCESS)
        res = sim_device_index(peerDev, &b);
    if (res != CUDA_SUCCESS)
        return res;
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    *canAccessPeer = a != b;
    return CUDA_SUCCESS;
}

/* The errors in the order cuda.h gives them for cuCtxEnablePeerAccess. */
CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    SIM_CALLED();
    CUcontext self;
    CUresult res = sim_current_context(&self);
    if (res != CUDA_SUCCESS)
        return res;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (peerContext == self || sim_check_live_context(peerContext) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (peerContext->device == self->device)
        return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    sim_contexts_lock();
    for (uint32_t i = 0; i < self->npeers && res == CUDA_SUCCESS; i++)
        if (self->peers[i] == peerContext)
            res = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    if (res == CUDA_SUCCESS && self->npeers == SIM_MAX_PEERS)
        res = CUDA_ERROR_TOO_MANY_PEERS;
    if (res == CUDA_SUCCESS)
        self->peers[self->npeers++] = peerContext;
    sim_contexts_unlock();
    return res;
}

CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
    SIM_CALLED();
    CUcontext self;
    CUresult res = sim_current_context(&self);
    if (res != CUDA_SUCCESS)
        return res;
    if (sim_check_context(peerContext) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_CONTEXT;
    sim_contexts_lock();
    res = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    for (uint32_t i = 0; i < self->npeers; i++)
        if (self->peers[i] == peerContext) {
            self->peers[i] = self->peers[--self->npeers];
            res = CUDA_SUCCESS;
            break;
        }
    sim_contexts_unlock();
    return res;
}

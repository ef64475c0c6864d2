/* simgpu's legacy interprocess memory: cuIpcGetMemHandle, cuIpcOpenMemHandle,
 * cuIpcCloseMemHandle, what torch.multiprocessing and CuPy share CUDA
 * tensors with.
 *
 * A handle names a shared allocation (shared.c) by its id: exporting turns
 * a cuMemAlloc allocation into one, with its charge and its contents.  The
 * allocation lives until the exporter has freed it and every importer has
 * closed it, and is charged to one holder at a time, as NVIDIA's kernel
 * driver charges memory it has duplicated for another client (shared.c).
 * cuda.h calls a cuMemFree before the importers' cuIpcCloseMemHandle
 * undefined; here the importers keep the memory, as that driver's
 * duplicates keep theirs. */
#include <string.h>

#include "driver.h"

/* What a CUipcMemHandle holds here. */
struct sim_ipc_handle {
    char magic[8];                  /* SIM_IPC_MAGIC */
    uint64_t id;                    /* the shared allocation */
};
_Static_assert(sizeof(struct sim_ipc_handle) <= sizeof(CUipcMemHandle), "an IPC handle has 64 bytes");

#define SIM_IPC_MAGIC "simgpuM"

/* The base of a cuMemAlloc allocation (cuda.h: "created with cuMemAlloc");
 * a pool's, a mapping's or an opened one's is CUDA_ERROR_INVALID_VALUE. */
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pHandle)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_ipc_handle h = {.magic = SIM_IPC_MAGIC};
    res = sim_mem_share((uintptr_t)dptr, &h.id);
    if (res == CUDA_SUCCESS) {
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle, &h, sizeof h);
    }
    return res;
}

/* In the current context; a second open in it counts, and returns the same
 * pointer (cuda.h).  Flags: 0 or CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, which
 * changes nothing here, where every device reaches every other's memory. */
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    struct sim_ipc_handle h;
    memcpy(&h, &handle, sizeof h);
    if (!pdptr || (Flags & ~(unsigned int)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ||
        memcmp(h.magic, SIM_IPC_MAGIC, sizeof h.magic) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uintptr_t p;
    res = sim_mem_ipc_open(ctx, h.id, &p);
    if (res == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr)p;
    return res;
}

/* The symbol of CUDA 4.1, the same call. */
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    SIM_CALLED();
    return cuIpcOpenMemHandle_v2(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    return sim_mem_ipc_close((uintptr_t)dptr);
}

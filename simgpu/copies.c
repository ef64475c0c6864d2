/* simgpu's copies and memsets: cuMemcpy*, cuMemset* and their asynchronous
 * and per-thread-stream variants.
 *
 * The bytes move at once (device memory is host pages, memory.c); the time a
 * copy takes is spent on one of the device's copy engines (timeline.c), in
 * its stream's order: SIM_ENGINE_H2D for host to device, SIM_ENGINE_D2H for
 * device to host, each at SIMGPU_COPY_GBPS, so that the two directions
 * overlap as over a full-duplex PCIe link; SIM_ENGINE_D2D for copies within
 * the device and memsets, at SIMGPU_DEVICE_COPY_GBPS.  Copies run beside
 * kernels and are not kernel time (NVML's utilisation leaves them out).
 * A copy from host memory to host memory takes no device time.
 *
 * As the driver documents ("API synchronization behavior"): a synchronous
 * copy is queued on the default stream and returns when it is done; a memset
 * is queued and returns at once; an asynchronous copy returns at once,
 * except one from the device to pageable (not page-locked, host_memory.c)
 * host memory, which returns when it is done.  Copies into a stream that is
 * being captured are CUDA_ERROR_NOT_SUPPORTED: simgpu's graphs hold kernels
 * only. */
#include <string.h>

#include "work.h"

enum sim_side {
    SIM_HOST,
    SIM_DEVICE,
    SIM_EITHER,                     /* cuMemcpy: device if it is one of ours, else host */
};

/* How a copy or memset was asked for. */
struct sim_call {
    CUstream stream;
    bool per_thread;                /* a _ptds / _ptsz entry point */
    bool async;                     /* an ...Async entry point: `stream` is its stream */
};

#define SIM_SYNC ((struct sim_call){0})
#define SIM_SYNC_PTDS ((struct sim_call){.per_thread = true})
#define SIM_ASYNC(s) ((struct sim_call){.stream = (s), .async = true})
#define SIM_ASYNC_PTSZ(s) ((struct sim_call){.stream = (s), .per_thread = true, .async = true})

static bool sim_side_ok(uintptr_t addr, size_t n, enum sim_side side)
{
    return addr && (side == SIM_HOST || sim_mem_device_range(addr, n));
}

/* How long `engine` takes over `n` bytes: at least a nanosecond, so that
 * every copy is an item of its stream. */
static uint64_t sim_copy_ns(enum sim_engine engine, size_t n)
{
    const struct sim_config *cfg = sim_driver_config();
    uint64_t rate = engine == SIM_ENGINE_D2D ? cfg->device_bytes_per_s : cfg->link_bytes_per_s;
    double ns = (double)n * 1e9 / (double)rate;
    return ns < 1 ? 1 : (uint64_t)ns;
}

/* The lane a call's work goes to, once the current context is checked. */
static CUresult sim_call_lane(const struct sim_call *call, struct sim_lane *lane)
{
    CUresult res = sim_lane_of(call->async ? call->stream : NULL, call->per_thread, lane);
    if (res == CUDA_SUCCESS && sim_capturing(lane))
        res = CUDA_ERROR_NOT_SUPPORTED;
    return res;
}

static CUresult sim_copy(uintptr_t dst, enum sim_side dst_side, uintptr_t src, enum sim_side src_side, size_t n,
                         struct sim_call call)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS || n == 0)
        return res;
    if (dst_side == SIM_EITHER)
        dst_side = sim_mem_device(dst) ? SIM_DEVICE : SIM_HOST;
    if (src_side == SIM_EITHER)
        src_side = sim_mem_device(src) ? SIM_DEVICE : SIM_HOST;
    if (!sim_side_ok(dst, n, dst_side) || !sim_side_ok(src, n, src_side))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_lane lane;
    res = sim_call_lane(&call, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (dst_side == SIM_HOST && src_side == SIM_HOST) {
        memmove((void *)dst, (const void *)src, n);
        return CUDA_SUCCESS;
    }
    enum sim_engine engine = src_side == SIM_HOST ? SIM_ENGINE_H2D
                             : dst_side == SIM_HOST ? SIM_ENGINE_D2H
                                                    : SIM_ENGINE_D2D;
    /* Queued before the bytes move, which takes the host a while: the copy's
     * time on the device starts when it was asked for. */
    res = sim_run_on(&lane, engine, sim_copy_ns(engine, n));
    if (res != CUDA_SUCCESS)
        return res;
    memmove((void *)dst, (const void *)src, n);
    if (!call.async || (engine == SIM_ENGINE_D2H && !sim_host_pinned(dst, n)))
        res = sim_wait_lane(&lane);
    return res;
}

/* N elements of `width` bytes (1, 2 or 4) of `value` at dst, which must be
 * aligned to `width`. */
static CUresult sim_memset(CUdeviceptr dst, unsigned int value, unsigned int width, size_t n, struct sim_call call)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS || n == 0)
        return res;
    if (dst % width != 0 || n > SIZE_MAX / width || !sim_side_ok((uintptr_t)dst, n * width, SIM_DEVICE))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_lane lane;
    res = sim_call_lane(&call, &lane);
    if (res == CUDA_SUCCESS)
        res = sim_run_on(&lane, SIM_ENGINE_D2D, sim_copy_ns(SIM_ENGINE_D2D, n * width));
    if (res != CUDA_SUCCESS)
        return res;
    void *p = (void *)(uintptr_t)dst;
    uint32_t byte = value & 0xff;
    bool bytes_alike = width == 1 || (width == 2 ? (value & 0xffff) == byte * 0x0101u : value == byte * 0x01010101u);
    if (bytes_alike) {
        memset(p, (int)byte, n * width); /* no need to touch element by element */
    } else if (width == 2) {
        for (size_t i = 0; i < n; i++)
            ((uint16_t *)p)[i] = (uint16_t)value;
    } else {
        for (size_t i = 0; i < n; i++)
            ((uint32_t *)p)[i] = value;
    }
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcHost, SIM_HOST, ByteCount, SIM_SYNC);
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcHost, SIM_HOST, ByteCount, SIM_SYNC_PTDS);
}

CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
    SIM_CALLED();
    return cuMemcpyHtoD_v2(dstDevice, srcHost, ByteCount);
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcHost, SIM_HOST, ByteCount, SIM_ASYNC(hStream));
}

CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcHost, SIM_HOST, ByteCount,
                    SIM_ASYNC_PTSZ(hStream));
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return cuMemcpyHtoDAsync_v2(dstDevice, srcHost, ByteCount, hStream);
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstHost, SIM_HOST, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount, SIM_SYNC);
}

CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstHost, SIM_HOST, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount, SIM_SYNC_PTDS);
}

CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    SIM_CALLED();
    return cuMemcpyDtoH_v2(dstHost, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstHost, SIM_HOST, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount, SIM_ASYNC(hStream));
}

CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstHost, SIM_HOST, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount,
                    SIM_ASYNC_PTSZ(hStream));
}

CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return cuMemcpyDtoHAsync_v2(dstHost, srcDevice, ByteCount, hStream);
}

CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount, SIM_SYNC);
}

CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount, SIM_SYNC_PTDS);
}

CUresult cuMemcpyDtoD(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    SIM_CALLED();
    return cuMemcpyDtoD_v2(dstDevice, srcDevice, ByteCount);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount,
                    SIM_ASYNC(hStream));
}

CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount,
                                   CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dstDevice, SIM_DEVICE, (uintptr_t)srcDevice, SIM_DEVICE, ByteCount,
                    SIM_ASYNC_PTSZ(hStream));
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
                           CUstream hStream)
{
    SIM_CALLED();
    return cuMemcpyDtoDAsync_v2(dstDevice, srcDevice, ByteCount, hStream);
}

CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dst, SIM_EITHER, (uintptr_t)src, SIM_EITHER, ByteCount, SIM_SYNC);
}

CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dst, SIM_EITHER, (uintptr_t)src, SIM_EITHER, ByteCount, SIM_SYNC_PTDS);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dst, SIM_EITHER, (uintptr_t)src, SIM_EITHER, ByteCount, SIM_ASYNC(hStream));
}

CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    SIM_CALLED();
    return sim_copy((uintptr_t)dst, SIM_EITHER, (uintptr_t)src, SIM_EITHER, ByteCount, SIM_ASYNC_PTSZ(hStream));
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    SIM_CALLED();
    return sim_memset(dstDevice, uc, 1, N, SIM_SYNC);
}

CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    SIM_CALLED();
    return sim_memset(dstDevice, uc, 1, N, SIM_SYNC_PTDS);
}

CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
    SIM_CALLED();
    return cuMemsetD8_v2(dstDevice, uc, N);
}

CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    SIM_CALLED();
    return sim_memset(dstDevice, uc, 1, N, SIM_ASYNC(hStream));
}

CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    SIM_CALLED();
    return sim_memset(dstDevice, uc, 1, N, SIM_ASYNC_PTSZ(hStream));
}

CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    SIM_CALLED();
    return sim_memset(dstDevice, us, 2, N, SIM_SYNC);
}

CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    SIM_CALLED();
    return sim_memset(dstDevice, us, 2, N, SIM_SYNC_PTDS);
}

CUresult cuMemsetD16(CUdeviceptr_v1 dstDevice, unsigned short us, unsigned int N)
{
    SIM_CALLED();
    return cuMemsetD16_v2(dstDevice, us, N);
}

CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
    SIM_CALLED();
    return sim_memset(dstDevice, us, 2, N, SIM_ASYNC(hStream));
}

CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream)
{
    SIM_CALLED();
    return sim_memset(dstDevice, us, 2, N, SIM_ASYNC_PTSZ(hStream));
}

CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    SIM_CALLED();
    return sim_memset(dstDevice, ui, 4, N, SIM_SYNC);
}

CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    SIM_CALLED();
    return sim_memset(dstDevice, ui, 4, N, SIM_SYNC_PTDS);
}

CUresult cuMemsetD32(CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N)
{
    SIM_CALLED();
    return cuMemsetD32_v2(dstDevice, ui, N);
}

CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    SIM_CALLED();
    return sim_memset(dstDevice, ui, 4, N, SIM_ASYNC(hStream));
}

CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    SIM_CALLED();
    return sim_memset(dstDevice, ui, 4, N, SIM_ASYNC_PTSZ(hStream));
}

/* CUDA arrays and mipmapped arrays, which the driver lays out itself
 * (padding, tiling, levels).  It reports an array's size only for arrays made
 * with CUDA_ARRAY3D_DEFERRED_MAPPING, which take no memory until mapped; so
 * before creating one we create the same array deferred, ask the driver what
 * it needs (cu[Mipmapped]ArrayGetMemoryRequirements), destroy it, and reserve
 * exactly that.  Drivers that cannot (before CUDA 11.6) get an estimate. */
#include "internal.h"
#include "resume_ask.h"

/* Bytes of one channel of a CUarray_format; compressed and planar formats
 * take at most this much. */
static uint64_t channel_bytes(CUarray_format format)
{
    switch (format) {
    case 0x01: /* UNSIGNED_INT8 */
    case 0x08: /* SIGNED_INT8 */
        return 1;
    case 0x02: /* UNSIGNED_INT16 */
    case 0x09: /* SIGNED_INT16 */
    case 0x10: /* HALF */
        return 2;
    case 0x03: /* UNSIGNED_INT32 */
    case 0x0a: /* SIGNED_INT32 */
    case 0x20: /* FLOAT */
        return 4;
    default:
        return 16;
    }
}

/* Rows padded to 512 bytes, every mip level counted, the total rounded up to
 * the driver's 2 MiB allocation granularity: at least what drivers take. */
static uint64_t estimate(const CUDA_ARRAY3D_DESCRIPTOR_v2 *d, unsigned int levels)
{
    unsigned __int128 total = 0;
    uint64_t element = channel_bytes(d->Format) * (d->NumChannels ? d->NumChannels : 1);
    for (unsigned int level = 0; level < (levels ? levels : 1); level++) {
        uint64_t width = d->Width >> level ? d->Width >> level : 1;
        uint64_t height = d->Height >> level ? d->Height >> level : 1;
        uint64_t depth = d->Depth >> level ? d->Depth >> level : 1;
        unsigned __int128 row = ((unsigned __int128)width * element + 511) / 512 * 512;
        total += row * height * depth;
    }
    total = (total + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    return total > UINT64_MAX ? UINT64_MAX : (uint64_t)total;
}

/* What the driver says an array of this shape needs. */
static uint64_t driver_size(const CUDA_ARRAY3D_DESCRIPTOR_v2 *d, unsigned int levels, bool mipmapped,
                            int device)
{
    CUDA_ARRAY3D_DESCRIPTOR_v2 probe = *d;
    probe.Flags |= CUDA_ARRAY3D_DEFERRED_MAPPING;
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    CUresult rc;
    if (mipmapped) {
        CUmipmappedArray mipmap;
        rc = vgl_real.cuMipmappedArrayCreate(&mipmap, &probe, levels);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuMipmappedArrayGetMemoryRequirements(&req, mipmap, device);
            vgl_real.cuMipmappedArrayDestroy(mipmap);
        }
    } else {
        CUarray array;
        rc = vgl_real.cuArray3DCreate_v2(&array, &probe);
        if (rc == CUDA_SUCCESS) {
            rc = vgl_real.cuArrayGetMemoryRequirements(&req, array, device);
            vgl_real.cuArrayDestroy(array);
        }
    }
    return rc == CUDA_SUCCESS ? req.size : estimate(d, levels);
}

/* Reserves an array's size before the driver makes it; CUDA_SUCCESS with
 * c->device < 0: nothing to charge (no context, or a deferred-mapping array,
 * whose memory is the cuMemCreate handles mapped into it, charged there). */
static CUresult charge_array(const char *call, const CUDA_ARRAY3D_DESCRIPTOR_v2 *d, unsigned int levels,
                             bool mipmapped, struct vgl_charge *c)
{
    c->device = -1;
    int device = vgl_current_device();
    if (device < 0 || (d->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING))
        return CUDA_SUCCESS;
    return vgl_charge_begin(call, device, driver_size(d, levels, mipmapped, device), c);
}

/* Makes one array with `make` (a call of the real driver), charged its size
 * first; returns from the hook. */
#define CHARGED_ARRAY(call, shape, make)                                                             \
    do {                                                                                           \
        struct vgl_charge c;                                                                       \
        CUresult rc = charge_array(call, shape, 1, false, &c);                                     \
        if (rc != CUDA_SUCCESS)                                                                    \
            return rc;                                                                             \
        rc = (make);                                                                               \
        vgl_charge_end(&c, rc, VGL_ALLOC_ARRAY, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0); \
        return rc;                                                                                 \
    } while (0)

/* A 2D array's shape, as a 3D descriptor of depth 0. */
#define SHAPE_2D(d) {.Width = (d)->Width, .Height = (d)->Height, .Format = (d)->Format, .NumChannels = (d)->NumChannels}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v2 *pAllocateArray)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pAllocateArray)
        return vgl_real.cuArrayCreate_v2(pHandle, pAllocateArray);
    const CUDA_ARRAY3D_DESCRIPTOR_v2 shape = SHAPE_2D(pAllocateArray);
    CHARGED_ARRAY("cuArrayCreate", &shape, vgl_real.cuArrayCreate_v2(pHandle, pAllocateArray));
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v2 *pAllocateArray)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pAllocateArray)
        return vgl_real.cuArray3DCreate_v2(pHandle, pAllocateArray);
    CHARGED_ARRAY("cuArray3DCreate", pAllocateArray, vgl_real.cuArray3DCreate_v2(pHandle, pAllocateArray));
}

/* CUDA 2.x's, with 32-bit sizes: still exported, and handed out by
 * cuGetProcAddress for version 2000, so charged like the others. */
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pAllocateArray)
        return vgl_real.cuArrayCreate(pHandle, pAllocateArray);
    const CUDA_ARRAY3D_DESCRIPTOR_v2 shape = SHAPE_2D(pAllocateArray);
    CHARGED_ARRAY("cuArrayCreate", &shape, vgl_real.cuArrayCreate(pHandle, pAllocateArray));
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pAllocateArray)
        return vgl_real.cuArray3DCreate(pHandle, pAllocateArray);
    const CUDA_ARRAY3D_DESCRIPTOR_v2 shape = {
        .Width = pAllocateArray->Width,
        .Height = pAllocateArray->Height,
        .Depth = pAllocateArray->Depth,
        .Format = pAllocateArray->Format,
        .NumChannels = pAllocateArray->NumChannels,
        .Flags = pAllocateArray->Flags,
    };
    CHARGED_ARRAY("cuArray3DCreate", &shape, vgl_real.cuArray3DCreate(pHandle, pAllocateArray));
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v2 *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled) || !pMipmappedArrayDesc)
        return vgl_real.cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    struct vgl_charge c;
    CUresult rc = charge_array("cuMipmappedArrayCreate", pMipmappedArrayDesc, numMipmapLevels, true, &c);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = vgl_real.cuMipmappedArrayCreate(pHandle, pMipmappedArrayDesc, numMipmapLevels);
    vgl_charge_end(&c, rc, VGL_ALLOC_ARRAY, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0);
    return rc;
}

/* As cuMemFree: the charge stays until the driver has the memory back. */
CUresult cuArrayDestroy(CUarray hArray)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuArrayDestroy(hArray);
    struct vgl_uncharge u;
    vgl_uncharge_begin(VGL_ALLOC_ARRAY, (uint64_t)(uintptr_t)hArray, &u);
    CUresult rc = vgl_real.cuArrayDestroy(hArray);
    vgl_uncharge_end(&u, rc);
    return rc;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    VGL_ASKS();
    if (VGL_LIKELY(!vgl_config.enabled))
        return vgl_real.cuMipmappedArrayDestroy(hMipmappedArray);
    struct vgl_uncharge u;
    vgl_uncharge_begin(VGL_ALLOC_ARRAY, (uint64_t)(uintptr_t)hMipmappedArray, &u);
    CUresult rc = vgl_real.cuMipmappedArrayDestroy(hMipmappedArray);
    vgl_uncharge_end(&u, rc);
    return rc;
}

/* simgpu's CUDA arrays and mipmapped arrays: device memory in the opaque
 * layout of textures and surfaces.  simgpu has no array copies and no
 * textures, so nothing reads or writes an array's bytes: an array is its
 * descriptor and its charge in the state file, made in the current context and
 * destroyed with it.
 *
 * What an array is charged (a real driver's layout is its own; this is
 * simgpu's rule):
 * - an element is the format's size times NumChannels;
 * - a row is Width elements, padded to SIM_ARRAY_ROW_ALIGN (512) bytes;
 * - the array is max(Height, 1) x max(Depth, 1) rows (Depth counts the layers
 *   of a layered array and the faces of a cubemap);
 * - a mipmapped array is the rows of all its levels, level l being every
 *   dimension shifted right by l, but not below 1 (layers and faces stay);
 * - the total is rounded up to SIM_GRANULARITY (2 MiB).
 * The bytes are charged at creation and come back at destruction.
 *
 * An array made with CUDA_ARRAY3D_DEFERRED_MAPPING has no memory of its own and
 * is charged nothing: a real driver backs it through cuMemMapArrayAsync, which
 * simgpu lacks.  As cuda.h documents, cuArrayGetMemoryRequirements and
 * cuMipmappedArrayGetMemoryRequirements answer only for such arrays (the size
 * by the rule above, aligned to SIM_GRANULARITY), and CUDA_ERROR_INVALID_VALUE
 * for any other. */
#include <stdlib.h>
#include <string.h>

#include "driver.h"

enum {
    SIM_ARRAY_ROW_ALIGN = 512,
    SIM_ARRAY_FLAGS = CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP |
                      CUDA_ARRAY3D_TEXTURE_GATHER | CUDA_ARRAY3D_DEPTH_TEXTURE | CUDA_ARRAY3D_COLOR_ATTACHMENT |
                      CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING,
};

struct CUarray_st {
    CUarray next;                   /* in sim_arrays.arrays; levels are in no list */
    CUcontext ctx;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    uint64_t bytes;                 /* by the rule above */
    uint64_t charged;               /* bytes, or 0: deferred mapping, or a level */
    CUmipmappedArray mipmap;        /* the mipmapped array this is a level of, or NULL */
};

struct CUmipmappedArray_st {
    CUmipmappedArray next;          /* in sim_arrays.mipmaps */
    CUcontext ctx;
    CUDA_ARRAY3D_DESCRIPTOR desc;
    uint64_t bytes, charged;
    unsigned int n_levels;
    struct CUarray_st levels[];
};

/* Guarded by the memory mutex (sim_mem_lock). */
static struct {
    CUarray arrays;
    CUmipmappedArray mipmaps;
} sim_arrays;

/* Bytes per channel; 0 for a format simgpu does not simulate (normalized,
 * block-compressed and video formats). */
static size_t sim_format_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    }
    return 0;
}

/* The shapes cuda.h lists for cuArray3DCreate: 1D (Height and Depth 0), 2D
 * (Depth 0), 3D, layered (Depth layers of 1D or 2D), cubemap (Width = Height,
 * Depth 6) and layered cubemap (Depth a multiple of 6). */
static CUresult sim_array_check(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    if (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4)
        return CUDA_ERROR_INVALID_VALUE;
    if (d->Flags & ~(unsigned int)SIM_ARRAY_FLAGS)
        return CUDA_ERROR_INVALID_VALUE;
    if (!sim_format_bytes(d->Format) || (d->Flags & CUDA_ARRAY3D_SPARSE))
        return CUDA_ERROR_NOT_SUPPORTED;
    bool layered = d->Flags & CUDA_ARRAY3D_LAYERED;
    if (d->Width == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (d->Flags & CUDA_ARRAY3D_CUBEMAP) {
        if (d->Width != d->Height || (layered ? d->Depth == 0 || d->Depth % 6 : d->Depth != 6))
            return CUDA_ERROR_INVALID_VALUE;
    } else if (layered ? d->Depth == 0 : d->Height == 0 && d->Depth != 0) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* Level `level` of a mipmapped array of descriptor `d`. */
static CUDA_ARRAY3D_DESCRIPTOR sim_level(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int level)
{
    CUDA_ARRAY3D_DESCRIPTOR l = *d;
    l.Width = d->Width >> level ? d->Width >> level : 1;
    if (d->Height)
        l.Height = d->Height >> level ? d->Height >> level : 1;
    if (d->Depth && !(d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)))
        l.Depth = d->Depth >> level ? d->Depth >> level : 1;
    return l;
}

/* The levels a descriptor allows: 1 + log2 of its largest dimension (layers
 * and faces are not one). */
static unsigned int sim_max_levels(const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    uint64_t largest = d->Width > d->Height ? d->Width : d->Height;
    if (!(d->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) && d->Depth > largest)
        largest = d->Depth;
    return 64u - (unsigned int)__builtin_clzll(largest);
}

/* Adds the unrounded bytes of one array or level to `*total`; false on overflow. */
static bool sim_add_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, uint64_t *total)
{
    uint64_t element = sim_format_bytes(d->Format) * d->NumChannels;
    uint64_t height = d->Height ? d->Height : 1, depth = d->Depth ? d->Depth : 1;
    if (d->Width > (UINT64_MAX - SIM_ARRAY_ROW_ALIGN) / element || height > UINT64_MAX / depth)
        return false;
    uint64_t row = (d->Width * element + SIM_ARRAY_ROW_ALIGN - 1) / SIM_ARRAY_ROW_ALIGN * SIM_ARRAY_ROW_ALIGN;
    uint64_t rows = height * depth;
    if (row > UINT64_MAX / rows || row * rows > UINT64_MAX - *total)
        return false;
    *total += row * rows;
    return true;
}

/* `total` rounded up to the granularity; false on overflow. */
static bool sim_round_total(uint64_t *total)
{
    if (*total > UINT64_MAX - SIM_GRANULARITY)
        return false;
    *total = (*total + SIM_GRANULARITY - 1) / SIM_GRANULARITY * SIM_GRANULARITY;
    return true;
}

/* An array of this process: one made by cuArray*Create, or with `levels` also
 * a level of a mipmapped array.  Under the memory mutex. */
static CUarray sim_array_find(CUarray h, bool levels)
{
    for (CUarray a = sim_arrays.arrays; a; a = a->next)
        if (a == h)
            return a;
    if (levels) {
        for (CUmipmappedArray m = sim_arrays.mipmaps; m; m = m->next) {
            uintptr_t offset = (uintptr_t)h - (uintptr_t)m->levels;
            if (offset < m->n_levels * sizeof *m->levels && offset % sizeof *m->levels == 0)
                return h;
        }
    }
    return NULL;
}

static bool sim_mipmap_known(CUmipmappedArray h)
{
    for (CUmipmappedArray m = sim_arrays.mipmaps; m; m = m->next)
        if (m == h)
            return true;
    return false;
}

void sim_arrays_release_context(CUcontext ctx)
{
    for (CUarray *link = &sim_arrays.arrays; *link;) {
        CUarray a = *link;
        if (a->ctx != ctx) {
            link = &a->next;
            continue;
        }
        *link = a->next;
        sim_state_uncharge(ctx->device, a->charged);
        free(a);
    }
    for (CUmipmappedArray *link = &sim_arrays.mipmaps; *link;) {
        CUmipmappedArray m = *link;
        if (m->ctx != ctx) {
            link = &m->next;
            continue;
        }
        *link = m->next;
        sim_state_uncharge(ctx->device, m->charged);
        free(m);
    }
}

void sim_arrays_forget(void)
{
    while (sim_arrays.arrays) {
        CUarray a = sim_arrays.arrays;
        sim_arrays.arrays = a->next;
        free(a);
    }
    while (sim_arrays.mipmaps) {
        CUmipmappedArray m = sim_arrays.mipmaps;
        sim_arrays.mipmaps = m->next;
        free(m);
    }
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pHandle || !pAllocateArray)
        return CUDA_ERROR_INVALID_VALUE;
    res = sim_array_check(pAllocateArray);
    if (res != CUDA_SUCCESS)
        return res;
    uint64_t bytes = 0;
    if (!sim_add_bytes(pAllocateArray, &bytes) || !sim_round_total(&bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUarray a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->ctx = ctx;
    a->desc = *pAllocateArray;
    a->bytes = bytes;
    a->charged = pAllocateArray->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING ? 0 : bytes;
    if (a->charged && sim_state_charge(ctx->device, a->charged) != 0) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_mem_lock();
    a->next = sim_arrays.arrays;
    sim_arrays.arrays = a;
    sim_mem_unlock();
    *pHandle = a;
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    SIM_CALLED();
    if (!pAllocateArray) {
        CUcontext ctx;
        CUresult res = sim_current_context(&ctx);
        return res == CUDA_SUCCESS ? CUDA_ERROR_INVALID_VALUE : res;
    }
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = pAllocateArray->Width,
        .Height = pAllocateArray->Height,
        .Format = pAllocateArray->Format,
        .NumChannels = pAllocateArray->NumChannels,
    };
    return cuArray3DCreate_v2(pHandle, &d);
}

/* CUDA 2.x's entry points, with 32-bit sizes. */
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)
{
    SIM_CALLED();
    if (!pAllocateArray)
        return cuArrayCreate_v2(pHandle, NULL);
    CUDA_ARRAY_DESCRIPTOR d = {
        .Width = pAllocateArray->Width,
        .Height = pAllocateArray->Height,
        .Format = pAllocateArray->Format,
        .NumChannels = pAllocateArray->NumChannels,
    };
    return cuArrayCreate_v2(pHandle, &d);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)
{
    SIM_CALLED();
    if (!pAllocateArray)
        return cuArray3DCreate_v2(pHandle, NULL);
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = pAllocateArray->Width,
        .Height = pAllocateArray->Height,
        .Depth = pAllocateArray->Depth,
        .Format = pAllocateArray->Format,
        .NumChannels = pAllocateArray->NumChannels,
        .Flags = pAllocateArray->Flags,
    };
    return cuArray3DCreate_v2(pHandle, &d);
}

/* A level of a mipmapped array goes with its mipmapped array only. */
CUresult cuArrayDestroy(CUarray hArray)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    CUarray a = sim_array_find(hArray, false);
    if (a) {
        CUarray *link = &sim_arrays.arrays;
        while (*link != a)
            link = &(*link)->next;
        *link = a->next;
    }
    sim_mem_unlock();
    if (!a)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_state_uncharge(a->ctx->device, a->charged);
    free(a);
    return CUDA_SUCCESS;
}

/* A 3D array's Depth is not in the 2D descriptor. */
CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *pArrayDescriptor, CUarray hArray)
{
    SIM_CALLED();
    CUDA_ARRAY3D_DESCRIPTOR d;
    if (!pArrayDescriptor)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = cuArray3DGetDescriptor_v2(&d, hArray);
    if (res == CUDA_SUCCESS)
        *pArrayDescriptor = (CUDA_ARRAY_DESCRIPTOR){
            .Width = d.Width, .Height = d.Height, .Format = d.Format, .NumChannels = d.NumChannels};
    return res;
}

CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *pArrayDescriptor, CUarray hArray)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!pArrayDescriptor)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    CUarray a = sim_array_find(hArray, true);
    if (a)
        *pArrayDescriptor = a->desc;
    sim_mem_unlock();
    return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static CUresult sim_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *out, CUdevice device, uint64_t bytes,
                                 unsigned int flags)
{
    CUdevice checked;
    CUresult res = cuDeviceGet(&checked, device);
    if (res != CUDA_SUCCESS)
        return res;
    if (!(flags & CUDA_ARRAY3D_DEFERRED_MAPPING))
        return CUDA_ERROR_INVALID_VALUE;
    *out = (CUDA_ARRAY_MEMORY_REQUIREMENTS){.size = bytes, .alignment = SIM_GRANULARITY};
    return CUDA_SUCCESS;
}

CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements, CUarray array,
                                      CUdevice device)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!memoryRequirements)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    CUarray a = sim_array_find(array, false);
    uint64_t bytes = a ? a->bytes : 0;
    unsigned int flags = a ? a->desc.Flags : 0;
    sim_mem_unlock();
    return a ? sim_requirements(memoryRequirements, device, bytes, flags) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels)
{
    SIM_CALLED();
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    if (!pHandle || !d)
        return CUDA_ERROR_INVALID_VALUE;
    res = sim_array_check(d);
    if (res != CUDA_SUCCESS)
        return res;
    if (numMipmapLevels == 0 || numMipmapLevels > sim_max_levels(d))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = 0;
    for (unsigned int l = 0; l < numMipmapLevels; l++) {
        CUDA_ARRAY3D_DESCRIPTOR level = sim_level(d, l);
        if (!sim_add_bytes(&level, &bytes))
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!sim_round_total(&bytes))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUmipmappedArray m = calloc(1, sizeof *m + numMipmapLevels * sizeof *m->levels);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = ctx;
    m->desc = *d;
    m->bytes = bytes;
    m->charged = d->Flags & CUDA_ARRAY3D_DEFERRED_MAPPING ? 0 : bytes;
    m->n_levels = numMipmapLevels;
    for (unsigned int l = 0; l < numMipmapLevels; l++)
        m->levels[l] = (struct CUarray_st){.ctx = ctx, .desc = sim_level(d, l), .mipmap = m};
    if (m->charged && sim_state_charge(ctx->device, m->charged) != 0) {
        free(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim_mem_lock();
    m->next = sim_arrays.mipmaps;
    sim_arrays.mipmaps = m;
    sim_mem_unlock();
    *pHandle = m;
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    sim_mem_lock();
    CUmipmappedArray m = sim_mipmap_known(hMipmappedArray) ? hMipmappedArray : NULL;
    if (m) {
        CUmipmappedArray *link = &sim_arrays.mipmaps;
        while (*link != m)
            link = &(*link)->next;
        *link = m->next;
    }
    sim_mem_unlock();
    if (!m)
        return CUDA_ERROR_INVALID_HANDLE;
    sim_state_uncharge(m->ctx->device, m->charged);
    free(m);
    return CUDA_SUCCESS;
}

/* The level is part of the mipmapped array: it is charged nothing of its own
 * and lives as long as the mipmapped array. */
CUresult cuMipmappedArrayGetLevel(CUarray *pLevelArray, CUmipmappedArray hMipmappedArray, unsigned int level)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!pLevelArray)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    if (!sim_mipmap_known(hMipmappedArray))
        res = CUDA_ERROR_INVALID_HANDLE;
    else if (level >= hMipmappedArray->n_levels)
        res = CUDA_ERROR_INVALID_VALUE;
    else
        *pLevelArray = &hMipmappedArray->levels[level];
    sim_mem_unlock();
    return res;
}

CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *memoryRequirements,
                                               CUmipmappedArray mipmap, CUdevice device)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    if (!memoryRequirements)
        return CUDA_ERROR_INVALID_VALUE;
    sim_mem_lock();
    bool known = sim_mipmap_known(mipmap);
    uint64_t bytes = known ? mipmap->bytes : 0;
    unsigned int flags = known ? mipmap->desc.Flags : 0;
    sim_mem_unlock();
    return known ? sim_requirements(memoryRequirements, device, bytes, flags) : CUDA_ERROR_INVALID_VALUE;
}

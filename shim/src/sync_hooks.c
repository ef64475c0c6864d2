/* The synchronisations (cuCtxSynchronize, cuStreamSynchronize,
 * cuEventSynchronize), intercepted only so that a suspended container's
 * process asks to be resumed when its next call is one (resume_ask.c): a
 * notebook's next cell often begins by waiting for its last one's work.  A
 * synchronisation costs the driver a round trip at least, so the one load
 * while the container runs is not seen.  The copies are not intercepted:
 * there are dozens of them, and a copy into or out of device memory usually
 * follows an allocation or a launch of the same cell, which asks. */
#include "internal.h"
#include "resume_ask.h"

CUresult cuCtxSynchronize(void)
{
    VGL_ASKS();
    return vgl_real.cuCtxSynchronize();
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    VGL_ASKS();
    return vgl_real.cuCtxSynchronize_v2(ctx);
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    VGL_ASKS();
    return vgl_real.cuStreamSynchronize(hStream);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    VGL_ASKS();
    return vgl_real.cuStreamSynchronize_ptsz(hStream);
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    VGL_ASKS();
    return vgl_real.cuEventSynchronize(hEvent);
}

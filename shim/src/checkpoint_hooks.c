/* The driver's checkpoint API (cuda.h, "CUDA Checkpointing") locks, empties
 * and refills another process's GPU memory by its pid.  Suspending is a
 * setter's act, done from outside the container (`vgpulimit suspend`,
 * docs/suspend.md): a tenant that could call these could stall or empty a
 * neighbour's processes, or take its own memory off the GPU behind the
 * node's back.  So a process under the shim is refused all four; asking a
 * process's state (cuCheckpointProcessGetState) changes nothing and is not
 * intercepted. */
#include "internal.h"

static CUresult refuse(const char *call)
{
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        vgl_log(VGL_LOG_WARN, "%s refused: suspending and resuming processes is for the node's setters "
                "(vgpulimit suspend), not for processes in a container", call);
    return CUDA_ERROR_NOT_PERMITTED;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    (void)pid, (void)args;
    return refuse("cuCheckpointProcessLock");
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    (void)pid, (void)args;
    return refuse("cuCheckpointProcessCheckpoint");
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    (void)pid, (void)args;
    return refuse("cuCheckpointProcessRestore");
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    (void)pid, (void)args;
    return refuse("cuCheckpointProcessUnlock");
}

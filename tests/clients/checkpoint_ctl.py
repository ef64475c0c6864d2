"""Calls the driver's checkpoint API on another process, as a setter would:

    python checkpoint_ctl.py OP PID [TIMEOUT_MS]

OP is lock, checkpoint, restore, unlock, state or tid; prints one JSON line:
{"result": "CUDA_...", "state": ..., "tid": ...}."""

import json
import sys

from cuda.bindings import driver as cu


def main():
    op, pid = sys.argv[1], int(sys.argv[2])
    err, = cu.cuInit(0)
    report = {}
    if op == "lock":
        args = cu.CUcheckpointLockArgs()
        args.timeoutMs = int(sys.argv[3]) if len(sys.argv) > 3 else 0
        err, = cu.cuCheckpointProcessLock(pid, args)
    elif op == "checkpoint":
        err, = cu.cuCheckpointProcessCheckpoint(pid, None)
    elif op == "restore":
        err, = cu.cuCheckpointProcessRestore(pid, None)
    elif op == "unlock":
        err, = cu.cuCheckpointProcessUnlock(pid, None)
    elif op == "state":
        err, state = cu.cuCheckpointProcessGetState(pid)
        report["state"] = state.name if err == cu.CUresult.CUDA_SUCCESS else None
    elif op == "tid":
        err, tid = cu.cuCheckpointProcessGetRestoreThreadId(pid)
        report["tid"] = tid
    report["result"] = cu.cuGetErrorName(err)[1].decode()
    print(json.dumps(report))


if __name__ == "__main__":
    main()

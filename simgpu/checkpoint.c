/* simgpu's checkpoint API (cuda.h, "CUDA Checkpointing"): one process locks,
 * checkpoints, restores and unlocks another, named by its pid.
 *
 * As in the driver, the work is done inside the target, by a thread of its own
 * (cuCheckpointProcessGetRestoreThreadId): the caller posts a request in the
 * target's entry of the state file and waits (state.c); the thread carries it
 * out.  The thread starts at cuInit and waits on the process's entry, which
 * its first context makes, so a process without one has nobody to answer:
 * CUDA_ERROR_NOT_INITIALIZED, the driver's
 * code 3, which the runtime names cudaErrorInitializationError (what llm-d's
 * agent reports for a process without a context).
 *
 * LOCKED: every entry point of the target waits at its first statement
 * (SIM_CALLED) until the unlock; the lock waits for the calls in progress and
 * for the work the target has submitted, within timeoutMs (past it the
 * process is RUNNING again and the answer CUDA_ERROR_NOT_READY).  timeoutMs
 * bounds the whole call, the target's taking the request up included: a
 * target that is stopped (SIGSTOP) or stuck never takes it up, and the
 * caller gives the request up at the timeout; should the thread carry it out
 * later, it undoes the lock.  The other three calls have no timeout in the
 * driver's API and wait for the target as long as it lives (the driver's work
 * is done by the target's own restore thread too).
 * FAILED ("an uncorrectable error during the checkpoint/restore process"): a
 * restore whose copy back fails half way, the memory charged again and its
 * contents lost; the process's calls then wait for good, every request is
 * CUDA_ERROR_ILLEGAL_STATE, and only its end gives the memory back.  simgpu's
 * copies do not fail: SIMGPU_FAIL=cuCheckpointProcessRestore in the target's
 * environment makes its restores fail so (tests).
 * CHECKPOINTED: what the process holds on every device is released in the
 * state file, so the device's free memory rises and NVML lists the process
 * with no memory.  simgpu's device memory is already host pages (memory.c),
 * so the bytes stay where they are, as the driver keeps them in host memory;
 * the checkpoint and the restore take the time a copy of that size takes over
 * the board's host link.  A restore charges it all back, all or nothing, at
 * the same addresses, or answers CUDA_ERROR_OUT_OF_MEMORY and leaves the
 * process CHECKPOINTED.  Refused as the driver refuses (NVIDIA's
 * cuda-checkpoint: "does not support UVM or IPC memory"): managed memory and
 * memory shared with other processes, CUDA_ERROR_NOT_SUPPORTED.  The facts
 * and their sources: docs/facts.md §4. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "driver.h"

enum {
    SIM_CKPT_WAIT_MS = 1000,        /* the thread's wait between looks at its entry */
    SIM_CKPT_CONTEXTS = 256,        /* contexts whose work a lock waits for */
};

static struct {
    pthread_mutex_t mutex;          /* guards the gate's waits and `tid` */
    pthread_cond_t cond;
    int gated;                      /* atomic: new calls wait */
    uint32_t inflight;              /* atomic: outermost calls in progress */
    pid_t thread_pid;               /* the process generation whose thread runs */
    int32_t tid;
    uint64_t saved[SIM_MAX_DEVICES]; /* what the checkpoint took off each device */
} sim_ck = {.mutex = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static _Thread_local unsigned int sim_depth;

static void sim_call_out(void)
{
    if (__atomic_sub_fetch(&sim_ck.inflight, 1, __ATOMIC_SEQ_CST) == 0 &&
        __atomic_load_n(&sim_ck.gated, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&sim_ck.mutex);
        pthread_cond_broadcast(&sim_ck.cond);
        pthread_mutex_unlock(&sim_ck.mutex);
    }
}

/* Counted in first, then the gate looked at: a lock that sets the gate
 * either sees this call in progress or this call sees the gate. */
int sim_call_enter(void)
{
    if (sim_depth++)
        return 0;
    for (;;) {
        __atomic_add_fetch(&sim_ck.inflight, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&sim_ck.gated, __ATOMIC_SEQ_CST))
            return 1;
        sim_call_out();
        pthread_mutex_lock(&sim_ck.mutex);
        while (__atomic_load_n(&sim_ck.gated, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&sim_ck.cond, &sim_ck.mutex);
        pthread_mutex_unlock(&sim_ck.mutex);
    }
}

void sim_call_leave(int *entered)
{
    if (*entered)
        sim_call_out();
    sim_depth--;
}

static void sim_ungate(void)
{
    pthread_mutex_lock(&sim_ck.mutex);
    __atomic_store_n(&sim_ck.gated, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&sim_ck.cond);
    pthread_mutex_unlock(&sim_ck.mutex);
}

/* Waits for the work every context has submitted; false past `deadline_ns`. */
static bool sim_drain_work(uint64_t deadline_ns)
{
    struct sim_ctx_work w[SIM_CKPT_CONTEXTS];
    size_t n = sim_contexts_work(w, SIM_CKPT_CONTEXTS);
    for (size_t i = 0; i < n; i++) {
        for (;;) {
            uint64_t done_ns, wake_ns;
            if (sim_timeline_done(w[i].device, w[i].ticket, (uintptr_t)w[i].ctx, &done_ns, &wake_ns) != 0)
                break;
            if (sim_now_ns() >= deadline_ns)
                return false;
            sim_sleep_until(wake_ns < deadline_ns ? wake_ns : deadline_ns);
        }
    }
    return true;
}

static CUresult sim_lock_self(uint32_t timeout_ms)
{
    uint64_t deadline_ns = timeout_ms ? sim_now_ns() + (uint64_t)timeout_ms * 1000000ULL : UINT64_MAX;
    bool drained = true;
    pthread_mutex_lock(&sim_ck.mutex);
    __atomic_store_n(&sim_ck.gated, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&sim_ck.inflight, __ATOMIC_SEQ_CST) > 0) {
        if (sim_now_ns() >= deadline_ns) {
            drained = false;
            break;
        }
        /* Bounded: the last call out may broadcast before we wait. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&sim_ck.cond, &sim_ck.mutex, &ts);
    }
    pthread_mutex_unlock(&sim_ck.mutex);
    if (drained && sim_drain_work(deadline_ns))
        return CUDA_SUCCESS;
    sim_ungate();
    return CUDA_ERROR_NOT_READY;
}

/* The time a copy of `bytes` takes over the board's host link. */
static void sim_copy_time(uint64_t bytes)
{
    const struct sim_config *cfg = sim_driver_config();
    if (!cfg || !cfg->link_bytes_per_s || !bytes)
        return;
    sim_sleep_until(sim_now_ns() + (uint64_t)((double)bytes * 1e9 / (double)cfg->link_bytes_per_s));
}

static uint64_t sim_saved_total(void)
{
    uint64_t total = 0;
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++)
        total += sim_ck.saved[d];
    return total;
}

static CUresult sim_checkpoint_self(void)
{
    if (sim_mem_checkpointable() != 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    int rc = sim_state_ckpt_release(sim_ck.saved);
    if (rc == -EOPNOTSUPP)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (rc)
        return CUDA_ERROR_OPERATING_SYSTEM;
    /* Released first, copied after: the device's memory is free from here,
     * and the call returns once the copy's time has passed. */
    sim_copy_time(sim_saved_total());
    return CUDA_SUCCESS;
}

static CUresult sim_restore_self(void)
{
    int rc = sim_state_ckpt_recharge(sim_ck.saved);
    if (rc == -ENOMEM)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (rc)
        return CUDA_ERROR_OPERATING_SYSTEM;
    if (sim_failing("cuCheckpointProcessRestore")) {
        sim_copy_time(sim_saved_total() / 2);
        return CUDA_ERROR_UNKNOWN;   /* the copy back failed half way: FAILED */
    }
    sim_copy_time(sim_saved_total());
    memset(sim_ck.saved, 0, sizeof sim_ck.saved);
    return CUDA_SUCCESS;
}

/* Carries out request `r`; *state: the process's state after it. */
static CUresult sim_carry_out(const struct sim_ckpt_request *r, uint32_t *state)
{
    CUresult res = CUDA_ERROR_ILLEGAL_STATE;
    *state = r->state;
    switch (r->op) {
    case SIM_CKPT_LOCK:
        if (r->state == CU_PROCESS_STATE_RUNNING && (res = sim_lock_self(r->timeout_ms)) == CUDA_SUCCESS)
            *state = CU_PROCESS_STATE_LOCKED;
        break;
    case SIM_CKPT_CHECKPOINT:
        if (r->state == CU_PROCESS_STATE_LOCKED && (res = sim_checkpoint_self()) == CUDA_SUCCESS)
            *state = CU_PROCESS_STATE_CHECKPOINTED;
        break;
    case SIM_CKPT_RESTORE:
        if (r->state == CU_PROCESS_STATE_CHECKPOINTED) {
            res = sim_restore_self();
            *state = res == CUDA_SUCCESS       ? CU_PROCESS_STATE_LOCKED
                     : res == CUDA_ERROR_UNKNOWN ? CU_PROCESS_STATE_FAILED
                                                 : r->state;
        }
        break;
    case SIM_CKPT_UNLOCK:
        if (r->state == CU_PROCESS_STATE_LOCKED) {
            sim_ungate();
            *state = CU_PROCESS_STATE_RUNNING;
            res = CUDA_SUCCESS;
        }
        break;
    default:
        res = CUDA_ERROR_INVALID_VALUE;
    }
    return res;
}

static void *sim_checkpoint_main(void *arg)
{
    (void)arg;
    int32_t tid = (int32_t)syscall(SYS_gettid);
    pthread_mutex_lock(&sim_ck.mutex);
    sim_ck.tid = tid;
    pthread_cond_broadcast(&sim_ck.cond);
    pthread_mutex_unlock(&sim_ck.mutex);
    for (;;) {
        struct sim_ckpt_request r;
        if (sim_state_ckpt_next(tid, SIM_CKPT_WAIT_MS, &r) != 1)
            continue;
        uint32_t state;
        CUresult res = sim_carry_out(&r, &state);
        /* A lock its caller gave up at the timeout is undone: the process
         * is RUNNING, as the caller was told. */
        if (!sim_state_ckpt_finish(r.seq, state, (int32_t)res) && r.op == SIM_CKPT_LOCK && res == CUDA_SUCCESS)
            sim_ungate();
    }
    return NULL;
}

/* The child of a fork has no thread, no calls of its parent's threads in
 * progress, and no checkpoint of its own. */
static void sim_checkpoint_atfork_child(void)
{
    pthread_mutex_init(&sim_ck.mutex, NULL);
    pthread_cond_init(&sim_ck.cond, NULL);
    sim_ck.gated = 0;
    sim_ck.inflight = sim_depth ? 1 : 0;
    sim_ck.thread_pid = 0;
    sim_ck.tid = 0;
    memset(sim_ck.saved, 0, sizeof sim_ck.saved);
}

void sim_checkpoint_thread_start(void)
{
    pid_t me = getpid();
    if (sim_ck.thread_pid != me) {
        static bool atfork_done;
        if (!atfork_done) {
            pthread_atfork(NULL, NULL, sim_checkpoint_atfork_child);
            atfork_done = true;
        }
        /* Signals are the application's: the thread takes none. */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_t t;
        if (pthread_create(&t, &attr, sim_checkpoint_main, NULL) == 0) {
            sim_ck.thread_pid = me;
            pthread_mutex_lock(&sim_ck.mutex);
            while (!sim_ck.tid)
                pthread_cond_wait(&sim_ck.cond, &sim_ck.mutex);
            pthread_mutex_unlock(&sim_ck.mutex);
        }
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    if (sim_ck.tid)
        sim_state_ckpt_register(sim_ck.tid);
}

/* ---- The entry points: the caller's side ----------------------------------- */

static CUresult sim_checkpoint_request(int pid, uint32_t op, uint32_t timeout_ms)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pid <= 0 || pid == getpid())
        return CUDA_ERROR_INVALID_VALUE;
    /* Only a lock has a timeout (CUcheckpointLockArgs.timeoutMs). */
    uint64_t deadline_ns = timeout_ms ? sim_now_ns() + (uint64_t)timeout_ms * 1000000ULL : UINT64_MAX;
    struct sim_ckpt_ticket t;
    int rc;
    while ((rc = sim_state_ckpt_post(pid, op, timeout_ms, &t)) == -EBUSY && sim_now_ns() < deadline_ns)
        sim_sleep_until(sim_now_ns() + 1000000ULL); /* another caller's request first */
    int32_t result = CUDA_ERROR_OPERATING_SYSTEM;
    if (rc == 0)
        rc = sim_state_ckpt_wait(&t, deadline_ns, &result);
    if (rc == -EPERM)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (rc == -ESRCH)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (rc == -EBUSY || rc == -ETIMEDOUT)
        return CUDA_ERROR_NOT_READY;   /* the process stays RUNNING */
    return rc ? CUDA_ERROR_OPERATING_SYSTEM : (CUresult)result;
}

static bool sim_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    SIM_CALLED();
    if (args && (args->reserved0 || !sim_zero(args->reserved1, sizeof args->reserved1)))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_checkpoint_request(pid, SIM_CKPT_LOCK, args ? args->timeoutMs : 0);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    SIM_CALLED();
    if (args && !sim_zero(args, sizeof *args))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_checkpoint_request(pid, SIM_CKPT_CHECKPOINT, 0);
}

/* simgpu restores a process onto the GPUs it left: pairs that name another
 * GPU are CUDA_ERROR_NOT_SUPPORTED. */
CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    SIM_CALLED();
    if (args) {
        if (!sim_zero(args->reserved, sizeof args->reserved) || args->reserved1 ||
            (args->gpuPairsCount && !args->gpuPairs))
            return CUDA_ERROR_INVALID_VALUE;
        for (unsigned int i = 0; i < args->gpuPairsCount; i++)
            if (memcmp(&args->gpuPairs[i].oldUuid, &args->gpuPairs[i].newUuid, sizeof(CUuuid)) != 0)
                return CUDA_ERROR_NOT_SUPPORTED;
    }
    return sim_checkpoint_request(pid, SIM_CKPT_RESTORE, 0);
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    SIM_CALLED();
    if (args && !sim_zero(args, sizeof *args))
        return CUDA_ERROR_INVALID_VALUE;
    return sim_checkpoint_request(pid, SIM_CKPT_UNLOCK, 0);
}

static CUresult sim_checkpoint_get(int pid, uint32_t *state, int32_t *tid)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pid <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int rc = sim_state_ckpt_get(pid, state, tid);
    return rc == -ESRCH ? CUDA_ERROR_NOT_INITIALIZED : rc ? CUDA_ERROR_OPERATING_SYSTEM : CUDA_SUCCESS;
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    SIM_CALLED();
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t s;
    int32_t tid;
    CUresult res = sim_checkpoint_get(pid, &s, &tid);
    if (res == CUDA_SUCCESS)
        *state = (CUprocessState)s;
    return res;
}

CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    SIM_CALLED();
    if (!tid)
        return CUDA_ERROR_INVALID_VALUE;
    uint32_t s;
    int32_t t;
    CUresult res = sim_checkpoint_get(pid, &s, &t);
    if (res == CUDA_SUCCESS)
        *tid = t;
    return res;
}

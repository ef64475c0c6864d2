/* A process-shared robust mutex, kept in a shared mapping: a process killed
 * at any instruction leaves no lock held, and the next locker is told
 * (EOWNERDEAD) so that it can repair what the lock guards.
 *
 * Robustness covers the dead only.  A holder that lives on and does not let
 * go (stopped by a signal or a debugger), or a lock word written by some
 * other code to name a live thread, holds every other locker for as long as
 * it likes: the file is shared with every process of a container, so any
 * of them can.  Hence every wait is bounded (vgl_robust_lock_within), and a
 * word whose owner cannot be a thread at all is given to the next locker as
 * a dead owner's. */
#include <errno.h>
#include <stdint.h>
#include <time.h>

#include "base.h"

int vgl_robust_init(pthread_mutex_t *mutex)
{
    pthread_mutexattr_t attr;
    int err = pthread_mutexattr_init(&attr);
    if (err)
        return -err;
    err = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    if (!err)
        err = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    if (!err)
        err = pthread_mutex_init(mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    return -err;
}

/* The kernel's bits in a robust lock word (linux/futex.h); the rest is the
 * owner's thread id, which no thread has above PID_MAX_LIMIT (2^22). */
#define WORD_WAITERS 0x80000000u
#define WORD_OWNER_DIED 0x40000000u
#define WORD_TID_MASK 0x3fffffffu
#define PID_MAX_LIMIT 4194304u

/* The lock word of a glibc mutex (its first int, __data.__lock). */
static uint32_t *word_of(pthread_mutex_t *mutex) { return (uint32_t *)(void *)mutex; }

uint32_t vgl_robust_owner(pthread_mutex_t *mutex)
{
    return __atomic_load_n(word_of(mutex), __ATOMIC_RELAXED) & WORD_TID_MASK;
}

/* A word that names no possible thread was not written by a locker: it is
 * marked as a dead owner's (one compare-and-swap, so of several repairers
 * one wins and the others see the change), and the next locker repairs
 * what it guards.  True when this call repaired it. */
static bool repair_impossible_owner(pthread_mutex_t *mutex)
{
    uint32_t word = __atomic_load_n(word_of(mutex), __ATOMIC_RELAXED);
    if ((word & WORD_TID_MASK) <= PID_MAX_LIMIT || (word & WORD_OWNER_DIED))
        return false;
    return __atomic_compare_exchange_n(word_of(mutex), &word, WORD_OWNER_DIED | (word & WORD_WAITERS),
                                       false, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED);
}

/* Waits in slices, each ended by the real-time clock that
 * pthread_mutex_timedlock takes (pthread_mutex_clocklock is newer than the
 * shim's glibc floor); the bound itself is kept on the monotonic clock. */
#define SLICE_NS 50000000ULL

int vgl_robust_lock_within(pthread_mutex_t *mutex, uint64_t wait_ns, bool *repaired)
{
    if (repaired)
        *repaired = false;
    uint64_t deadline = vgl_clock_ns(CLOCK_MONOTONIC) + wait_ns;
    for (;;) {
        if (repair_impossible_owner(mutex) && repaired)
            *repaired = true;
        uint64_t now = vgl_clock_ns(CLOCK_MONOTONIC);
        uint64_t slice = deadline > now ? deadline - now : 0;
        if (slice > SLICE_NS)
            slice = SLICE_NS;
        uint64_t until = vgl_clock_ns(CLOCK_REALTIME) + slice;
        struct timespec at = {(time_t)(until / 1000000000ULL), (long)(until % 1000000000ULL)};
        int err = pthread_mutex_timedlock(mutex, &at);
        if (err == EOWNERDEAD)
            return 1;
        if (err != ETIMEDOUT)
            return -err;
        if (vgl_clock_ns(CLOCK_MONOTONIC) >= deadline)
            return -ETIMEDOUT;
    }
}

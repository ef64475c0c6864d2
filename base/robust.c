/* A process-shared robust mutex, kept in a shared mapping: a process killed
 * at any instruction leaves no lock held, and the next locker is told
 * (EOWNERDEAD) so that it can repair what the lock guards. */
#include <errno.h>

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

int vgl_robust_lock(pthread_mutex_t *mutex)
{
    int err = pthread_mutex_lock(mutex);
    if (err == EOWNERDEAD)
        return 1;
    return -err;
}

/* Resume on use (docs/agent.md).  A container suspended by the node agent
 * for idleness is resumed when one of its processes next calls CUDA: the
 * driver blocks a locked process's calls, but the shim sees the call first,
 * and asks.  It asks by holding a shared lock on the first byte of its
 * container's beacon's `pad` for as long as the call is blocked; the agent
 * looks for the lock.  A lock is the kernel's: it goes when the call returns
 * or the process dies, so no ask outlives its asker, and nothing is written
 * that a tenant could leave behind.  An ask is a claim: the agent resumes
 * only containers it suspended itself, and makes room for one only by the
 * setters' rules, so a tenant's ask can get back its own memory at most.
 *
 * Every hook that calls the driver asks, from its first statement to its
 * return (VGL_ASKS, internal.h): the shim has no one entry that all hooks
 * pass through before the driver (a pool allocation asks the driver about
 * its pool before its charge; a query or a context call has no charge), and
 * a hook that forgot would wait unheard (tests/test_lint.py checks).  The launches ask at their gate (launch_hooks.c), the
 * checkpoint calls and cuGetProcAddress do not (another process's, or no
 * work of this one's).  While the container runs, an ask costs one load: its
 * region's suspend state, the setter's word, inline in every hook. */
#include <stddef.h>
#include <pthread.h>

#include "internal.h"
#include "resume_ask.h"

static pthread_mutex_t ask_lock = PTHREAD_MUTEX_INITIALIZER;
static uint32_t asking; /* this process's calls asking now: the byte is locked while one does */

static void forget_in_child(void)
{
    pthread_mutex_init(&ask_lock, NULL);
    asking = 0; /* the parent's lock is not the child's */
}
VGL_AFTER_FORK(forget_in_child)

off_t vgl_resume_byte(void) { return (off_t)offsetof(struct vgl_beacon, pad); }

bool vgl_resume_asking(void)
{
    if (vgl_board_place() != VGL_PLACE_ROW)
        return false; /* no row, no beacon: no agent can hear it */
    const char *path, *why;
    if (!vgl_beacon_own(&path, &why) || vgl_beacon_own_fd() < 0)
        return false;
    pthread_mutex_lock(&ask_lock);
    if (asking++ == 0)
        vgl_share_byte(vgl_beacon_own_fd(), vgl_resume_byte());
    pthread_mutex_unlock(&ask_lock);
    static int said;
    if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
        vgl_log(VGL_LOG_INFO, "the container is suspended: its CUDA calls wait, and it asks the node agent "
                "to resume it");
    return true;
}

void vgl_resume_asked(void)
{
    pthread_mutex_lock(&ask_lock);
    if (asking && --asking == 0)
        vgl_release_byte(vgl_beacon_own_fd(), vgl_resume_byte());
    pthread_mutex_unlock(&ask_lock);
}

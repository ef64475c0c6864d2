/* A region file truncated under its mapping.
 *
 * Every process of a container maps the region read-write, so any of them
 * can truncate it; touching a page past the file's new end then raises
 * SIGBUS, whose default kills: the application inside the shim, or the
 * supervisor as it reclaims.  A guarded mapping gets a private page of zeros
 * in place of each page it lost, and is marked broken: the faulting
 * instruction runs again on the zeros, the process lives, and its owner
 * stops trusting what it can no longer share (the shim refuses device
 * allocations, the supervisor stops reclaiming).
 *
 * Only the lost pages are replaced.  The ones the file still holds stay
 * shared, so a lock taken there before the fault is released where the
 * other processes see it; a lock word lost with its page was private to us
 * from then on, and nobody else can wait on it.
 *
 * Not siglongjmp out of the region operation instead: that would leave its
 * robust mutex held by a thread that lives on, which blocks every other
 * process of the container that takes it, and leave the mutex queued on the
 * thread's robust list in memory we would then have to keep anyway.
 *
 * A container's beacon (board.h) is mapped read-write by its processes for
 * the same reason, and guarded the same way: a page of it lost takes only
 * the container's own claims with it (priority.c).
 *
 * The handler is installed once per process, the first time a mapping is
 * guarded; a SIGBUS that is not about a guarded page goes to the handler
 * that was there before, or kills as it would have.  A program that installs
 * its own SIGBUS handler later, without passing on what is not its own,
 * takes the guard away. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

/* A process maps one region (the shim's) or a few (the Python binding's). */
enum { GUARDS = 64 };

static struct {
    uintptr_t start; /* the mapping; 0: a free entry */
    uint64_t size;   /* written before `start` */
    int broken;
} guards[GUARDS];

static int any_broken; /* so that the shim's hot path asks one word */
static uintptr_t page_mask;
static struct sigaction previous;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;

/* What would have happened without us. */
static void pass_on(int sig, siginfo_t *info, void *context)
{
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, context);
        return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    bool sent = info->si_code <= 0; /* by kill(), raise(), ...; not by an access */
    if (previous.sa_handler == SIG_IGN && sent)
        return;
    /* Die of it.  A faulting access faults again once we return; a sent
     * signal is raised again, and arrives when this handler returns. */
    struct sigaction fatal = {.sa_handler = SIG_DFL};
    sigaction(SIGBUS, &fatal, NULL);
    if (sent)
        raise(sig);
}

/* Async-signal-safe throughout: atomics and a raw mmap. */
static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    int saved_errno = errno;
    uintptr_t addr = (uintptr_t)info->si_addr;
    for (int i = 0; info->si_code > 0 && i < GUARDS; i++) {
        uintptr_t start = __atomic_load_n(&guards[i].start, __ATOMIC_ACQUIRE);
        if (!start || addr < start || addr - start >= __atomic_load_n(&guards[i].size, __ATOMIC_RELAXED))
            continue;
        /* Two threads faulting on one page both map it: the second may drop
         * a write of the first into zeros that nobody else shares anyway. */
        void *page = (void *)(addr & ~page_mask);
        if (mmap(page, page_mask + 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) == MAP_FAILED)
            break;
        __atomic_store_n(&guards[i].broken, 1, __ATOMIC_RELEASE);
        __atomic_store_n(&any_broken, 1, __ATOMIC_RELEASE);
        errno = saved_errno;
        return;
    }
    pass_on(sig, info, context);
    errno = saved_errno;
}

static void install(void)
{
    page_mask = (uintptr_t)sysconf(_SC_PAGESIZE) - 1;
    struct sigaction ours = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO | SA_ONSTACK};
    sigemptyset(&ours.sa_mask);
    sigaction(SIGBUS, &ours, &previous);
}

int vgl_guard_mapping(void *start, uint64_t size)
{
    pthread_once(&install_once, install);
    for (int i = 0; i < GUARDS; i++) {
        uintptr_t free_entry = 0;
        /* Taken first with a size of 0, which no fault matches, then sized. */
        if (__atomic_compare_exchange_n(&guards[i].start, &free_entry, (uintptr_t)start, false,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            __atomic_store_n(&guards[i].size, size, __ATOMIC_RELEASE);
            return 0;
        }
    }
    return -EMFILE;
}

int vgl_region_guard(struct vgl_region *region)
{
    return vgl_guard_mapping(region, sizeof *region);
}

void vgl_region_unguard(struct vgl_region *region) { vgl_unguard_mapping(region); }

void vgl_unguard_mapping(void *start)
{
    for (int i = 0; i < GUARDS; i++)
        if (__atomic_load_n(&guards[i].start, __ATOMIC_ACQUIRE) == (uintptr_t)start) {
            __atomic_store_n(&guards[i].size, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&guards[i].broken, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&guards[i].start, 0, __ATOMIC_RELEASE);
        }
}

int vgl_region_broken(const struct vgl_region *region)
{
    if (!region)
        return 0;
    /* Touch the last byte: a file truncated anywhere below its last page
     * lost that page, so the region is found broken now, not at whichever
     * access next reaches past the end (a process's own slot may lie in the
     * pages that remain). */
    (void)*((const volatile char *)region + sizeof *region - 1);
    if (VGL_LIKELY(!__atomic_load_n(&any_broken, __ATOMIC_ACQUIRE)))
        return 0;
    for (int i = 0; i < GUARDS; i++)
        if (__atomic_load_n(&guards[i].start, __ATOMIC_ACQUIRE) == (uintptr_t)region)
            return __atomic_load_n(&guards[i].broken, __ATOMIC_ACQUIRE);
    return 0;
}

/* The machine-wide state file: device memory as accounting, and the table of
 * processes that hold it.
 *
 * Every process maps the same file MAP_SHARED and changes it under one
 * process-shared robust mutex.  A process killed while holding the mutex leaves
 * it EOWNERDEAD: the next locker recomputes what the dead one may have left half
 * done and marks the mutex consistent.  A dead process's entry is dropped and
 * its bytes returned whenever the table is read or memory runs short, as a real
 * driver frees the memory of a process that exits. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <time.h>
#include <unistd.h>

#include "state.h"
#include "base.h"
#include "vgpulimit/cuda_abi.h"

_Static_assert(sizeof(pthread_mutex_t) <= 64, "the file reserves 64 bytes for its mutex");
_Static_assert(sizeof(struct sim_file_device) == 256, "device layout moved");
_Static_assert(sizeof(struct sim_file_proc) == 112 + 8 * SIM_MAX_DEVICES, "process layout moved");
_Static_assert(SIM_MAX_DEVICES <= 32, "context_mask has a bit per device");
_Static_assert(offsetof(struct sim_file, lock) == 128, "header layout moved");
_Static_assert(offsetof(struct sim_file, devices) == 192, "header layout moved");
_Static_assert(offsetof(struct sim_file, procs) == 192 + 256 * SIM_MAX_DEVICES, "header layout moved");

/* This process's view of the file.  `file` is set once and never unmapped. */
static struct {
    pthread_mutex_t open_mutex;     /* guards opening and `fd` */
    struct sim_file *file;
    char path[4096];
    int open_flags;
    int fd;                         /* holds our entry's lock; -1 after fork */
    pid_t fd_pid;                   /* the process that opened `fd` */
    /* Below: guarded by the file's mutex. */
    int self;                       /* our entry, or -1 */
    pid_t self_pid;
    struct sim_pid who;             /* this process, once found */
    pid_t who_pid;                  /* the process that found it: a forked child looks again */
} sim_st = {
    .open_mutex = PTHREAD_MUTEX_INITIALIZER,
    .fd = -1,
    .self = -1,
};

struct sim_pid sim_state_self(void)
{
    pid_t me = getpid();
    if (sim_st.who_pid == me)
        return sim_st.who;
    struct sim_pid who = {.ns = vgl_pid_ns_of("/proc/self/ns/pid"), .pid = me,
                          .host_pid = vgl_host_pid_self()};
    sim_st.who = who;
    sim_st.who_pid = me;
    return who;
}

static int sim_init_file(void *map, void *arg)
{
    struct sim_file *f = map;
    const struct sim_config *cfg = arg;
    memset(f, 0, sizeof *f);
    memcpy(f->magic, SIM_STATE_MAGIC, sizeof f->magic);
    f->version = SIM_STATE_VERSION;
    f->device_count = cfg->unit_count;
    f->file_size = sizeof *f;
    f->memory_bytes = cfg->memory_bytes;
    f->max_procs = SIM_MAX_PROCS;
    f->driver_bytes = cfg->reserved_bytes;
    f->mig_layout = cfg->mig_layout;
    for (uint32_t d = 0; d < cfg->unit_count; d++) {
        f->devices[d].total_bytes = cfg->units[d].memory_bytes;
        f->devices[d].driver_bytes = cfg->units[d].reserved_bytes;
    }
    return vgl_robust_init(&f->lock.u.mutex);
}

/* Maps an existing file after checking that it is a state file of this layout
 * made for this configuration. */
static int sim_attach(const struct sim_config *cfg, int fd, struct sim_file **map_out)
{
    const char *path = cfg->state_path;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size < offsetof(struct sim_file, lock)) {
        sim_log("%s: not a simgpu state file; remove it or set SIMGPU_STATE to another path", path);
        return -EINVAL;
    }
    struct sim_file *f = mmap(NULL, sizeof *f, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (f == MAP_FAILED)
        return -errno;
    int rc = -EINVAL;
    if (memcmp(f->magic, SIM_STATE_MAGIC, sizeof f->magic) != 0) {
        sim_log("%s: not a simgpu state file; remove it or set SIMGPU_STATE to another path", path);
    } else if (f->version != SIM_STATE_VERSION || f->file_size != sizeof *f ||
               (size_t)st.st_size < sizeof *f || f->max_procs != SIM_MAX_PROCS) {
        sim_log("%s: made by another simgpu (layout version %u, expected %d); remove it when no process uses it",
                path, f->version, SIM_STATE_VERSION);
    } else if (f->device_count != cfg->unit_count || f->memory_bytes != cfg->memory_bytes ||
               f->driver_bytes != cfg->reserved_bytes || f->mig_layout != cfg->mig_layout) {
        sim_log("%s: made for %u device(s) and MIG instance(s) of %llu bytes with %llu reserved (MIG layout "
                "%llx), but SIMGPU_DEVICES/SIMGPU_MEMORY/SIMGPU_RESERVED/SIMGPU_MIG ask for %u of %llu with %llu "
                "(%llx); use the same values in every process, or another SIMGPU_STATE",
                path, f->device_count, (unsigned long long)f->memory_bytes, (unsigned long long)f->driver_bytes,
                (unsigned long long)f->mig_layout, cfg->unit_count, (unsigned long long)cfg->memory_bytes,
                (unsigned long long)cfg->reserved_bytes, (unsigned long long)cfg->mig_layout);
    } else {
        *map_out = f;
        return 0;
    }
    munmap(f, sizeof *f);
    return rc;
}

static void sim_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_st.open_mutex);
}

static void sim_atfork_parent(void)
{
    pthread_mutex_unlock(&sim_st.open_mutex);
}

static void sim_atfork_child(void)
{
    pthread_mutex_unlock(&sim_st.open_mutex);
    sim_state_forget_self();
}

int sim_state_open(const struct sim_config *cfg)
{
    if (__atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE))
        return 0;
    pthread_mutex_lock(&sim_st.open_mutex);
    int rc = 0;
    if (sim_st.file)
        goto out;
    struct sim_file *f = NULL;
    int fd = -1;
    /* Open the file, or make it; a lost race to make it means open the winner's. */
    /* The default path may be in /tmp, where another user could plant a link. */
    int nofollow = cfg->state_path_default ? O_NOFOLLOW : 0;
    for (int attempt = 0; attempt < 8 && !f; attempt++) {
        fd = open(cfg->state_path, O_RDWR | O_CLOEXEC | nofollow);
        if (fd >= 0) {
            rc = sim_attach(cfg, fd, &f);
            if (rc) {
                close(fd);
                goto out;
            }
        } else if (errno == ENOENT) {
            /* Made whole, then opened as the winner's (ours or another's).
             * Mode 0600: one simulated machine per user. */
            rc = vgl_create_linked(cfg->state_path, 0600, sizeof *f, sim_init_file, (void *)cfg, NULL);
            if (rc < 0 && rc != -EEXIST) {
                sim_log("%s: cannot create the state file: %s", cfg->state_path, strerror(-rc));
                goto out;
            }
        } else {
            rc = -errno;
            sim_log("%s: cannot open the state file: %s", cfg->state_path, strerror(errno));
            goto out;
        }
    }
    if (!f) {
        rc = -EAGAIN;
        goto out;
    }
    rc = 0;
    snprintf(sim_st.path, sizeof sim_st.path, "%s", cfg->state_path);
    sim_st.open_flags = O_RDWR | O_CLOEXEC | nofollow;
    sim_st.fd = fd;
    sim_st.fd_pid = getpid();
    static bool atfork_done;
    if (!atfork_done) {
        pthread_atfork(sim_atfork_prepare, sim_atfork_parent, sim_atfork_child);
        atfork_done = true;
    }
    __atomic_store_n(&sim_st.file, f, __ATOMIC_RELEASE);
out:
    pthread_mutex_unlock(&sim_st.open_mutex);
    return rc;
}

/* A timeline's cursors back within its rings (what a process that died
 * mid-update may have left). */
static void repair_timeline(struct sim_timeline *tl)
{
    if (tl->head > tl->next || tl->next - tl->head > SIM_TIMELINE_SLOTS)
        tl->head = tl->next;
    if (tl->sample_head >= SIM_SAMPLES || tl->sample_count > SIM_SAMPLES) {
        tl->sample_head = 0;
        tl->sample_count = 0;
    }
    if (tl->current.nprocs > SIM_SAMPLE_PROCS)
        tl->current.nprocs = SIM_SAMPLE_PROCS;
}

/* Makes the derived totals agree with the entries again: what a process that
 * died holding the mutex may have left half done. */
static void sim_repair(struct sim_file *f)
{
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++) {
        uint64_t sum = f->shared.orphan_bytes[d];
        for (uint32_t i = 0; i < SIM_MAX_PROCS; i++)
            if (f->procs[i].state == SIM_PROC_LIVE)
                sum += f->procs[i].used_bytes[d];
        f->devices[d].used_bytes = sum;
        repair_timeline(&f->timelines[d]);
    }
}

/* The longest a call waits for the state lock.  A process stopped while it
 * holds it (a debugger, SIGSTOP) would otherwise hang every process of the
 * simulated machine until it resumes; a real driver has no such lock.  Past
 * the bound the call fails, as a driver call fails, and the next one tries
 * again. */
#define SIM_LOCK_WAIT_NS 2000000000ULL

static int sim_lock(struct sim_file *f)
{
    int rc = vgl_robust_lock_within(&f->lock.u.mutex, SIM_LOCK_WAIT_NS, NULL);
    if (rc == 1) {
        sim_repair(f);
        pthread_mutex_consistent(&f->lock.u.mutex);
        return 0;
    }
    if (rc == -ETIMEDOUT) {
        static int logged;
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            sim_log("%s: the state lock was held for more than %d s by thread %u (a process stopped in the "
                    "simulated driver?); this call fails, later ones try again", sim_st.path,
                    (int)(SIM_LOCK_WAIT_NS / 1000000000ULL), (unsigned)vgl_robust_owner(&f->lock.u.mutex));
        return rc;
    }
    if (rc) {
        static int logged;
        if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
            sim_log("%s: the state file's lock is unusable (%s); remove the file when no process uses it",
                    sim_st.path, strerror(-rc));
    }
    return rc;
}

static void sim_unlock(struct sim_file *f)
{
    pthread_mutex_unlock(&f->lock.u.mutex);
}

struct sim_file *sim_state_lock_file(void)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    return f && sim_lock(f) == 0 ? f : NULL;
}

void sim_state_unlock_file(struct sim_file *f)
{
    sim_unlock(f);
}

/* An fd of the file opened by this very process (a forked child must not use
 * its parent's: they would share the entry lock).  Under the file's mutex. */
static int sim_own_fd(void)
{
    pthread_mutex_lock(&sim_st.open_mutex);
    if (sim_st.fd < 0 || sim_st.fd_pid != getpid()) {
        sim_st.fd = open(sim_st.path, sim_st.open_flags);
        sim_st.fd_pid = getpid();
    }
    int fd = sim_st.fd;
    pthread_mutex_unlock(&sim_st.open_mutex);
    return fd;
}

static off_t sim_entry_offset(int i)
{
    return (off_t)(offsetof(struct sim_file, procs) + (size_t)i * sizeof(struct sim_file_proc));
}

static bool sim_entry_lock(int i, bool hold)
{
    int fd = sim_own_fd();
    if (fd < 0)
        return false;
    return (hold ? vgl_hold_byte : vgl_release_byte)(fd, sim_entry_offset(i)) == 0;
}

/* An entry's lock, where it can be asked about, says more than its pid: it
 * goes with the process image that took it.  The driver's device files are
 * O_CLOEXEC, so an exec frees the memory of the image before it (the pid
 * runs on, same start time, holding nothing); the state file's descriptor is
 * O_CLOEXEC too, and its lock goes at the exec as the driver's memory does. */
static bool sim_entry_dead(const struct sim_file_proc *p, int i)
{
    if (p->who.pid <= 0)
        return true; /* half-claimed by a process killed in the act: kill(0, 0) would succeed */
    if (p->flags & SIM_PROC_LOCKED) {
        int fd = sim_own_fd();
        int held = fd >= 0 ? vgl_byte_held(fd, sim_entry_offset(i)) : -1;
        if (held >= 0)
            return held == 0;
    }
    if (p->who.ns == sim_state_self().ns) {
        /* Exited (a zombie too: a real driver frees a process's memory at
         * its exit, not when its parent reaps it), or the pid is reused. */
        return !vgl_proc_running(p->who.pid, p->start_time);
    }
    /* Another pid namespace: its pids mean nothing here, but its owner holds a
     * lock on the entry for as long as it lives. */
    if (!(p->flags & SIM_PROC_LOCKED))
        return false; /* cannot tell: never take what may be a live process's memory */
    int fd = sim_own_fd();
    return fd >= 0 && vgl_byte_held(fd, sim_entry_offset(i)) == 0;
}

/* ---- Memory shared between processes: who holds it, who is charged --------
 *
 * The rows of struct sim_file_shared (shared.c makes and joins them).  A
 * shared allocation is charged to one holder at a time; when its owner lets
 * go the charge passes to another holder, to the device alone while only
 * exported descriptors hold it, or goes back with the bytes (shared.c says
 * why, as NVIDIA's kernel driver does).  Here because a process's entry
 * going (its exit, its death) is the state file's business. */

void sim_state_shared_file(uint64_t id, char *out, size_t size)
{
    snprintf(out, size, "%s.shared/%" PRIu64, sim_st.path, id);
}

static bool sim_holds(const struct sim_file_shared *s, int entry)
{
    return (s->holders[entry / 64] >> (entry % 64)) & 1u;
}

/* Whether an exported descriptor of `s` is open anywhere. */
static bool sim_exported_open(const struct sim_file_shared *s)
{
    char path[4200];
    sim_state_shared_file(s->id, path, sizeof path);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return false;
    bool held = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd);
    return held;
}

/* Moves the charge of `s` to entry `to` (-1: the device alone). */
static void sim_move_owner(struct sim_file *f, struct sim_file_shared *s, int to)
{
    uint32_t d = s->device;
    if (s->owner >= 0) {
        uint64_t *used = &f->procs[s->owner].used_bytes[d];
        *used -= s->size < *used ? s->size : *used;
    } else {
        f->shared.orphan_bytes[d] -= s->size < f->shared.orphan_bytes[d] ? s->size : f->shared.orphan_bytes[d];
    }
    if (to >= 0)
        f->procs[to].used_bytes[d] += s->size;
    else
        f->shared.orphan_bytes[d] += s->size;
    s->owner = to;
}

/* After a holder let go: the charge passes to another holder, to the device
 * alone while exported descriptors remain, or goes back with the bytes. */
static void sim_settle(struct sim_file *f, struct sim_file_shared *s)
{
    if (s->owner >= 0 && sim_holds(s, s->owner))
        return;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        if (sim_holds(s, i)) {
            sim_move_owner(f, s, i);
            return;
        }
    }
    if (sim_exported_open(s)) {
        if (s->owner >= 0)
            sim_move_owner(f, s, -1);
        return;
    }
    sim_move_owner(f, s, -1);
    f->shared.orphan_bytes[s->device] -= s->size;
    struct sim_file_device *dev = &f->devices[s->device];
    dev->used_bytes -= s->size < dev->used_bytes ? s->size : dev->used_bytes;
    char path[4200];
    sim_state_shared_file(s->id, path, sizeof path);
    unlink(path);
    memset(s, 0, sizeof *s);
}

void sim_state_shared_drop(struct sim_file *f, struct sim_file_shared *s, int entry)
{
    if (!sim_holds(s, entry))
        return;
    s->holders[entry / 64] &= ~(UINT64_C(1) << (entry % 64));
    if (f->procs[entry].shared_held)
        f->procs[entry].shared_held--;
    sim_settle(f, s);
}

static void sim_shared_forget_entry(struct sim_file *f, int i)
{
    for (int k = 0; k < SIM_MAX_IPC_EVENTS; k++)
        if (f->shared.events[k].id && f->shared.events[k].owner == i)
            memset(&f->shared.events[k], 0, sizeof f->shared.events[k]);
    for (int k = 0; k < SIM_MAX_SHARED && f->procs[i].shared_held; k++)
        if (f->shared.v[k].id)
            sim_state_shared_drop(f, &f->shared.v[k], i);
}

static void sim_shared_reap(struct sim_file *f)
{
    for (int k = 0; k < SIM_MAX_SHARED; k++)
        if (f->shared.v[k].id && f->shared.v[k].owner < 0)
            sim_settle(f, &f->shared.v[k]);
}

static void sim_drop_entry(struct sim_file *f, int i)
{
    struct sim_file_proc *p = &f->procs[i];
    sim_shared_forget_entry(f, i);
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++) {
        uint64_t b = p->used_bytes[d];
        f->devices[d].used_bytes -= b < f->devices[d].used_bytes ? b : f->devices[d].used_bytes;
    }
    memset(p, 0, sizeof *p);
}

/* Returns the memory of every process that has died.  Under the file's mutex. */
static void sim_reap(struct sim_file *f)
{
    pid_t me = getpid();
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_file_proc *p = &f->procs[i];
        if (p->state != SIM_PROC_LIVE || (i == sim_st.self && sim_st.self_pid == me))
            continue;
        if (sim_entry_dead(p, i))
            sim_drop_entry(f, i);
    }
    sim_shared_reap(f);
}

/* Our entry, claimed on first need.  Under the file's mutex. */
static int sim_claim_self(struct sim_file *f)
{
    pid_t me = getpid();
    if (sim_st.self >= 0 && sim_st.self_pid == me)
        return sim_st.self;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < SIM_MAX_PROCS; i++) {
            struct sim_file_proc *p = &f->procs[i];
            if (p->state != SIM_PROC_FREE)
                continue;
            memset(p, 0, sizeof *p);
            p->who = sim_state_self();
            p->start_time = vgl_proc_start_time(me);
            p->flags = sim_entry_lock(i, true) ? SIM_PROC_LOCKED : 0;
            vgl_proc_comm_self(p->comm);
            p->state = SIM_PROC_LIVE;
            sim_st.self = i;
            sim_st.self_pid = me;
            return i;
        }
        sim_reap(f);
    }
    static int logged;
    if (!__atomic_exchange_n(&logged, 1, __ATOMIC_RELAXED))
        sim_log("%s: all %d process entries are taken", sim_st.path, SIM_MAX_PROCS);
    return -ENOSPC;
}

int sim_state_self_entry(struct sim_file *f)
{
    return sim_claim_self(f);
}

const char *sim_state_path(void)
{
    return sim_st.path;
}

static struct sim_file_proc *sim_self_entry(struct sim_file *f)
{
    if (sim_st.self < 0 || sim_st.self_pid != getpid())
        return NULL;
    return &f->procs[sim_st.self];
}

/* Gives our entry back once we hold neither a context nor memory, as a process
 * leaves nvidia-smi's list when it destroys its last context.  Under the mutex. */
static void sim_release_self_if_idle(struct sim_file *f)
{
    struct sim_file_proc *p = sim_self_entry(f);
    if (!p || p->context_mask || p->shared_held)
        return;
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++)
        if (p->used_bytes[d])
            return;
    if (p->flags & SIM_PROC_LOCKED)
        sim_entry_lock(sim_st.self, false);
    memset(p, 0, sizeof *p);
    sim_st.self = -1;
}

static struct sim_file *sim_file_for(uint32_t device)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    return f && device < f->device_count ? f : NULL;
}

int sim_state_charge(uint32_t device, uint64_t bytes)
{
    struct sim_file *f = sim_file_for(device);
    if (!f)
        return -EINVAL;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    int i = sim_claim_self(f);
    if (i < 0) {
        sim_unlock(f);
        return i;
    }
    struct sim_file_device *d = &f->devices[device];
    for (int pass = 0;; pass++) {
        uint64_t taken = d->used_bytes + d->driver_bytes;
        uint64_t free_bytes = taken < d->total_bytes ? d->total_bytes - taken : 0;
        if (bytes <= free_bytes)
            break;
        if (pass == 1) {
            sim_release_self_if_idle(f);
            sim_unlock(f);
            return -ENOMEM;
        }
        sim_reap(f); /* memory is short: return what dead processes held first */
    }
    d->used_bytes += bytes;
    f->procs[i].used_bytes[device] += bytes;
    sim_unlock(f);
    return 0;
}

void sim_state_uncharge(uint32_t device, uint64_t bytes)
{
    struct sim_file *f = sim_file_for(device);
    if (!f || sim_lock(f) != 0)
        return;
    struct sim_file_proc *p = sim_self_entry(f);
    if (p) {
        uint64_t b = bytes < p->used_bytes[device] ? bytes : p->used_bytes[device];
        p->used_bytes[device] -= b;
        f->devices[device].used_bytes -= b < f->devices[device].used_bytes ? b : f->devices[device].used_bytes;
        sim_release_self_if_idle(f);
    }
    sim_unlock(f);
}

/* This process's checkpoint thread (checkpoint.c), which a new entry names,
 * and the word it waits on while the process has no entry. */
static struct {
    int32_t tid;
    pid_t pid;                      /* the process generation it runs in */
} sim_ckpt_thread;
static uint32_t sim_ckpt_idle;

static long sim_futex(uint32_t *word, int op, uint32_t value, uint32_t wait_ms);

/* A process's first context names its checkpoint thread in its entry, and
 * wakes the thread to wait there.  Under the mutex. */
static void sim_ckpt_name_thread(struct sim_file_proc *p)
{
    if (__atomic_load_n(&sim_ckpt_thread.pid, __ATOMIC_ACQUIRE) != getpid())
        return;
    p->ckpt_tid = __atomic_load_n(&sim_ckpt_thread.tid, __ATOMIC_ACQUIRE);
    __atomic_add_fetch(&sim_ckpt_idle, 1, __ATOMIC_RELEASE);
    sim_futex(&sim_ckpt_idle, FUTEX_WAKE, INT32_MAX, 0);
}

static int set_context_bit(struct sim_file *f, uint32_t device, bool active)
{
    int rc = sim_lock(f);
    if (rc)
        return rc;
    if (active) {
        int i = sim_claim_self(f);
        if (i < 0)
            rc = i;
        else {
            f->procs[i].context_mask |= 1u << device;
            sim_ckpt_name_thread(&f->procs[i]);
        }
    } else {
        struct sim_file_proc *p = sim_self_entry(f);
        if (p) {
            p->context_mask &= ~(1u << device);
            sim_release_self_if_idle(f);
        }
    }
    sim_unlock(f);
    return rc;
}

/* A process's first context on a device costs it device memory, as on a
 * real GPU (the context, its heaps, the loaded modules): charged when the
 * context comes and given back when the last one goes, so it shows in NVML's
 * per-process numbers like any allocation. */
int sim_state_set_context(uint32_t device, bool active, uint64_t overhead)
{
    struct sim_file *f = sim_file_for(device);
    if (!f)
        return -EINVAL;
    if (!active) {
        if (overhead)
            sim_state_uncharge(device, overhead);
        return set_context_bit(f, device, false);
    }
    int rc = set_context_bit(f, device, true);
    if (rc == 0 && overhead && (rc = sim_state_charge(device, overhead)) != 0)
        set_context_bit(f, device, false);
    return rc;
}

int sim_state_mem_info(uint32_t device, struct sim_mem_info *out)
{
    struct sim_file *f = sim_file_for(device);
    if (!f)
        return -EINVAL;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    sim_reap(f);
    const struct sim_file_device *d = &f->devices[device];
    out->total_bytes = d->total_bytes;
    out->reserved_bytes = d->driver_bytes < d->total_bytes ? d->driver_bytes : d->total_bytes;
    uint64_t room = out->total_bytes - out->reserved_bytes;
    out->used_bytes = d->used_bytes < room ? d->used_bytes : room;
    sim_unlock(f);
    return 0;
}

int sim_state_processes(uint32_t device, struct sim_proc_info *out, uint32_t max)
{
    struct sim_file *f = sim_file_for(device);
    if (!f)
        return -EINVAL;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    sim_reap(f);
    uint32_t n = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_file_proc *p = &f->procs[i];
        if (p->state != SIM_PROC_LIVE || !((p->context_mask >> device) & 1u || p->used_bytes[device]))
            continue;
        if (n < max)
            out[n] = (struct sim_proc_info){.who = p->who, .used_bytes = p->used_bytes[device]};
        n++;
    }
    sim_unlock(f);
    struct sim_host_pids host = {0};
    for (uint32_t i = 0; i < n && i < max; i++)
        out[i].pid = sim_driver_pid(&out[i].who, &host);
    sim_host_pids_free(&host);
    return (int)n;
}

void sim_state_forget_self(void)
{
    /* The child of a fork: the entry is the parent's.  Dropping the inherited fd
     * (not unlocking through it, which would drop the parent's lock) lets the
     * parent's lock go when the parent dies. */
    sim_st.self = -1;
    if (sim_st.fd >= 0)
        close(sim_st.fd);
    sim_st.fd = -1;
}

/* A process that exits normally gives its memory back at once; one that is
 * killed is reaped by the next process that looks.  Bounded wait: a thread of
 * ours may be killed by exit() while holding the mutex. */
__attribute__((destructor)) static void sim_state_at_exit(void)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f || sim_st.self < 0 || sim_st.self_pid != getpid())
        return;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    int rc = pthread_mutex_timedlock(&f->lock.u.mutex, &deadline);
    if (rc == EOWNERDEAD) {
        sim_repair(f);
        pthread_mutex_consistent(&f->lock.u.mutex);
        rc = 0;
    }
    if (rc)
        return;
    struct sim_file_proc *p = sim_self_entry(f);
    if (p) {
        if (p->flags & SIM_PROC_LOCKED)
            sim_entry_lock(sim_st.self, false);
        sim_drop_entry(f, sim_st.self);
        sim_st.self = -1;
    }
    sim_unlock(f);
}

/* ---- Checkpoint requests between processes --------------------------------
 *
 * The driver carries out a checkpoint request inside the process it names (its
 * "restore thread", cuCheckpointProcessGetRestoreThreadId): a caller posts the
 * request in the process's entry and waits; the process's checkpoint thread
 * (checkpoint.c) waits on the entry, carries it out and says so.  The waits are
 * futexes on the shared mapping, bounded so that a death on either side is
 * seen: a dead target's entry is reaped, a dead caller leaves a request that
 * is carried out all the same. */

static long sim_futex(uint32_t *word, int op, uint32_t value, uint32_t wait_ms)
{
    struct timespec ts = {.tv_sec = wait_ms / 1000, .tv_nsec = (long)(wait_ms % 1000) * 1000000L};
    return syscall(SYS_futex, word, op, value, op == FUTEX_WAIT ? &ts : NULL, NULL, 0);
}

/* The live entry of the process `pid` names as this process sees it: the
 * same pid namespace, or the host's seen from the host's.  Under the mutex. */
static int sim_find_pid(struct sim_file *f, int32_t pid)
{
    struct sim_pid me = sim_state_self();
    bool host_view = me.host_pid == me.pid;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_file_proc *p = &f->procs[i];
        if (p->state != SIM_PROC_LIVE)
            continue;
        if ((p->who.ns == me.ns && p->who.pid == pid) || (host_view && p->who.host_pid == pid))
            return i;
    }
    return -ESRCH;
}

/* The state a request needs its target in. */
static bool sim_ckpt_allowed(uint32_t op, uint32_t state)
{
    switch (op) {
    case SIM_CKPT_LOCK:
        return state == CU_PROCESS_STATE_RUNNING;
    case SIM_CKPT_CHECKPOINT:
    case SIM_CKPT_UNLOCK:
        return state == CU_PROCESS_STATE_LOCKED;
    case SIM_CKPT_RESTORE:
        return state == CU_PROCESS_STATE_CHECKPOINTED;
    default:
        return false;
    }
}

int sim_state_ckpt_post(int32_t pid, uint32_t op, uint32_t timeout_ms, struct sim_ckpt_ticket *t)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f)
        return -ESRCH;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    sim_reap(f);
    int i = sim_find_pid(f, pid);
    struct sim_file_proc *p = i >= 0 ? &f->procs[i] : NULL;
    if (!p || !p->ckpt_tid || !p->context_mask)
        rc = -ESRCH;
    else if (p->ckpt_request != p->ckpt_done)
        rc = -EBUSY;
    else if (!sim_ckpt_allowed(op, p->ckpt_state))
        rc = -EPERM;
    if (rc == 0) {
        p->ckpt_op = op;
        p->ckpt_timeout_ms = timeout_ms;
        __atomic_store_n(&p->ckpt_request, p->ckpt_request + 1, __ATOMIC_RELEASE);
        *t = (struct sim_ckpt_ticket){.entry = i, .who = p->who, .start_time = p->start_time,
                                      .seq = p->ckpt_request};
    }
    sim_unlock(f);
    if (rc == 0)
        sim_futex(&p->ckpt_request, FUTEX_WAKE, INT32_MAX, 0);
    return rc;
}

int sim_state_ckpt_wait(const struct sim_ckpt_ticket *t, uint64_t deadline_ns, int32_t *result)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    struct sim_file_proc *p = &f->procs[t->entry];
    for (;;) {
        uint32_t done = __atomic_load_n(&p->ckpt_done, __ATOMIC_ACQUIRE);
        uint64_t now = vgl_node_clock_ns();   /* sim_now_ns's clock */
        if (done != t->seq && now < deadline_ns) {
            uint64_t left_ms = (deadline_ns - now + 999999) / 1000000;
            sim_futex(&p->ckpt_done, FUTEX_WAIT, done, left_ms < 100 ? (uint32_t)left_ms : 100);
        }
        int rc = sim_lock(f);
        if (rc)
            return rc;
        sim_reap(f);
        bool same = p->state == SIM_PROC_LIVE && p->who.pid == t->who.pid && p->who.ns == t->who.ns &&
                    p->start_time == t->start_time;
        bool finished = same && p->ckpt_done == t->seq;
        bool given_up = same && !finished && vgl_node_clock_ns() >= deadline_ns;
        if (finished)
            *result = p->ckpt_result;
        if (given_up)
            __atomic_store_n(&p->ckpt_done, t->seq, __ATOMIC_RELEASE);
        sim_unlock(f);
        if (!same)
            return -ESRCH;
        if (finished)
            return 0;
        if (given_up)
            return -ETIMEDOUT;
    }
}

int sim_state_ckpt_get(int32_t pid, uint32_t *state, int32_t *tid)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f)
        return -ESRCH;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    sim_reap(f);
    int i = sim_find_pid(f, pid);
    if (i < 0 || !f->procs[i].ckpt_tid || !f->procs[i].context_mask) {
        rc = -ESRCH;
    } else {
        *state = f->procs[i].ckpt_state;
        *tid = f->procs[i].ckpt_tid;
    }
    sim_unlock(f);
    return rc;
}

void sim_state_ckpt_register(int32_t tid)
{
    __atomic_store_n(&sim_ckpt_thread.tid, tid, __ATOMIC_RELEASE);
    __atomic_store_n(&sim_ckpt_thread.pid, getpid(), __ATOMIC_RELEASE);
}

int sim_state_ckpt_next(int32_t tid, uint32_t wait_ms, struct sim_ckpt_request *r)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f || sim_lock(f) != 0) {
        struct timespec ts = {.tv_sec = wait_ms / 1000, .tv_nsec = (long)(wait_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        return 0;
    }
    struct sim_file_proc *p = sim_self_entry(f);
    uint32_t request = __atomic_load_n(&sim_ckpt_idle, __ATOMIC_ACQUIRE);
    bool pending = false;
    if (p) {
        p->ckpt_tid = tid;
        request = p->ckpt_request;
        pending = request != p->ckpt_done;
        *r = (struct sim_ckpt_request){.seq = request, .op = p->ckpt_op, .timeout_ms = p->ckpt_timeout_ms,
                                       .state = p->ckpt_state};
    }
    sim_unlock(f);
    if (pending)
        return 1;
    /* Without an entry, a context's coming wakes us (sim_state_ckpt_attach). */
    sim_futex(p ? &p->ckpt_request : &sim_ckpt_idle, FUTEX_WAIT, request, wait_ms);
    return 0;
}

bool sim_state_ckpt_finish(uint32_t seq, uint32_t state, int32_t result)
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f || sim_lock(f) != 0)
        return true;
    struct sim_file_proc *p = sim_self_entry(f);
    bool accepted = p && p->ckpt_request == seq && p->ckpt_done != seq;
    if (accepted) {
        p->ckpt_state = state;
        p->ckpt_result = result;
        __atomic_store_n(&p->ckpt_done, seq, __ATOMIC_RELEASE);
    }
    sim_unlock(f);
    if (accepted)
        sim_futex(&p->ckpt_done, FUTEX_WAKE, INT32_MAX, 0);
    return accepted || !p;
}

int sim_state_ckpt_release(uint64_t out[SIM_MAX_DEVICES])
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f)
        return -ESRCH;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    struct sim_file_proc *p = sim_self_entry(f);
    if (!p) {
        rc = -ESRCH;
    } else if (p->shared_held) {
        rc = -EOPNOTSUPP;
    } else {
        for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++) {
            uint64_t b = p->used_bytes[d];
            out[d] = b;
            p->used_bytes[d] = 0;
            f->devices[d].used_bytes -= b < f->devices[d].used_bytes ? b : f->devices[d].used_bytes;
        }
    }
    sim_unlock(f);
    return rc;
}

int sim_state_ckpt_recharge(const uint64_t bytes[SIM_MAX_DEVICES])
{
    struct sim_file *f = __atomic_load_n(&sim_st.file, __ATOMIC_ACQUIRE);
    if (!f)
        return -ESRCH;
    int rc = sim_lock(f);
    if (rc)
        return rc;
    struct sim_file_proc *p = sim_self_entry(f);
    if (!p)
        rc = -ESRCH;
    for (int pass = 0; rc == 0 && pass < 2; pass++) {
        bool room = true;
        for (uint32_t d = 0; d < f->device_count; d++) {
            const struct sim_file_device *dv = &f->devices[d];
            uint64_t taken = dv->used_bytes + dv->driver_bytes;
            uint64_t free_bytes = taken < dv->total_bytes ? dv->total_bytes - taken : 0;
            room = room && bytes[d] <= free_bytes;
        }
        if (room)
            break;
        if (pass == 1)
            rc = -ENOMEM;
        else
            sim_reap(f); /* memory is short: return what dead processes held first */
    }
    for (uint32_t d = 0; rc == 0 && d < f->device_count; d++) {
        p->used_bytes[d] += bytes[d];
        f->devices[d].used_bytes += bytes[d];
    }
    sim_unlock(f);
    return rc;
}

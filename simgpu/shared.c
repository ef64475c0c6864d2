/* Device memory that processes share: what legacy CUDA IPC
 * (cuIpcGetMemHandle), exported virtual memory (cuMemExportToShareableHandle)
 * and exported memory pools hand from one process to another.
 *
 * The bytes of a shared allocation are a file in a directory beside the
 * state file (`<state file>.shared/<id>`), so that every process that maps it
 * sees the same bytes, and the state file's table says who holds it.  As on
 * NVIDIA's driver, the memory lives until the last holder anywhere lets go —
 * a process's handle or mapping, or an exported file descriptor (cuda.h,
 * cuMemExportToShareableHandle: "Once all shareable handles are closed and
 * the allocation is released") — and it is charged to one process at a time:
 * the one that made it, then, when that one lets go, another holder.  That
 * is how the kernel driver counts a process's memory for NVML: memory whose
 * descriptor is shared counts for the client that owns it, and freeing the
 * owner's reference passes the ownership on (open-gpu-kernel-modules,
 * _gpuCollectMemInfo and memDestructCommon).  Memory that only exported
 * descriptors hold is owned by the kernel's own client there, which NVML
 * lists for no process: here it is the device's alone (orphan_bytes).
 *
 * An exported descriptor is an open file description of the allocation's
 * file with a shared flock(2) on it.  The lock lives as long as the
 * description does — across dup(2), SCM_RIGHTS and pidfd_getfd(2), until the
 * last copy is closed — so whether any exported descriptor is still open
 * anywhere is whether an exclusive lock can be had.
 *
 * state.c passes an allocation's charge on, or gives it back, when a holder
 * lets go (sim_state_shared_drop): a process's exit is the state file's.
 *
 * Interprocess events (cuIpcGetEventHandle) are kept here too: a table of
 * their last records, which any process that opened one reads.  The
 * timeline that says when a record completes is machine-wide already. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state.h"

/* How many references this process has to each shared allocation it holds:
 * it is a holder in the state file while it has any. */
static struct {
    pthread_mutex_t mutex;
    struct {
        uint64_t id;
        uint32_t refs;
    } *v;
    size_t n, cap;
} sim_refs = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static void sim_refs_prepare(void)
{
    pthread_mutex_lock(&sim_refs.mutex);
}

static void sim_refs_parent(void)
{
    pthread_mutex_unlock(&sim_refs.mutex);
}

/* A forked child holds nothing of its parent's (its state-file entry is its own). */
static void sim_refs_child(void)
{
    sim_refs.n = 0;
    pthread_mutex_unlock(&sim_refs.mutex);
}

__attribute__((constructor)) static void sim_refs_load(void)
{
    pthread_atfork(sim_refs_prepare, sim_refs_parent, sim_refs_child);
}

/* Under sim_refs.mutex: +1 or -1 to `id`'s count; its new value. */
static int sim_ref_add(uint64_t id, int delta)
{
    size_t i = 0;
    while (i < sim_refs.n && sim_refs.v[i].id != id)
        i++;
    if (i == sim_refs.n) {
        if (delta < 0)
            return 0;
        if (sim_refs.n == sim_refs.cap) {
            size_t cap = sim_refs.cap ? 2 * sim_refs.cap : 16;
            void *v = realloc(sim_refs.v, cap * sizeof *sim_refs.v);
            if (!v)
                return -ENOMEM;
            sim_refs.v = v;
            sim_refs.cap = cap;
        }
        sim_refs.v[sim_refs.n].id = id;
        sim_refs.v[sim_refs.n].refs = 0;
        sim_refs.n++;
    }
    int refs = (int)(sim_refs.v[i].refs += (uint32_t)delta);
    if (refs == 0)
        sim_refs.v[i] = sim_refs.v[--sim_refs.n];
    return refs;
}

static struct sim_file_shared *sim_find_id(struct sim_file *f, uint64_t id)
{
    for (int i = 0; i < SIM_MAX_SHARED; i++)
        if (id && f->shared.v[i].id == id)
            return &f->shared.v[i];
    return NULL;
}

static bool sim_holds(const struct sim_file_shared *s, int entry)
{
    return (s->holders[entry / 64] >> (entry % 64)) & 1u;
}

/* Opens the file of `id` for the calling process. */
static int sim_open_file(uint64_t id, bool create, uint64_t size)
{
    char path[4200];
    if (create) {
        snprintf(path, sizeof path, "%s.shared", sim_state_path());
        if (mkdir(path, 0700) != 0 && errno != EEXIST)
            return -errno;
    }
    sim_state_shared_file(id, path, sizeof path);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0)
        return -errno;
    if (create && ftruncate(fd, (off_t)size) != 0) {
        int err = -errno;
        close(fd);
        unlink(path);
        return err;
    }
    return fd;
}

int sim_shared_create(uint32_t device, uint64_t size, bool charge, struct sim_shared_ref *out)
{
    if (charge) {
        int rc = sim_state_charge(device, size);
        if (rc)
            return rc;
    }
    int rc = -ENOSPC;
    struct sim_file *f = sim_state_lock_file();
    if (!f) {
        rc = -EIO;
        goto fail;
    }
    int self = sim_state_self_entry(f);
    struct sim_file_shared *s = sim_find_id(f, 0);
    for (int k = 0; !s && k < SIM_MAX_SHARED; k++)
        if (!f->shared.v[k].id)
            s = &f->shared.v[k];
    if (self < 0 || !s) {
        rc = self < 0 ? self : -ENOSPC;
        sim_state_unlock_file(f);
        goto fail;
    }
    uint64_t id = ++f->shared.last_id;
    int fd = sim_open_file(id, true, size);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = fd < 0 ? fd : -errno;
        sim_state_unlock_file(f);
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    /* The bytes already charged to this process are now the allocation's. */
    *s = (struct sim_file_shared){.id = id, .size = size, .file_dev = (uint64_t)st.st_dev,
                                  .file_ino = (uint64_t)st.st_ino, .device = device, .owner = self};
    s->holders[self / 64] |= UINT64_C(1) << (self % 64);
    f->procs[self].shared_held++;
    sim_state_unlock_file(f);
    pthread_mutex_lock(&sim_refs.mutex);
    sim_ref_add(id, +1);
    pthread_mutex_unlock(&sim_refs.mutex);
    *out = (struct sim_shared_ref){.id = id, .device = device, .size = size, .fd = fd};
    return 0;
fail:
    if (charge)
        sim_state_uncharge(device, size);
    return rc;
}

int sim_shared_join(uint64_t id, int fd, struct sim_shared_ref *out)
{
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)))
        return -ENOENT;
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return -EIO;
    struct sim_file_shared *s = NULL;
    for (int k = 0; k < SIM_MAX_SHARED && !s; k++) {
        struct sim_file_shared *c = &f->shared.v[k];
        if (c->id && (fd >= 0 ? c->file_dev == (uint64_t)st.st_dev && c->file_ino == (uint64_t)st.st_ino
                              : c->id == id))
            s = c;
    }
    int self = s ? sim_state_self_entry(f) : -ENOENT;
    int own = self >= 0 ? sim_open_file(s->id, false, 0) : self;
    pthread_mutex_lock(&sim_refs.mutex);
    int refs = own >= 0 ? sim_ref_add(s->id, +1) : own;
    pthread_mutex_unlock(&sim_refs.mutex);
    if (refs < 0) {
        if (own >= 0)
            close(own);
        sim_state_unlock_file(f);
        return refs;
    }
    if (!sim_holds(s, self)) {
        s->holders[self / 64] |= UINT64_C(1) << (self % 64);
        f->procs[self].shared_held++;
    }
    *out = (struct sim_shared_ref){.id = s->id, .device = s->device, .size = s->size, .fd = own};
    sim_state_unlock_file(f);
    return 0;
}

void sim_shared_leave(const struct sim_shared_ref *ref)
{
    close(ref->fd);
    pthread_mutex_lock(&sim_refs.mutex);
    int refs = sim_ref_add(ref->id, -1);
    pthread_mutex_unlock(&sim_refs.mutex);
    if (refs > 0)
        return;
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return;
    struct sim_file_shared *s = sim_find_id(f, ref->id);
    int self = sim_state_self_entry(f);
    if (s && self >= 0)
        sim_state_shared_drop(f, s, self);
    sim_state_unlock_file(f);
}

int sim_shared_export(const struct sim_shared_ref *ref)
{
    int fd = sim_open_file(ref->id, false, 0);
    if (fd >= 0 && flock(fd, LOCK_SH) != 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

static struct sim_file_event *sim_event_find(struct sim_file *f, uint64_t id)
{
    for (int k = 0; k < SIM_MAX_IPC_EVENTS; k++)
        if (id && f->shared.events[k].id == id)
            return &f->shared.events[k];
    return NULL;
}

uint64_t sim_ipc_event_new(void)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return 0;
    uint64_t id = 0;
    int self = sim_state_self_entry(f);
    struct sim_file_event *e = self >= 0 ? sim_event_find(f, 0) : NULL;
    for (int k = 0; self >= 0 && !e && k < SIM_MAX_IPC_EVENTS; k++)
        if (!f->shared.events[k].id)
            e = &f->shared.events[k];
    if (e) {
        id = ++f->shared.last_id;
        *e = (struct sim_file_event){.id = id, .owner = self};
    }
    sim_state_unlock_file(f);
    return id;
}

void sim_ipc_event_free(uint64_t id)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return;
    struct sim_file_event *e = sim_event_find(f, id);
    if (e)
        memset(e, 0, sizeof *e);
    sim_state_unlock_file(f);
}

int sim_ipc_event_set(uint64_t id, uint32_t state, uint32_t device, uint64_t ticket)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return -EIO;
    struct sim_file_event *e = sim_event_find(f, id);
    if (e) {
        e->state = state;
        e->device = device;
        e->ticket = ticket;
    }
    sim_state_unlock_file(f);
    return e ? 0 : -ENOENT;
}

int sim_ipc_event_get(uint64_t id, uint32_t *state, uint32_t *device, uint64_t *ticket)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return -EIO;
    struct sim_file_event *e = sim_event_find(f, id);
    if (e) {
        *state = e->state;
        *device = e->device;
        *ticket = e->ticket;
    }
    sim_state_unlock_file(f);
    return e ? 0 : -ENOENT;
}

uint64_t sim_shared_new_id(void)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return 0;
    uint64_t id = ++f->shared.last_id;
    sim_state_unlock_file(f);
    return id;
}

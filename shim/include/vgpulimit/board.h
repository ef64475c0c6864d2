/* The node's board: which containers take part in priorities, and the
 * priority of each; and what memory each is guaranteed on its GPUs (elastic
 * memory, docs/memory.md).  One small file per node, written only by setters
 * (`vgpulimit run`, `vgpulimit set`, the OCI hook) and mapped read-only by
 * every container's processes, so no tenant can raise its own priority or
 * lower another's (docs/threat-model.md).
 *
 * A row is the container's by its region file (device and inode): the
 * setter that made the region names it in the row, and the shim finds its
 * row by the file it has open, never by what the region says, which every
 * process of the container may write.
 *
 * Each row names a beacon: a file of the container's own, beside the board,
 * where its processes write until when their launched work will keep each
 * device busy.  Others read it; only the container writes it, so a tenant
 * can say it is busy (what it could do by launching kernels anyway) but not
 * make another look busy or idle.
 *
 * Fixed-width fields; pinned by tests/c/region_layout.c.  This header is fed
 * to cffi (src/vgpulimit/_cffi_build.py): no macros in its body. */
#ifndef VGPULIMIT_BOARD_H
#define VGPULIMIT_BOARD_H

#include <stdint.h>

#include "vgpulimit/limits.h"

enum {
    VGL_BOARD_VERSION = 3,
    VGL_BOARD_ROWS = 64,
    VGL_BEACON_NAME_LEN = 64,
    /* vgl_board_join's priority for a row that takes no part in priorities
     * (a row for elastic memory alone). */
    VGL_BOARD_NO_PRIORITY = 255,
};

/* What a row takes part in (vgl_board_row.flags). */
enum vgl_board_row_flags {
    VGL_ROW_PRIORITY = 1,        /* priorities: `priority` applies */
    VGL_ROW_MEMORY = 2,          /* elastic memory: `guarantee` and `guarantee_by_uuid` apply */
    VGL_ROW_SUSPENDED = 4,       /* suspended (docs/suspend.md): its memory is off the GPU, and
                                    nothing is held for its guarantee until it is resumed */
};

/* A guarantee given for a device by its UUID, whatever the container numbers it. */
struct vgl_board_guarantee {
    uint8_t uuid[16];            /* all zero: an unused entry */
    struct vgl_mem_limit guarantee;
};

struct vgl_board_row {
    uint64_t key;                /* 0: a free row */
    uint32_t priority;           /* enum vgl_priority */
    int32_t owner_pid;           /* the process that holds the row (a supervisor, or the hook's
                                    container's init), in the setters' pid namespace; once it is
                                    gone the row is free; 0: until it is left */
    uint64_t owner_start;        /* its /proc/<pid>/stat starttime: a reused pid is not it */
    char beacon[64];             /* VGL_BEACON_NAME_LEN: the beacon's file name in the board's
                                    directory, NUL-terminated; always vgl_beacon_name(key), which
                                    the shim uses instead (see there) */
    uint64_t region_dev;         /* the container's region file, as stat(2) gives it: st_dev */
    uint64_t region_ino;         /* and st_ino (never 0 in a row that is held) */
    uint32_t flags;              /* enum vgl_board_row_flags */
    uint32_t suspend_idle_ms;    /* the node agent may suspend the container once its GPU work
                                    has been idle this long and others wait (docs/agent.md);
                                    0: never for idleness */
    uint64_t memory_wait_ns;     /* the container's memory wait: a row with none is no one's to
                                    wake, and where no row has one a free wakes no one */
    /* The memory guaranteed to the container, as its setter gave it: its
     * request, else its cap; both fields 0: nothing.  By the container's
     * device index, and by UUID (which beats the index). */
    struct vgl_mem_limit guarantee[16];                 /* VGL_MAX_DEVICES */
    struct vgl_board_guarantee guarantee_by_uuid[16];   /* VGL_MAX_DEVICES */
};

struct vgl_board {
    char magic[8];               /* "VGLBOARD" (no NUL) */
    uint32_t version;            /* VGL_BOARD_VERSION */
    uint32_t rows;               /* VGL_BOARD_ROWS */
    uint64_t generation;         /* bumped by every change of a row */
    struct vgl_board_row row[64];   /* VGL_BOARD_ROWS */
};

struct vgl_beacon_device {
    uint8_t uuid[16];            /* the device (all zero: an unused entry) */
    uint64_t busy_until_ns;      /* until when (the node's CLOCK_MONOTONIC) the work launched so far is
                                    expected to keep the device busy */
    uint64_t launches;
    /* Elastic memory: claims of the container's, which others believe only
     * as far as a lie costs the liar (docs/threat-model.md). */
    uint64_t used_bytes;         /* the container's memory in use on the device */
    uint64_t oldest_wait_ns;     /* when its oldest waiting allocation began to wait (the node's
                                    CLOCK_MONOTONIC); 0: none waits */
    uint32_t frees;              /* bumped whenever its memory on the device is freed, or a waiter
                                    of its ends: waiters of every container sleep on it (a futex) */
    uint32_t waiters;            /* its allocations waiting for memory on the device now */
};

struct vgl_beacon {
    char magic[8];               /* "VGLBEACN" (no NUL) */
    uint32_t version;            /* VGL_BOARD_VERSION */
    uint32_t pad;                /* its first byte is the one a suspended container's processes
                                    hold a shared lock on while they ask to be resumed
                                    (resume_ask.c); never written */
    struct vgl_beacon_device device[16];  /* VGL_MAX_DEVICES, by the container's device index */
};

/* board.c — the setters' side; 0 or a negative errno. */

/* Gives the container of the region file (`region_dev`, `region_ino`) a row
 * of `priority` in the board at `path` (made, mode 0644, if missing) held by
 * process `owner_pid` (0: none), and makes its beacon beside it (mode 0644,
 * owned by `beacon_uid` when it is not -1); a row the file held before (left
 * by no one) is freed.  *key and *row name the row.  -ENOSPC: every row is
 * held. */
int vgl_board_join(const char *path, uint32_t priority, int32_t owner_pid, int64_t beacon_uid,
                   uint64_t region_dev, uint64_t region_ino, uint64_t *key, uint32_t *row);
/* Sets the priority of the row of the region file: -ESRCH if it has none,
 * -ENOENT if its row takes no part in priorities. */
int vgl_board_set(const char *path, uint64_t region_dev, uint64_t region_ino, uint32_t priority);
/* Sets what the row of the region file is guaranteed (`guarantee`: by
 * index, VGL_MAX_DEVICES entries; `by_uuid`: VGL_MAX_DEVICES entries or
 * NULL) and its memory wait, and that it takes part in elastic memory:
 * -ESRCH if it has no row. */
int vgl_board_set_memory(const char *path, uint64_t region_dev, uint64_t region_ino,
                         const struct vgl_mem_limit *guarantee, const struct vgl_board_guarantee *by_uuid,
                         uint64_t memory_wait_ns);
/* The row of the region file in a board (a validated one, or one mapped
 * that setters may be writing), and its key: the row, or -ESRCH. */
int vgl_board_find(const struct vgl_board *board, uint64_t region_dev, uint64_t region_ino, uint64_t *key);
/* Marks the row of the region file suspended, or not: -ESRCH if it has none. */
int vgl_board_set_suspended(const char *path, uint64_t region_dev, uint64_t region_ino, uint32_t suspended);
/* Sets how long the container of the region file may be idle before the
 * node agent may suspend it (0: never): -ESRCH if it has no row. */
int vgl_board_set_suspend_idle(const char *path, uint64_t region_dev, uint64_t region_ino,
                               uint32_t suspend_idle_ms);
/* Frees the row and removes its beacon (nothing if the row has another key). */
int vgl_board_leave(const char *path, uint32_t row, uint64_t key);
/* The name of the beacon of the row of `key`.  Setters rewrite the board
 * with pwrite(2) under the mappings of every container's processes, so a
 * reader can see a row's new key beside the name its row had before; the
 * name that follows from the key is never torn from it. */
void vgl_beacon_name(uint64_t key, char name[64]);

/* waits.c — what a container's beacon says of its waits for memory, written
 * by its processes as they wait and repaired by its setter (`vgpulimit run`'s
 * supervisor, every second), derived from the container's live slots: a
 * process killed as it waited leaves nothing there once its slot is
 * reclaimed.  Repairs the beacon at `path` from `region`: 0, or -errno (not a
 * beacon, or it cannot be written). */
struct vgl_region;
int vgl_beacon_repair(const char *path, struct vgl_region *region);
/* Wakes every waiter that sleeps on the beacon at `path` (its `frees` word on
 * each device it names), as a free by its container does: a setter's, when
 * the container's memory leaves the GPU without its processes freeing it (a
 * suspend).  0, or -errno. */
int vgl_beacon_wake(const char *path);

/* Validates `size` bytes of a board or a beacon: 0, -EPROTO (not one),
 * -EPROTONOSUPPORT (another version), -EBADF (wrong size), -EBADMSG (a value
 * no setter writes). */
int vgl_board_check(const void *image, uint64_t size);
int vgl_beacon_check(const void *image, uint64_t size);

#endif

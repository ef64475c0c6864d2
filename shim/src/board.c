/* The node's priority board (vgpulimit/board.h), the setters' side: rows are
 * taken, changed and freed under an flock of the board file, which only
 * setters can open for writing; containers map it read-only (beacons.c).
 * A setter killed while it holds the flock loses it with its descriptor, so
 * nothing here can block the next one. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base.h"
#include "vgpulimit/board.h"
#include "vgpulimit/region.h"

static const char BOARD_MAGIC[8] = {'V', 'G', 'L', 'B', 'O', 'A', 'R', 'D'};
static const char BEACON_MAGIC[8] = {'V', 'G', 'L', 'B', 'E', 'A', 'C', 'N'};

_Static_assert(VGL_MAX_DEVICES == 16, "struct vgl_beacon holds 16 devices");

/* Both files begin with their magic and the layout's version, read up to
 * `header` bytes: -EPROTO for some other file, -EBADF for one cut short,
 * -EPROTONOSUPPORT for another version. */
_Static_assert(offsetof(struct vgl_board, version) == sizeof BOARD_MAGIC &&
               offsetof(struct vgl_beacon, version) == sizeof BEACON_MAGIC, "magic, then version");
static int check_start(const void *image, uint64_t size, const char magic[8], uint64_t header)
{
    if (size < 8 || memcmp(image, magic, 8) != 0)
        return -EPROTO;
    if (size < header)
        return -EBADF;
    uint32_t version;
    memcpy(&version, (const char *)image + 8, sizeof version);
    return version == VGL_BOARD_VERSION ? 0 : -EPROTONOSUPPORT;
}

static bool plausible(const struct vgl_mem_limit *l)
{
    return !(l->bytes && l->ppm) && l->bytes <= INT64_MAX && l->ppm <= 1000000;
}

int vgl_board_check(const void *image, uint64_t size)
{
    const struct vgl_board *b = image;
    int err = check_start(image, size, BOARD_MAGIC, offsetof(struct vgl_board, rows));
    if (err)
        return err;
    if (size != sizeof *b)
        return -EBADF;
    if (b->rows != VGL_BOARD_ROWS)
        return -EBADMSG;
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++) {
        const struct vgl_board_row *r = &b->row[i];
        if (!r->key)
            continue;
        /* A beacon's name is a plain file name: never a path out of the board's directory. */
        if (r->priority > VGL_PRIORITY_LOW || !memchr(r->beacon, '\0', sizeof r->beacon) || !r->beacon[0] ||
            strchr(r->beacon, '/') || r->beacon[0] == '.' || !r->region_ino ||
            (r->flags & ~(uint32_t)(VGL_ROW_PRIORITY | VGL_ROW_MEMORY | VGL_ROW_SUSPENDED)))
            return -EBADMSG;
        for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
            if (!plausible(&r->guarantee[d]) || !plausible(&r->guarantee_by_uuid[d].guarantee))
                return -EBADMSG;
    }
    return 0;
}

int vgl_beacon_check(const void *image, uint64_t size)
{
    int err = check_start(image, size, BEACON_MAGIC, offsetof(struct vgl_beacon, pad));
    return err ? err : size == sizeof(struct vgl_beacon) ? 0 : -EBADF;
}

/* Made now (or by a setter killed before it wrote one): a fresh board.
 * `fd`, or -EIO (closed). */
static int fresh_board(int fd, const struct stat *st)
{
    if (st->st_size != 0)
        return fd;
    struct vgl_board fresh = {.version = VGL_BOARD_VERSION, .rows = VGL_BOARD_ROWS};
    memcpy(fresh.magic, BOARD_MAGIC, sizeof BOARD_MAGIC);
    if (pwrite(fd, &fresh, sizeof fresh, 0) != (ssize_t)sizeof fresh) {
        close(fd);
        return -EIO;
    }
    return fd;
}

/* Opens the board at `path` for writing, locked, made if missing: a
 * descriptor, or a negative errno (-ESRCH: no board, so no row, where it
 * is not to be made).  The last row to leave removes the board
 * (vgl_board_leave): a file removed while this waited for its lock is left
 * for the one at `path` now. */
static int open_locked(const char *path, bool create)
{
    for (;;) {
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0644);
        if (fd < 0)
            return errno == ENOENT && !create ? -ESRCH : -errno;
        if (flock(fd, LOCK_EX) < 0) {
            int err = -errno;
            close(fd);
            return err;
        }
        struct stat st;
        if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
            close(fd);
            return -EPROTO;
        }
        if (st.st_nlink == 0) {
            close(fd);
            continue;
        }
        return fresh_board(fd, &st);
    }
}


static int read_board(int fd, struct vgl_board *b)
{
    ssize_t got = pread(fd, b, sizeof *b, 0);
    if (got < 0)
        return -errno;
    return vgl_board_check(b, (uint64_t)got);
}

static int write_board(int fd, struct vgl_board *b)
{
    b->generation++;
    return pwrite(fd, b, sizeof *b, 0) == (ssize_t)sizeof *b ? 0 : -EIO;
}

void vgl_beacon_name(uint64_t key, char name[VGL_BEACON_NAME_LEN])
{
    snprintf(name, VGL_BEACON_NAME_LEN, "beacon-%016llx", (unsigned long long)key);
}

/* The beacon's path: the board's directory and its name. */
static int beacon_path(const char *board, const char *name, char *out, size_t len)
{
    const char *slash = strrchr(board, '/');
    int dir = slash ? (int)(slash - board) : 0;
    int n = slash ? snprintf(out, len, "%.*s/%s", dir, board, name) : snprintf(out, len, "%s", name);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Not getrandom: board.o is linked into the shim, whose glibc floor (2.17)
 * is older than it. */
static int random_key(uint64_t *key)
{
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t got = read(fd, key, sizeof *key);
    close(fd);
    return got == (ssize_t)sizeof *key ? 0 : -EIO;
}

/* A row whose supervisor is gone: free, though it was not left. */
static bool abandoned(const struct vgl_board_row *r)
{
    return r->owner_pid > 0 && !vgl_proc_running(r->owner_pid, r->owner_start);
}

int vgl_board_find(const struct vgl_board *board, uint64_t region_dev, uint64_t region_ino, uint64_t *key)
{
    for (uint32_t i = 0; region_ino && i < VGL_BOARD_ROWS; i++) {
        const struct vgl_board_row *r = &board->row[i];
        uint64_t k = __atomic_load_n(&r->key, __ATOMIC_ACQUIRE);
        if (k && __atomic_load_n(&r->region_ino, __ATOMIC_RELAXED) == region_ino &&
            __atomic_load_n(&r->region_dev, __ATOMIC_RELAXED) == region_dev) {
            if (key)
                *key = k;
            return (int)i;
        }
    }
    return -ESRCH;
}

/* Frees row i and removes its beacon. */
static void free_row(const char *path, struct vgl_board *b, uint32_t i)
{
    char beacon[4096];
    if (beacon_path(path, b->row[i].beacon, beacon, sizeof beacon) == 0)
        unlink(beacon);
    memset(&b->row[i], 0, sizeof b->row[i]);
}

int vgl_board_join(const char *path, uint32_t priority, int32_t owner_pid, int64_t beacon_uid,
                   uint64_t region_dev, uint64_t region_ino, uint64_t *key, uint32_t *row)
{
    bool ranked = priority != VGL_BOARD_NO_PRIORITY;
    if ((ranked && priority > VGL_PRIORITY_LOW) || !region_ino)
        return -EINVAL;
    int fd = open_locked(path, true);
    if (fd < 0)
        return fd;
    struct vgl_board b;
    int err = read_board(fd, &b);
    /* A row of a file gone since (its inode now another's) that no one left:
     * one file, one row, or the shim could not tell which is its. */
    int held = err ? -ESRCH : vgl_board_find(&b, region_dev, region_ino, NULL);
    if (held >= 0)
        free_row(path, &b, (uint32_t)held);
    uint32_t i = 0;
    for (; !err && i < VGL_BOARD_ROWS; i++)
        if (!b.row[i].key || abandoned(&b.row[i]))
            break;
    if (!err && i == VGL_BOARD_ROWS)
        err = -ENOSPC;
    uint64_t k = 0;
    while (!err && !k)
        err = random_key(&k);
    char beacon[4096];
    struct vgl_board_row r = {.key = k, .priority = ranked ? priority : VGL_PRIORITY_NORMAL,
                              .owner_pid = owner_pid, .region_dev = region_dev, .region_ino = region_ino,
                              .flags = ranked ? VGL_ROW_PRIORITY : 0};
    if (!err) {
        if (b.row[i].key)
            free_row(path, &b, i);
        r.owner_start = owner_pid > 0 ? vgl_proc_start_time(owner_pid) : 0;
        vgl_beacon_name(k, r.beacon);
        err = beacon_path(path, r.beacon, beacon, sizeof beacon);
    }
    if (!err) {
        /* Written whole before the row names it: a reader never maps a short one. */
        struct vgl_beacon fresh = {.version = VGL_BOARD_VERSION};
        memcpy(fresh.magic, BEACON_MAGIC, sizeof BEACON_MAGIC);
        int bfd = open(beacon, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (bfd < 0)
            err = -errno;
        else if (write(bfd, &fresh, sizeof fresh) != (ssize_t)sizeof fresh ||
                 (beacon_uid >= 0 && fchown(bfd, (uid_t)beacon_uid, (gid_t)-1) < 0))
            err = errno ? -errno : -EIO;
        if (bfd >= 0)
            close(bfd);
        if (err)
            unlink(beacon);
    }
    if (!err) {
        b.row[i] = r;
        err = write_board(fd, &b);
    }
    close(fd);
    if (!err) {
        *key = k;
        *row = i;
    }
    return err;
}

/* The board at `path`, locked and read into *b, and the row of the region
 * file (`region_dev`, `region_ino`) in it, into *row: the locked descriptor,
 * or a negative errno (nothing left open). */
static int open_row(const char *path, uint64_t region_dev, uint64_t region_ino, struct vgl_board *b, int *row)
{
    int fd = open_locked(path, false);
    if (fd < 0)
        return fd;
    int err = read_board(fd, b);
    *row = err ? err : vgl_board_find(b, region_dev, region_ino, NULL);
    if (*row < 0) {
        close(fd);
        return *row;
    }
    return fd;
}

int vgl_board_set(const char *path, uint64_t region_dev, uint64_t region_ino, uint32_t priority)
{
    if (priority > VGL_PRIORITY_LOW || !region_ino)
        return -EINVAL;
    struct vgl_board b;
    int row;
    int fd = open_row(path, region_dev, region_ino, &b, &row);
    if (fd < 0)
        return fd;
    int err = -ENOENT;
    if (b.row[row].flags & VGL_ROW_PRIORITY) {
        b.row[row].priority = priority;
        err = write_board(fd, &b);
    }
    close(fd);
    return err;
}

int vgl_board_set_memory(const char *path, uint64_t region_dev, uint64_t region_ino,
                         const struct vgl_mem_limit *guarantee, const struct vgl_board_guarantee *by_uuid,
                         uint64_t memory_wait_ns)
{
    for (uint32_t d = 0; d < VGL_MAX_DEVICES; d++)
        if (!plausible(&guarantee[d]) || (by_uuid && !plausible(&by_uuid[d].guarantee)))
            return -EINVAL;
    struct vgl_board b;
    int row;
    int fd = open_row(path, region_dev, region_ino, &b, &row);
    if (fd < 0)
        return fd;
    struct vgl_board_row *r = &b.row[row];
    r->flags |= VGL_ROW_MEMORY;
    r->memory_wait_ns = memory_wait_ns;
    memcpy(r->guarantee, guarantee, sizeof r->guarantee);
    if (by_uuid)
        memcpy(r->guarantee_by_uuid, by_uuid, sizeof r->guarantee_by_uuid);
    else
        memset(r->guarantee_by_uuid, 0, sizeof r->guarantee_by_uuid);
    int err = write_board(fd, &b);
    close(fd);
    return err;
}

int vgl_board_set_suspended(const char *path, uint64_t region_dev, uint64_t region_ino, uint32_t suspended)
{
    struct vgl_board b;
    int row;
    int fd = open_row(path, region_dev, region_ino, &b, &row);
    if (fd < 0)
        return fd;
    if (suspended)
        b.row[row].flags |= VGL_ROW_SUSPENDED;
    else
        b.row[row].flags &= ~(uint32_t)VGL_ROW_SUSPENDED;
    int err = write_board(fd, &b);
    close(fd);
    return err;
}

int vgl_board_set_suspend_idle(const char *path, uint64_t region_dev, uint64_t region_ino,
                               uint32_t suspend_idle_ms)
{
    struct vgl_board b;
    int row;
    int fd = open_row(path, region_dev, region_ino, &b, &row);
    if (fd < 0)
        return fd;
    b.row[row].suspend_idle_ms = suspend_idle_ms;
    int err = write_board(fd, &b);
    close(fd);
    return err;
}

int vgl_board_leave(const char *path, uint32_t row, uint64_t key)
{
    if (row >= VGL_BOARD_ROWS || !key)
        return -EINVAL;
    int fd = open_locked(path, false);
    if (fd < 0)
        return fd;
    struct vgl_board b;
    int err = read_board(fd, &b);
    if (!err && b.row[row].key == key) {
        free_row(path, &b, row);
        bool held = false;
        for (uint32_t i = 0; i < VGL_BOARD_ROWS && !held; i++)
            held = b.row[i].key && !abandoned(&b.row[i]);
        /* The last leaves nothing behind (the beacons of rows abandoned
         * included); a setter waiting for the lock opens anew. */
        for (uint32_t i = 0; i < VGL_BOARD_ROWS && !held; i++)
            if (b.row[i].key)
                free_row(path, &b, i);
        err = held ? write_board(fd, &b) : unlink(path) == 0 ? 0 : -errno;
    }
    close(fd);
    return err;
}

/* The node's board and the containers' beacons (vgpulimit/board.h), the
 * containers' side: what priorities (priority.c) and elastic memory
 * (elastic.c) read and write, looked at once per process.  board.c is the
 * setters' side.
 *
 * The board is mapped read-only; the container's row in it is found by its
 * region file (the one the hook mounted, or the one its supervisor made),
 * never by what its region or environment say, which the tenant may write.
 * The container's own beacon is mapped for writing, guarded as the region is
 * (region_guard.c), and open for reading besides: its waits' bytes are
 * locked through that descriptor (waits.c).
 *
 * Other containers' beacons are each their tenant's file: one truncated
 * under a mapping would kill its readers with SIGBUS, and one replaced by a
 * FIFO would block them.  So they are opened without blocking, taken only
 * if they are regular files of a beacon's size, and read with pread, never
 * through a mapping.  A waiter for memory needs an address for the kernel's
 * futex on another's wake word: only then is that beacon mapped, read-only,
 * and the mapping is handed to the kernel alone, which answers a truncated
 * file with an error, not a signal. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "vgpulimit/paths.h"

struct other {
    uint64_t key;                  /* the row's, when `fd` was opened */
    int fd;                        /* its beacon, read-only; -1: none (or not a beacon) */
    const struct vgl_beacon *map;  /* the same, mapped for futex addresses only; NULL: not (yet) */
};

static struct {
    pthread_mutex_t lock;
    bool looked;                   /* `place` is known */
    enum vgl_board_place place;
    char path[VGL_PARENT_LEN];     /* the board's */
    char dir[VGL_PARENT_LEN];      /* its directory, where the beacons are */
    uint32_t link;                 /* the process's link whose region the row is for */
    const struct vgl_board *board;
    uint64_t region_dev, region_ino;
    uint32_t row;                  /* where the container's row was last seen (atomic) */
    uint64_t key;                  /* the row's when found: its beacon's name */
    bool own_looked;               /* `own` is known */
    struct vgl_beacon *own;
    int own_fd;                    /* the same, open for reading; -1: none */
    const char *own_why;           /* why `own` is NULL */
    char own_path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
    struct other others[VGL_BOARD_ROWS];
} node = {.lock = PTHREAD_MUTEX_INITIALIZER, .own_fd = -1};

/* The mappings stay valid in the child.  Its own descriptor of the beacon
 * holds none of the parent's locks, which die with the parent. */
static void forget_in_child(void)
{
    pthread_mutex_init(&node.lock, NULL);
    if (node.own_fd >= 0) {
        int fresh = vgl_reopen(node.own_fd, O_RDONLY);
        close(node.own_fd);
        node.own_fd = fresh;
    }
}
VGL_AFTER_FORK(forget_in_child)

void *vgl_map_file(const char *path, size_t size, bool writable)
{
    int fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *map = MAP_FAILED;
    int err = EBADF;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == size) {
        map = mmap(NULL, size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
        err = errno;
    }
    close(fd);
    errno = err;
    return map == MAP_FAILED ? NULL : map;
}

/* The path of the beacon of the row keyed `key` in the board's directory. */
static void beacon_path(uint64_t key, char *out, size_t len)
{
    char name[VGL_BEACON_NAME_LEN];
    vgl_beacon_name(key, name);
    snprintf(out, len, "%s/%.*s", node.dir, VGL_BEACON_NAME_LEN - 1, name);
}

/* Where the container's board is, and the region file its row names, into
 * `board` and *region, and which of the process's links that region is
 * (*link): in a container of the hook, where the hook mounted them, which no
 * tenant can change; elsewhere the outermost region that names a board (a
 * nested run's own region names none).  False: none. */
static bool locate(char board[VGL_PARENT_LEN], struct stat *region, uint32_t *link)
{
    *link = vgl_links() - 1; /* the hook's region is the outermost */
    char path[sizeof vgl_config.region_path], named[sizeof vgl_config.region_path] = "";
    if (vgl_config.authoritative) {
        if (access(VGL_CONTAINER_BOARD, F_OK) != 0)
            return false; /* the hook gave no row */
        snprintf(board, VGL_PARENT_LEN, "%s", VGL_CONTAINER_BOARD);
        snprintf(named, sizeof named, "%s", VGL_CONTAINER_REGION);
    } else {
        board[0] = '\0';
        memcpy(path, vgl_config.region_path, sizeof path);
        for (uint32_t i = 0; i < vgl_links(); i++) {
            /* Copies: the header is in a mapping every process of the container may write. */
            const struct vgl_region *r = vgl_link_at(i).region;
            if (__atomic_load_n(&r->board[0], __ATOMIC_RELAXED)) {
                memcpy(board, r->board, VGL_PARENT_LEN);
                board[VGL_PARENT_LEN - 1] = '\0';
                memcpy(named, path, sizeof named);
                *link = i;
            }
            memcpy(path, r->parent, VGL_PARENT_LEN);
            path[VGL_PARENT_LEN - 1] = '\0';
        }
        if (!board[0])
            return false;
    }
    if (stat(named, region) != 0) {
        vgl_log(VGL_LOG_WARN, "the container's region %s cannot be looked at (%s); it takes no part in "
                "priorities or elastic memory", named, strerror(errno));
        return false;
    }
    return true;
}

/* The container's own beacon, mapped for writing and guarded; else NULL and
 * why in node.own_why.  Under node.lock. */
static void map_own_beacon(uint64_t key)
{
    beacon_path(key, node.own_path, sizeof node.own_path);
    struct vgl_beacon *map = vgl_map_file(node.own_path, sizeof *map, true);
    const char *why = map ? NULL : errno == EBADF ? "it is not a file of a beacon's size" : strerror(errno);
    if (map && vgl_beacon_check(map, sizeof *map) != 0)
        why = "it is not a beacon";
    else if (map && vgl_guard_mapping(map, sizeof *map) != 0)
        why = "too many files are mapped to guard one more";
    if (!why) {
        node.own = map;
        node.own_fd = open(node.own_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        return;
    }
    if (map)
        munmap(map, sizeof *map);
    node.own_why = why;
}

static enum vgl_board_place look(void)
{
    struct stat region;
    if (!locate(node.path, &region, &node.link))
        return VGL_PLACE_NONE;
    char *slash = strrchr(node.path, '/');
    if (node.path[0] != '/' || !slash)
        return VGL_PLACE_BAD_PATH;
    snprintf(node.dir, sizeof node.dir, "%.*s", (int)(slash - node.path), node.path);
    const struct vgl_board *board = vgl_map_file(node.path, sizeof *board, false);
    if (!board || vgl_board_check(board, sizeof *board) != 0) {
        if (board)
            munmap((void *)board, sizeof *board);
        return VGL_PLACE_UNREADABLE;
    }
    node.region_dev = (uint64_t)region.st_dev;
    node.region_ino = (uint64_t)region.st_ino;
    int row = vgl_board_find(board, node.region_dev, node.region_ino, NULL);
    if (row < 0) {
        munmap((void *)board, sizeof *board);
        return VGL_PLACE_NO_ROW;
    }
    node.row = (uint32_t)row;
    for (uint32_t i = 0; i < VGL_BOARD_ROWS; i++)
        node.others[i].fd = -1;
    node.key = __atomic_load_n(&board->row[row].key, __ATOMIC_ACQUIRE);
    node.board = board;
    return VGL_PLACE_ROW;
}

enum vgl_board_place vgl_board_place(void)
{
    pthread_mutex_lock(&node.lock);
    if (!node.looked && vgl_self.region) {
        node.place = look();
        node.looked = true;
    }
    enum vgl_board_place place = node.looked ? node.place : VGL_PLACE_NONE;
    pthread_mutex_unlock(&node.lock);
    return place;
}

const char *vgl_board_path(void) { return node.path; }

uint32_t vgl_board_link(void) { return node.link; }

const struct vgl_board *vgl_board_mapped(void) { return node.board; }

const struct vgl_board_row *vgl_board_own_row(uint32_t *index)
{
    uint32_t at = __atomic_load_n(&node.row, __ATOMIC_RELAXED);
    const struct vgl_board_row *r = &node.board->row[at];
    if (index)
        *index = at;
    if (__atomic_load_n(&r->region_ino, __ATOMIC_RELAXED) == node.region_ino &&
        __atomic_load_n(&r->region_dev, __ATOMIC_RELAXED) == node.region_dev)
        return r;
    int row = vgl_board_find(node.board, node.region_dev, node.region_ino, NULL);
    if (row < 0)
        return NULL;
    __atomic_store_n(&node.row, (uint32_t)row, __ATOMIC_RELAXED);
    if (index)
        *index = (uint32_t)row;
    return &node.board->row[row];
}

struct vgl_beacon *vgl_beacon_own(const char **path, const char **why)
{
    /* Mapped when first asked for: a row that neither feature takes part in costs no mapping. */
    pthread_mutex_lock(&node.lock);
    if (!node.own_looked) {
        map_own_beacon(node.key);
        node.own_looked = true;
    }
    pthread_mutex_unlock(&node.lock);
    *path = node.own_path;
    *why = node.own_why;
    return node.own;
}

int vgl_beacon_own_fd(void) { return node.own_fd; }

/* Row i's beacon, opened anew when the row changed hands.  Under node.lock. */
static struct other *other_at(uint32_t i, uint64_t key)
{
    struct other *o = &node.others[i];
    if (o->key == key)
        return o;
    if (o->fd >= 0)
        close(o->fd);
    if (o->map)
        munmap((void *)o->map, sizeof *o->map);
    o->map = NULL;
    char path[VGL_PARENT_LEN + VGL_BEACON_NAME_LEN + 2];
    beacon_path(key, path, sizeof path);
    o->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st;
    if (o->fd >= 0 && (fstat(o->fd, &st) != 0 || !S_ISREG(st.st_mode) ||
                       (uint64_t)st.st_size != sizeof(struct vgl_beacon))) {
        close(o->fd);
        o->fd = -1;
    }
    o->key = key;
    return o;
}

bool vgl_beacon_read(uint32_t row, uint64_t key, struct vgl_beacon *out)
{
    pthread_mutex_lock(&node.lock);
    const struct other *o = other_at(row, key);
    bool read = o->fd >= 0 && pread(o->fd, out, sizeof *out, 0) == (ssize_t)sizeof *out &&
                vgl_beacon_check(out, sizeof *out) == 0;
    pthread_mutex_unlock(&node.lock);
    return read;
}

const uint32_t *vgl_beacon_frees_word(uint32_t row, uint64_t key, uint32_t device)
{
    pthread_mutex_lock(&node.lock);
    struct other *o = other_at(row, key);
    if (o->fd >= 0 && !o->map) {
        void *map = mmap(NULL, sizeof *o->map, PROT_READ, MAP_SHARED, o->fd, 0);
        o->map = map == MAP_FAILED ? NULL : map;
    }
    const uint32_t *word = o->map ? &o->map->device[device].frees : NULL;
    pthread_mutex_unlock(&node.lock);
    return word;
}

int vgl_beacon_waits_held(uint32_t row, uint64_t key, uint32_t device)
{
    pthread_mutex_lock(&node.lock);
    const struct other *o = other_at(row, key);
    int held = o->fd >= 0 ? vgl_waits_held(o->fd, device) : 0;
    pthread_mutex_unlock(&node.lock);
    return held;
}

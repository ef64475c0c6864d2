/* The region file (region.c, slot_owner.c): made, opened and refused;
 * a process told by its start time; a slot attached again after exec; a
 * lock made unusable.  Built with AddressSanitizer and UBSan by
 * tests/test_core.py.  Prints "N passed, N failed". */
#include "core_fixture.h"

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}

static void test_region_files(const char *dir)
{
    char path[512];
    struct vgl_mem_limit limits[VGL_MAX_DEVICES] = {{.bytes = GIB}};
    snprintf(path, sizeof path, "%s/region", dir);
    CHECK(vgl_region_create(path, limits, NULL, 0, NULL) == 0, "create");
    CHECK(vgl_region_create(path, limits, NULL, 0, NULL) == -EEXIST, "second create");
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600, "mode %o", st.st_mode & 0777);
    struct vgl_region *region = NULL;
    CHECK(vgl_region_open(path, &region) == 0, "open");
    CHECK(region && region->devices[0].limit.bytes == GIB && region->devices[1].limit.bytes == 0,
          "limits written");
    vgl_region_close(region);

    snprintf(path, sizeof path, "%s/shared", dir);
    CHECK(vgl_region_create(path, NULL, NULL, 1, NULL) == 0, "create group-shared");
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0660, "mode %o", st.st_mode & 0777);

    snprintf(path, sizeof path, "%s/foreign", dir);
    write_file(path, "#!/bin/sh\necho not a region\n", 28);
    CHECK(vgl_region_open(path, &region) == -EPROTO, "foreign file");

    snprintf(path, sizeof path, "%s/truncated", dir);
    struct vgl_region *model = calloc(1, sizeof *model);
    memcpy(model->magic, "VGPULIM", 8);
    model->version = VGL_REGION_VERSION;
    write_file(path, model, 4096);
    CHECK(vgl_region_open(path, &region) == -EBADF, "truncated");

    snprintf(path, sizeof path, "%s/future", dir);
    model->version = VGL_REGION_VERSION + 1;
    write_file(path, model, sizeof *model);
    CHECK(vgl_region_open(path, &region) == -EPROTONOSUPPORT, "other version");
    free(model);

    snprintf(path, sizeof path, "%s/open-to-all", dir);
    CHECK(vgl_region_create(path, NULL, NULL, 0, NULL) == 0 && chmod(path, 0666) == 0, "chmod");
    CHECK(vgl_region_open(path, &region) == -EPERM, "a world-writable region is refused");

    snprintf(path, sizeof path, "%s/absent", dir);
    CHECK(vgl_region_open(path, &region) == -ENOENT, "absent");
}

/* A process's start time identifies it across pid reuse, so it must not move
 * while the process lives (a neighbouring field, vsize, does). */
static void test_start_time(void)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')') + 2; /* field 3 */
    for (int field = 3; field < 22; field++)
        p = strchr(p, ' ') + 1;
    uint64_t expected = strtoull(p, NULL, 10);
    uint64_t before = vgl_proc_start_time(getpid());
    void *big = mmap(NULL, GIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uint64_t after = vgl_proc_start_time(getpid());
    munmap(big, GIB);
    CHECK(before == expected && after == expected, "start time %llu, then %llu; /proc says %llu",
          (unsigned long long)before, (unsigned long long)after, (unsigned long long)expected);
}

/* A process that attaches again with the same pid and start time has
 * exec'd: the driver dropped the old image's memory, so its bytes go back,
 * even from the middle of a change (a thread that exec ended there), and
 * the process has one slot. */
static void test_exec_attaches_again(struct vgl_region *region)
{
    enum { DEV = 5 };
    struct vgl_slot *before, *after;
    CHECK(vgl_region_attach(region, getpid(), 0, &before) == 0, "attach");
    CHECK(vgl_region_reserve(region, before, DEV, 256 * MIB, GIB) == 0, "reserve");
    __atomic_add_fetch(&before->busy, 1, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&region->devices[DEV].used_bytes, 64 * MIB, __ATOMIC_RELAXED);
    CHECK(vgl_region_attach(region, getpid(), 0, &after) == 0, "attach after exec");
    CHECK(region->devices[DEV].used_bytes == 0, "used %llu", (unsigned long long)region->devices[DEV].used_bytes);
    int mine = 0;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
        mine += region->slots[i].state != VGL_SLOT_FREE && region->slots[i].pid == getpid();
    CHECK(mine == 1, "%d slots of this process", mine);
    vgl_region_detach(region, after);
}

/* A region lock made unusable (its bytes are in every tenant's hands): no
 * call that needs it changes what it guards as if it held it. */
static void test_broken_lock(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/broken", dir);
    struct vgl_region *region;
    CHECK(vgl_region_create(path, NULL, NULL, 0, NULL) == 0 && vgl_region_open(path, &region) == 0,
          "cannot make %s", path);
    pthread_mutex_t *mutex = (pthread_mutex_t *)(void *)region->lock.opaque;
    pid_t child = fork_child();
    if (child == 0) {
        pthread_mutex_lock(mutex);
        raise(SIGKILL);
    }
    waitpid(child, NULL, 0);
    /* Unlocked without being made consistent: unrecoverable for good. */
    CHECK(pthread_mutex_lock(mutex) == EOWNERDEAD, "the holder died");
    pthread_mutex_unlock(mutex);
    struct vgl_slot *slot = NULL;
    CHECK(vgl_region_attach(region, getpid(), 0, &slot) == -ENOTRECOVERABLE, "attach refused");
    CHECK(slot == NULL, "no slot claimed");
    struct vgl_mem_limit limit = {.bytes = GIB};
    uint64_t generation = region->generation;
    CHECK(vgl_region_set_limits(region, 0, &limit, 50) == -ENOTRECOVERABLE, "limits refused");
    CHECK(region->devices[0].limit.bytes == 0 && region->generation == generation, "nothing changed");
    CHECK(vgl_region_reclaim(region) == -ENOTRECOVERABLE, "nothing reclaimed, and said why");
    vgl_region_close(region);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: region_test SCRATCH_DIR [start_time|region_files|broken_lock|exec_again]...\n");
        return 2;
    }
    vgl_log_level = VGL_LOG_ERROR;
    if (wanted(argc, argv, "start_time"))
        test_start_time();
    if (wanted(argc, argv, "region_files"))
        test_region_files(argv[1]);
    if (wanted(argc, argv, "broken_lock"))
        test_broken_lock(argv[1]);
    char path[512];
    struct vgl_region *region = scratch_region(argv[1], "attach", path, sizeof path);
    if (region) {
        if (wanted(argc, argv, "exec_again"))
            test_exec_attaches_again(region);
        vgl_region_close(region);
    } else {
        CHECK(0, "cannot make %s", path);
    }
    return check_summary();
}

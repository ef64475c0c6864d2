/* The shim's core (limit parser, region file, ledger) on its own, built with
 * AddressSanitizer and UBSan by tests/test_core.py.  Prints "N passed, N failed". */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "internal.h"

/* fork() for a test child that must not outlive the test, whatever happens
 * to the test (a timeout kills only the parent). */
static pid_t fork_child(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0 && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent))
        _exit(9);
    return pid;
}

#define GIB (1ULL << 30)
#define MIB (1ULL << 20)

static void test_parser(void)
{
    static const struct {
        const char *text;
        int err;
        uint64_t bytes;
        uint32_t ppm;
    } cases[] = {
        {"1073741824", 0, GIB, 0},  {"1GiB", 0, GIB, 0},      {"1Gi", 0, GIB, 0},
        {"1g", 0, GIB, 0},          {"1gb", 0, GIB, 0},       {"3000m", 0, 3000 * MIB, 0},
        {"3000Mi", 0, 3000 * MIB, 0}, {"1G", 0, 1000000000ULL, 0}, {"1GB", 0, 1000000000ULL, 0},
        {"1.5g", 0, GIB + GIB / 2, 0}, {" 2GiB ", 0, 2 * GIB, 0}, {"512B", 0, 512, 0},
        {"50%", 0, 0, 500000},      {"12.5%", 0, 0, 125000},  {"0.2", 0, 0, 200000},
        {"1.0", 0, 0, 1000000},     {"100%", 0, 0, 1000000},
        {"lots", -EINVAL, 0, 0},    {"8GBs", -EINVAL, 0, 0},  {"", -EINVAL, 0, 0},
        {"1.5", -ERANGE, 0, 0},     {"0", -ERANGE, 0, 0},     {"0%", -ERANGE, 0, 0},
        {"101%", -ERANGE, 0, 0},    {"-1G", -EINVAL, 0, 0},   {"1.5B", -EINVAL, 0, 0},
        {"99999999999999999999", -ERANGE, 0, 0}, {"20000000Ti", -ERANGE, 0, 0},
        {"1 GiB", -EINVAL, 0, 0},   {"1gi", -EINVAL, 0, 0},   {".", -EINVAL, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct vgl_mem_limit limit = {0};
        int err = vgl_parse_memory(cases[i].text, &limit);
        CHECK(err == cases[i].err, "\"%s\": error %d, expected %d", cases[i].text, err, cases[i].err);
        if (!err && !cases[i].err)
            CHECK(limit.bytes == cases[i].bytes && limit.ppm == cases[i].ppm,
                  "\"%s\": %llu bytes %u ppm", cases[i].text, (unsigned long long)limit.bytes, limit.ppm);
    }
    uint32_t pct = 0;
    CHECK(vgl_parse_cores("30", &pct) == 0 && pct == 30, "30");
    CHECK(vgl_parse_cores("30%", &pct) == 0 && pct == 30, "30%%");
    CHECK(vgl_parse_cores("0", &pct) == -ERANGE, "0");
    CHECK(vgl_parse_cores("101", &pct) == -ERANGE, "101");
    CHECK(vgl_parse_cores("1000", &pct) == -ERANGE, "1000");
    CHECK(vgl_parse_cores("3o", &pct) == -EINVAL, "3o");

    struct vgl_mem_limit half = {.ppm = 500000}, big = {.bytes = 64 * GIB}, none = {0};
    CHECK(vgl_cap_bytes(&half, 16 * GIB) == 8 * GIB, "50%% of 16 GiB");
    CHECK(vgl_cap_bytes(&big, 16 * GIB) == 16 * GIB, "a cap above the device");
    CHECK(vgl_cap_bytes(&none, 16 * GIB) == UINT64_MAX, "no cap");
}

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

/* 8 processes x 200 rounds of random sizes against a 1 GiB cap: the device
 * total never passes the cap and returns to zero. */
static void test_racing_processes(struct vgl_region *region)
{
    enum { PROCS = 8, ROUNDS = 200 };
    const uint64_t cap = GIB;
    for (int p = 0; p < PROCS; p++) {
        if (fork_child() != 0)
            continue;
        struct vgl_slot *slot;
        if (vgl_region_attach(region, getpid(), 0, &slot) != 0)
            _exit(3);
        srand((unsigned)getpid());
        uint64_t held[ROUNDS];
        int n = 0;
        for (int r = 0; r < ROUNDS; r++) {
            uint64_t bytes = (uint64_t)(rand() % 256 + 1) * MIB;
            if (vgl_ledger_reserve(region, slot, 0, bytes, cap) == 0)
                held[n++] = bytes;
            if (__atomic_load_n(&region->devices[0].used_bytes, __ATOMIC_RELAXED) > cap)
                _exit(4);
            if (n > 0 && rand() % 2)
                vgl_ledger_release(region, slot, 0, held[--n]);
        }
        while (n > 0)
            vgl_ledger_release(region, slot, 0, held[--n]);
        vgl_region_detach(region, slot);
        _exit(0);
    }
    int worst = 0, status;
    while (wait(&status) > 0)
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            worst = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    CHECK(worst == 0, "a racer failed: %d (4 = over the cap)", worst);
    CHECK(region->devices[0].used_bytes == 0, "left %llu", (unsigned long long)region->devices[0].used_bytes);
}

/* A process that dies holding bytes, or holding the ledger lock, blocks nobody. */
static void test_dead_holders(struct vgl_region *region)
{
    pid_t child = fork_child();
    if (child == 0) {
        struct vgl_slot *slot;
        vgl_region_attach(region, getpid(), 0, &slot);
        vgl_ledger_reserve(region, slot, 1, 768 * MIB, GIB);
        _exit(0); /* never released */
    }
    waitpid(child, NULL, 0);
    CHECK(region->devices[1].used_bytes == 768 * MIB, "the dead child's bytes are counted");
    struct vgl_slot *self;
    CHECK(vgl_region_attach(region, getpid(), 0, &self) == 0, "attach");
    /* Short of room, the ledger takes back what the dead held. */
    CHECK(vgl_ledger_reserve(region, self, 1, 512 * MIB, GIB) == 0, "reserve after a death");
    CHECK(region->devices[1].used_bytes == 512 * MIB, "used %llu", (unsigned long long)region->devices[1].used_bytes);
    CHECK(region->devices[1].oom_refusals == 0, "no refusal counted");

    child = fork_child();
    if (child == 0) {
        vgl_lock_acquire(&region->devices[1].lock);
        raise(SIGKILL); /* dies holding the lock */
    }
    waitpid(child, NULL, 0);
    CHECK(vgl_ledger_reserve(region, self, 1, 512 * MIB, GIB) == 0, "reserve after a lock holder died");
    CHECK(vgl_ledger_reserve(region, self, 1, 1, GIB) == -ENOMEM, "the cap holds");
    CHECK(region->devices[1].oom_refusals == 1, "the refusal is counted");
    vgl_region_detach(region, self);
    CHECK(region->devices[1].used_bytes == 0, "detach returns everything");
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t live_sum(const struct vgl_region *region, uint32_t device)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < VGL_MAX_SLOTS; i++)
        if (region->slots[i].state == VGL_SLOT_LIVE)
            sum += region->slots[i].used_bytes[device];
    return sum;
}

/* A holder killed with SIGKILL at random moments (mid-reservation, mid-release,
 * holding the ledger lock) 100 times while a survivor keeps allocating: the
 * survivor never stalls, the next allocation that needs the dead holder's bytes
 * gets them, and the ledger stays the sum of the live slots.  The bound here is
 * loose (a test is no stopwatch); benchmarks/kill_recovery.py prints the times. */
static void test_kill_storm(struct vgl_region *region)
{
    enum { KILLS = 100, DEV = 2 };
    const uint64_t cap = GIB, survivor_share = 64 * MIB;
    int pipe_fd[2];
    if (pipe(pipe_fd) != 0)
        return;
    uint64_t *survivor_worst = mmap(NULL, sizeof *survivor_worst, PROT_READ | PROT_WRITE,
                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t survivor = fork_child();
    if (survivor == 0) {
        struct vgl_slot *slot;
        vgl_region_attach(region, getpid(), 0, &slot);
        uint64_t worst = 0;
        char stop;
        close(pipe_fd[1]);
        fcntl(pipe_fd[0], F_SETFL, O_NONBLOCK);
        while (read(pipe_fd[0], &stop, 1) != 1) {
            uint64_t t0 = now_ns();
            if (vgl_ledger_reserve(region, slot, DEV, survivor_share, cap) == 0)
                vgl_ledger_release(region, slot, DEV, survivor_share);
            uint64_t took = now_ns() - t0;
            worst = took > worst ? took : worst;
        }
        vgl_region_detach(region, slot);
        *survivor_worst = worst;
        _exit(0);
    }
    close(pipe_fd[0]);
    struct vgl_slot *self;
    vgl_region_attach(region, getpid(), 0, &self);
    uint64_t worst_wait = 0;
    bool consistent = true, got_all = true;
    srand(12345);
    for (int k = 0; k < KILLS; k++) {
        pid_t victim = fork_child();
        if (victim == 0) {
            struct vgl_slot *slot;
            vgl_region_attach(region, getpid(), 0, &slot);
            uint64_t held[64];
            int n = 0;
            for (;;) {
                uint64_t bytes = (uint64_t)(rand() % 64 + 1) * MIB;
                if (n < 64 && vgl_ledger_reserve(region, slot, DEV, bytes, cap - survivor_share) == 0)
                    held[n++] = bytes;
                else if (n > 0)
                    vgl_ledger_release(region, slot, DEV, held[--n]);
            }
        }
        usleep((useconds_t)(rand() % 3000));
        kill(victim, SIGKILL);
        /* Not reaped yet: the dead holder is a zombie, as it is until its parent waits. */
        uint64_t t0 = now_ns(), waited;
        bool ok;
        while (!(ok = vgl_ledger_reserve(region, self, DEV, cap - survivor_share, cap) == 0) &&
               now_ns() - t0 < 2000000000u)
            ;
        waited = now_ns() - t0;
        worst_wait = waited > worst_wait ? waited : worst_wait;
        got_all = got_all && ok;
        if (ok)
            vgl_ledger_release(region, self, DEV, cap - survivor_share);
        waitpid(victim, NULL, 0);
        /* Compared under the ledger's lock: the survivor is mid-change otherwise. */
        if (vgl_lock_acquire(&region->devices[DEV].lock)) {
            vgl_ledger_repair(region, DEV);
            vgl_lock_consistent(&region->devices[DEV].lock);
        }
        consistent = consistent && region->devices[DEV].used_bytes == live_sum(region, DEV);
        vgl_lock_release(&region->devices[DEV].lock);
    }
    (void)write(pipe_fd[1], "x", 1);
    int status;
    waitpid(survivor, &status, 0);
    close(pipe_fd[1]);
    vgl_region_detach(region, self);
    printf("kill storm: %d kills, longest wait for a dead holder's bytes %.1f us, "
           "longest call of a survivor %.1f us\n", KILLS, (double)worst_wait / 1000.0,
           (double)*survivor_worst / 1000.0);
    CHECK(*survivor_worst < 1000000000u, "a survivor's call took %.1f ms", (double)*survivor_worst / 1e6);
    munmap(survivor_worst, sizeof *survivor_worst);
    CHECK(got_all, "an allocation never got a dead holder's bytes");
    CHECK(worst_wait < 1000000000u, "waited %.1f ms", (double)worst_wait / 1e6);
    CHECK(consistent, "the ledger drifted from the sum of the live slots");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the survivor died");
}

/* core_test SCRATCH_DIR [TEST...]: every test, or those named.  Under
 * qemu-user (tests/test_platforms.py) a dead process's robust mutex is never
 * handed on, so the tests of dead holders are left out there. */
static bool wanted(int argc, char **argv, const char *test)
{
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], test) == 0)
            return true;
    return argc == 2;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: core_test SCRATCH_DIR [parser|start_time|region_files|racing|"
                        "dead_holders|kill_storm]...\n");
        return 2;
    }
    vgl_log_level = VGL_LOG_ERROR;
    if (wanted(argc, argv, "parser"))
        test_parser();
    if (wanted(argc, argv, "start_time"))
        test_start_time();
    if (wanted(argc, argv, "region_files"))
        test_region_files(argv[1]);
    char path[512];
    snprintf(path, sizeof path, "%s/race", argv[1]);
    struct vgl_region *region = NULL;
    if (vgl_region_create(path, NULL, NULL, 0, NULL) == 0 && vgl_region_open(path, &region) == 0) {
        if (wanted(argc, argv, "racing"))
            test_racing_processes(region);
        if (wanted(argc, argv, "dead_holders"))
            test_dead_holders(region);
        if (wanted(argc, argv, "kill_storm"))
            test_kill_storm(region);
        vgl_region_close(region);
    } else {
        CHECK(0, "cannot make %s", path);
    }
    return check_summary();
}

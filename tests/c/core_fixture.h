/* What the C tests of the shim's core share (limits_test.c, region_test.c,
 * ledger_test.c, board_test.c): their includes, sizes, a child that dies
 * with the test, the choice of tests by name, and a region to work in.
 * Each test program is one translation unit with check.h's counters. */
#ifndef VGPULIMIT_TEST_CORE_FIXTURE_H
#define VGPULIMIT_TEST_CORE_FIXTURE_H

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
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

#define GIB (1ULL << 30)
#define MIB (1ULL << 20)

/* fork() for a test child that must not outlive the test, whatever happens
 * to the test (a timeout kills only the parent). */
static inline pid_t fork_child(void)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0 && (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent))
        _exit(9);
    return pid;
}

/* PROGRAM SCRATCH_DIR [TEST...]: every test, or those named.  Under
 * qemu-user (tests/test_platforms.py) a dead process's robust mutex is never
 * handed on, so the tests of dead holders (ledger_test's dead_holders,
 * kill_storm, and death_mid_change's dead reclaimer and recounter) are left
 * out there. */
static inline bool wanted(int argc, char **argv, const char *test)
{
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], test) == 0)
            return true;
    return argc == 2;
}

/* A fresh region file DIR/NAME, mapped; NULL when it cannot be made. */
static inline struct vgl_region *scratch_region(const char *dir, const char *name, char *path, size_t len)
{
    struct vgl_region *region = NULL;
    snprintf(path, len, "%s/%s", dir, name);
    if (vgl_region_create(path, NULL, NULL, 0, NULL) != 0 || vgl_region_open(path, &region) != 0)
        return NULL;
    return region;
}

#endif

/* What simgpu offers to measure and test the layers above it.
 *
 * Counting the driver calls a process makes, for benchmarks that report what a
 * layer above the driver adds per launch: with SIMGPU_CALLS=FILE, each process
 * appends one JSON line to FILE at exit,
 *
 *   {"pid": 123, "calls": 4711, "by_name": {"cuLaunchKernel": 1000, ...}}
 *
 * A call counts when it comes from outside libcuda.so.1: the driver's own
 * calls between its entry points (cuCtxCreate into cuCtxCreate_v2) are not the
 * caller's.  Entry points are never inlined into one another (SIM_EXPORT) and
 * never tail-called (-fno-optimize-sibling-calls, meson.build), so each
 * external call sees its caller's return address.
 *
 * Failing on request: SIMGPU_FAIL names entry points that fail, to test how a
 * caller takes a driver that refuses a call. */
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver.h"

enum { SIM_CALL_NAMES = 512 };

bool sim_counting;

static struct {
    uintptr_t text_lo, text_hi;     /* this library's mapped segments */
    uint64_t total;
    struct {
        const char *name;           /* an entry point's __func__: one address per name */
        uint64_t count;
    } names[SIM_CALL_NAMES];
} sim_calls;

static int sim_find_self(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t self = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (self < lo || self >= hi)
            continue;
        sim_calls.text_lo = lo;
        sim_calls.text_hi = hi;
        return 1;
    }
    return 0;
}

void sim_count_call(const char *name, const void *return_address)
{
    uintptr_t from = (uintptr_t)return_address;
    if (from >= sim_calls.text_lo && from < sim_calls.text_hi)
        return;
    __atomic_add_fetch(&sim_calls.total, 1, __ATOMIC_RELAXED);
    uint32_t slot = (uint32_t)(((uintptr_t)name >> 3) * 0x9E3779B97F4A7C15ULL >> 40) % SIM_CALL_NAMES;
    for (uint32_t i = 0; i < SIM_CALL_NAMES; i++, slot = (slot + 1) % SIM_CALL_NAMES) {
        const char *expected = NULL;
        if (__atomic_compare_exchange_n(&sim_calls.names[slot].name, &expected, name, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE) || expected == name) {
            __atomic_add_fetch(&sim_calls.names[slot].count, 1, __ATOMIC_RELAXED);
            return;
        }
    }
}

static void sim_calls_write(void)
{
    const struct sim_config *cfg = sim_config();
    char line[32768];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"pid\": %d, \"calls\": %llu, \"by_name\": {", (int)getpid(),
                                (unsigned long long)__atomic_load_n(&sim_calls.total, __ATOMIC_RELAXED));
    const char *sep = "";
    for (uint32_t i = 0; i < SIM_CALL_NAMES && n < sizeof line - 128; i++) {
        const char *name = __atomic_load_n(&sim_calls.names[i].name, __ATOMIC_ACQUIRE);
        if (!name)
            continue;
        n += (size_t)snprintf(line + n, sizeof line - n, "%s\"%s\": %llu", sep, name,
                              (unsigned long long)__atomic_load_n(&sim_calls.names[i].count, __ATOMIC_RELAXED));
        sep = ", ";
    }
    n += (size_t)snprintf(line + n, sizeof line - n, "}}\n");
    int fd = open(cfg->calls_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        sim_log("SIMGPU_CALLS=%s: cannot open it to append the count of driver calls", cfg->calls_path);
        return;
    }
    /* One write, so that lines of concurrent processes do not interleave. */
    ssize_t rc = write(fd, line, n);
    (void)rc;
    close(fd);
}

/* The child of a fork makes its own calls, from none. */
static void sim_calls_atfork_child(void)
{
    sim_calls.total = 0;
    memset(sim_calls.names, 0, sizeof sim_calls.names);
}

bool sim_failing(const char *name)
{
    const struct sim_config *cfg = sim_config();
    if (!cfg || !cfg->fail[0])
        return false;
    size_t n = strlen(name);
    for (const char *p = cfg->fail; (p = strstr(p, name)); p += n)
        if ((p == cfg->fail || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

__attribute__((constructor)) static void sim_calls_load(void)
{
    const struct sim_config *cfg = sim_config();
    if (!cfg || !cfg->calls_path[0])
        return;
    dl_iterate_phdr(sim_find_self, (void *)(uintptr_t)&sim_count_call);
    pthread_atfork(NULL, NULL, sim_calls_atfork_child);
    atexit(sim_calls_write);
    __atomic_store_n(&sim_counting, true, __ATOMIC_RELEASE);
}

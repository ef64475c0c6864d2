/* What a process reads of the node's clock and of its own identity
 * (base/clock.c, base/identity.c), for tests/test_time_namespaces.py, which
 * runs it in time namespaces of its own under AddressSanitizer and UBSan:
 * prints one JSON line, then waits for its standard input to close, so that
 * the host can read its /proc meanwhile. */
#include <stdio.h>
#include <unistd.h>

#include "base.h"

int main(void)
{
    struct vgl_time_offsets off = vgl_time_offsets();
    printf("{\"pid\": %d, \"node_ns\": %llu, \"own_ns\": %llu, \"monotonic_offset_ns\": %lld, "
           "\"boottime_offset_ns\": %lld, \"start_ticks\": %llu, \"running\": %d}\n",
           (int)getpid(), (unsigned long long)vgl_node_clock_ns(),
           (unsigned long long)vgl_clock_ns(CLOCK_MONOTONIC), (long long)off.monotonic_ns,
           (long long)off.boottime_ns, (unsigned long long)vgl_proc_start_time(getpid()),
           vgl_proc_running(getpid(), vgl_proc_start_time(getpid())));
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0)
        continue;
    return 0;
}

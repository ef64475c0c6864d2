/* simgpu's diagnostics: one line on stderr, written with one write(2) so that
 * lines of concurrent processes do not interleave. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

void sim_log(const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "simgpu: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    ssize_t rc = write(STDERR_FILENO, line, len);
    (void)rc;
}

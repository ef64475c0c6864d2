/* Diagnostics: one line per message, written with one write(2) so that lines
 * from several processes do not interleave.  Never on the hot path below
 * debug: VGL_LOG tests the level before anything is formatted. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "log.h"

int vgl_log_level = VGL_LOG_WARN;

static const char *const LEVEL_NAMES[] = {"error", "warning", "info", "debug"};

static void vlog(enum vgl_log_level level, const char *fmt, va_list ap)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "vgpulimit[%d]: %s: ", (int)getpid(), LEVEL_NAMES[level]);
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    if (m < 0)
        return;
    size_t len = (size_t)n + (size_t)m;
    if (len > sizeof line - 2)
        len = sizeof line - 2;
    line[len++] = '\n';
    ssize_t ignored = write(STDERR_FILENO, line, len);
    (void)ignored;
}

void vgl_log(enum vgl_log_level level, const char *fmt, ...)
{
    if ((int)level > vgl_log_level)
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

#define LOG_BOUND 20u

void vgl_log_bounded(enum vgl_log_level level, unsigned *count, const char *fmt, ...)
{
    if ((int)level > vgl_log_level)
        return;
    unsigned seen = __atomic_fetch_add(count, 1, __ATOMIC_RELAXED);
    if (seen > LOG_BOUND)
        return;
    if (seen == LOG_BOUND) {
        vgl_log(level, "(further messages of this kind are not shown)");
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    vlog(level, fmt, ap);
    va_end(ap);
}

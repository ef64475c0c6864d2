/* Diagnostics (log.c), on their own so that the files everything else
 * stands on (the timing table's reader) can say what they ignored without
 * taking in the whole shim. */
#ifndef VGPULIMIT_LOG_H
#define VGPULIMIT_LOG_H

#define VGL_LIKELY(x) __builtin_expect(!!(x), 1)
#define VGL_UNLIKELY(x) __builtin_expect(!!(x), 0)

enum vgl_log_level { VGL_LOG_ERROR, VGL_LOG_WARN, VGL_LOG_INFO, VGL_LOG_DEBUG };
extern int vgl_log_level; /* set once by config.c; VGL_LOG_WARN until then */
void vgl_log(enum vgl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Logs unless `*count` has passed a bound, then says once that it goes quiet. */
void vgl_log_bounded(enum vgl_log_level level, unsigned *count, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Formatting happens only at an enabled level, so a disabled one costs a compare. */
#define VGL_LOG(level, ...)                              \
    do {                                                 \
        if (VGL_UNLIKELY((level) <= vgl_log_level))      \
            vgl_log((level), __VA_ARGS__);               \
    } while (0)

#endif

/* The timing table's overrides, read once at load in a tunable build. */
#include <ctype.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "timings.h"

#define PREFIX "VGPULIMIT_TIMING_"

#ifdef VGL_TUNABLE_TIMINGS
struct vgl_timings vgl_timings = {
#define VGL_TIMING(name, type, value, measured, why) .name = (value),
#include "timings.def"
#undef VGL_TIMING
};

/* Whether `var` (NAME=value after the prefix) names `name`, upper-cased:
 * its value, or NULL. */
static const char *value_of(const char *var, const char *name)
{
    for (; *name; name++, var++)
        if (*var != toupper((unsigned char)*name))
            return NULL;
    return *var == '=' ? var + 1 : NULL;
}

/* A whole number of at most 18 digits (every row's type holds it). */
static bool whole(const char *text, uint64_t *n)
{
    size_t digits = strspn(text, "0123456789");
    if (digits == 0 || digits > 18 || text[digits])
        return false;
    *n = strtoull(text, NULL, 10);
    return true;
}

static void set(const char *var)
{
    bool found = false;
    const char *text;
    uint64_t n;
#define VGL_TIMING(name, type, value, measured, why)                                               \
    if (!found && (text = value_of(var, #name)) != NULL) {                                         \
        found = true;                                                                              \
        if (whole(text, &n))                                                                       \
            vgl_timings.name = (type)n;                                                            \
        else                                                                                       \
            vgl_log(VGL_LOG_WARN, PREFIX "%s: not a whole number of its unit; %llu kept", var,     \
                    (unsigned long long)(value));                                                  \
    }
#include "timings.def"
#undef VGL_TIMING
    if (!found)
        vgl_log(VGL_LOG_WARN, PREFIX "%s names no timing (shim/src/timings.def has them)", var);
}
#endif

void vgl_timings_load(char **env)
{
    for (char **e = env; e && *e; e++) {
        if (strncmp(*e, PREFIX, strlen(PREFIX)) != 0)
            continue;
#ifdef VGL_TUNABLE_TIMINGS
        set(*e + strlen(PREFIX));
#else
        vgl_log(VGL_LOG_WARN, "%.*s ignored: this build's timings are fixed (build with "
                "-Dtunable_timings=true to change them)", (int)strcspn(*e, "="), *e);
        return;
#endif
    }
}

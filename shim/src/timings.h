/* The table of timing constants (timings.def), as `vgl_timings.<name>`.
 *
 * A release build's table is a constant the compiler folds into the code: no
 * load, nothing a tenant's environment can change (a share's constants are
 * its strength).  A tunable build (-Dtunable_timings=true, or a debug build)
 * makes it a variable that vgl_timings_load fills from the environment, for
 * sweeps on a lent GPU without editing the code. */
#ifndef VGPULIMIT_TIMINGS_H
#define VGPULIMIT_TIMINGS_H

#include <stdint.h>

struct vgl_timings {
#define VGL_TIMING(name, type, value, measured, why) type name;
#include "timings.def"
#undef VGL_TIMING
};

#ifdef VGL_TUNABLE_TIMINGS
extern struct vgl_timings vgl_timings;
#else
__attribute__((unused)) static const struct vgl_timings vgl_timings = {
#define VGL_TIMING(name, type, value, measured, why) .name = (value),
#include "timings.def"
#undef VGL_TIMING
};
#endif

/* Reads VGPULIMIT_TIMING_<NAME> from `env` in a tunable build (a value that
 * is not a whole number is said and the default kept); in a release build
 * says once that such variables are ignored.  Once, at load. */
void vgl_timings_load(char **env);

#endif

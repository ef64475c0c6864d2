/* simgpu's diagnostics (log.c), apart from the state so that the files the
 * state stands on can speak. */
#ifndef SIMGPU_LOG_H
#define SIMGPU_LOG_H

/* One line on stderr, prefixed "simgpu: ". */
void sim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif

/* Where vgpulimit's files are, for the shim and the Python package alike.
 *
 * Also the cffi declaration of the binding (src/vgpulimit/_cffi_build.py
 * reads it without its preprocessor lines). */
#ifndef VGPULIMIT_PATHS_H
#define VGPULIMIT_PATHS_H

#include <stddef.h>

/* Where `vgpulimit oci-hook` mounts a container's region: the shim looks
 * there first, and a process that finds one there runs under it. */
#define VGL_CONTAINER_REGION "/.vgpulimit/region"
const char *vgl_container_region(void);
/* Where the hook mounts the node's priority board (read-only) beside it: a
 * container whose region is there finds its board there too, whatever its
 * region names. */
#define VGL_CONTAINER_BOARD "/.vgpulimit/board/priority.board"
const char *vgl_container_board(void);

/* Where Slurm's Prolog (`vgpulimit slurm prolog`) makes each job's region,
 * <dir>/<job id>/region: a process of a Slurm job that names no region
 * (VGPULIMIT_REGION unset) finds its job's there by its cgroup. */
#define VGL_SLURM_DIR "/run/vgpulimit/slurm"
const char *vgl_slurm_dir(void);

/* The directories for a process's own regions, best first:
 * $XDG_RUNTIME_DIR/vgpulimit (when absolute), /run/vgpulimit, and
 * $TMPDIR/vgpulimit-<uid> (an absolute TMPDIR, else /tmp).  Writes the
 * `index`th (from 0) into `out`: 0, -ENOENT past the last, or -ENAMETOOLONG. */
int vgl_runtime_dir(char **envp, int index, char *out, size_t len);

#endif

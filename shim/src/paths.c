/* Where vgpulimit's files are (paths.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "vgpulimit/paths.h"

const char *vgl_container_region(void) { return VGL_CONTAINER_REGION; }
const char *vgl_container_board(void) { return VGL_CONTAINER_BOARD; }
const char *vgl_slurm_dir(void) { return VGL_SLURM_DIR; }

/* The value of `name` in envp when it is an absolute path, else NULL. */
static const char *absolute(char **envp, const char *name)
{
    size_t n = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (strncmp(*e, name, n) == 0 && (*e)[n] == '=' && (*e)[n + 1] == '/')
            return *e + n + 1;
    return NULL;
}

int vgl_runtime_dir(char **envp, int index, char *out, size_t len)
{
    const char *xdg = absolute(envp, "XDG_RUNTIME_DIR");
    if (!xdg)
        index++; /* no first choice */
    int n;
    switch (index) {
    case 0:
        n = snprintf(out, len, "%s/vgpulimit", xdg);
        break;
    case 1:
        n = snprintf(out, len, "/run/vgpulimit");
        break;
    case 2: {
        const char *tmp = absolute(envp, "TMPDIR");
        n = snprintf(out, len, "%s/vgpulimit-%u", tmp ? tmp : "/tmp", (unsigned)getuid());
        break;
    }
    default:
        return -ENOENT;
    }
    return n >= 0 && (size_t)n < len ? 0 : -ENAMETOOLONG;
}

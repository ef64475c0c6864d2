/* Interposing dlsym, so that clients which dlopen the driver and look its
 * functions up (cuda-bindings, the CUDA runtime, pynvml, nvidia-smi) are
 * handed our wrappers.
 *
 * The exported dlsym is a few instructions of assembly (dlsym_<arch>.S): it
 * asks vgl_dlsym_intercept() and, when that declines, tail-jumps to the C
 * library's dlsym with the caller's return address untouched.  glibc resolves
 * RTLD_NEXT relative to the object that called dlsym, found from that
 * address; a forward through an ordinary C call would make the shim the
 * caller and send RTLD_NEXT look-ups one object too far (a library looking up
 * "the next malloc after me" would get its own back and loop). */
#include <dlfcn.h>
#include <string.h>

#include "internal.h"

/* Called by the assembly stub.  NULL: forward to the real dlsym. */
__attribute__((visibility("hidden"))) void *vgl_dlsym_intercept(void *handle, const char *name);

VGL_NO_SANITIZE void *vgl_dlsym_intercept(void *handle, const char *name)
{
    if (VGL_UNLIKELY(!vgl_real_dlsym))
        vgl_resolve_real_dlsym();
    /* RTLD_DEFAULT already finds our exports first; RTLD_NEXT and look-ups by
     * other libraries must behave as if we were absent. */
    if (handle == RTLD_NEXT || handle == RTLD_DEFAULT || !name || !vgl_config.enabled)
        return NULL;
    if (!vgl_hook_by_name(name))
        return NULL;
    void *real = vgl_real_dlsym(handle, name);
    if (!real)
        return NULL; /* the forward repeats the look-up and sets dlerror() */
    bool resolved = strncmp(name, "nvml", 4) == 0 ? vgl_resolve_nvml() : vgl_resolve_cuda();
    return resolved ? vgl_wrap_real_pointer(name, real) : real;
}

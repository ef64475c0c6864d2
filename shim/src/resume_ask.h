/* resume_ask.c — a suspended container's call asks the node agent to resume
 * it.  Apart from internal.h: only the hooks whose driver calls the
 * checkpoint lock can block open with VGL_ASKS. */
#ifndef VGL_RESUME_ASK_H
#define VGL_RESUME_ASK_H

#include "internal.h"

/* The container is suspended: the call asks now (the byte of
 * vgl_resume_byte in its beacon locked), or cannot (false). */
bool vgl_resume_asking(void);
void vgl_resume_asked(void);
off_t vgl_resume_byte(void);

/* True when the container is suspended and the call now asks: the caller
 * then calls vgl_resume_asked once the driver's call returned.  Inline, one
 * load while the container runs: every hook opens with it. */
static inline bool vgl_resume_ask(void)
{
    const struct vgl_region *region = vgl_self.region;
    if (VGL_LIKELY(!region || __atomic_load_n(&region->suspend_state, __ATOMIC_RELAXED) == VGL_SUSPEND_RUNNING))
        return false;
    return vgl_resume_asking();
}
static inline void vgl_resume_done(const bool *asked)
{
    if (VGL_UNLIKELY(*asked))
        vgl_resume_asked();
}
/* The first statement of a hook whose driver call the checkpoint lock can
 * block: the call asks from here until the hook returns, whichever return. */
#define VGL_ASKS() bool vgl_asks_ __attribute__((cleanup(vgl_resume_done), unused)) = vgl_resume_ask()

#endif

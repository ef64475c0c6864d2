/* Interposes whoami() and malloc() the way real interposers do: by asking for
 * the next definition after this object with dlsym(RTLD_NEXT, …).  If the shim's
 * dlsym forwarded RTLD_NEXT from its own frame, the search would start after
 * the shim and find these very functions again. */
#include <dlfcn.h>
#include <stddef.h>

void *__libc_malloc(size_t size);

static int (*next_whoami)(void);
static void *(*next_malloc)(size_t);
static __thread int in_lookup;

int whoami(void)
{
    if (!next_whoami)
        next_whoami = (int (*)(void))dlsym(RTLD_NEXT, "whoami");
    if (next_whoami == whoami)
        return -1; /* found ourselves: RTLD_NEXT was resolved from the wrong object */
    return next_whoami ? 100 + next_whoami() : 0;
}

void *malloc(size_t size)
{
    if (!next_malloc) {
        if (in_lookup) /* dlsym itself may allocate */
            return __libc_malloc(size);
        in_lookup = 1;
        next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
        in_lookup = 0;
        if (!next_malloc || next_malloc == malloc)
            return NULL;
    }
    return next_malloc(size);
}

void *rtld_next_malloc(void) { return (void *)next_malloc; }
void *rtld_next_lookup_again(void) { return dlsym(RTLD_NEXT, "malloc"); }

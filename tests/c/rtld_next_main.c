/* Prints what RTLD_NEXT look-ups made by rtld_next_wrap.so found:
 * "whoami 101" (wrap → base), "malloc libc" when malloc's next is the C
 * library's, "same" when a repeated look-up returns the same pointer. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

int whoami(void);
void *rtld_next_malloc(void);
void *rtld_next_lookup_again(void);

int main(void)
{
    printf("whoami %d\n", whoami());
    void *p = malloc(32);
    Dl_info info;
    void *next = rtld_next_malloc();
    const char *where = next && dladdr(next, &info) && info.dli_fname ? info.dli_fname : "none";
    printf("malloc %s\n", p && next ? where : "failed");
    printf("%s\n", rtld_next_lookup_again() == next ? "same" : "different");
    free(p);
    return 0;
}

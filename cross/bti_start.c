/* The one thing of the start files (crtbeginS.o) that the shim and simgpu
 * need: the library's own handle, which pthread_atfork hands to glibc so that
 * the handlers go when the library is unloaded.  See aarch64-linux-gnu.ini. */
void *const __dso_handle __attribute__((visibility("hidden"))) = (void *)&__dso_handle;

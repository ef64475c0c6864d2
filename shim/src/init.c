/* Load-time set-up, the region attach (once per process), and fork. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

struct vgl_self vgl_self;

static pthread_mutex_t attach_lock = PTHREAD_MUTEX_INITIALIZER;

/* After fork the child is a new process with no CUDA state: it gets a slot of
 * its own when it first allocates, and forgets the parent's allocations. */
static void after_fork_in_child(void)
{
    pthread_mutex_init(&attach_lock, NULL);
    vgl_self.slot = NULL;
    vgl_self.pid = (int32_t)getpid();
    vgl_allocations_forget();
}

__attribute__((constructor)) static void vgl_init(void)
{
    vgl_self.pid = (int32_t)getpid();
    vgl_config_load();
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* mkdir -p of the region's directory, private to the user. */
static void make_parent_dirs(const char *path)
{
    char dir[sizeof vgl_config.region_path];
    strcpy(dir, path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(dir, 0700);
        *p = '/';
    }
}

static void warn_if_env_differs(const struct vgl_region *region)
{
    char want[32], have[32];
    for (uint32_t i = 0; i < VGL_MAX_DEVICES; i++) {
        const struct vgl_mem_limit *env = &vgl_config.memory[i];
        const struct vgl_mem_limit *live = &region->devices[i].limit;
        if (!vgl_config.mem_limited || (env->bytes == live->bytes && env->ppm == live->ppm))
            continue;
        vgl_log(VGL_LOG_WARN, "the region %s caps device %u at %s, the environment at %s; the "
                              "region's cap applies (change it with `vgpulimit set`)",
                vgl_config.region_path, i,
                live->bytes ? vgl_format_bytes(live->bytes, have, sizeof have) : "no cap",
                env->bytes ? vgl_format_bytes(env->bytes, want, sizeof want) : "a share of the device");
        return;
    }
}

static struct vgl_region *open_region(void)
{
    const char *path = vgl_config.region_path;
    struct vgl_region *region = NULL;
    int err = vgl_region_open(path, &region);
    if (err == -ENOENT) {
        /* No supervisor made one: the first process of the container does. */
        make_parent_dirs(path);
        err = vgl_region_create(path, vgl_config.memory, vgl_config.cores_pct, 0);
        if (!err || err == -EEXIST)
            err = vgl_region_open(path, &region);
    }
    if (err) {
        vgl_log(VGL_LOG_ERROR, "region file %s: %s; device memory allocations are refused",
                path, vgl_region_strerror(err));
        return NULL;
    }
    warn_if_env_differs(region);
    return region;
}

bool vgl_attach(void)
{
    static unsigned failures;
    pthread_mutex_lock(&attach_lock);
    if (!vgl_self.region)
        vgl_self.region = open_region();
    if (vgl_self.region && !vgl_self.slot) {
        struct vgl_slot *slot;
        int err = vgl_region_attach(vgl_self.region, vgl_self.pid, 0, &slot);
        if (err)
            vgl_log_bounded(VGL_LOG_ERROR, &failures, "region file %s: %s; device memory "
                            "allocations are refused", vgl_config.region_path, vgl_region_strerror(err));
        else
            __atomic_store_n(&vgl_self.slot, slot, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_lock);
    return vgl_self.slot != NULL;
}

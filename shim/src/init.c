/* Load-time set-up, the region attach (once per process), and fork. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
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
    vgl_overhead_forget();
    vgl_launch_forget();
    vgl_graph_memory_forget();
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
    vgl_region_guard(region); /* the one region of the process: there is room */
    warn_if_env_differs(region);
    return region;
}

/* The kernel's inode number of the initial pid namespace (PROC_PID_INIT_INO,
 * fixed since Linux 3.8). */
#define INIT_PID_NS_INODE 0xEFFFFFFCu

static bool in_initial_pid_ns(const char *ns_link)
{
    struct stat st;
    return stat(ns_link, &st) == 0 && st.st_ino == INIT_PID_NS_INODE;
}

/* Our pid as the host knows it (and as the NVIDIA driver reports it), or 0
 * when this process cannot know it.  In the host's pid namespace it is our
 * own.  Below it, NSpid in /proc/self/status lists our pid in the namespace
 * of the mounted /proc first, then in each namespace down to ours: the first
 * is the host's when that /proc is the host's (its pid 1 lives in the initial
 * namespace).  A container with a /proc of its own sees one entry: unknown;
 * the supervisor or an outside view must then match processes otherwise. */
static int32_t host_pid_of_self(void)
{
    if (in_initial_pid_ns("/proc/self/ns/pid"))
        return vgl_self.pid;
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *line = strstr(buf, "\nNSpid:");
    if (!line)
        return 0;
    char *end;
    long outer = strtol(line + 7, &end, 10);
    bool nested = *end == ' ' || *end == '\t';
    if (!nested || outer <= 0 || outer > INT32_MAX || !in_initial_pid_ns("/proc/1/ns/pid"))
        return 0;
    return (int32_t)outer;
}

static bool map_region_locked(void)
{
    if (!vgl_self.region)
        __atomic_store_n(&vgl_self.region, open_region(), __ATOMIC_RELEASE);
    return vgl_self.region != NULL;
}

bool vgl_map_region(void)
{
    if (VGL_LIKELY(__atomic_load_n(&vgl_self.region, __ATOMIC_ACQUIRE) != NULL))
        return true;
    pthread_mutex_lock(&attach_lock);
    bool mapped = map_region_locked();
    pthread_mutex_unlock(&attach_lock);
    return mapped;
}

bool vgl_attach(void)
{
    static unsigned failures;
    pthread_mutex_lock(&attach_lock);
    if (map_region_locked() && !vgl_self.slot) {
        struct vgl_slot *slot;
        int err = vgl_region_attach(vgl_self.region, vgl_self.pid, host_pid_of_self(), &slot);
        if (err)
            vgl_log_bounded(VGL_LOG_ERROR, &failures, "region file %s: %s; device memory "
                            "allocations are refused", vgl_config.region_path, vgl_region_strerror(err));
        else
            __atomic_store_n(&vgl_self.slot, slot, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&attach_lock);
    return vgl_self.slot != NULL;
}

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
    for (uint32_t i = 0; i < vgl_self.nouter; i++)
        vgl_self.outer[i].slot = NULL;
    vgl_self.pid = (int32_t)getpid();
}

__attribute__((constructor)) static void vgl_init(void)
{
    vgl_self.pid = (int32_t)getpid();
    vgl_config_load();
    vgl_timings_load(environ);
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

/* The directory of the shim's own regions (config.c), private to the user.
 * A path someone named is never created: a typo must not make directories
 * (as root, anywhere). */
static void make_own_dir(void)
{
    char dir[sizeof vgl_config.region_path];
    memcpy(dir, vgl_config.region_path, vgl_config.own_dir_len);
    dir[vgl_config.own_dir_len] = '\0';
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        mkdir(dir, 0700);
        *p = '/';
    }
    mkdir(dir, 0700);
}

/* KAI's layout (environment.c kai_region): <mount>/containers/<pod>_<ctr>/.
 * The mount is the node's, shared by every pod, so containers/ is open to
 * all and sticky, as /tmp is; a container's own directory is private. */
static void make_kai_dirs(void)
{
    char dir[sizeof vgl_config.region_path];
    strcpy(dir, vgl_config.region_path);
    *strrchr(dir, '/') = '\0';
    char *own = strrchr(dir, '/');
    *own = '\0';
    if (mkdir(dir, 0700) == 0)
        chmod(dir, 01777);
    *own = '/';
    mkdir(dir, 0700);
}

static bool same_limit(const struct vgl_mem_limit *a, const struct vgl_mem_limit *b)
{
    return a->bytes == b->bytes && a->ppm == b->ppm;
}

/* What the environment gives the device of `uuid` by its UUID, or NULL. */
static const struct vgl_uuid_limit *env_uuid_limit(const struct vgl_env *env, const uint8_t uuid[16])
{
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        if (env->by_uuid[i].flags && memcmp(env->by_uuid[i].uuid, uuid, 16) == 0)
            return &env->by_uuid[i];
    return NULL;
}

/* The first device whose limits the environment states otherwise than the
 * region, or -1. */
static int differing_device(const struct vgl_region *region)
{
    const struct vgl_env *env = &vgl_config.env;
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        const struct vgl_uuid_limit *by_uuid = env_uuid_limit(env, region->devices[i].uuid);
        bool memory = env->memory_from[i].source && !same_limit(&env->memory[i], &region->devices[i].limit);
        bool cores = env->cores_from[i].source && env->cores_pct[i] != region->devices[i].cores_pct;
        if (by_uuid && (by_uuid->flags & VGL_UUID_MEMORY))
            memory = !same_limit(&by_uuid->limit, &region->devices[i].limit);
        if (by_uuid && (by_uuid->flags & VGL_UUID_CORES))
            cores = by_uuid->cores_pct != region->devices[i].cores_pct;
        if (memory || cores)
            return i;
    }
    return -1;
}

static void describe_limits(const struct vgl_device_state *dev, char *buf, size_t len)
{
    char size[32];
    const char *memory = dev->limit.bytes ? vgl_format_bytes(dev->limit.bytes, size, sizeof size)
                         : dev->limit.ppm ? "a share of the device" : "no cap";
    if (dev->cores_pct)
        snprintf(buf, len, "%s and %u%% of its time", memory, dev->cores_pct);
    else
        snprintf(buf, len, "%s", memory);
}

/* Says once which of the environment's limits do not apply, and why. */
static void warn_if_env_differs(const struct vgl_region *region)
{
    int i = differing_device(region);
    if (i < 0 || vgl_config.said_ignored)
        return;
    const struct vgl_env *env = &vgl_config.env;
    const char *name = env->memory_from[i].source ? env->memory_from[i].name : env->cores_from[i].name;
    char live[96];
    describe_limits(&region->devices[i], live, sizeof live);
    if (vgl_config.authoritative)
        vgl_log(VGL_LOG_WARN, "%s and the other limit variables are ignored: this container's limits "
                              "are set up by its runtime (%s: device %d, %s)", name,
                vgl_config.region_path, i, live);
    else
        vgl_log(VGL_LOG_WARN, "%s is not what the region %s holds (device %d, %s), which a live "
                              "process of the container uses; the region's limits apply (change them "
                              "with `vgpulimit set`)", name, vgl_config.region_path, i, live);
}

static void close_outer(void)
{
    while (vgl_self.nouter) {
        struct vgl_region *outer = vgl_self.outer[--vgl_self.nouter].region;
        vgl_region_unguard(outer);
        vgl_region_close(outer);
    }
}

/* Maps the regions `region` is nested in, nearest first.  False (said once)
 * when one cannot be, or the chain is deeper than VGL_MAX_CHAIN: what the
 * process uses could not be counted there, so it fails closed. */
static bool open_outer(const struct vgl_region *region)
{
    static int said;
    const char *inner = vgl_config.region_path;
    char last[VGL_PARENT_LEN], path[VGL_PARENT_LEN];
    bool in_runtime = strcmp(inner, VGL_CONTAINER_REGION) == 0;
    /* A copy first: the header is in a mapping every process of the container may write. */
    memcpy(path, region->parent, sizeof path);
    path[sizeof path - 1] = '\0';
    while (path[0]) {
        int err = vgl_self.nouter == VGL_MAX_CHAIN - 1 ? -ELOOP : 0;
        struct vgl_region *outer = NULL;
        if (!err)
            err = vgl_region_open(path, &outer);
        if (err) {
            if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
                vgl_log(VGL_LOG_ERROR, "region file %s is nested in %s: %s; device memory allocations "
                        "are refused", inner, path, err == -ELOOP ? "regions are nested deeper than "
                        "vgpulimit follows (a nested run inside a nested run inside a nested run)"
                        : vgl_region_strerror(err));
            close_outer();
            return false;
        }
        vgl_region_guard(outer);
        vgl_self.outer[vgl_self.nouter++].region = outer;
        in_runtime = in_runtime || strcmp(path, VGL_CONTAINER_REGION) == 0;
        memcpy(last, path, sizeof last);
        inner = last;
        memcpy(path, outer->parent, sizeof path);
        path[sizeof path - 1] = '\0';
    }
    /* The file named may have been replaced since the configuration was read. */
    if (vgl_config.authoritative && !in_runtime) {
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            vgl_log(VGL_LOG_ERROR, "region file %s is not nested in this container's region (%s); "
                    "device memory allocations are refused", vgl_config.region_path, VGL_CONTAINER_REGION);
        close_outer();
        return false;
    }
    return true;
}

/* Whether the region named is made by someone else, never by the shim:
 * VGPULIMIT_REGION names the region of `vgpulimit run`, the OCI hook or a CDI
 * device, which made it with the limits.  Made here instead, from whatever
 * the process's environment says, a region that was removed, or a new path
 * a process named, would hold no cap at all.  HAMi's shared cache and KAI's
 * file are made on first use, as HAMi-core and KAI make them. */
static bool made_elsewhere(void)
{
    return vgl_config.authoritative || vgl_config.slurm_job ||
           strcmp(vgl_config.env.region_from, "VGPULIMIT_REGION") == 0;
}

/* The directory of the shim's own regions is usable (config.c
 * vgl_private_dir), else one line saying whose it is. */
static int check_own_dir(char *why, size_t len)
{
    char dir[sizeof vgl_config.region_path];
    memcpy(dir, vgl_config.region_path, vgl_config.own_dir_len);
    dir[vgl_config.own_dir_len] = '\0';
    uint32_t owner = 0, mode = 0;
    int err = vgl_private_dir(dir, &owner, &mode);
    if (err == -EPERM || err == -EACCES)
        snprintf(why, len, "its directory %.300s is %s (owner uid %u, mode %04o), and a runtime directory must be "
                 "this user's own (uid %u) and writable by no one else; remove it, or set XDG_RUNTIME_DIR to "
                 "a directory of your own", dir, err == -EPERM ? "another user's" : "writable by others", owner,
                 mode, (unsigned)geteuid());
    else if (err)
        snprintf(why, len, "its directory %.300s cannot be used: %s", dir, strerror(-err));
    return err;
}

static struct vgl_region *open_region(void)
{
    const char *path = vgl_config.region_path;
    const struct vgl_env *env = &vgl_config.env;
    struct vgl_region *region = NULL;
    char why[640] = "";
    int err = 0;
    if (vgl_config.own_dir_len) {
        make_own_dir();
        err = check_own_dir(why, sizeof why);
    }
    if (!err)
        err = vgl_region_open(path, &region);
    if (err == -ENOENT && vgl_config.slurm_job) {
        snprintf(why, sizeof why, "no such file; a Slurm job's region is made by its Prolog and removed by its "
                 "Epilog (has the job ended?)");
    } else if (err == -ENOENT && made_elsewhere()) {
        snprintf(why, sizeof why, "no such file; a region named by %s is made by `vgpulimit run`, the OCI hook "
                 "or a CDI device, never by the shim (was it removed?)",
                 vgl_config.authoritative ? VGL_CONTAINER_REGION : "VGPULIMIT_REGION");
    } else if (err == -ENOENT) {
        /* No supervisor made one: the first process of the container does. */
        if (env->region_dir_len)
            make_kai_dirs();
        err = vgl_region_create_elastic(path, env->memory, env->cores_pct, env->by_uuid, env->request,
                                        env->memory_wait_ns, VGL_REGION_FROM_ENVIRONMENT, NULL);
        bool made = !err;
        if (!err || err == -EEXIST)
            err = vgl_region_open(path, &region);
        else if (err == -ENOENT)
            snprintf(why, sizeof why, "its directory does not exist (vgpulimit creates no directory it is named)");
        else
            snprintf(why, sizeof why, "cannot create it: %s", strerror(-err)); /* a full disk, say */
        /* Its name hashes the policy too: whoever made it wrote the same. */
        for (int i = 0; made && !err && env->cores_policy > 0 && i < VGL_MAX_DEVICES; i++)
            __atomic_store_n(&region->devices[i].cores_policy, (uint32_t)env->cores_policy, __ATOMIC_RELEASE);
        /* For the views only: with no setter there is no board row, and a
         * priority means nothing without one (priority.c). */
        if (made && !err && env->priority > 0)
            region->priority = (uint32_t)env->priority;
    }
    if (err) {
        static int said; /* every later call fails the same way: once is enough */
        if (!__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED))
            vgl_log(VGL_LOG_ERROR, "region file %s (%s): %s; device memory allocations are refused", path,
                vgl_config.authoritative ? "set up by the container's runtime"
                : vgl_config.slurm_job    ? "the Slurm job's, found by its cgroup"
                : env->region_from[0]     ? env->region_from : "made from the limit variables",
                why[0] ? why : vgl_region_strerror(err));
        return NULL;
    }
    vgl_region_guard(region); /* the first region of the process: there is room */
    if (!open_outer(region)) {
        vgl_region_unguard(region);
        vgl_region_close(region);
        return NULL;
    }
    /* A region made from an environment's limits holds only while a process
     * does: one left by processes that are gone takes this process's. */
    if ((region->flags & VGL_REGION_FROM_ENVIRONMENT) && !vgl_config.authoritative &&
        differing_device(region) >= 0)
        vgl_region_renew(region, env->memory, env->cores_pct);
    warn_if_env_differs(region);
    return region;
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
        int32_t host_pid = vgl_host_pid_self();
        struct vgl_slot *slot;
        int err = vgl_region_attach(vgl_self.region, vgl_self.pid, host_pid, &slot);
        bool outer = false;
        for (uint32_t i = 0; i < vgl_self.nouter && !err; i++, outer = true)
            err = vgl_region_attach(vgl_self.outer[i].region, vgl_self.pid, host_pid, &vgl_self.outer[i].slot);
        if (err == -ETIMEDOUT)
            /* Not for good: the next call tries again. */
            vgl_log_bounded(VGL_LOG_ERROR, &failures, VGL_LOCK_HELD_FMT "; this process's device memory "
                            "allocations are refused until it is let go",
                            VGL_LOCK_HELD_ARGS(outer ? "the region this one is nested in" : vgl_config.region_path,
                                               outer ? vgl_self.outer[0].region : vgl_self.region));
        else if (err)
            vgl_log_bounded(VGL_LOG_ERROR, &failures, "%s%s%s: %s; device memory allocations are "
                            "refused", outer ? "the region file that " : "region file ", vgl_config.region_path,
                            outer ? " is nested in" : "", vgl_region_strerror(err));
        else
            __atomic_store_n(&vgl_self.slot, slot, __ATOMIC_RELEASE);
        /* With no supervisor, a process starting is the moment to take back
         * what the dead left: a run of programs one after another must find
         * the cap as the first one did. */
        vgl_region_reclaim(vgl_self.region);
        for (uint32_t i = 0; i < vgl_self.nouter; i++)
            vgl_region_reclaim(vgl_self.outer[i].region);
    }
    pthread_mutex_unlock(&attach_lock);
    return vgl_self.slot != NULL;
}

/* The shim's configuration, decided once when it is loaded: no getenv
 * afterwards.  The environment is read by the one reader (environment.c);
 * here it meets the region a runtime may have set up for the container.
 *
 * Which region, strongest first:
 *  1. /.vgpulimit/region, mounted by `vgpulimit oci-hook`: set up by the
 *     runtime, not by the process, so it is authoritative: the process's own
 *     variables cannot name another region or change a limit (they are
 *     ignored, with one line).  A region nested in it (that of a `vgpulimit
 *     run` inside the container) may be named: it can only tighten.
 *  2. VGPULIMIT_REGION, else HAMi's CUDA_DEVICE_MEMORY_SHARED_CACHE: the
 *     region of an enclosing `vgpulimit run`, or a path a device plugin
 *     chose; else the file KAI's resource isolator implies
 *     (CONTAINER_VGPU_MOUNT, POD_UID, CONTAINER_NAME).
 *  2b. Unless VGPULIMIT_REGION names it or a region nested in it: the
 *     region Slurm's Prolog made for the job the process is in, found by
 *     its cgroup (VGL_SLURM_DIR/<job id>/region), which the job cannot
 *     change: authoritative as the runtime's, so that a job that unsets
 *     VGPULIMIT_REGION, names a region it made itself or HAMi's or KAI's
 *     files, or sets limit variables of its own, keeps its job's cap.
 *  3. Limits in the environment alone: a region of the shim's own, named
 *     after those limits, so that it never meets a process that asks for
 *     others.
 * A variable that cannot be used makes the configuration "broken": device
 * allocations are refused (fail closed), never run without the limit. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

struct vgl_config vgl_config;

extern char **environ;

/* An empty file at VGL_CONTAINER_REGION is only a mount point left behind
 * (in an image committed from a running container), not a region. */
static bool runtime_set_up(void)
{
    struct stat st;
    return stat(VGL_CONTAINER_REGION, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
}

/* The region of the Slurm job this process is in (vgl_env_slurm_job), into
 * `path`, when there is one; false on anything else (no job, no region, an
 * unreadable /proc): the process is then configured as before. */
static bool slurm_job_region(char *path, size_t len)
{
    char text[4096], job[24];
    int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return false;
    text[n] = '\0';
    if (vgl_env_slurm_job(text, job, sizeof job) != 0)
        return false;
    struct stat st;
    int made = snprintf(path, len, "%s/%s/region", VGL_SLURM_DIR, job);
    return made > 0 && (size_t)made < len && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Whether the region at `path` is nested, through at most VGL_MAX_CHAIN
 * regions, in the one at `outer` (the runtime's, a Slurm job's).  (Checked
 * again when the chain is mapped: init.c open_outer.) */
static bool nested_in(const char *path, const char *outer)
{
    char parent[VGL_PARENT_LEN];
    for (int depth = 1; depth < VGL_MAX_CHAIN; depth++) {
        if (vgl_region_read_parent(path, parent) < 0 || !parent[0])
            return false;
        if (strcmp(parent, outer) == 0)
            return true;
        path = parent;
    }
    return false;
}

/* Whether the environment names the Slurm job's region at `job`, or one
 * nested in it (a `vgpulimit run` inside the job): those can only tighten. */
static bool names_within(const struct vgl_env *env, const char *job)
{
    return strcmp(env->region_from, "VGPULIMIT_REGION") == 0 &&
           (strcmp(env->region_path, job) == 0 || nested_in(env->region_path, job));
}

/* FNV-1a over the limits: the name of the region that environment makes. */
static uint64_t limits_hash(const struct vgl_env *env)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *parts[] = {(const void *)env->memory, (const void *)env->cores_pct,
                                    (const void *)&env->cores_policy, (const void *)env->by_uuid,
                                    (const void *)&env->priority, (const void *)env->request,
                                    (const void *)&env->memory_wait_ns};
    size_t sizes[] = {sizeof env->memory, sizeof env->cores_pct, sizeof env->cores_policy,
                      sizeof env->by_uuid, sizeof env->priority, sizeof env->request,
                      sizeof env->memory_wait_ns};
    for (int p = 0; p < 7; p++)
        for (size_t i = 0; i < sizes[p]; i++)
            h = (h ^ parts[p][i]) * 0x100000001b3ULL;
    return h;
}

int vgl_private_dir(const char *dir, uint32_t *owner, uint32_t *mode)
{
    /* Not lstat: newer than the shim's glibc floor.  O_NOFOLLOW refuses a link. */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ELOOP ? -ENOTDIR : -errno;
    struct stat st;
    int err = fstat(fd, &st) < 0 ? -errno : 0;
    close(fd);
    if (err)
        return err;
    *owner = (uint32_t)st.st_uid;
    *mode = (uint32_t)(st.st_mode & 07777);
    if (st.st_uid != geteuid())
        return -EPERM;
    return st.st_mode & (S_IWGRP | S_IWOTH) ? -EACCES : 0;
}

/* The directory for regions the shim makes itself: the first of the runtime
 * directories (paths.h, as `vgpulimit run` picks its own) that is this
 * user's own and writable by no one else, or that this process may make.
 * One another user made (in /tmp, anyone can) is passed over: its owner
 * could replace the region in it. */
static void own_region_path(const struct vgl_env *env)
{
    char *out = vgl_config.region_path;
    size_t len = sizeof vgl_config.region_path;
    /* None usable: the last, where making the region says why. */
    int last = 0;
    while (vgl_runtime_dir(environ, last + 1, out, len) == 0)
        last++;
    for (int i = 0; i <= last; i++) {
        if (vgl_runtime_dir(environ, i, out, len) != 0)
            continue;
        uint32_t owner, mode;
        int err = vgl_private_dir(out, &owner, &mode);
        bool usable = err == 0;
        if (err == -ENOENT) {
            char *slash = strrchr(out, '/');
            *slash = '\0';
            usable = access(slash == out ? "/" : out, W_OK | X_OK) == 0;
            *slash = '/';
        }
        if (usable || i == last)
            break;
    }
    size_t dir = strlen(out);
    vgl_config.own_dir_len = dir;
    /* Named by the layout version too: a file another version left (an
     * upgrade, two installations) is not this one's, and is not in its way. */
    snprintf(out + dir, len - dir, "/env-v%d-%016llx.region", (int)VGL_REGION_VERSION,
             (unsigned long long)limits_hash(env));
}

/* The name of a limit variable in the environment, or NULL. */
static const char *limit_variable(const struct vgl_env *env)
{
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        if (env->memory_from[i].source || env->cores_from[i].source)
            return env->memory_from[i].source ? env->memory_from[i].name : env->cores_from[i].name;
    return env->by_uuid[0].flags ? "the limits by UUID" : NULL;
}

static void report(const struct vgl_env *env)
{
    for (uint32_t i = 0; i < env->lines; i++)
        vgl_log(env->line_is_error[i] ? VGL_LOG_ERROR : VGL_LOG_WARN, "%s%s", env->line[i],
                env->line_is_error[i] ? "; device memory allocations are refused until it is fixed" : "");
}

void vgl_config_load(void)
{
    struct vgl_env *env = &vgl_config.env;
    vgl_env_read(environ, env);
    if (env->log_level >= 0)
        vgl_log_level = env->log_level;

    if (runtime_set_up()) {
        vgl_config.enabled = true;
        vgl_config.authoritative = true;
        strcpy(vgl_config.region_path, VGL_CONTAINER_REGION);
        /* Its limits are compared with the environment's once it is mapped
         * (init.c); what cannot even be read is said here. */
        if (env->region_path[0] && nested_in(env->region_path, VGL_CONTAINER_REGION))
            strcpy(vgl_config.region_path, env->region_path);
        else if (env->region_path[0] && strcmp(env->region_path, VGL_CONTAINER_REGION) != 0) {
            const char *limit = limit_variable(env);
            vgl_log(VGL_LOG_WARN, "%s=\"%s\"%s%s%s ignored: this container's region is set up by its "
                    "runtime (%s)", env->region_from, env->region_path, limit ? " and " : "",
                    limit ? limit : "", limit ? " (every limit variable) are" : " is", VGL_CONTAINER_REGION);
            vgl_config.said_ignored = true;
        } else if (env->errors) {
            vgl_log(VGL_LOG_WARN, "the limit variables in the environment are ignored: this "
                    "container's limits are set up by its runtime (%s)", VGL_CONTAINER_REGION);
            vgl_config.said_ignored = true;
        }
        if (env->control_disabled)
            vgl_log(VGL_LOG_WARN, "CUDA_DISABLE_CONTROL=true ignored: this container's limits are set up "
                    "by its runtime (%s)", VGL_CONTAINER_REGION);
        /* An MPS client given a compute share too: said here, where the
         * container's log shows it (the hook read the same variables). */
        for (uint32_t i = 0; env->mps && i < env->lines; i++)
            if (!env->line_is_error[i])
                vgl_log(VGL_LOG_WARN, "%s", env->line[i]);
        return;
    }
    char job[sizeof vgl_config.region_path];
    if (slurm_job_region(job, sizeof job) && !names_within(env, job)) {
        vgl_config.enabled = true;
        vgl_config.slurm_job = true;
        strcpy(vgl_config.region_path, job);
        if (env->region_path[0]) {
            vgl_log(VGL_LOG_WARN, "%s=\"%s\" ignored: this process runs under its Slurm job's region %s, "
                    "found by the job's cgroup; the limit variables in the environment are ignored",
                    env->region_from, env->region_path, job);
            vgl_config.said_ignored = true;
        } else if (env->asks || env->control_disabled || env->lines) {
            vgl_log(VGL_LOG_WARN, "VGPULIMIT_REGION is not set: this process runs under its Slurm job's region "
                    "%s, found by the job's cgroup; the limit variables in the environment are ignored", job);
            vgl_config.said_ignored = true;
        }
        return;
    }
    if (env->control_disabled) {
        /* HAMi's switch, honoured as HAMi-core honours it: said, not silent
         * (and nothing else about limits that do not apply). */
        vgl_log(VGL_LOG_WARN, "CUDA_DISABLE_CONTROL=true: no limit is enforced in this process");
        return;
    }
    report(env);
    if (!env->asks)
        return;
    vgl_config.enabled = true;
    vgl_config.broken = env->errors != 0;
    if (env->region_path[0])
        strcpy(vgl_config.region_path, env->region_path);
    else
        own_region_path(env);
}

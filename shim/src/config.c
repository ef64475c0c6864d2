/* The environment, read once when the shim is loaded: no getenv afterwards.
 *
 * A variable we cannot use makes the configuration "broken": one line names
 * it and the accepted forms, and device allocations are refused from then on
 * (fail closed) rather than run without the limit the user asked for. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

struct vgl_config vgl_config;

extern char **environ;

static const char PREFIX[] = "VGPULIMIT_";

static void set_log_level(const char *value)
{
    static const char *const NAMES[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(value, NAMES[i]) == 0) {
            vgl_log_level = i;
            return;
        }
    }
    vgl_log(VGL_LOG_WARN, "VGPULIMIT_LOG=\"%s\" is not a level; accepted: error, warn, info, debug "
                          "(keeping warn)", value);
}

static void refuse(const char *name, const char *value, int err, const char *forms)
{
    vgl_config.broken = true;
    vgl_log(VGL_LOG_ERROR, "%s=\"%s\" is %s; accepted: %s. Device memory allocations are refused "
                           "until it is fixed",
            name, value, err == -ERANGE ? "out of range" : "not understood", forms);
}

/* "VGPULIMIT_MEMORY_3" → 3; "VGPULIMIT_MEMORY" → -1 (every device); -2: not this variable. */
static int device_suffix(const char *name, size_t name_len, const char *stem)
{
    size_t stem_len = strlen(stem);
    if (name_len < stem_len || strncmp(name, stem, stem_len) != 0)
        return -2;
    if (name_len == stem_len)
        return -1;
    if (name[stem_len] != '_' || name_len == stem_len + 1 || name_len > stem_len + 3)
        return -2;
    int index = 0;
    for (size_t i = stem_len + 1; i < name_len; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -2;
        index = index * 10 + (name[i] - '0');
    }
    return index < VGL_MAX_DEVICES ? index : -2;
}

static void read_memory(const char *name, int device, const char *value)
{
    struct vgl_mem_limit limit;
    int err = vgl_parse_memory(value, &limit);
    if (err) {
        refuse(name, value, err, vgl_memory_forms());
        return;
    }
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        if (i == device || (device < 0 && !vgl_config.memory_set[i]))
            vgl_config.memory[i] = limit;
    if (device >= 0)
        vgl_config.memory_set[device] = true; /* a device's own value beats the global one */
    vgl_config.mem_limited = true;
}

static void read_cores(const char *name, int device, const char *value)
{
    uint32_t pct;
    int err = vgl_parse_cores(value, &pct);
    if (err) {
        refuse(name, value, err, vgl_cores_forms());
        return;
    }
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        if (i == device || (device < 0 && !vgl_config.cores_set[i]))
            vgl_config.cores_pct[i] = pct;
    if (device >= 0)
        vgl_config.cores_set[device] = true;
}

/* Where `vgpulimit oci-hook` mounts a container's region (oci_hook.py
 * CONTAINER_REGION).  A hook cannot change a container's environment, so the
 * region there turns the shim on by itself: it carries the limits, those
 * given as annotations included.  An empty file is only a mount point left
 * behind (in an image committed from a running container), not a region. */
#define CONTAINER_REGION "/.vgpulimit/region"

static void default_region_path(void)
{
    struct stat st;
    if (stat(CONTAINER_REGION, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        strcpy(vgl_config.region_path, CONTAINER_REGION);
        vgl_config.enabled = true;
        return;
    }
    if (!vgl_config.enabled)
        return;
    const char *runtime = getenv("XDG_RUNTIME_DIR");
    char *out = vgl_config.region_path;
    size_t len = sizeof vgl_config.region_path;
    if (runtime && runtime[0] == '/')
        snprintf(out, len, "%s/vgpulimit/region", runtime);
    else if (access("/run", W_OK) == 0)
        snprintf(out, len, "/run/vgpulimit/region");
    else
        snprintf(out, len, "/tmp/vgpulimit-%u/region", (unsigned)getuid());
}

static void read_region(const char *name, const char *value)
{
    if (value[0] != '/' || strlen(value) >= sizeof vgl_config.region_path) {
        vgl_config.broken = true;
        vgl_log(VGL_LOG_ERROR, "%s=\"%s\" must be an absolute path to a region file; device "
                               "memory allocations are refused", name, value);
        return;
    }
    strcpy(vgl_config.region_path, value);
}

/* HAMi-core's variables, as HAMi's device plugin sets them, so that vgpulimit
 * drops in where libvgpu.so was: each is honoured where our own variable for
 * the same setting is absent.  Where HAMi-core reads a value differently
 * (a 0 meaning "no limit", its log levels), we read it as HAMi-core does. */
static const char HAMI_MEMORY[] = "CUDA_DEVICE_MEMORY_LIMIT";
static const char HAMI_CORES[] = "CUDA_DEVICE_SM_LIMIT";
static const char HAMI_REGION[] = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
static const char HAMI_POLICY[] = "GPU_CORE_UTILIZATION_POLICY";

static void set_hami_log_level(const char *value)
{
    /* HAMi-core: 0 errors only, 1 warnings, 2 info, 3 and up debug. */
    if (value[0] >= '0' && value[0] <= '9')
        vgl_log_level = value[0] - '0' < VGL_LOG_DEBUG ? value[0] - '0' : VGL_LOG_DEBUG;
}

static void load_hami(bool have_memory, bool have_cores, bool have_region)
{
    const char *policy = getenv(HAMI_POLICY);
    /* HAMi-core's DISABLE turns its compute limit off; FORCE and DEFAULT both
     * mean a hard cap here (HAMi-core's DEFAULT skips limiting a container
     * that is alone on the GPU, which we never do). */
    bool cores_disabled = policy && strcasecmp(policy, "DISABLE") == 0;
    for (char **env = environ; env && *env; env++) {
        const char *entry = *env, *eq = strchr(entry, '=');
        if (!eq || strncmp(entry, "CUDA_DEVICE_", 12) != 0)
            continue;
        size_t name_len = (size_t)(eq - entry);
        const char *value = eq + 1;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)name_len, entry);
        bool zero = strcmp(value, "0") == 0; /* HAMi-core: no limit */
        int device;
        if ((device = device_suffix(name, name_len, HAMI_MEMORY)) != -2) {
            if (!have_memory && !zero && value[0])
                read_memory(name, device, value);
        } else if ((device = device_suffix(name, name_len, HAMI_CORES)) != -2) {
            if (!have_cores && !cores_disabled && !zero && value[0])
                read_cores(name, device, value);
        } else if (strcmp(name, HAMI_REGION) == 0) {
            if (!have_region && value[0])
                read_region(name, value);
        } else {
            continue;
        }
        vgl_config.enabled = true;
    }
}

void vgl_config_load(void)
{
    /* The log level first, so that what follows is logged at the asked level. */
    const char *log = getenv("VGPULIMIT_LOG");
    const char *hami_log = getenv("LIBCUDA_LOG_LEVEL");
    if (log)
        set_log_level(log);
    else if (hami_log)
        set_hami_log_level(hami_log);

    bool have_memory = false, have_cores = false, have_region = false;
    for (char **env = environ; env && *env; env++) {
        const char *entry = *env;
        if (strncmp(entry, PREFIX, sizeof PREFIX - 1) != 0)
            continue;
        const char *eq = strchr(entry, '=');
        if (!eq)
            continue;
        size_t name_len = (size_t)(eq - entry);
        const char *value = eq + 1;
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)name_len, entry);
        int device;
        if ((device = device_suffix(name, name_len, "VGPULIMIT_MEMORY")) != -2) {
            read_memory(name, device, value);
            have_memory = true;
        } else if ((device = device_suffix(name, name_len, "VGPULIMIT_CORES")) != -2) {
            read_cores(name, device, value);
            have_cores = true;
        } else if (strcmp(name, "VGPULIMIT_REGION") == 0) {
            read_region(name, value);
            have_region = true;
        } else if (strcmp(name, "VGPULIMIT_LOG") != 0) {
            vgl_log(VGL_LOG_WARN, "%s is not a vgpulimit variable (VGPULIMIT_MEMORY[_<i>], "
                                  "VGPULIMIT_CORES[_<i>], VGPULIMIT_REGION, VGPULIMIT_LOG); ignored",
                    name);
            continue;
        }
        vgl_config.enabled = true;
    }
    load_hami(have_memory, have_cores, have_region);
    if (!vgl_config.region_path[0])
        default_region_path();
}

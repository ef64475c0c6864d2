/* The one reader of the environment contract (vgpulimit/environment.h has the
 * precedence).  No getenv, no globals: it reads the array it is given, so the
 * Python side can ask what a process would make of an environment before it
 * starts one. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "vgpulimit/environment.h"
#include "vgpulimit/region.h"

enum kind { MEMORY, CORES, REQUEST, KINDS };
enum tier { PORTION, HAMI, OURS, TIERS };

/* The limit variables: ours first, then HAMi-core's, as HAMi's device plugin
 * sets them, so that vgpulimit drops in where libvgpu.so was. */
static const struct family {
    const char *stem;
    enum kind kind;
    enum tier tier;
} FAMILIES[] = {
    /* Before VGPULIMIT_MEMORY, whose stem it starts with. */
    {"VGPULIMIT_MEMORY_REQUEST", REQUEST, OURS},
    {"VGPULIMIT_MEMORY", MEMORY, OURS},
    {"VGPULIMIT_CORES", CORES, OURS},
    {"CUDA_DEVICE_MEMORY_LIMIT", MEMORY, HAMI},
    {"CUDA_DEVICE_SM_LIMIT", CORES, HAMI},
};

static const char OUR_REGION[] = "VGPULIMIT_REGION";
static const char HAMI_REGION[] = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
static const char OUR_POLICY[] = "VGPULIMIT_CORES_POLICY";
static const char HAMI_POLICY[] = "GPU_CORE_UTILIZATION_POLICY";
static const char HAMI_DISABLE[] = "CUDA_DISABLE_CONTROL";
static const char OUR_PRIORITY[] = "VGPULIMIT_PRIORITY";
static const char OUR_WAIT[] = "VGPULIMIT_MEMORY_WAIT";
static const char HAMI_PRIORITY[] = "CUDA_TASK_PRIORITY";
static const char KAI_PORTION[] = "GPU_PORTION";
static const char KAI_MOUNT[] = "CONTAINER_VGPU_MOUNT";
static const char MPS_PIPE[] = "CUDA_MPS_PIPE_DIRECTORY";
/* What HAMi's DRA driver writes as CUDA_DEVICE_SM_LIMIT_<i> where the claim's
 * allocation consumes no "cores" (hami_core.go, GetCDIContainerEdits). */
static const uint32_t HAMI_DRA_DEFAULT_CORES = 60;
static const char OUR_SETTER[] = "VGPULIMIT_SETTER";
/* The timing table's overrides (timings.c reads them). */
static const char OUR_TIMINGS[] = "VGPULIMIT_TIMING_";

static const char *lookup(char **envp, const char *name);

/* One value for one device, before the tiers are merged. */
struct candidate {
    bool set;
    struct vgl_mem_limit memory;
    uint32_t cores_pct;
    struct vgl_env_origin origin;
};

struct reading {
    struct vgl_env *out;
    struct candidate found[KINDS][TIERS][VGL_MAX_DEVICES]; /* [kind][tier][device] */
    const char *region[TIERS];
    const char *region_name[TIERS];
    char uuid_name[KINDS][VGL_MAX_DEVICES][VGL_ENV_NAME_LEN]; /* the variable of out->by_uuid[i] */
};

static void say(struct vgl_env *out, bool error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void say(struct vgl_env *out, bool error, const char *fmt, ...)
{
    if (error)
        out->errors++;
    if (out->lines == VGL_ENV_MAX_LINES)
        return;
    char line[VGL_ENV_LINE_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    for (uint32_t i = 0; i < out->lines; i++)
        if (strcmp(out->line[i], line) == 0)
            return; /* the same disagreement on every device is said once */
    memcpy(out->line[out->lines], line, sizeof line);
    out->line_is_error[out->lines++] = error;
}

/* "STEM" → -1 (every device); "STEM_3" → 3; -2: another name; -3: STEM_ with
 * a suffix that is no device index (said as an error: a limit the user meant
 * must not be dropped). */
static int device_of(const char *name, size_t len, const char *stem)
{
    size_t stem_len = strlen(stem);
    if (len < stem_len || strncmp(name, stem, stem_len) != 0)
        return -2;
    if (len == stem_len)
        return -1;
    if (name[stem_len] != '_')
        return -2;
    const char *digits = name + stem_len + 1;
    size_t n = len - stem_len - 1;
    int index = 0;
    if (n == 0 || n > 2)
        return -3;
    for (size_t i = 0; i < n; i++) {
        if (digits[i] < '0' || digits[i] > '9')
            return -3;
        index = index * 10 + (digits[i] - '0');
    }
    return index < VGL_MAX_DEVICES ? index : -3;
}

/* "1.5", "12.0": digits, a point, digits, no unit: read as a fraction of the
 * device and refused as more than all of it, though a size was meant. */
static bool unitless_above_one(const char *value)
{
    size_t whole = strspn(value, "0123456789");
    const char *frac = value + whole + 1;
    if (whole == 0 || value[whole] != '.' || frac[strspn(frac, "0123456789")])
        return false;
    while (whole > 1 && *value == '0') {
        value++;
        whole--;
    }
    if (whole > 1 || *value > '1')
        return true;
    return *value == '1' && frac[strspn(frac, "0")] != '\0';
}

/* The one line for a value of `name` that the parser refused with `err`,
 * worded as the Python side words a bad flag (limits.py LimitError). */
static void refuse(struct vgl_env *out, enum kind kind, const char *name, const char *value, int err)
{
    if (kind != CORES && err == -ERANGE && unitless_above_one(value))
        say(out, true, "%s=%s: %s what? (a fraction is 0-1; sizes need a unit, e.g. %sGiB)", name, value,
            value, value);
    else
        say(out, true, "%s: '%s' is %s; accepted forms: %s", name, value,
            err == -ERANGE ? "out of range (zero, or more than can be)" : "not a valid value",
            kind != CORES ? vgl_memory_forms() : vgl_cores_forms());
}

static void read_limit(struct reading *r, const struct family *f, const char *name, int device,
                       const char *value)
{
    enum vgl_env_source own = f->tier == OURS ? VGL_ENV_OURS_DEVICE : VGL_ENV_HAMI_DEVICE;
    const struct candidate *had = device >= 0 ? &r->found[f->kind][f->tier][device] : NULL;
    if (had && had->origin.source == own) {
        /* "_0" and "_00": two names of one device's limit, which the order
         * of the environment would otherwise settle, unseen. */
        say(r->out, true, "%s=%s and %s=%s both give device %d's %s: a limit given twice; give it "
            "once", had->origin.name, had->origin.text, name, value, device,
            f->kind == CORES ? "compute share" : f->kind == REQUEST ? "memory request" : "memory limit");
        return;
    }
    struct candidate c = {.set = true};
    int err = f->kind != CORES ? vgl_parse_memory(value, &c.memory) : vgl_parse_cores(value, &c.cores_pct);
    if (err) {
        refuse(r->out, f->kind, name, value, err);
        return;
    }
    c.origin.source = device < 0 ? (f->tier == OURS ? VGL_ENV_OURS : VGL_ENV_HAMI) : own;
    snprintf(c.origin.name, sizeof c.origin.name, "%s", name);
    snprintf(c.origin.text, sizeof c.origin.text, "%s", value);
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        struct candidate *slot = &r->found[f->kind][f->tier][i];
        /* Within a tier a device's own variable beats the one for all. */
        if ((i == device || device < 0) && (!slot->set || slot->origin.source <= c.origin.source))
            *slot = c;
    }
}

/* VGPULIMIT_MEMORY_GPU-<uuid>, VGPULIMIT_CORES_GPU-<uuid> (or MIG-<uuid>, a
 * MIG device's): a limit for the device with that UUID, whatever CUDA in the
 * container calls it (applied when the shim learns the UUID's ordinal:
 * shim/src/devices.c).  True when `name` is such a name (read, or said as an
 * error). */
static bool read_uuid_limit(struct reading *r, const struct family *f, const char *name, const char *value)
{
    struct vgl_env *out = r->out;
    const char *suffix = name + strlen(f->stem);
    if (f->tier != OURS || (strncmp(suffix, "_GPU-", 5) != 0 && strncmp(suffix, "_MIG-", 5) != 0))
        return false;
    out->asks = 1;
    uint8_t uuid[16];
    int bad = vgl_parse_uuid(suffix + 1, uuid);
    if (bad) {
        say(out, true, "%s: \"%s\" is %s; accepted: %s_GPU- or %s_MIG- and the UUID as nvidia-smi -L "
                       "prints it (GPU-8932f937-d72c-4106-c12f-20bd9faed9f6)", name, suffix + 1,
            bad == -ERANGE ? "all zeros, which is no device's UUID" : "not a GPU or MIG device UUID",
            f->stem, f->stem);
        return true;
    }
    static const uint32_t FLAG[KINDS] = {[MEMORY] = VGL_UUID_MEMORY, [CORES] = VGL_UUID_CORES,
                                         [REQUEST] = VGL_UUID_REQUEST};
    struct vgl_uuid_limit got = {.flags = FLAG[f->kind] | (suffix[1] == 'M' ? VGL_UUID_MIG : 0)};
    memcpy(got.uuid, uuid, sizeof uuid);
    int err = f->kind == CORES ? vgl_parse_cores(value, &got.cores_pct)
                               : vgl_parse_memory(value, f->kind == MEMORY ? &got.limit : &got.request);
    if (err) {
        refuse(out, f->kind, name, value, err);
        return true;
    }
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        struct vgl_uuid_limit *u = &out->by_uuid[i];
        if (u->flags && memcmp(u->uuid, uuid, sizeof uuid) != 0)
            continue;
        if (u->flags & FLAG[f->kind]) {
            /* The same UUID in another case, or as GPU- and MIG-. */
            say(out, true, "%s and %s both give the %s of one device: a limit given twice; give it once",
                r->uuid_name[f->kind][i], name,
                f->kind == CORES ? "compute share" : f->kind == REQUEST ? "memory request" : "memory limit");
            return true;
        }
        snprintf(r->uuid_name[f->kind][i], sizeof r->uuid_name[f->kind][i], "%s", name);
        memcpy(u->uuid, uuid, sizeof uuid);
        u->flags |= got.flags;
        if (f->kind == MEMORY)
            u->limit = got.limit;
        else if (f->kind == REQUEST)
            u->request = got.request;
        else
            u->cores_pct = got.cores_pct;
        return true;
    }
    say(out, true, "%s: more than %d devices have limits by UUID", name, VGL_MAX_DEVICES);
    return true;
}

static bool same(const struct candidate *a, const struct candidate *b, enum kind kind)
{
    if (kind == CORES)
        return a->cores_pct == b->cores_pct;
    return a->memory.bytes == b->memory.bytes && a->memory.ppm == b->memory.ppm;
}

/* -- the forms of HAMi's DRA driver and of KAI ----------------------------------------------- */

/* KAI's GPU_PORTION: the share of each device's memory, always a fraction
 * ("0.5"; "1" is the whole device), never a size. */
static void read_portion(struct reading *r, const char *value)
{
    struct candidate c = {.set = true};
    char text[32];
    size_t len = strlen(value);
    bool fraction_form = len > 0 && strspn(value, "0123456789.") == len && len + 3 <= sizeof text;
    int err = -EINVAL;
    if (fraction_form) {
        snprintf(text, sizeof text, "%s%s", value, strchr(value, '.') ? "" : ".0");
        err = vgl_parse_memory(text, &c.memory);
    }
    if (err || !c.memory.ppm) {
        say(r->out, true, "%s: '%s' is %s; accepted: a fraction of the GPU from 0 to 1 (0.5)", KAI_PORTION,
            value, err == -ERANGE ? "out of range (zero, or more than the GPU)" : "not a fraction of the GPU");
        return;
    }
    c.origin.source = VGL_ENV_PORTION;
    snprintf(c.origin.name, sizeof c.origin.name, "%s", KAI_PORTION);
    snprintf(c.origin.text, sizeof c.origin.text, "%s", value);
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        r->found[MEMORY][PORTION][i] = c;
}

/* HAMi's DRA driver numbers the devices of a claim in the order it walks
 * them, not as CUDA numbers the container's devices, and every claim of a
 * container numbers from 0.  So in its form (the cache file under
 * .../vgpu/claims/<claim>/) an index names no device: each indexed limit is
 * applied to every device, the tightest winning, which never gives a device
 * more than its claim was given. */
static bool tighter(const struct candidate *a, const struct candidate *b, enum kind kind)
{
    if (kind == CORES)
        return a->cores_pct < b->cores_pct;
    if (a->memory.bytes && b->memory.bytes)
        return a->memory.bytes < b->memory.bytes;
    if (a->memory.ppm && b->memory.ppm)
        return a->memory.ppm < b->memory.ppm;
    return a->memory.bytes != 0; /* a size against a share: the driver writes sizes */
}

static void spread_claim_indices(struct reading *r)
{
    const char *cache = r->region[HAMI];
    if (!cache || !strstr(cache, "/vgpu/claims/"))
        return;
    for (int kind = MEMORY; kind <= CORES; kind++) {
        struct candidate *found = r->found[kind][HAMI];
        const struct candidate *tightest = NULL;
        bool differ = false;
        for (int i = 0; i < VGL_MAX_DEVICES; i++) {
            if (found[i].origin.source != VGL_ENV_HAMI_DEVICE)
                continue;
            if (tightest && !same(&found[i], tightest, kind))
                differ = true;
            if (!tightest || tighter(&found[i], tightest, kind))
                tightest = &found[i];
        }
        if (!tightest)
            continue;
        struct candidate use = *tightest;
        bool ours = false;
        for (int i = 0; i < VGL_MAX_DEVICES; i++)
            ours = ours || r->found[CORES][OURS][i].set;
        /* A user who asked for memory only did not expect 60% of the time. */
        if (kind == CORES && use.cores_pct == HAMI_DRA_DEFAULT_CORES && !ours)
            say(r->out, false, "%s=%u holds this container to %u%% of the GPU's compute: HAMi's DRA driver "
                "writes %u also where the claim asks for no cores (ask for \"cores\": 100 for all of it)",
                use.origin.name, use.cores_pct, use.cores_pct, use.cores_pct);
        if (differ)
            say(r->out, false, "%s=\"%s\" applies to every device: the indices of HAMi's DRA form (%s under "
                "/vgpu/claims/) need not be the container's device numbers, and the tightest is kept",
                use.origin.name, use.origin.text, HAMI_REGION);
        for (int i = 0; i < VGL_MAX_DEVICES; i++)
            if (found[i].origin.source <= VGL_ENV_HAMI_DEVICE)
                found[i] = use;
    }
}

/* A name as Kubernetes makes a pod's UID (a UUID, or a static pod's hash)
 * and a container's name (a DNS label): 1-63 letters, digits, '-' and '.',
 * starting with a letter or a digit.  The pair names a directory that the
 * node's views and metrics show, and a tenant can set both in its own
 * environment: a byte outside these (not UTF-8, a newline, '/', '_', which
 * splits the pair) would be its to choose there. */
static bool ascii_alnum(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Not isalnum(): the application's locale may call a byte above 0x7f a letter. */
static bool kubernetes_name(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > 63 || !ascii_alnum(name[0]))
        return false;
    for (size_t i = 0; i < len; i++)
        if (!ascii_alnum(name[i]) && name[i] != '-' && name[i] != '.')
            return false;
    return true;
}

/* `text` for a line of the log: printable ASCII as it is, every other byte
 * as \xNN, cut to fit `out`. */
static const char *escaped(const char *text, char *out, size_t len)
{
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)text; *c && n + 5 < len; c++)
        n += (size_t)snprintf(out + n, len - n, *c >= 0x20 && *c < 0x7f && *c != '\\' ? "%c" : "\\x%02x", *c);
    out[n] = '\0';
    return out;
}

/* KAI's resource isolator names no cache file: it gives the container the
 * node's vgpu directory at CONTAINER_VGPU_MOUNT with POD_UID and
 * CONTAINER_NAME, and the library keeps its file in
 * <mount>/containers/<pod uid>_<container>/, where the node's monitor looks. */
static void kai_region(char **envp, struct vgl_env *out)
{
    const char *mount = lookup(envp, KAI_MOUNT), *pod = lookup(envp, "POD_UID"),
               *name = lookup(envp, "CONTAINER_NAME");
    if (!mount || !pod || !name || out->region_path[0] || !out->asks)
        return;
    bool usable = mount[0] == '/' && kubernetes_name(pod) && kubernetes_name(name);
    int n = usable ? snprintf(out->region_path, sizeof out->region_path, "%s/containers/%s_%s/vgpulimit.cache",
                              mount, pod, name) : -1;
    if (n < 0 || (size_t)n >= sizeof out->region_path) {
        char shown[3][96];
        out->region_path[0] = '\0';
        say(out, false, "%s=\"%s\" with POD_UID=\"%s\" and CONTAINER_NAME=\"%s\" make no region path "
            "(an absolute directory, and Kubernetes names: 1-63 letters, digits, '-' and '.'); the region "
            "is the shim's own", KAI_MOUNT, escaped(mount, shown[0], sizeof shown[0]),
            escaped(pod, shown[1], sizeof shown[1]), escaped(name, shown[2], sizeof shown[2]));
        return;
    }
    out->region_dir_len = (uint32_t)strlen(mount);
    snprintf(out->region_from, sizeof out->region_from, "%s", KAI_MOUNT);
}

/* An MPS client (CUDA_MPS_PIPE_DIRECTORY set, as NVIDIA's DRA driver sets it
 * for an MPS claim): its compute is its MPS daemon's to share out, and the
 * memory cap holds.  A compute share given too is kept, never dropped: the
 * variable is one a tenant can set, and would otherwise shed its share by
 * naming any directory.  Both then apply, the tighter holding, said once. */
static void note_mps(char **envp, struct vgl_env *out)
{
    if (!lookup(envp, MPS_PIPE))
        return;
    out->mps = 1;
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        bool by_uuid = out->by_uuid[i].flags & VGL_UUID_CORES;
        if (!out->cores_from[i].source && !by_uuid)
            continue;
        char given[VGL_ENV_NAME_LEN + 70];
        snprintf(given, sizeof given, "%s%s%s", by_uuid ? "a compute share by UUID" : out->cores_from[i].name,
                 by_uuid ? "" : "=", by_uuid ? "" : out->cores_from[i].text);
        say(out, false, "%s is set: this MPS client's compute is held both by its MPS daemon's limits and by "
            "%s, the tighter applying; to leave compute to MPS, give it no compute share", MPS_PIPE, given);
        return;
    }
}

/* HAMi's CUDA_DISABLE_CONTROL, read as its device plugin reads it (Go's
 * strconv.ParseBool): true, and the plugin mounts no preload; a shim loaded
 * anyway enforces nothing, as HAMi-core.  It is the tenant's own switch in
 * HAMi's forms; limits vgpulimit set up (any VGPULIMIT_ variable) it cannot
 * turn off. */
static void read_disable(struct vgl_env *out, const char *value, const char *ours)
{
    static const char *const YES[] = {"1", "t", "T", "TRUE", "true", "True"};
    static const char *const NO[] = {"0", "f", "F", "FALSE", "false", "False"};
    for (int i = 0; i < 6; i++) {
        if (strcmp(value, NO[i]) == 0)
            return;
        if (strcmp(value, YES[i]) != 0)
            continue;
        if (ours)
            say(out, false, "%s=%s ignored: %s is set, and limits vgpulimit sets up cannot be turned off",
                HAMI_DISABLE, value, ours);
        else
            out->control_disabled = 1;
        return;
    }
    say(out, false, "%s=\"%s\" is neither true nor false; limits are enforced", HAMI_DISABLE, value);
}

/* -- elastic memory: the request and the wait ------------------------------------------------ */

static void read_wait(char **envp, struct vgl_env *out)
{
    const char *wait = lookup(envp, OUR_WAIT);
    if (!wait)
        return;
    out->asks = 1;
    int err = vgl_parse_wait(wait, &out->memory_wait_ns);
    if (err) {
        say(out, true, "%s: '%s' is %s; accepted forms: %s", OUR_WAIT, wait,
            err == -ERANGE ? "out of range (more than 1h)" : "not a valid value", vgl_wait_forms());
        return;
    }
    out->memory_wait_set = 1;
    out->memory_wait_from.source = VGL_ENV_OURS;
    snprintf(out->memory_wait_from.name, sizeof out->memory_wait_from.name, "%s", OUR_WAIT);
    snprintf(out->memory_wait_from.text, sizeof out->memory_wait_from.text, "%s", wait);
}

/* A request above its limit, where the two compare without the device's
 * size (both sizes, or both shares; a size against a share is held to the
 * limit when the device is seen, vgl_memory_request). */
static bool above(const struct vgl_mem_limit *request, const struct vgl_mem_limit *limit)
{
    if (request->bytes && limit->bytes)
        return request->bytes > limit->bytes;
    return request->ppm && limit->ppm && request->ppm > limit->ppm;
}

static void check_requests(struct vgl_env *out)
{
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        if (!above(&out->request[i], &out->memory[i]))
            continue;
        /* Two variables for every device disagree on each: said once. */
        char where[32] = "every device";
        if (out->request_from[i].source == VGL_ENV_OURS_DEVICE || out->memory_from[i].source == VGL_ENV_OURS_DEVICE ||
            out->memory_from[i].source == VGL_ENV_HAMI_DEVICE)
            snprintf(where, sizeof where, "device %d", i);
        say(out, true, "%s=%s is above the limit %s=%s on %s; a request is at most the limit "
            "(accepted forms: %s)", out->request_from[i].name, out->request_from[i].text,
            out->memory_from[i].name, out->memory_from[i].text, where, vgl_memory_forms());
    }
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        const struct vgl_uuid_limit *u = &out->by_uuid[i];
        if ((u->flags & VGL_UUID_REQUEST) && (u->flags & VGL_UUID_MEMORY) && above(&u->request, &u->limit)) {
            char uuid[41];
            vgl_format_uuid(u->uuid, uuid);
            say(out, true, "VGPULIMIT_MEMORY_REQUEST_%s is above the limit VGPULIMIT_MEMORY_%s; a request "
                "is at most the limit (accepted forms: %s)", uuid, uuid, vgl_memory_forms());
        }
    }
}

/* -- merging ---------------------------------------------------------------------------------- */

static void merge(struct reading *r)
{
    struct vgl_env *out = r->out;
    spread_claim_indices(r);
    for (int kind = MEMORY; kind < KINDS; kind++) {
        for (int i = 0; i < VGL_MAX_DEVICES; i++) {
            const struct candidate *ours = &r->found[kind][OURS][i], *hami = &r->found[kind][HAMI][i];
            const struct candidate *use = ours->set ? ours : hami->set ? hami : &r->found[kind][PORTION][i];
            if (!use->set)
                continue;
            if (ours->set && hami->set && !same(ours, hami, kind))
                say(out, false, "%s=\"%s\" and %s=\"%s\" disagree; %s applies", ours->origin.name,
                    ours->origin.text, hami->origin.name, hami->origin.text, ours->origin.name);
            if (kind == MEMORY) {
                out->memory[i] = use->memory;
                out->memory_from[i] = use->origin;
            } else if (kind == REQUEST) {
                out->request[i] = use->memory;
                out->request_from[i] = use->origin;
            } else {
                out->cores_pct[i] = use->cores_pct;
                out->cores_from[i] = use->origin;
            }
        }
    }
    const char *path = r->region[OURS] ? r->region[OURS] : r->region[HAMI];
    const char *from = r->region[OURS] ? OUR_REGION : HAMI_REGION;
    if (r->region[OURS] && r->region[HAMI] && strcmp(r->region[OURS], r->region[HAMI]) != 0)
        say(out, false, "%s=\"%s\" and %s=\"%s\" disagree; %s applies", OUR_REGION, r->region[OURS],
            HAMI_REGION, r->region[HAMI], OUR_REGION);
    if (!path)
        return;
    if (path[0] != '/' || strlen(path) >= sizeof out->region_path) {
        say(out, true, "%s=\"%s\" must be an absolute path to a region file", from, path);
        return;
    }
    strcpy(out->region_path, path);
    snprintf(out->region_from, sizeof out->region_from, "%s", from);
}

static int log_level_of(const char *value)
{
    static const char *const NAMES[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcmp(value, NAMES[i]) == 0)
            return i;
    return -1;
}

/* -- the Slurm job of a process, by its cgroups ------------------------------------------------ */

/* "job_<digits>" of `len` bytes at `c`: the digits' count, else 0. */
static size_t job_component(const char *c, size_t len)
{
    if (len <= 4 || strncmp(c, "job_", 4) != 0)
        return 0;
    return strspn(c + 4, "0123456789") == len - 4 ? len - 4 : 0;
}

int vgl_env_slurm_job(const char *text, char *job, unsigned long len)
{
    int found = -ENOENT;
    for (const char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        /* "hierarchy-id:controllers:path": the path is after the second ':' */
        const char *end = strchr(line, '\n'), *path = strchr(line, ':');
        path = path && (!end || path < end) ? strchr(path + 1, ':') : NULL;
        if (!end)
            end = line + strlen(line);
        if (!path || path > end)
            continue;
        bool below_slurm = false;
        for (const char *c = path + 1; c < end;) {
            const char *slash = memchr(c, '/', (size_t)(end - c));
            size_t n = (size_t)((slash ? slash : end) - c);
            size_t digits = below_slurm ? job_component(c, n) : 0;
            if (digits) {
                if (digits + 1 > len)
                    return -EINVAL;
                if (found == 0 && (strlen(job) != digits || strncmp(job, c + 4, digits) != 0))
                    return -EINVAL;
                memcpy(job, c + 4, digits);
                job[digits] = '\0';
                found = 0;
                break;
            }
            below_slurm = below_slurm || (n >= 5 && strncmp(c, "slurm", 5) == 0);
            c += n + 1;
        }
    }
    return found;
}

/* `vgpulimit run` marks the processes it gives a region (VGPULIMIT_SETTER).
 * One that has the mark but not the region -- `env -u VGPULIMIT_REGION`, a
 * wrapper that cleans the environment by a list -- has shed the region's
 * limits: said, never silent.  A process that drops the mark too cannot be
 * told from one that never had limits, which must stay silent. */
static void lost_region(char **envp, struct vgl_env *out)
{
    const char *setter = lookup(envp, OUR_SETTER);
    if (!setter || lookup(envp, OUR_REGION))
        return;
    say(out, false, "%s is not set, though %s=%.32s%s says this process was given a region: it runs %s",
        OUR_REGION, OUR_SETTER, setter, strlen(setter) > 32 ? "..." : "",
        !out->asks ? "with no limit"
        : out->region_path[0] ? "in another region, under its limits"
                              : "under its own limit variables only");
}

/* The value of `name` in envp, as getenv would find it (the first). */
static const char *lookup(char **envp, const char *name)
{
    size_t len = strlen(name);
    for (char **e = envp; e && *e; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            return *e + len + 1;
    return NULL;
}

/* The shim's log level: ours, else HAMi-core's. */
static void read_log(char **envp, struct vgl_env *out)
{
    out->log_level = -1;
    const char *log = lookup(envp, "VGPULIMIT_LOG");
    const char *hami_log = lookup(envp, "LIBCUDA_LOG_LEVEL");
    if (log) {
        out->log_level = log_level_of(log);
        if (out->log_level < 0)
            say(out, false, "VGPULIMIT_LOG=\"%s\" is not a level; accepted: error, warn, info, debug "
                            "(keeping warn)", log);
    } else if (hami_log && hami_log[0] >= '0' && hami_log[0] <= '9') {
        /* HAMi-core: 0 errors only, 1 warnings, 2 info, 3 and up debug. */
        out->log_level = hami_log[0] - '0' < 3 ? hami_log[0] - '0' : 3;
    }
}

/* The compute policy: ours beats HAMi-core's (FORCE hard, DEFAULT borrow,
 * DISABLE none; its DISABLE also drops its own share). */
static void read_policy(char **envp, struct vgl_env *out)
{
    out->cores_policy = -1;
    const char *policy = lookup(envp, OUR_POLICY);
    const char *policy_name = OUR_POLICY;
    if (!policy) {
        policy = lookup(envp, HAMI_POLICY);
        policy_name = HAMI_POLICY;
    }
    uint32_t policy_value;
    if (policy && vgl_parse_cores_policy(policy, &policy_value) == 0) {
        out->asks = 1;
        out->cores_policy = (int32_t)policy_value;
        out->cores_policy_from.source = policy_name == OUR_POLICY ? VGL_ENV_OURS : VGL_ENV_HAMI;
        snprintf(out->cores_policy_from.name, sizeof out->cores_policy_from.name, "%s", policy_name);
        snprintf(out->cores_policy_from.text, sizeof out->cores_policy_from.text, "%s", policy);
    } else if (policy) {
        out->asks = 1;
        say(out, true, "%s: '%s' is not a valid value; accepted forms: %s", policy_name, policy,
            vgl_cores_policy_forms());
    }
}

/* The priority: ours (high, normal, low) beats HAMi-core's (0 high, 1 low). */
static void read_priority(char **envp, struct vgl_env *out)
{
    out->priority = -1;
    const char *priority = lookup(envp, OUR_PRIORITY);
    const char *priority_name = priority ? OUR_PRIORITY : HAMI_PRIORITY;
    priority = priority ? priority : lookup(envp, HAMI_PRIORITY);
    uint32_t priority_value;
    if (priority) {
        out->asks = 1;
        bool ours_given = priority_name == OUR_PRIORITY;
        if ((ours_given ? vgl_parse_priority(priority, &priority_value)
                        : vgl_parse_hami_priority(priority, &priority_value)) == 0) {
            out->priority = (int32_t)priority_value;
            out->priority_from.source = ours_given ? VGL_ENV_OURS : VGL_ENV_HAMI;
            snprintf(out->priority_from.name, sizeof out->priority_from.name, "%s", priority_name);
            snprintf(out->priority_from.text, sizeof out->priority_from.text, "%s", priority);
        } else {
            say(out, true, "%s: '%s' is not a valid value; accepted forms: %s", priority_name, priority,
                ours_given ? vgl_priority_forms() : vgl_hami_priority_forms());
        }
    }
}

void vgl_env_read(char **envp, struct vgl_env *out)
{
    static struct reading zero;
    struct reading r = zero;
    memset(out, 0, sizeof *out);
    r.out = out;
    read_log(envp, out);
    read_policy(envp, out);
    read_priority(envp, out);
    read_wait(envp, out);
    const char *ours = NULL; /* a VGPULIMIT_ variable that sets something up */
    const char *hami_policy = lookup(envp, HAMI_POLICY);
    bool hami_cores_off = hami_policy && strcasecmp(hami_policy, "DISABLE") == 0;

    for (char **e = envp; e && *e; e++) {
        const char *entry = *e, *eq = strchr(entry, '=');
        if (!eq || (strncmp(entry, "VGPULIMIT_", 10) != 0 && strncmp(entry, "CUDA_DEVICE_", 12) != 0))
            continue;
        size_t len = (size_t)(eq - entry);
        const char *value = eq + 1;
        char name[VGL_ENV_NAME_LEN];
        snprintf(name, sizeof name, "%.*s", (int)len, entry);
        if (lookup(envp, name) != value)
            continue; /* a second entry of one name: getenv sees the first */
        if (strcmp(name, OUR_POLICY) == 0) {
            ours = OUR_POLICY; /* read above */
            continue;
        }
        if (strcmp(name, OUR_PRIORITY) == 0 || strcmp(name, OUR_WAIT) == 0) {
            ours = name[10] == 'P' ? OUR_PRIORITY : OUR_WAIT; /* read above */
            continue;
        }
        const struct family *f = NULL;
        int device = -2;
        for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0] && device == -2; i++)
            if ((device = device_of(entry, len, FAMILIES[i].stem)) != -2)
                f = &FAMILIES[i];
        if (f && device == -3 && read_uuid_limit(&r, f, name, value)) {
            ours = f->stem;
            continue;
        } else if (f && device == -3) {
            out->asks = 1;
            say(out, true, "%s: \"%s\" is not a device index; accepted: %s_0 to %s_%d (ASCII digits)",
                name, name + strlen(f->stem) + 1, f->stem, f->stem, VGL_MAX_DEVICES - 1);
        } else if (f) {
            /* HAMi-core reads an empty value or 0 as "no limit". */
            bool hami_none = f->tier == HAMI && (!value[0] || strcmp(value, "0") == 0);
            out->asks = 1;
            if (f->tier == OURS)
                ours = f->stem;
            if (!hami_none && !(f->tier == HAMI && f->kind == CORES && hami_cores_off))
                read_limit(&r, f, name, device, value);
        } else if (strcmp(name, OUR_REGION) == 0 || strcmp(name, HAMI_REGION) == 0) {
            enum tier tier = name[0] == 'V' ? OURS : HAMI;
            out->asks = 1;
            if (tier == OURS)
                ours = OUR_REGION;
            r.region[tier] = value;
        } else if (strncmp(name, "VGPULIMIT_", 10) == 0 && strcmp(name, "VGPULIMIT_LOG") != 0 &&
                   strcmp(name, OUR_SETTER) != 0 && strncmp(name, OUR_TIMINGS, sizeof OUR_TIMINGS - 1) != 0) {
            say(out, false, "%s is not a vgpulimit variable (VGPULIMIT_MEMORY[_<i>|_GPU-<uuid>|_MIG-<uuid>], "
                            "VGPULIMIT_CORES[_<i>|_GPU-<uuid>|_MIG-<uuid>], VGPULIMIT_CORES_POLICY, VGPULIMIT_PRIORITY, "
                            "VGPULIMIT_MEMORY_REQUEST[_<i>|_GPU-<uuid>|_MIG-<uuid>], VGPULIMIT_MEMORY_WAIT, "
                            "VGPULIMIT_REGION, VGPULIMIT_LOG); ignored", name);
        }
    }
    const char *portion = lookup(envp, KAI_PORTION);
    if (portion) {
        out->asks = 1;
        read_portion(&r, portion);
    }
    merge(&r);
    note_mps(envp, out);
    check_requests(out);
    kai_region(envp, out);
    lost_region(envp, out);
    const char *disable = lookup(envp, HAMI_DISABLE);
    if (disable)
        read_disable(out, disable, ours);
}

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

#include "limit_kinds.h"
#include "vgpulimit/environment.h"
#include "vgpulimit/region.h"

/* The limit kinds (limit_kinds.def): ours, HAMi-core's as HAMi's device
 * plugin sets them (so that vgpulimit drops in where libvgpu.so was) and
 * KAI's. */
static const struct vgl_limit_kind KINDS[VGL_KINDS] = {
#define VGL_LIMIT_KIND(id, what, ours, hami, kai, flag, per_device, by_uuid, annotation, parser, hami_parser, \
                       region_field, board_field, example, hami_example, help, device_help)                  \
    {#id, what, ours, hami, kai, flag, per_device, by_uuid, annotation, #parser, #hami_parser,                \
     region_field, board_field, example, hami_example, help, device_help},
#include "limit_kinds.def"
#undef VGL_LIMIT_KIND
};

const struct vgl_limit_kind *vgl_limit_kind(uint32_t index)
{
    return index < VGL_KINDS ? &KINDS[index] : NULL;
}

/* The parsers a row names (limits.h vgl_parse_<parser>): PARSER_ is none. */
enum parser { PARSER_memory, PARSER_cores, PARSER_cores_policy, PARSER_priority, PARSER_hami_priority,
              PARSER_wait, PARSER_ };

static const enum parser PARSE[VGL_KINDS][2] = {
#define VGL_LIMIT_KIND(id, what, ours, hami, kai, flag, per_device, by_uuid, annotation, parser, hami_parser, \
                       ...)                                                                                   \
    {PARSER_##parser, PARSER_##hami_parser},
#include "limit_kinds.def"
#undef VGL_LIMIT_KIND
};

/* A per-device kind's value is a percent (cores) or a memory limit. */
static bool percent(enum vgl_kind_id kind)
{
    return PARSE[kind][0] == PARSER_cores;
}

enum tier { PORTION, HAMI, OURS, TIERS };

/* One stem of a per-device kind: its variable in one tier. */
struct family {
    const char *stem;
    enum vgl_kind_id kind;
    enum tier tier;
};

static const char OUR_REGION[] = "VGPULIMIT_REGION";
static const char HAMI_REGION[] = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
static const char HAMI_DISABLE[] = "CUDA_DISABLE_CONTROL";
static const char KAI_MOUNT[] = "CONTAINER_VGPU_MOUNT";
static const char MPS_PIPE[] = "CUDA_MPS_PIPE_DIRECTORY";
/* What HAMi's DRA driver writes as CUDA_DEVICE_SM_LIMIT_<i> where the claim's
 * allocation consumes no "cores" (hami_core.go, GetCDIContainerEdits). */
static const uint32_t HAMI_DRA_DEFAULT_CORES = 60;
static const char OUR_SETTER[] = "VGPULIMIT_SETTER";
/* The timing table's overrides (timings.c reads them). */
static const char OUR_TIMINGS[] = "VGPULIMIT_TIMING_";

static const char *lookup(char **envp, const char *name);
static const char *first_of(char **envp, const char *name, size_t len);

/* One value for one device, before the tiers are merged. */
struct candidate {
    bool set;
    struct vgl_mem_limit memory;
    uint32_t cores_pct;
    struct vgl_env_origin origin;
};

struct reading {
    struct vgl_env *out;
    /* [the per-device kind's slot][tier][device] */
    struct candidate found[VGL_DEVICE_KINDS][TIERS][VGL_MAX_DEVICES];
    const char *region[TIERS];
    const char *region_name[TIERS];
    char uuid_name[VGL_DEVICE_KINDS][VGL_MAX_DEVICES][VGL_ENV_NAME_LEN]; /* the variable of out->by_uuid[i] */
};

/* A per-device kind's slot in struct reading: its place among them. */
static int slot(enum vgl_kind_id kind)
{
    int n = 0;
    for (int k = 0; k < (int)kind; k++)
        n += (int)KINDS[k].per_device;
    return n;
}

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
static void refuse(struct vgl_env *out, enum vgl_kind_id kind, const char *name, const char *value, int err)
{
    if (!percent(kind) && err == -ERANGE && unitless_above_one(value))
        say(out, true, "%s=%s: %s what? (a fraction is 0-1; sizes need a unit, e.g. %sGiB)", name, value,
            value, value);
    else
        say(out, true, "%s: '%s' is %s; accepted forms: %s", name, value,
            err == -ERANGE ? "out of range (zero, or more than can be)" : "not a valid value",
            !percent(kind) ? vgl_memory_forms() : vgl_cores_forms());
}

static void read_limit(struct reading *r, const struct family *f, const char *name, int device,
                       const char *value)
{
    enum vgl_env_source own = f->tier == OURS ? VGL_ENV_OURS_DEVICE : VGL_ENV_HAMI_DEVICE;
    struct candidate *found = r->found[slot(f->kind)][f->tier];
    const struct candidate *had = device >= 0 ? &found[device] : NULL;
    if (had && had->origin.source == own) {
        /* "_0" and "_00": two names of one device's limit, which the order
         * of the environment would otherwise settle, unseen. */
        say(r->out, true, "%s=%s and %s=%s both give device %d's %s: a limit given twice; give it "
            "once", had->origin.name, had->origin.text, name, value, device, KINDS[f->kind].what);
        return;
    }
    struct candidate c = {.set = true};
    int err = !percent(f->kind) ? vgl_parse_memory(value, &c.memory) : vgl_parse_cores(value, &c.cores_pct);
    if (err) {
        refuse(r->out, f->kind, name, value, err);
        return;
    }
    c.origin.source = device < 0 ? (f->tier == OURS ? VGL_ENV_OURS : VGL_ENV_HAMI) : own;
    snprintf(c.origin.name, sizeof c.origin.name, "%s", name);
    snprintf(c.origin.text, sizeof c.origin.text, "%s", value);
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        /* Within a tier a device's own variable beats the one for all. */
        if ((i == device || device < 0) && (!found[i].set || found[i].origin.source <= c.origin.source))
            found[i] = c;
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
    if (f->tier != OURS || !KINDS[f->kind].by_uuid ||
        (strncmp(suffix, "_GPU-", 5) != 0 && strncmp(suffix, "_MIG-", 5) != 0))
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
    /* Where a kind by UUID is kept: a row with by_uuid needs its flag and field here. */
    uint32_t flag = f->kind == VGL_KIND_memory ? VGL_UUID_MEMORY
                    : f->kind == VGL_KIND_memory_request ? VGL_UUID_REQUEST : VGL_UUID_CORES;
    struct vgl_uuid_limit got = {.flags = flag | (suffix[1] == 'M' ? VGL_UUID_MIG : 0)};
    memcpy(got.uuid, uuid, sizeof uuid);
    int err = percent(f->kind) ? vgl_parse_cores(value, &got.cores_pct)
                               : vgl_parse_memory(value, flag == VGL_UUID_MEMORY ? &got.limit : &got.request);
    if (err) {
        refuse(out, f->kind, name, value, err);
        return true;
    }
    for (int i = 0; i < VGL_MAX_DEVICES; i++) {
        struct vgl_uuid_limit *u = &out->by_uuid[i];
        if (u->flags && memcmp(u->uuid, uuid, sizeof uuid) != 0)
            continue;
        char *named = r->uuid_name[slot(f->kind)][i];
        if (u->flags & flag) {
            /* The same UUID in another case, or as GPU- and MIG-. */
            say(out, true, "%s and %s both give the %s of one device: a limit given twice; give it once",
                named, name, KINDS[f->kind].what);
            return true;
        }
        snprintf(named, VGL_ENV_NAME_LEN, "%s", name);
        memcpy(u->uuid, uuid, sizeof uuid);
        u->flags |= got.flags;
        if (flag == VGL_UUID_MEMORY)
            u->limit = got.limit;
        else if (flag == VGL_UUID_REQUEST)
            u->request = got.request;
        else
            u->cores_pct = got.cores_pct;
        return true;
    }
    say(out, true, "%s: more than %d devices have limits by UUID", name, VGL_MAX_DEVICES);
    return true;
}

static bool same(const struct candidate *a, const struct candidate *b, enum vgl_kind_id kind)
{
    if (percent(kind))
        return a->cores_pct == b->cores_pct;
    return a->memory.bytes == b->memory.bytes && a->memory.ppm == b->memory.ppm;
}

/* -- the forms of HAMi's DRA driver and of KAI ----------------------------------------------- */

/* KAI's GPU_PORTION: the share of each device's memory, always a fraction
 * ("0.5"; "1" is the whole device), never a size (a kind's KAI variable is
 * such a fraction, for every device). */
static void read_portion(struct reading *r, enum vgl_kind_id kind, const char *value)
{
    const char *name = KINDS[kind].kai;
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
        say(r->out, true, "%s: '%s' is %s; accepted: a fraction of the GPU from 0 to 1 (0.5)", name,
            value, err == -ERANGE ? "out of range (zero, or more than the GPU)" : "not a fraction of the GPU");
        return;
    }
    c.origin.source = VGL_ENV_PORTION;
    snprintf(c.origin.name, sizeof c.origin.name, "%s", name);
    snprintf(c.origin.text, sizeof c.origin.text, "%s", value);
    for (int i = 0; i < VGL_MAX_DEVICES; i++)
        r->found[slot(kind)][PORTION][i] = c;
}

/* HAMi's DRA driver numbers the devices of a claim in the order it walks
 * them, not as CUDA numbers the container's devices, and every claim of a
 * container numbers from 0.  So in its form (the cache file under
 * .../vgpu/claims/<claim>/) an index names no device: each indexed limit is
 * applied to every device, the tightest winning, which never gives a device
 * more than its claim was given. */
static bool tighter(const struct candidate *a, const struct candidate *b, enum vgl_kind_id kind)
{
    if (percent(kind))
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
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS; kind++) {
        if (!KINDS[kind].per_device || !KINDS[kind].hami[0])
            continue;
        struct candidate *found = r->found[slot(kind)][HAMI];
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
            ours = ours || r->found[slot(VGL_KIND_cores)][OURS][i].set;
        /* A user who asked for memory only did not expect 60% of the time. */
        if (kind == VGL_KIND_cores && use.cores_pct == HAMI_DRA_DEFAULT_CORES && !ours)
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

/* -- elastic memory: a request at most its limit ------------------------------------------- */

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
            say(out, true, "%s_%s is above the limit %s_%s; a request is at most the limit (accepted forms: "
                "%s)", KINDS[VGL_KIND_memory_request].ours, uuid, KINDS[VGL_KIND_memory].ours, uuid,
                vgl_memory_forms());
        }
    }
}

/* -- merging ---------------------------------------------------------------------------------- */

/* Our variable and HAMi's or KAI's on one device.  In a device plugin's
 * container (no hook) both arrive in the environment, the plugin's and the
 * pod author's alike, so neither may loosen the other: the tighter holds.  A
 * size and a share of the device cannot be weighed before the device is
 * known, and are refused rather than guessed. */
static const struct candidate *settle(struct vgl_env *out, const struct candidate *ours,
                                      const struct candidate *theirs, enum vgl_kind_id kind)
{
    bool comparable = percent(kind) || (ours->memory.bytes && theirs->memory.bytes) ||
                      (ours->memory.ppm && theirs->memory.ppm);
    if (!comparable) {
        say(out, true, "%s=\"%s\" and %s=\"%s\" disagree, and a size cannot be weighed against a share "
            "of the device: give both as sizes or both as shares (accepted forms: %s)", ours->origin.name,
            ours->origin.text, theirs->origin.name, theirs->origin.text, vgl_memory_forms());
        return NULL;
    }
    const struct candidate *use = tighter(theirs, ours, kind) ? theirs : ours;
    say(out, false, "%s=\"%s\" and %s=\"%s\" disagree; %s applies, the tighter: one may not loosen the "
        "other", ours->origin.name, ours->origin.text, theirs->origin.name, theirs->origin.text,
        use->origin.name);
    return use;
}

static void merge(struct reading *r)
{
    struct vgl_env *out = r->out;
    spread_claim_indices(r);
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS; kind++) {
        if (!KINDS[kind].per_device)
            continue;
        struct candidate (*found)[VGL_MAX_DEVICES] = r->found[slot(kind)];
        for (int i = 0; i < VGL_MAX_DEVICES; i++) {
            const struct candidate *ours = &found[OURS][i];
            const struct candidate *theirs = found[HAMI][i].set ? &found[HAMI][i] : &found[PORTION][i];
            const struct candidate *use = ours->set ? ours : theirs;
            if (!use->set)
                continue;
            if (ours->set && theirs->set && !same(ours, theirs, kind)) {
                use = settle(out, ours, theirs, kind);
                if (!use)
                    continue;
            }
            /* Where a per-device kind lands in struct vgl_env. */
            if (kind == VGL_KIND_memory) {
                out->memory[i] = use->memory;
                out->memory_from[i] = use->origin;
            } else if (kind == VGL_KIND_memory_request) {
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

/* The value of the first entry of envp named as the `len` bytes at `name`
 * (which need not end there): what getenv would find. */
static const char *first_of(char **envp, const char *name, size_t len)
{
    for (char **e = envp; e && *e; e++)
        if (strncmp(*e, name, len) == 0 && (*e)[len] == '=')
            return *e + len + 1;
    return NULL;
}

/* The value of `name` in envp, as getenv would find it (the first). */
static const char *lookup(char **envp, const char *name)
{
    return first_of(envp, name, strlen(name));
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

/* -- the kinds given once for every device: the compute policy, the priority, the wait --------- */

static const struct {
    const char *(*forms)(void);
    const char *range; /* what -ERANGE from the parser means */
} PARSERS[] = {
    [PARSER_cores_policy] = {vgl_cores_policy_forms, "out of range"},
    [PARSER_priority] = {vgl_priority_forms, "out of range"},
    [PARSER_hami_priority] = {vgl_hami_priority_forms, "out of range"},
    [PARSER_wait] = {vgl_wait_forms, "out of range (more than 1h)"},
};

static int parse_scalar(enum parser parser, const char *value, uint64_t *got)
{
    uint32_t small = 0;
    int err = -EINVAL;
    if (parser == PARSER_wait)
        return vgl_parse_wait(value, got);
    if (parser == PARSER_cores_policy)
        err = vgl_parse_cores_policy(value, &small);
    else if (parser == PARSER_priority)
        err = vgl_parse_priority(value, &small);
    else if (parser == PARSER_hami_priority)
        err = vgl_parse_hami_priority(value, &small);
    *got = small;
    return err;
}

/* Where a kind given once lands in struct vgl_env. */
static void store_scalar(struct vgl_env *out, enum vgl_kind_id kind, uint64_t value,
                         const struct vgl_env_origin *from)
{
    if (kind == VGL_KIND_cores_policy) {
        out->cores_policy = (int32_t)value;
        out->cores_policy_from = *from;
    } else if (kind == VGL_KIND_priority) {
        out->priority = (int32_t)value;
        out->priority_from = *from;
    } else if (kind == VGL_KIND_memory_wait) {
        out->memory_wait_ns = value;
        out->memory_wait_set = 1;
        out->memory_wait_from = *from;
    }
}

/* Ours beats HAMi-core's (the compute policy: FORCE hard, DEFAULT borrow,
 * DISABLE none, its DISABLE also dropping its own share; the priority: 0
 * high, 1 low). */
static void read_scalar(char **envp, struct vgl_env *out, enum vgl_kind_id kind)
{
    const struct vgl_limit_kind *k = &KINDS[kind];
    bool ours = lookup(envp, k->ours) != NULL;
    const char *name = ours || !k->hami[0] ? k->ours : k->hami;
    const char *value = lookup(envp, name);
    if (!value)
        return;
    out->asks = 1;
    enum parser parser = PARSE[kind][ours ? 0 : 1];
    uint64_t got;
    int err = parse_scalar(parser, value, &got);
    if (err) {
        say(out, true, "%s: '%s' is %s; accepted forms: %s", name, value,
            err == -ERANGE ? PARSERS[parser].range : "not a valid value", PARSERS[parser].forms());
        return;
    }
    struct vgl_env_origin from = {.source = ours ? VGL_ENV_OURS : VGL_ENV_HAMI};
    snprintf(from.name, sizeof from.name, "%s", name);
    snprintf(from.text, sizeof from.text, "%s", value);
    store_scalar(out, kind, got, &from);
}

/* -- reading ---------------------------------------------------------------------------------- */

/* The per-device kind whose variable `entry` (`len` bytes of name) is, and
 * the device as device_of says; -2: none.  The longest stem wins:
 * VGPULIMIT_MEMORY_REQUEST_0 is a request's, not a badly indexed limit. */
static int family_of(const char *entry, size_t len, struct family *f)
{
    int device = -2;
    size_t longest = 0;
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS; kind++) {
        for (enum tier tier = HAMI; tier <= OURS && KINDS[kind].per_device; tier++) {
            const char *stem = tier == OURS ? KINDS[kind].ours : KINDS[kind].hami;
            int d = stem[0] ? device_of(entry, len, stem) : -2;
            if (d != -2 && strlen(stem) > longest) {
                longest = strlen(stem);
                device = d;
                *f = (struct family){stem, kind, tier};
            }
        }
    }
    return device;
}

/* The variable of ours that names a kind given once, or NULL. */
static const char *scalar_named(const char *name)
{
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS; kind++)
        if (!KINDS[kind].per_device && strcmp(name, KINDS[kind].ours) == 0)
            return KINDS[kind].ours;
    return NULL;
}

static void unknown(struct vgl_env *out, const char *name)
{
    char known[512] = "";
    size_t n = 0;
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS && n < sizeof known; kind++)
        n += (size_t)snprintf(known + n, sizeof known - n, "%s%s, ", KINDS[kind].ours,
                              !KINDS[kind].per_device ? ""
                              : KINDS[kind].by_uuid   ? "[_<i>|_GPU-<uuid>|_MIG-<uuid>]"
                                                      : "[_<i>]");
    say(out, false, "%s is not a vgpulimit variable (%s%s, VGPULIMIT_LOG); ignored", name, known, OUR_REGION);
}

void vgl_env_read(char **envp, struct vgl_env *out)
{
    static struct reading zero;
    struct reading r = zero;
    memset(out, 0, sizeof *out);
    r.out = out;
    out->cores_policy = -1;
    out->priority = -1;
    read_log(envp, out);
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS; kind++)
        if (!KINDS[kind].per_device)
            read_scalar(envp, out, kind);
    const char *ours = NULL; /* a VGPULIMIT_ variable that sets something up */
    const char *hami_policy = lookup(envp, KINDS[VGL_KIND_cores_policy].hami);
    bool hami_cores_off = hami_policy && strcasecmp(hami_policy, "DISABLE") == 0;

    for (char **e = envp; e && *e; e++) {
        const char *entry = *e, *eq = strchr(entry, '=');
        if (!eq)
            continue;
        size_t len = (size_t)(eq - entry);
        struct family f = {0};
        int device = family_of(entry, len, &f);
        if (device == -2 && strncmp(entry, "VGPULIMIT_", 10) != 0 && strncmp(entry, "CUDA_DEVICE_", 12) != 0)
            continue;
        const char *value = eq + 1;
        char name[VGL_ENV_NAME_LEN];
        snprintf(name, sizeof name, "%.*s", (int)len, entry);
        if (first_of(envp, entry, len) != value)
            continue; /* a second entry of one name: getenv sees the first */
        if (scalar_named(name)) {
            ours = scalar_named(name); /* read above */
            continue;
        }
        if (device == -3 && read_uuid_limit(&r, &f, name, value)) {
            ours = f.stem;
            continue;
        } else if (device == -3) {
            out->asks = 1;
            say(out, true, "%s: \"%s\" is not a device index; accepted: %s_0 to %s_%d (ASCII digits)",
                name, name + strlen(f.stem) + 1, f.stem, f.stem, VGL_MAX_DEVICES - 1);
        } else if (device != -2) {
            /* HAMi-core reads an empty value or 0 as "no limit". */
            bool hami_none = f.tier == HAMI && (!value[0] || strcmp(value, "0") == 0);
            out->asks = 1;
            if (f.tier == OURS)
                ours = f.stem;
            if (!hami_none && !(f.tier == HAMI && percent(f.kind) && hami_cores_off))
                read_limit(&r, &f, name, device, value);
        } else if (strcmp(name, OUR_REGION) == 0 || strcmp(name, HAMI_REGION) == 0) {
            enum tier tier = name[0] == 'V' ? OURS : HAMI;
            out->asks = 1;
            if (tier == OURS)
                ours = OUR_REGION;
            r.region[tier] = value;
        } else if (strncmp(name, "VGPULIMIT_", 10) == 0 && strcmp(name, "VGPULIMIT_LOG") != 0 &&
                   strcmp(name, OUR_SETTER) != 0 && strncmp(name, OUR_TIMINGS, sizeof OUR_TIMINGS - 1) != 0) {
            unknown(out, name);
        }
    }
    for (enum vgl_kind_id kind = 0; kind < VGL_KINDS; kind++) {
        const char *portion = KINDS[kind].kai[0] ? lookup(envp, KINDS[kind].kai) : NULL;
        if (portion) {
            out->asks = 1;
            read_portion(&r, kind, portion);
        }
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

/* The simulated machine as the environment describes it (the devices' fixed
 * identity, which follows from it, is units.c's).
 *
 *   SIMGPU_PROFILE         what each device is: h100-80gb, h200-141gb, a100-40gb,
 *                          a100-80gb or l4 (default h200-141gb; profiles.c).  It
 *                          gives every default marked "the profile's" below
 *   SIMGPU_DEVICES         number of devices, 1-32 (default 1)
 *   SIMGPU_MEMORY          memory per device, an absolute size (default the
 *                          profile's), parsed by the project's one size parser
 *   SIMGPU_SMS             streaming multiprocessors per device: one number for
 *                          all, or one per device, comma-separated, 1-1024
 *                          (default the profile's: 132 on an H100 SXM; 114 is an
 *                          H100 PCIe).  A device with fewer is slower, so CUDA's
 *                          default order puts it later (devices.c)
 *   SIMGPU_CONTEXT_OVERHEAD  device memory each process's first context on a device
 *                          costs, shown in NVML as the process's, an absolute
 *                          size or 0 (default the profile's)
 *   SIMGPU_RESERVED        device memory the driver keeps for itself on each
 *                          device, an absolute size or 0 (default the profile's):
 *                          in NVML v1's used, v2's reserved, never free
 *   SIMGPU_DRIVER_VERSION  what cuDriverGetVersion reports (default 13000)
 *   SIMGPU_STATE           the machine-wide state file (default below)
 *   SIMGPU_KERNEL_US       how long a kernel runs, in microseconds, unless its
 *                          name says otherwise (default 10; see modules.c)
 *   SIMGPU_LAUNCH_US       the CPU time a kernel or graph launch takes in the
 *                          calling thread before its work is queued, in
 *                          microseconds, 0-1000 (default 4: an empty
 *                          cuLaunchKernel took 4-5 us on an H200's driver)
 *   SIMGPU_CONCURRENT_KERNELS  kernels of different streams of one context that
 *                          run at once, 1-128 (default 4; 1: one at a time)
 *   SIMGPU_TIMESLICE_US    how long a context holds a device while others wait,
 *                          100-1000000 (default 2000; timeline.c)
 *   SIMGPU_COPY_GBPS       bandwidth of each copy engine between host and
 *                          device, GB/s (10^9 bytes), 1-10000 (default the
 *                          profile's)
 *   SIMGPU_DEVICE_COPY_GBPS  bandwidth of copies within a device and of
 *                          memsets, GB/s, 1-100000 (default the profile's)
 *   SIMGPU_TRACE=1         log every cuGetProcAddress request to stderr
 *   SIMGPU_CALLS           a file to which each process appends the count of
 *                          driver calls it made, at exit (instruments.c)
 *   SIMGPU_FAIL            entry points that fail with CUDA_ERROR_UNKNOWN,
 *                          comma-separated (tests; only cuStreamIsCapturing[_ptsz],
 *                          and cuCheckpointProcessRestore: named in the target's
 *                          environment, its restores fail half way, FAILED)
 *   SIMGPU_MIG             each device's MIG instances (mig.c): one layout for
 *                          all, or one per device separated by ';', such as
 *                          3g.40gb,2g.20gb,1g.10gb or 3g.40gb@4;off (default
 *                          none: MIG disabled)
 *   SIMGPU_MIG_MONITOR     all (default) or none: whether NVML's MIG-wide
 *                          answers (a MIG parent's memory and processes, the
 *                          placements) are allowed, as for the host and a
 *                          container given NVIDIA_MIG_MONITOR_DEVICES=all, or
 *                          answer NVML_ERROR_NO_PERMISSION, as in a container
 *                          without that capability
 *   SIMGPU_NVML_ANSWER     what NVML functions answer, for tests of their callers:
 *                          FUNCTION:ANSWERS[,FUNCTION:ANSWERS...], where ANSWERS
 *                          are one or more answers separated by ';' that the
 *                          function's successive calls in the process give, the
 *                          last one repeating.  An answer is an NVML return name
 *                          without NVML_ERROR_ (NOT_FOUND, NOT_SUPPORTED,
 *                          NO_PERMISSION, UNINITIALIZED, FUNCTION_NOT_FOUND,
 *                          GPU_IS_LOST, UNKNOWN, ..., and SUCCESS), a decimal code,
 *                          INSUFFICIENT_SIZE=N (which also sets the function's
 *                          count out-argument to N: the process lists, the process
 *                          utilisation, the detail list), or `real` (what simgpu
 *                          answers unscripted).  A scripted answer leaves every
 *                          output untouched, but that count.  Every function of
 *                          nvml_api.def takes it (nvml_api.c); e.g.
 *                          nvmlDeviceGetProcessUtilization:INSUFFICIENT_SIZE=100;NOT_FOUND
 *
 * An empty variable counts as unset.  A bad value is reported once, naming the
 * variable and the accepted forms, and makes cuInit / nvmlInit fail.  Each
 * variable but SIMGPU_PROFILE is one row of sim_settings below: its name, its
 * reader and the field it fills. */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "state.h"
#include "base.h"

enum {
    SIM_DEFAULT_DEVICES = 1,
    SIM_DEFAULT_DRIVER_VERSION = 13000,
    SIM_DEFAULT_KERNEL_US = 10,
    SIM_DEFAULT_LAUNCH_US = 4,
    SIM_MAX_KERNEL_US = 60000000,   /* a minute: longer is surely a typo */
    SIM_DEFAULT_CONCURRENT = 4,
    SIM_DEFAULT_TIMESLICE_US = 2000,
    SIM_MAX_SMS = 1024,
};

static pthread_once_t sim_config_once = PTHREAD_ONCE_INIT;
static struct sim_config sim_config_value;
static bool sim_config_ok;

static const char *sim_env(const char *name)
{
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

/* A whole decimal number in [lo, hi], nothing else around it. */
static bool sim_parse_int(const char *text, long lo, long hi, long *out)
{
    if (*text < '0' || *text > '9')
        return false;
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* FNV-1a: names the default state file after the configuration, so machines of
 * different shapes never share a file. */
static uint64_t sim_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ULL;
    }
    return h;
}

static bool sim_default_state_path(struct sim_config *c)
{
    char key[128];
    snprintf(key, sizeof key, "simgpu state v%d devices %" PRIu32 " memory %" PRIu64 " reserved %" PRIu64
             " mig %" PRIx64, SIM_STATE_VERSION, c->device_count, c->memory_bytes, c->reserved_bytes, c->mig_layout);
    uint64_t h = sim_hash(key);
    const char *dir = sim_env("XDG_RUNTIME_DIR");
    struct stat st;
    int n;
    if (dir && stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && access(dir, W_OK | X_OK) == 0)
        n = snprintf(c->state_path, sizeof c->state_path, "%s/simgpu-%016" PRIx64 ".state", dir, h);
    else
        n = snprintf(c->state_path, sizeof c->state_path, "/tmp/simgpu-%u-%016" PRIx64 ".state",
                     (unsigned)getuid(), h);
    return n > 0 && (size_t)n < sizeof c->state_path;
}

/* SIMGPU_SMS: "132" for every device, or "132,114,132" one per device. */
static bool sim_parse_sms(const char *text, struct sim_config *c)
{
    char buf[SIM_MAX_DEVICES * 6];
    if (strlen(text) >= sizeof buf)
        return false;
    strcpy(buf, text);
    uint32_t n = 0;
    long v;
    for (char *item = buf, *comma; item; item = comma ? comma + 1 : NULL) {
        if ((comma = strchr(item, ',')))
            *comma = '\0';
        if (n == SIM_MAX_DEVICES || !sim_parse_int(item, 1, SIM_MAX_SMS, &v))
            return false;
        c->sms[n++] = (uint32_t)v;
    }
    if (n == 1)
        for (uint32_t d = 1; d < SIM_MAX_DEVICES; d++)
            c->sms[d] = c->sms[0];
    return n == 1 || n == c->device_count;
}

/* The units (mig.c): a GPU without MIG, or each of its MIG instances. */
static bool sim_mig_units(struct sim_config *cfg, char *message, size_t size)
{
    uint32_t n = 0;
    uint64_t hash = 0xcbf29ce484222325ULL;
    bool any = false;
    for (uint32_t d = 0; d < cfg->device_count; d++) {
        struct sim_gpu_mig *gpu = &cfg->mig[d];
        uint32_t wanted = gpu->enabled ? gpu->count : 1;
        if (n + wanted > SIM_MAX_DEVICES) {
            snprintf(message, size, "SIMGPU_MIG: %u devices and MIG instances in all are more than simgpu keeps "
                     "(%d); expected fewer devices or instances", n + wanted, SIM_MAX_DEVICES);
            return false;
        }
        cfg->gpu_unit[d] = gpu->enabled ? SIM_WHOLE_GPU : n;
        if (!gpu->enabled) {
            cfg->units[n++] = (struct sim_unit){.gpu = d, .instance = SIM_WHOLE_GPU, .sms = cfg->sms[d],
                                                .memory_bytes = cfg->memory_bytes,
                                                .reserved_bytes = cfg->reserved_bytes};
            continue;
        }
        any = true;
        for (uint32_t i = 0; i < gpu->count; i++) {
            struct sim_mig_instance *in = &gpu->instances[i];
            in->unit = n;
            /* No reserve of its own [inf]: the driver's is the parent's. */
            cfg->units[n++] = (struct sim_unit){.gpu = d, .instance = i, .sms = in->profile->sms,
                                                .memory_bytes = (uint64_t)in->profile->memory_mib << 20};
            /* FNV-1a over (device, profile id, start). */
            uint32_t key[3] = {d, in->profile->id, in->start};
            for (size_t b = 0; b < sizeof key; b++) {
                hash ^= ((const uint8_t *)key)[b];
                hash *= 0x100000001b3ULL;
            }
        }
    }
    cfg->unit_count = n;
    cfg->mig_layout = any ? hash : 0;
    return true;
}

/* ---- the settings: one row each ---------------------------------------------
 *
 * A row names its variable, how its text is read, and the field it fills.  The
 * rows are read in order, after the defaults (which SIMGPU_PROFILE gives):
 * SIMGPU_SMS is counted against SIMGPU_DEVICES, SIMGPU_RESERVED held to
 * SIMGPU_MEMORY, and SIMGPU_MIG made of the devices before it. */
struct sim_setting {
    const char *name;
    /* Reads `text` into c (NULL: unset, for a SIM_UNSET_TOO row); false after
     * one line naming the variable and what it takes. */
    bool (*read)(const struct sim_setting *s, const char *text, struct sim_config *c);
    size_t offset, size;      /* the field of struct sim_config it fills */
    long lo, hi;              /* a number's range */
    uint64_t scale;           /* a number's unit in its field: 1000 for _US into _ns */
    const char *expected;     /* what the line says is expected */
    const char *example;      /* what follows the range: ", such as ..." */
    unsigned flags;
};
enum {
    SIM_UNSET_TOO = 1,   /* read when unset too: it checks or builds on rows above */
    SIM_AFTER_GOOD = 2,  /* read only when every row above was good */
};

#define SIM_FIELD(f) offsetof(struct sim_config, f), sizeof(((struct sim_config *)0)->f)

static void sim_store(struct sim_config *c, const struct sim_setting *s, uint64_t value)
{
    char *field = (char *)c + s->offset;
    if (s->size == sizeof(uint32_t)) {
        uint32_t narrow = (uint32_t)value;
        memcpy(field, &narrow, sizeof narrow);
    } else {
        memcpy(field, &value, sizeof value);
    }
}

/* A whole number in [lo, hi], stored times `scale` (a uint32_t, int or uint64_t field). */
static bool sim_read_number(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    long v;
    if (!sim_parse_int(text, s->lo, s->hi, &v)) {
        sim_log("%s=%s: expected %s from %ld to %ld%s", s->name, text, s->expected, s->lo, s->hi, s->example);
        return false;
    }
    sim_store(c, s, (uint64_t)v * s->scale);
    return true;
}

/* An absolute size: a share of the device means nothing for the device itself. */
static bool sim_read_size(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    uint64_t bytes;
    if (vgl_parse_size(text, &bytes) != 0) {
        sim_log("%s=%s: expected %s", s->name, text, s->expected);
        return false;
    }
    sim_store(c, s, bytes);
    return true;
}

/* An absolute size or 0. */
static bool sim_read_size_or_zero(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    uint64_t bytes;
    if (strcmp(text, "0") == 0) {
        bytes = 0;
    } else if (vgl_parse_size(text, &bytes) != 0) {
        sim_log("%s=%s: expected an absolute size, such as %s, or 0", s->name, text, s->example);
        return false;
    }
    sim_store(c, s, bytes);
    return true;
}

/* SIMGPU_RESERVED, then the reserve held below the memory, set or not: a
 * smaller SIMGPU_MEMORY keeps the profile's reserve unless told otherwise. */
static bool sim_read_reserve(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    if (text && !sim_read_size_or_zero(s, text, c))
        return false;
    if (c->reserved_bytes < c->memory_bytes)
        return true;
    if (text)
        sim_log("%s=%s: the driver would keep all of a device of %" PRIu64 " bytes; expected less, "
                "or 0 for none", s->name, text, c->memory_bytes);
    else
        sim_log("SIMGPU_MEMORY=%s: no more than the %s profile's reserve of %" PRIu64 " bytes; set "
                "%s too (0 for none)", sim_env("SIMGPU_MEMORY"), c->profile->key, c->reserved_bytes, s->name);
    return false;
}

/* A string that fits its field. */
static bool sim_read_text(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    if (strlen(text) >= s->size) {
        sim_log("%s: expected %s shorter than %zu bytes", s->name, s->expected, s->size);
        return false;
    }
    memcpy((char *)c + s->offset, text, strlen(text) + 1);
    return true;
}

static bool sim_read_sms(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    if (sim_parse_sms(text, c))
        return true;
    sim_log("%s=%s: expected streaming multiprocessors per device, from 1 to %d: one number "
            "for every device, or one per device (%u), comma-separated, such as 132,114",
            s->name, text, SIM_MAX_SMS, c->device_count);
    return false;
}

/* SIMGPU_MIG's instances, then the units they and the other devices make. */
static bool sim_read_mig(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    (void)s;
    char message[1024];
    if ((text && !sim_mig_parse(text, c->profile, c->device_count, c->mig, message, sizeof message)) ||
        !sim_mig_units(c, message, sizeof message)) {
        sim_log("%s", message);
        return false;
    }
    return true;
}

static void sim_store_bool(struct sim_config *c, const struct sim_setting *s, bool value)
{
    memcpy((char *)c + s->offset, &value, sizeof value);
}

/* all or none. */
static bool sim_read_mig_monitor(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    if (strcmp(text, "none") != 0 && strcmp(text, "all") != 0) {
        sim_log("%s=%s: expected all (MIG-wide NVML queries allowed) or none (they answer "
                "NVML_ERROR_NO_PERMISSION)", s->name, text);
        return false;
    }
    sim_store_bool(c, s, strcmp(text, "all") == 0);
    return true;
}

/* True for one word (`expected`), false for any other: as the driver reads
 * CUDA_MODULE_LOADING, LAZY (the default since CUDA 12.2) or EAGER, taking any
 * other value as the default. */
static bool sim_read_word(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    sim_store_bool(c, s, strcmp(text, s->expected) == 0);
    return true;
}

/* True for any value but 0. */
static bool sim_read_switch(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    sim_store_bool(c, s, strcmp(text, "0") != 0);
    return true;
}

static bool sim_read_nvml_answers(const struct sim_setting *s, const char *text, struct sim_config *c)
{
    (void)s;
    char message[1024];
    if (!sim_nvml_scripts_parse(text, c->nvml_scripts, message, sizeof message)) {
        sim_log("%s", message);
        return false;
    }
    return true;
}

static const struct sim_setting sim_settings[] = {
    {"SIMGPU_DEVICES", sim_read_number, SIM_FIELD(device_count), 1, SIM_MAX_DEVICES, 1,
     "a number of devices", "", 0},
    {"SIMGPU_SMS", sim_read_sms, SIM_FIELD(sms), 0, 0, 0, NULL, NULL, 0},
    {"SIMGPU_MEMORY", sim_read_size, SIM_FIELD(memory_bytes), 0, 0, 0,
     "an absolute size per device, such as 16GiB, 80G, 24000MiB or a number of bytes", NULL, 0},
    {"SIMGPU_CONTEXT_OVERHEAD", sim_read_size_or_zero, SIM_FIELD(context_overhead_bytes), 0, 0, 0,
     NULL, "500MiB", 0},
    {"SIMGPU_RESERVED", sim_read_reserve, SIM_FIELD(reserved_bytes), 0, 0, 0, NULL, "615MiB", SIM_UNSET_TOO},
    {"SIMGPU_MIG", sim_read_mig, SIM_FIELD(mig), 0, 0, 0, NULL, NULL, SIM_UNSET_TOO | SIM_AFTER_GOOD},
    {"SIMGPU_MIG_MONITOR", sim_read_mig_monitor, SIM_FIELD(mig_monitor), 0, 0, 0, NULL, NULL, 0},
    {"SIMGPU_DRIVER_VERSION", sim_read_number, SIM_FIELD(driver_version), 2000, 99999, 1,
     "a CUDA version as an integer", ", such as 13000 (13.0) or 12080 (12.8)", 0},
    {"SIMGPU_KERNEL_US", sim_read_number, SIM_FIELD(kernel_ns), 0, SIM_MAX_KERNEL_US, 1000,
     "a kernel's duration in microseconds, a whole number", ", such as 10 or 2000", 0},
    {"SIMGPU_LAUNCH_US", sim_read_number, SIM_FIELD(launch_ns), 0, 1000, 1000,
     "the CPU time of a launch in microseconds, a whole number", ", such as 4", 0},
    {"SIMGPU_CONCURRENT_KERNELS", sim_read_number, SIM_FIELD(concurrent_kernels), 1, SIM_MAX_CONCURRENT, 1,
     "how many kernels of one context run at once, a whole number", "", 0},
    {"SIMGPU_TIMESLICE_US", sim_read_number, SIM_FIELD(timeslice_ns), 100, 1000000, 1000,
     "a time slice in microseconds, a whole number", ", such as 2000", 0},
    {"SIMGPU_COPY_GBPS", sim_read_number, SIM_FIELD(link_bytes_per_s), 1, 10000, 1000000000,
     "the bandwidth of a copy between host and device in GB/s, a whole number", ", such as 50", 0},
    {"SIMGPU_DEVICE_COPY_GBPS", sim_read_number, SIM_FIELD(device_bytes_per_s), 1, 100000, 1000000000,
     "the bandwidth of a copy within the device in GB/s, a whole number", ", such as 1500", 0},
    {"CUDA_MODULE_LOADING", sim_read_word, SIM_FIELD(eager_modules), 0, 0, 0, "EAGER", NULL, 0},
    {"SIMGPU_TRACE", sim_read_switch, SIM_FIELD(trace), 0, 0, 0, NULL, NULL, 0},
    {"SIMGPU_FAIL", sim_read_text, SIM_FIELD(fail), 0, 0, 0, "a list of entry points", NULL, 0},
    {"SIMGPU_NVML_ANSWER", sim_read_nvml_answers, SIM_FIELD(nvml_scripts), 0, 0, 0, NULL, NULL, 0},
    {"SIMGPU_CALLS", sim_read_text, SIM_FIELD(calls_path), 0, 0, 0, "a path", NULL, 0},
    {"SIMGPU_STATE", sim_read_text, SIM_FIELD(state_path), 0, 0, 0, "a path", NULL, 0},
};

/* What each setting is when unset: the profile's figures, else simgpu's own. */
static void sim_config_defaults(struct sim_config *c)
{
    const struct sim_profile *profile = c->profile;
    c->device_count = SIM_DEFAULT_DEVICES;
    for (uint32_t d = 0; d < SIM_MAX_DEVICES; d++)
        c->sms[d] = profile->sms;
    c->memory_bytes = profile->memory_bytes;
    c->context_overhead_bytes = profile->context_bytes;
    c->reserved_bytes = profile->reserved_bytes;
    c->mig_monitor = true;
    c->driver_version = SIM_DEFAULT_DRIVER_VERSION;
    c->kernel_ns = SIM_DEFAULT_KERNEL_US * 1000ULL;
    c->launch_ns = SIM_DEFAULT_LAUNCH_US * 1000ULL;
    c->concurrent_kernels = SIM_DEFAULT_CONCURRENT;
    c->timeslice_ns = SIM_DEFAULT_TIMESLICE_US * 1000ULL;
    c->link_bytes_per_s = profile->link_gbps * 1000000000ULL;
    c->device_bytes_per_s = profile->device_copy_gbps * 1000000000ULL;
}

static void sim_config_load(void)
{
    struct sim_config *c = &sim_config_value;
    bool ok = true;

    /* What the devices are comes first: it gives the defaults. */
    c->profile = sim_profile_default();
    const char *text = sim_env("SIMGPU_PROFILE");
    if (text) {
        const struct sim_profile *named = sim_profile_named(text);
        if (named) {
            c->profile = named;
        } else {
            char keys[256];
            sim_profile_keys(keys, sizeof keys);
            sim_log("SIMGPU_PROFILE=%s: expected the name of a GPU: %s", text, keys);
            ok = false;
        }
    }
    sim_config_defaults(c);

    for (size_t i = 0; i < sizeof sim_settings / sizeof *sim_settings; i++) {
        const struct sim_setting *s = &sim_settings[i];
        text = sim_env(s->name);
        if ((text || (s->flags & SIM_UNSET_TOO)) && (ok || !(s->flags & SIM_AFTER_GOOD)) && !s->read(s, text, c))
            ok = false;
    }

    /* Named after the whole configuration, so it comes last. */
    if (ok && !sim_env("SIMGPU_STATE")) {
        c->state_path_default = true;
        if (!sim_default_state_path(c)) {
            sim_log("XDG_RUNTIME_DIR: too long for the default state path; set SIMGPU_STATE");
            ok = false;
        }
    }

    sim_config_ok = ok;
}

const struct sim_config *sim_config(void)
{
    pthread_once(&sim_config_once, sim_config_load);
    return sim_config_ok ? &sim_config_value : NULL;
}

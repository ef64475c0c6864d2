/* MIG mode: each GPU's instances, from SIMGPU_MIG and the boards' profile
 * tables (mig_profiles.h, generated from src/vgpulimit/mig/profiles.json, the
 * tables the planner reads too).
 *
 *   SIMGPU_MIG   the GPU instances of each device: one layout for every device,
 *                or one per device separated by ';' (as many as SIMGPU_DEVICES).
 *                A layout is profile names, comma-separated, each placed at the
 *                first legal slot left free ("3g.40gb,2g.20gb,1g.10gb"), or at
 *                the first memory slice it names ("3g.40gb@4"); the named
 *                placements are made first, the rest in order after them.  An
 *                empty layout or "off": MIG disabled on that device.
 *
 * Each GPU instance holds one compute instance that spans it (id 0), which is
 * what mig-parted and HAMi create.  The GPU instance's id follows from its
 * placement as on A100 and H100 drivers [inf: ids seen in nvidia-smi mig -lgi
 * prints]: the whole GPU 0, the halves 1-2, the quarters 3-6, the eighths 7-14,
 * numbered from slice 0.  Its MIG device index (nvmlDeviceGetMigDeviceHandleByIndex)
 * is its place in the layout; indices past the last answer NOT_FOUND.
 *
 * Units (config.c numbers them) are where the state file keeps memory and
 * time: a GPU without MIG is one, and so is each MIG instance, which has its
 * own memory and its own timeline (instances run at once; contexts within one
 * time-slice).  The parent of MIG instances is no unit: its memory is theirs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"
#include "mig_profiles.h"

const struct sim_mig_model *sim_mig_model(const struct sim_profile *board)
{
    for (size_t m = 0; m < sizeof sim_mig_models / sizeof *sim_mig_models; m++)
        for (const char *const *name = sim_mig_models[m].names; *name; name++)
            if (strcmp(*name, board->key) == 0)
                return &sim_mig_models[m];
    return NULL;
}

static const struct sim_mig_profile *sim_mig_profile_named(const struct sim_mig_model *model, const char *name)
{
    for (uint32_t i = 0; i < model->profile_count; i++)
        if (strcmp(model->profiles[i].name, name) == 0)
            return &model->profiles[i];
    return NULL;
}

/* "a100-40gb, ...": the SIMGPU_PROFILE keys of the boards with MIG profiles. */
static void sim_mig_board_keys(char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (size_t m = 0; m < sizeof sim_mig_models / sizeof *sim_mig_models; m++)
        for (const char *const *name = sim_mig_models[m].names; *name && n < size; name++)
            if (sim_profile_named(*name))
                n += (size_t)snprintf(out + n, size - n, "%s%s", n ? ", " : "", *name);
}

/* "1g.10gb, 1g.10gb+me, ..." */
static void sim_mig_profile_names(const struct sim_mig_model *model, char *out, size_t size)
{
    size_t n = 0;
    for (uint32_t i = 0; i < model->profile_count && n < size; i++)
        n += (size_t)snprintf(out + n, size - n, "%s%s", i ? ", " : "", model->profiles[i].name);
}

/* "0-3, 4-7": a profile's legal slots, as memory slices. */
static void sim_mig_slots_text(const struct sim_mig_profile *p, char *out, size_t size)
{
    size_t n = 0;
    for (uint32_t i = 0; i < p->placement_count && n < size; i++) {
        uint32_t s = p->placements[i], e = s + p->memory_slices - 1;
        n += (size_t)(s == e ? snprintf(out + n, size - n, "%s%u", i ? ", " : "", s)
                             : snprintf(out + n, size - n, "%s%u-%u", i ? ", " : "", s, e));
    }
}

/* "0-3 by 4g.40gb, 4 by 1g.10gb": what holds the GPU's slices. */
static void sim_mig_taken_text(const struct sim_gpu_mig *gpu, char *out, size_t size)
{
    size_t n = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < gpu->count && n < size; i++) {
        const struct sim_mig_instance *in = &gpu->instances[i];
        uint32_t s = in->start, e = s + in->profile->memory_slices - 1;
        n += (size_t)(s == e ? snprintf(out + n, size - n, "%s%u by %s", i ? ", " : "", s, in->profile->name)
                             : snprintf(out + n, size - n, "%s%u-%u by %s", i ? ", " : "", s, e,
                                        in->profile->name));
    }
    if (!gpu->count)
        snprintf(out, size, "none");
}

static bool sim_mig_free(const struct sim_gpu_mig *gpu, uint32_t start, uint32_t slices)
{
    for (uint32_t i = 0; i < gpu->count; i++) {
        const struct sim_mig_instance *in = &gpu->instances[i];
        if (start < in->start + in->profile->memory_slices && in->start < start + slices)
            return false;
    }
    return true;
}

/* The id a driver gives the GPU instance at this placement (see the top). */
static uint32_t sim_mig_gi_id(uint32_t start, uint32_t slices)
{
    switch (slices) {
    case 8: return 0;
    case 4: return 1 + start / 4;
    case 2: return 3 + start / 2;
    default: return 7 + start;
    }
}

/* Places `p` on `gpu` at `start`, or at the first legal free slot when start
 * is negative: 0, or -1 after writing why into `why`. */
static int sim_mig_place(const struct sim_mig_model *model, struct sim_gpu_mig *gpu,
                         const struct sim_mig_profile *p, long start, char *why, size_t size)
{
    char slots[64], taken[256];
    sim_mig_slots_text(p, slots, sizeof slots);
    uint32_t same = 0, compute = 0;
    for (uint32_t i = 0; i < gpu->count; i++) {
        same += gpu->instances[i].profile == p;
        compute += gpu->instances[i].profile->compute_slices;
    }
    if (same == p->max_count) {
        snprintf(why, size, "%s: at most %u per GPU", p->name, p->max_count);
        return -1;
    }
    if (compute + p->compute_slices > model->compute_slices) {
        snprintf(why, size, "%s: needs %u compute slices, %u of %u left", p->name, p->compute_slices,
                 model->compute_slices - compute, model->compute_slices);
        return -1;
    }
    long at = -1;
    for (uint32_t i = 0; i < p->placement_count && at < 0; i++) {
        uint32_t s = p->placements[i];
        if ((start < 0 || s == (uint32_t)start) && sim_mig_free(gpu, s, p->memory_slices))
            at = s;
    }
    if (at < 0) {
        sim_mig_taken_text(gpu, taken, sizeof taken);
        bool legal = false;
        for (uint32_t i = 0; i < p->placement_count; i++)
            legal |= p->placements[i] == (uint32_t)start;
        if (start < 0)
            snprintf(why, size, "%s: no free slot among its slots %s (taken: %s)", p->name, slots, taken);
        else if (!legal)
            snprintf(why, size, "%s@%ld: it may not start at %ld (its slots: %s)", p->name, start, start, slots);
        else
            snprintf(why, size, "%s@%ld: slots %ld-%ld are not free (taken: %s)", p->name, start, start,
                     start + (long)p->memory_slices - 1, taken);
        return -1;
    }
    gpu->instances[gpu->count++] = (struct sim_mig_instance){
        .profile = p, .start = (uint32_t)at, .gi_id = sim_mig_gi_id((uint32_t)at, p->memory_slices), .ci_id = 0};
    return 0;
}

/* One device's layout (modified in place); false with `why`. */
static bool sim_mig_layout(const struct sim_mig_model *model, char *layout, struct sim_gpu_mig *gpu, char *why,
                           size_t size)
{
    *gpu = (struct sim_gpu_mig){0};
    if (!*layout || strcmp(layout, "off") == 0)
        return true;
    gpu->enabled = true;
    struct {
        const struct sim_mig_profile *profile;
        long start;
    } asked[SIM_MIG_MAX_INSTANCES + 1];
    uint32_t n = 0;
    for (char *item = layout, *comma; item; item = comma ? comma + 1 : NULL) {
        if ((comma = strchr(item, ',')))
            *comma = '\0';
        char *at = strchr(item, '@');
        long start = -1;
        if (at) {
            *at = '\0';
            char *end;
            start = strtol(at + 1, &end, 10);
            if (at[1] < '0' || at[1] > '9' || *end || start >= SIM_MIG_SLOTS) {
                snprintf(why, size, "%.64s@%.16s: expected the first memory slice, 0-%d", item, at + 1,
                         SIM_MIG_SLOTS - 1);
                return false;
            }
        }
        const struct sim_mig_profile *p = sim_mig_profile_named(model, item);
        if (!p) {
            char names[256];
            sim_mig_profile_names(model, names, sizeof names);
            snprintf(why, size, "%.64s is not a MIG profile of the %s; expected one of %.300s", item,
                     model->model, names);
            return false;
        }
        if (n == SIM_MIG_MAX_INSTANCES) {
            snprintf(why, size, "more than %d instances", SIM_MIG_MAX_INSTANCES);
            return false;
        }
        asked[n].profile = p;
        asked[n++].start = start;
    }
    for (int pass = 0; pass < 2; pass++) /* the named placements first */
        for (uint32_t i = 0; i < n; i++)
            if ((asked[i].start >= 0) == (pass == 0) &&
                sim_mig_place(model, gpu, asked[i].profile, asked[i].start, why, size) != 0)
                return false;
    return true;
}

bool sim_mig_parse(const char *text, const struct sim_profile *board, uint32_t device_count,
                   struct sim_gpu_mig mig[], char *message, size_t size)
{
    const struct sim_mig_model *model = sim_mig_model(board);
    char copy[2048], why[512] = "";
    if (strlen(text) >= sizeof copy) {
        snprintf(message, size, "SIMGPU_MIG: longer than %zu bytes", sizeof copy - 1);
        return false;
    }
    strcpy(copy, text);
    uint32_t layouts = 1;
    for (const char *p = copy; (p = strchr(p, ';')); p++)
        layouts++;
    if (layouts != 1 && layouts != device_count) {
        snprintf(message, size, "SIMGPU_MIG=%s: %u layouts for %u devices; expected one for every device, or one "
                 "per device separated by ';'", text, layouts, device_count);
        return false;
    }
    char *layout = copy;
    for (uint32_t d = 0; d < device_count; d++) {
        char *semicolon = strchr(layout, ';');
        if (semicolon)
            *semicolon = '\0';
        char mine[sizeof copy];
        strcpy(mine, layout);
        bool wants = *mine && strcmp(mine, "off") != 0;
        if (wants && !model) {
            char keys[256];
            sim_mig_board_keys(keys, sizeof keys);
            snprintf(message, size, "SIMGPU_MIG=%s: the %s has no MIG; expected SIMGPU_PROFILE to name a board "
                     "with MIG (%s)", text, board->name, keys);
            return false;
        }
        if (wants && !sim_mig_layout(model, mine, &mig[d], why, sizeof why)) {
            snprintf(message, size, "SIMGPU_MIG=%s: device %u: %s; a layout is profile names, comma-separated, "
                     "each optionally @ its first memory slice (3g.40gb@4)", text, d, why);
            return false;
        }
        if (semicolon && layouts > 1)
            layout = semicolon + 1;
    }
    return true;
}

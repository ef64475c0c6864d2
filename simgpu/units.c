/* The fixed identity of the simulated devices, GPUs and MIG instances (the
 * units config.c makes): their names, UUIDs and PCI addresses, the same in
 * every process and in both libraries (so that cuDeviceGetUuid and
 * nvmlDeviceGetUUID agree), from the configuration alone. */
#include <stdint.h>
#include <stdio.h>

#include "state.h"

const struct sim_mig_instance *sim_unit_instance(const struct sim_config *cfg, uint32_t unit)
{
    const struct sim_unit *u = &cfg->units[unit];
    return u->instance == SIM_WHOLE_GPU ? NULL : &cfg->mig[u->gpu].instances[u->instance];
}

void sim_unit_name(const struct sim_config *cfg, uint32_t unit, char *out, size_t size)
{
    const struct sim_mig_instance *in = sim_unit_instance(cfg, unit);
    if (in)
        snprintf(out, size, "%s MIG %s", cfg->profile->name, in->profile->name);
    else
        snprintf(out, size, "%s", cfg->profile->name);
}

/* splitmix64's finaliser: a fixed, well-spread function of the index. */
static uint64_t sim_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A UUID from a key: a GPU's index, or (for MIG) one above every index. */
static void sim_uuid_of(uint64_t key, uint8_t out[SIM_UUID_LEN])
{
    const uint64_t seed = 0x73696d677075ULL; /* "simgpu" */
    uint64_t hi = sim_mix(seed + 2 * key);
    uint64_t lo = sim_mix(seed + 2 * key + 1);
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(hi >> (56 - 8 * i));
        out[8 + i] = (uint8_t)(lo >> (56 - 8 * i));
    }
}

static void sim_uuid_text(const char *prefix, const uint8_t u[SIM_UUID_LEN], char out[41])
{
    snprintf(out, 41, "%s-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", prefix, u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

void sim_device_uuid(uint32_t index, uint8_t out[SIM_UUID_LEN])
{
    sim_uuid_of(index, out);
}

void sim_device_uuid_string(uint32_t index, char out[41])
{
    uint8_t u[SIM_UUID_LEN];
    sim_device_uuid(index, u);
    sim_uuid_text("GPU", u, out);
}

void sim_unit_uuid(const struct sim_config *cfg, uint32_t unit, uint8_t out[SIM_UUID_LEN])
{
    const struct sim_mig_instance *in = sim_unit_instance(cfg, unit);
    if (!in) {
        sim_device_uuid(cfg->units[unit].gpu, out);
        return;
    }
    sim_uuid_of(1ULL << 40 | (uint64_t)cfg->units[unit].gpu << 16 | in->profile->id << 8 | in->start, out);
}

void sim_unit_uuid_string(const struct sim_config *cfg, uint32_t unit, char out[41])
{
    uint8_t u[SIM_UUID_LEN];
    sim_unit_uuid(cfg, unit, u);
    sim_uuid_text(sim_unit_instance(cfg, unit) ? "MIG" : "GPU", u, out);
}

struct sim_pci_address sim_device_pci(const struct sim_config *cfg, uint32_t index)
{
    const struct sim_profile *p = cfg->profile;
    uint32_t n = sizeof p->slots / sizeof *p->slots;
    return (struct sim_pci_address){.domain = index / n, .bus = p->slots[index % n].bus,
                                    .device = p->slots[index % n].device};
}

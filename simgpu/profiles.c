/* simgpu's GPUs: named profiles of real boards, the one place where a model's
 * figures live (SIMGPU_PROFILE picks one; config.c lets SIMGPU_MEMORY,
 * SIMGPU_SMS, SIMGPU_CONTEXT_OVERHEAD, SIMGPU_RESERVED and the bandwidths
 * override its values, and the rest of simgpu reads the profile).
 *
 * Where each figure comes from:
 * - measured: the H200 141GB row's memory (143771 MiB), context (518 MiB),
 *   reserve (615 MiB = 644939776 B) and process-utilisation sample buffer
 *   (72), on driver 580.159.04 with CUDA 13.0 (docs/facts.md §1, "Measured
 *   on a real GPU");
 * - published: names as nvidia-smi prints them, memory totals as drivers
 *   report them, SM counts, compute capabilities, PCI device ids (pci.ids),
 *   clocks, bus widths, L2 and shared memory sizes (NVIDIA's data sheets and
 *   CUDA Programming Guide's tables), and the PCI slots of the systems each
 *   board usually comes in (DGX H100/H200, DGX A100, a cloud VM for the L4);
 * - approximate: every other board's context and reserve (the reserve as
 *   NVIDIA's own mock NVML profiles give it where they have the board, else a
 *   sibling's), their sample buffer (100, what other NVML clients report), the
 *   H200's bus ids and subsystem id (a DGX H200 laid out as a DGX H100), the
 *   PCI subsystem ids of the A100 80GB and the L4, and the copy bandwidths
 *   (what PCIe and the memory give a copy, not measured), and the BAR1
 *   sizes but the A100 80GB's (131072 MiB, which its 2g.20gb MIG device's
 *   32767 MiB in nvidia-smi corroborates: XuehaiPan/nvitop PR#8).
 *
 * A machine of more than eight boards puts each further eight in the next PCI
 * domain, at the same buses. */
#include <stdio.h>
#include <string.h>

#include "state.h"

#define MiB (1ULL << 20)
#define KiB 1024u

static const struct sim_profile sim_profiles[] = {
    {
        .key = "h100-80gb",
        .name = "NVIDIA H100 80GB HBM3",
        .memory_bytes = 81559 * MiB,
        .sms = 132,
        .cc_major = 9, .cc_minor = 0,
        .context_bytes = 500 * MiB,
        .reserved_bytes = 1024 * MiB,
        .process_samples = 100,
        .pci_device_id = 0x233010DE, .pci_subsystem_id = 0x16C110DE,
        .slots = {{0x18, 0}, {0x2A, 0}, {0x3A, 0}, {0x5D, 0}, {0x9A, 0}, {0xAB, 0}, {0xBA, 0}, {0xDB, 0}},
        .clock_khz = 1980000, .memory_clock_khz = 2619000, .memory_bus_bits = 5120,
        .l2_bytes = 50 * 1024 * KiB, .shared_per_sm = 228 * KiB, .shared_per_block_optin = 227 * KiB,
        .threads_per_sm = 2048,
        .link_gbps = 50, .device_copy_gbps = 1500,
        .bar1_mib = 131072,
    },
    {
        .key = "h200-141gb",
        .name = "NVIDIA H200",
        .memory_bytes = 143771 * MiB,
        .sms = 132,
        .cc_major = 9, .cc_minor = 0,
        .context_bytes = 518 * MiB,
        .reserved_bytes = 644939776,
        .process_samples = 72,
        .pci_device_id = 0x233510DE, .pci_subsystem_id = 0x18BE10DE,
        .slots = {{0x18, 0}, {0x2A, 0}, {0x3A, 0}, {0x5D, 0}, {0x9A, 0}, {0xAB, 0}, {0xBA, 0}, {0xDB, 0}},
        .clock_khz = 1980000, .memory_clock_khz = 3201000, .memory_bus_bits = 6144,
        .l2_bytes = 50 * 1024 * KiB, .shared_per_sm = 228 * KiB, .shared_per_block_optin = 227 * KiB,
        .threads_per_sm = 2048,
        .link_gbps = 50, .device_copy_gbps = 2200,
        .bar1_mib = 262144,
    },
    {
        .key = "a100-40gb",
        .name = "NVIDIA A100-SXM4-40GB",
        .memory_bytes = 40536 * MiB,
        .sms = 108,
        .cc_major = 8, .cc_minor = 0,
        .context_bytes = 420 * MiB,
        .reserved_bytes = 583 * MiB,
        .process_samples = 100,
        .pci_device_id = 0x20B010DE, .pci_subsystem_id = 0x134710DE,
        .slots = {{0x07, 0}, {0x0F, 0}, {0x47, 0}, {0x4E, 0}, {0x87, 0}, {0x90, 0}, {0xB7, 0}, {0xBD, 0}},
        .clock_khz = 1410000, .memory_clock_khz = 1215000, .memory_bus_bits = 5120,
        .l2_bytes = 40 * 1024 * KiB, .shared_per_sm = 164 * KiB, .shared_per_block_optin = 163 * KiB,
        .threads_per_sm = 2048,
        .link_gbps = 25, .device_copy_gbps = 700,
        .bar1_mib = 65536,
    },
    {
        .key = "a100-80gb",
        .name = "NVIDIA A100-SXM4-80GB",
        .memory_bytes = 81920 * MiB,
        .sms = 108,
        .cc_major = 8, .cc_minor = 0,
        .context_bytes = 420 * MiB,
        .reserved_bytes = 583 * MiB,
        .process_samples = 100,
        .pci_device_id = 0x20B210DE, .pci_subsystem_id = 0x147F10DE,
        .slots = {{0x07, 0}, {0x0F, 0}, {0x47, 0}, {0x4E, 0}, {0x87, 0}, {0x90, 0}, {0xB7, 0}, {0xBD, 0}},
        .clock_khz = 1410000, .memory_clock_khz = 1593000, .memory_bus_bits = 5120,
        .l2_bytes = 40 * 1024 * KiB, .shared_per_sm = 164 * KiB, .shared_per_block_optin = 163 * KiB,
        .threads_per_sm = 2048,
        .link_gbps = 25, .device_copy_gbps = 900,
        .bar1_mib = 131072,
    },
    {
        /* A PCIe card, as a cloud VM shows several: all on bus 0, one slot each. */
        .key = "l4",
        .name = "NVIDIA L4",
        .memory_bytes = 23034 * MiB,
        .sms = 58,
        .cc_major = 8, .cc_minor = 9,
        .context_bytes = 300 * MiB,
        .reserved_bytes = 400 * MiB,
        .process_samples = 100,
        .pci_device_id = 0x27B810DE, .pci_subsystem_id = 0x16CA10DE,
        .slots = {{0x00, 3}, {0x00, 4}, {0x00, 5}, {0x00, 6}, {0x00, 7}, {0x00, 8}, {0x00, 9}, {0x00, 10}},
        .clock_khz = 2040000, .memory_clock_khz = 6251000, .memory_bus_bits = 192,
        .l2_bytes = 48 * 1024 * KiB, .shared_per_sm = 100 * KiB, .shared_per_block_optin = 99 * KiB,
        .threads_per_sm = 1536,
        .link_gbps = 25, .device_copy_gbps = 130,
        .bar1_mib = 32768,
    },
};

/* The board the project was measured on: unconfigured, simgpu answers as
 * that driver did. */
#define SIM_DEFAULT_PROFILE "h200-141gb"

const struct sim_profile *sim_profile_named(const char *key)
{
    for (size_t i = 0; i < sizeof sim_profiles / sizeof *sim_profiles; i++)
        if (strcmp(sim_profiles[i].key, key) == 0)
            return &sim_profiles[i];
    return NULL;
}

const struct sim_profile *sim_profile_default(void)
{
    return sim_profile_named(SIM_DEFAULT_PROFILE);
}

size_t sim_profile_keys(char *out, size_t size)
{
    size_t n = 0;
    for (size_t i = 0; i < sizeof sim_profiles / sizeof *sim_profiles && n < size; i++)
        n += (size_t)snprintf(out + n, size - n, "%s%s", i ? ", " : "", sim_profiles[i].key);
    return n;
}

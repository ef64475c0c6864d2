/* Prints the region ABI (sizes and offsets) and fails if it moved: the
 * region file is shared by processes that may run different builds, so any
 * change here must bump VGL_REGION_VERSION and update these numbers.
 * tests/test_core.py compares the printout with the cffi binding's view. */
#include <stddef.h>
#include <stdio.h>

#include "vgpulimit/board.h"
#include "vgpulimit/region.h"

#define PIN(expr, expected)                                                         \
    do {                                                                            \
        printf("%s %zu\n", #expr, (size_t)(expr));                                  \
        if ((size_t)(expr) != (expected)) {                                         \
            fprintf(stderr, "%s is %zu, pinned at %zu: bump VGL_REGION_VERSION\n",  \
                    #expr, (size_t)(expr), (size_t)(expected));                     \
            failed = 1;                                                             \
        }                                                                           \
    } while (0)

int main(void)
{
    int failed = 0;
    PIN(VGL_REGION_VERSION, 10);
    PIN(sizeof(struct vgl_mem_limit), 16);
    PIN(sizeof(struct vgl_lock), 64);
    PIN(sizeof(struct vgl_device_state), 152);
    PIN(offsetof(struct vgl_device_state, limit), 0);
    PIN(offsetof(struct vgl_device_state, cores_pct), 16);
    PIN(offsetof(struct vgl_device_state, frozen), 20);
    PIN(offsetof(struct vgl_device_state, total_bytes), 24);
    PIN(offsetof(struct vgl_device_state, used_bytes), 32);
    PIN(offsetof(struct vgl_device_state, oom_refusals), 40);
    PIN(offsetof(struct vgl_device_state, throttled_ns), 48);
    PIN(offsetof(struct vgl_device_state, busy_ns), 56);
    PIN(offsetof(struct vgl_device_state, budget_ns), 64);
    PIN(offsetof(struct vgl_device_state, budget_at_ns), 72);
    PIN(offsetof(struct vgl_device_state, cores_policy), 80);
    PIN(offsetof(struct vgl_device_state, uuid_kind), 84);
    PIN(offsetof(struct vgl_device_state, lend_until_ns), 88);
    PIN(offsetof(struct vgl_device_state, uuid), 96);
    PIN(offsetof(struct vgl_device_state, request), 112);
    PIN(offsetof(struct vgl_device_state, waited_ns), 128);
    PIN(offsetof(struct vgl_device_state, wait_timeouts), 136);
    PIN(offsetof(struct vgl_device_state, borrow_refusals), 144);
    PIN(sizeof(struct vgl_slot), 376);
    PIN(offsetof(struct vgl_slot, pid), 4);
    PIN(offsetof(struct vgl_slot, host_pid), 8);
    PIN(offsetof(struct vgl_slot, busy), 12);
    PIN(offsetof(struct vgl_slot, start_time), 16);
    PIN(offsetof(struct vgl_slot, pid_ns), 24);
    PIN(offsetof(struct vgl_slot, flags), 32);
    PIN(offsetof(struct vgl_slot, used_bytes), 40);
    PIN(offsetof(struct vgl_slot, comm), 168);
    PIN(offsetof(struct vgl_slot, wait_since_ns), 184);
    PIN(offsetof(struct vgl_slot, waiting), 184 + 16 * 8);
    PIN(offsetof(struct vgl_region, version), 8);
    PIN(offsetof(struct vgl_region, header_size), 12);
    PIN(offsetof(struct vgl_region, file_size), 16);
    PIN(offsetof(struct vgl_region, generation), 24);
    PIN(offsetof(struct vgl_region, flags), 32);
    PIN(offsetof(struct vgl_region, parent), 40);
    PIN(offsetof(struct vgl_region, lock), 296);
    PIN(offsetof(struct vgl_region, devices), 360);
    PIN(offsetof(struct vgl_region, slots), 360 + 16 * 152);
    PIN(sizeof(struct vgl_uuid_limit), 56);
    PIN(offsetof(struct vgl_uuid_limit, limit), 16);
    PIN(offsetof(struct vgl_uuid_limit, cores_pct), 32);
    PIN(offsetof(struct vgl_uuid_limit, flags), 36);
    PIN(offsetof(struct vgl_uuid_limit, request), 40);
    PIN(offsetof(struct vgl_region, by_uuid), 360 + 16 * 152 + 1024 * 376);
    PIN(offsetof(struct vgl_region, priority), 360 + 16 * 152 + 1024 * 376 + 16 * 56);
    PIN(offsetof(struct vgl_region, board_row), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 4);
    PIN(offsetof(struct vgl_region, board_key), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 8);
    PIN(offsetof(struct vgl_region, board), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 16);
    PIN(offsetof(struct vgl_region, yielded_ns), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 272);
    PIN(offsetof(struct vgl_region, memory_wait_ns), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 272 + 16 * 8);
    PIN(offsetof(struct vgl_region, board_flags), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 272 + 16 * 8 + 8);
    PIN(sizeof(struct vgl_region), 360 + 16 * 152 + 1024 * 376 + 16 * 56 + 272 + 16 * 8 + 16);
    PIN(VGL_BOARD_VERSION, 3);
    PIN(sizeof(struct vgl_board_row), 888);
    PIN(offsetof(struct vgl_board_row, priority), 8);
    PIN(offsetof(struct vgl_board_row, owner_pid), 12);
    PIN(offsetof(struct vgl_board_row, owner_start), 16);
    PIN(offsetof(struct vgl_board_row, beacon), 24);
    PIN(offsetof(struct vgl_board_row, region_dev), 88);
    PIN(offsetof(struct vgl_board_row, region_ino), 96);
    PIN(offsetof(struct vgl_board_row, flags), 104);
    PIN(offsetof(struct vgl_board_row, memory_wait_ns), 112);
    PIN(offsetof(struct vgl_board_row, guarantee), 120);
    PIN(offsetof(struct vgl_board_row, guarantee_by_uuid), 120 + 16 * 16);
    PIN(sizeof(struct vgl_board_guarantee), 32);
    PIN(offsetof(struct vgl_board, version), 8);
    PIN(offsetof(struct vgl_board, rows), 12);
    PIN(offsetof(struct vgl_board, generation), 16);
    PIN(offsetof(struct vgl_board, row), 24);
    PIN(sizeof(struct vgl_board), 24 + 64 * 888);
    PIN(sizeof(struct vgl_beacon_device), 56);
    PIN(offsetof(struct vgl_beacon_device, busy_until_ns), 16);
    PIN(offsetof(struct vgl_beacon_device, launches), 24);
    PIN(offsetof(struct vgl_beacon_device, used_bytes), 32);
    PIN(offsetof(struct vgl_beacon_device, oldest_wait_ns), 40);
    PIN(offsetof(struct vgl_beacon_device, frees), 48);
    PIN(offsetof(struct vgl_beacon_device, waiters), 52);
    PIN(offsetof(struct vgl_beacon, device), 16);
    PIN(sizeof(struct vgl_beacon), 16 + 16 * 56);
    return failed;
}

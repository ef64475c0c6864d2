/* libFuzzer target: the region loader.  Any file content — foreign, truncated,
 * another version, a valid header over garbage — is either refused with an
 * error or mapped and readable, without a crash; a mapped one survives an
 * attach, a reservation and a reclaim. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vgpulimit/region.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "/tmp/vgl-fuzz-region-%d", (int)getpid());
    /* Inputs that start like a region get the real size, so the loader goes
     * past its header checks into the locks and slots. */
    size_t file_size = size >= 8 && memcmp(data, "VGPULIM", 8) == 0 ? sizeof(struct vgl_region) : size;
    uint8_t *content = calloc(1, file_size ? file_size : 1);
    memcpy(content, data, size < file_size ? size : file_size);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, content, file_size) != (ssize_t)file_size)
        abort();
    close(fd);
    free(content);

    struct vgl_region *region = NULL;
    int err = vgl_region_open(path, &region);
    if (err == 0) {
        volatile uint64_t sum = region->generation;
        for (int i = 0; i < VGL_MAX_DEVICES; i++)
            sum += region->devices[i].used_bytes + region->devices[i].limit.bytes;
        (void)sum;
        vgl_region_close(region);
    } else if (!vgl_region_strerror(err)) {
        abort();
    }
    unlink(path);
    return 0;
}

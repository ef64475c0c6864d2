/* A CUDA client driven one command per stdin line, one answer per stdout line,
 * whose commands are the driver-call sequences by which frameworks share
 * device memory between processes and give it back and take it again.  A
 * test runs two of them (two processes, or two containers) and steps them in
 * turn.  Answers: "ok [VALUE]" or the CUresult's number, "err N".
 *
 *   alloc MIB          cuMemAlloc (PyTorch's caching allocator's cudaMalloc)
 *   ipc_get            torch.multiprocessing's CUDA tensor sharing
 *                      (torch/multiprocessing/reductions.py, CuPy's
 *                      runtime.ipcGetMemHandle): cuIpcGetMemHandle of the block's
 *                      base; answers the handle in hex
 *   ipc_open HEX       the receiving side: cuIpcOpenMemHandle with
 *                      CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, as PyTorch passes it
 *   ipc_close          cuIpcCloseMemHandle, when the receiver's tensor dies
 *   free               cuMemFree of the block
 *   segment MIB        PyTorch's expandable segments (c10/cuda/CUDACachingAllocator.cpp,
 *                      ExpandableSegment): reserve the address range, cuMemCreate
 *                      with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, map, set access
 *   vmm MIB            one cuMemCreate of MIB, with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
 *                      mapped over a range of its own (vLLM's CuMemAllocator's allocation)
 *   export             ExpandableSegment::share: cuMemExportToShareableHandle; the fd
 *   listen PATH        a unix socket to receive a descriptor on
 *   send PATH          the descriptor over PATH with SCM_RIGHTS (NCCL's proxy, vLLM's
 *                      CuMemAllocator peers)
 *   recv               accept on the socket and take the descriptor
 *   pidfd PID FD       PyTorch's consumer (ExpandableSegment::fromShared): the fd
 *                      fetched from the producer with pidfd_open + pidfd_getfd
 *   import             cuMemImportFromShareableHandle of that descriptor, reserve,
 *                      map, set access (answers the size)
 *   close_fd           close(2) of the descriptor
 *   sleep              vLLM's sleep mode (vllm/device_allocator/cumem.py, CuMemAllocator.sleep;
 *                      SGLang's torch_memory_saver pause): cuMemUnmap + cuMemRelease of
 *                      every segment, the address range kept
 *   wake               CuMemAllocator.wake_up / resume: cuMemCreate + cuMemMap at the
 *                      same addresses, set access
 *   release            cuMemRelease of the last handle again (a double release)
 *   write BYTE / read  cuMemsetD8 / cuMemcpyDtoH of the first byte of what was opened,
 *                      or else of the segment, or else of the block
 *   host               NCCL's host cuMem (src/misc/cudawrap.cc, ncclCuMemHostAlloc):
 *                      the granularity of a CU_MEM_LOCATION_TYPE_HOST_NUMA allocation,
 *                      then cuMemCreate of it with a POSIX fd handle type, reserve, map,
 *                      set access for the device
 *   pool MIB           cudaMallocAsync IPC (PyTorch's CUDAMallocAsyncAllocator, CuPy's
 *                      MemoryAsyncPool): cuMemPoolCreate with a POSIX fd handle type,
 *                      cuMemAllocFromPoolAsync
 *   pool_export        cuMemPoolExportToShareableHandle: the pool's fd (then send)
 *   pool_ptr           cuMemPoolExportPointer of the block: the export data in hex
 *   pool_import        cuMemPoolImportFromShareableHandle of the received fd
 *   pool_open HEX      cuMemPoolImportPointer
 *   free_opened        cuMemFree of what pool_open gave (the importer frees first)
 *   free_async WHAT    cuMemFreeAsync on the default stream of the block, or of what
 *                      pool_open gave (WHAT: block or opened), as cudaFreeAsync does
 *   trim               cuMemPoolTrimTo(pool, 0)
 *   pool_destroy       cuMemPoolDestroy(pool)
 *   event              PyTorch's CUDA tensor sharing sends its event too: cuEventCreate
 *                      (CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), cuIpcGetEventHandle
 *   event_open HEX     cuIpcOpenEventHandle, then cuEventQuery
 *   record             cuEventRecord of the event on the default stream
 *   wait_event         cuStreamWaitEvent + cuStreamSynchronize on the default stream, as the
 *                      receiving side waits for the sender's work
 *   event_destroy      cuEventDestroy
 *   info               cuMemGetInfo: "ok FREE TOTAL"
 *   pid                this process's pid
 * Usage: share_client [DEVICE] */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "vgpulimit/cuda_abi.h"

CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes);
CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n);
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                      CUmemAllocationHandleType type, unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                        CUmemAllocationHandleType type);
CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream);
CUresult cuMemPoolDestroy(CUmemoryPool pool);
CUresult cuMemPoolExportToShareableHandle(void *handle_out, CUmemoryPool pool, CUmemAllocationHandleType type,
                                          unsigned long long flags);
CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool_out, void *handle, CUmemAllocationHandleType type,
                                            unsigned long long flags);
CUresult cuMemPoolExportPointer(CUmemPoolPtrExportData *data, CUdeviceptr ptr);
CUresult cuMemPoolImportPointer(CUdeviceptr *ptr, CUmemoryPool pool, CUmemPoolPtrExportData *data);
CUresult cuEventCreate(CUevent *event, unsigned int flags);
CUresult cuEventDestroy_v2(CUevent event);
CUresult cuEventRecord(CUevent event, CUstream stream);
CUresult cuEventQuery(CUevent event);
CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event);
CUresult cuIpcOpenEventHandle(CUevent *event, CUipcEventHandle handle);

#define MIB ((size_t)1 << 20)
/* vLLM and PyTorch map in pieces of the granularity: 2 MiB each here. */
#define PIECE ((size_t)2 << 20)

static int device;
static CUdeviceptr block;          /* alloc's */
static CUdeviceptr opened;         /* ipc_open's */
static CUdeviceptr range;          /* the segment's reserved range */
static size_t range_size;
static CUmemGenericAllocationHandle handles[4096];
static size_t n_handles;
static CUmemGenericAllocationHandle last_released;
static int fd = -1, listener = -1;
static CUmemoryPool pool;
static CUevent event;

/* A 64-byte handle or export data, in hex on one line. */
static void print_hex(const void *data, size_t n)
{
    printf("ok ");
    for (size_t i = 0; i < n; i++)
        printf("%02x", ((const unsigned char *)data)[i]);
    printf("\n");
}

static void parse_hex(const char *hex, void *data, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned v = 0;
        if (hex && strlen(hex) >= 2 * i + 2)
            sscanf(hex + 2 * i, "%2x", &v);
        ((unsigned char *)data)[i] = (unsigned char)v;
    }
}

static void answer(CUresult rc)
{
    if (rc == CUDA_SUCCESS)
        printf("ok\n");
    else
        printf("err %d\n", (int)rc);
}

static CUmemAllocationProp device_prop(void)
{
    return (CUmemAllocationProp){.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                 .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
}

static CUresult set_access(CUdeviceptr at, size_t size)
{
    CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return cuMemSetAccess(at, size, &access, 1);
}

/* Creates and maps the pieces of [range, range + range_size). */
static CUresult map_pieces(const CUmemAllocationProp *prop)
{
    for (size_t at = 0; at < range_size; at += PIECE) {
        CUmemGenericAllocationHandle h;
        CUresult rc = cuMemCreate(&h, PIECE, prop, 0);
        if (rc == CUDA_SUCCESS && (rc = cuMemMap(range + at, PIECE, 0, h, 0)) != CUDA_SUCCESS)
            cuMemRelease(h);
        if (rc != CUDA_SUCCESS)
            return rc;
        handles[n_handles++] = h;
    }
    return set_access(range, range_size);
}

static CUresult segment(size_t mib)
{
    range_size = mib * MIB;
    n_handles = 0;
    CUresult rc = cuMemAddressReserve(&range, range_size, 0, 0, 0);
    CUmemAllocationProp prop = device_prop();
    return rc == CUDA_SUCCESS ? map_pieces(&prop) : rc;
}

static CUresult one_handle(size_t mib)
{
    range_size = mib * MIB;
    n_handles = 0;
    CUmemAllocationProp prop = device_prop();
    CUmemGenericAllocationHandle h;
    CUresult rc = cuMemAddressReserve(&range, range_size, 0, 0, 0);
    if (rc == CUDA_SUCCESS && (rc = cuMemCreate(&h, range_size, &prop, 0)) == CUDA_SUCCESS) {
        handles[n_handles++] = h;
        if ((rc = cuMemMap(range, range_size, 0, h, 0)) == CUDA_SUCCESS)
            rc = set_access(range, range_size);
    }
    return rc;
}

static CUresult sleep_segments(void)
{
    CUresult rc = cuMemUnmap(range, range_size);
    for (size_t i = 0; rc == CUDA_SUCCESS && i < n_handles; i++)
        rc = cuMemRelease(last_released = handles[i]);
    n_handles = 0;
    return rc;
}

static int send_fd(const char *path)
{
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path);
    char byte = 0;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } control = {0};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    int rc = s >= 0 && connect(s, (struct sockaddr *)&addr, sizeof addr) == 0 && sendmsg(s, &msg, 0) == 1 ? 0 : -1;
    if (s >= 0)
        close(s);
    return rc;
}

static int recv_fd(void)
{
    int s = accept(listener, NULL, NULL);
    char byte;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    int got = -1;
    if (s >= 0 && recvmsg(s, &msg, 0) == 1) {
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        if (c && c->cmsg_type == SCM_RIGHTS)
            memcpy(&got, CMSG_DATA(c), sizeof got);
    }
    if (s >= 0)
        close(s);
    return got;
}

static void command(char *line)
{
    char *verb = strtok(line, " \n"), *arg = strtok(NULL, " \n"), *arg2 = strtok(NULL, " \n");
    if (!verb)
        return;
    CUdeviceptr first = opened ? opened : range ? range : block;
    if (!strcmp(verb, "alloc")) {
        answer(cuMemAlloc_v2(&block, strtoull(arg, NULL, 10) * MIB));
    } else if (!strcmp(verb, "ipc_get")) {
        CUipcMemHandle h;
        CUresult rc = cuIpcGetMemHandle(&h, block);
        if (rc == CUDA_SUCCESS)
            print_hex(&h, sizeof h);
        else
            answer(rc);
    } else if (!strcmp(verb, "ipc_open")) {
        CUipcMemHandle h;
        parse_hex(arg, &h, sizeof h);
        answer(cuIpcOpenMemHandle_v2(&opened, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    } else if (!strcmp(verb, "ipc_close")) {
        answer(cuIpcCloseMemHandle(opened));
    } else if (!strcmp(verb, "free")) {
        answer(cuMemFree_v2(block));
    } else if (!strcmp(verb, "segment")) {
        answer(segment(strtoull(arg, NULL, 10)));
    } else if (!strcmp(verb, "vmm")) {
        answer(one_handle(strtoull(arg, NULL, 10)));
    } else if (!strcmp(verb, "export")) {
        CUresult rc = cuMemExportToShareableHandle(&fd, handles[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (rc == CUDA_SUCCESS)
            printf("ok %d\n", fd);
        else
            answer(rc);
    } else if (!strcmp(verb, "listen")) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s", arg);
        listener = socket(AF_UNIX, SOCK_STREAM, 0);
        bool ok = listener >= 0 && bind(listener, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(listener, 1) == 0;
        printf(ok ? "ok\n" : "err errno %d\n", errno);
    } else if (!strcmp(verb, "send")) {
        printf(send_fd(arg) == 0 ? "ok\n" : "err errno %d\n", errno);
    } else if (!strcmp(verb, "recv")) {
        fd = recv_fd();
        printf(fd >= 0 ? "ok\n" : "err errno %d\n", errno);
    } else if (!strcmp(verb, "pidfd")) {
        int pidfd = (int)syscall(SYS_pidfd_open, atoi(arg), 0);
        fd = pidfd >= 0 ? (int)syscall(SYS_pidfd_getfd, pidfd, atoi(arg2), 0) : -1;
        printf(fd >= 0 ? "ok\n" : "err errno %d\n", errno);
        if (pidfd >= 0)
            close(pidfd);
    } else if (!strcmp(verb, "import")) {
        CUmemGenericAllocationHandle h;
        CUresult rc = cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        range_size = PIECE;
        if (rc == CUDA_SUCCESS && (rc = cuMemAddressReserve(&range, range_size, 0, 0, 0)) == CUDA_SUCCESS &&
            (rc = cuMemMap(range, range_size, 0, h, 0)) == CUDA_SUCCESS)
            rc = set_access(range, range_size);
        handles[0] = h;
        n_handles = 1;
        answer(rc);
    } else if (!strcmp(verb, "close_fd")) {
        printf(close(fd) == 0 ? "ok\n" : "err errno %d\n", errno);
    } else if (!strcmp(verb, "sleep")) {
        answer(sleep_segments());
    } else if (!strcmp(verb, "wake")) {
        CUmemAllocationProp prop = device_prop();
        answer(map_pieces(&prop));
    } else if (!strcmp(verb, "release")) {
        answer(cuMemRelease(last_released));
    } else if (!strcmp(verb, "write")) {
        answer(cuMemsetD8_v2(first, (unsigned char)atoi(arg), 1));
    } else if (!strcmp(verb, "read")) {
        unsigned char b = 0;
        CUresult rc = cuMemcpyDtoH_v2(&b, first, 1);
        if (rc == CUDA_SUCCESS)
            printf("ok %u\n", b);
        else
            answer(rc);
    } else if (!strcmp(verb, "host")) {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_HOST_NUMA, .id = 0}};
        size_t granularity = 0;
        CUresult rc = cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        range_size = strtoull(arg, NULL, 10) * MIB;
        n_handles = 0;
        if (rc == CUDA_SUCCESS && (rc = cuMemAddressReserve(&range, range_size, granularity, 0, 0)) == CUDA_SUCCESS)
            rc = map_pieces(&prop);
        answer(rc);
    } else if (!strcmp(verb, "pool")) {
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
        CUresult rc = cuMemPoolCreate(&pool, &props);
        answer(rc == CUDA_SUCCESS ? cuMemAllocFromPoolAsync(&block, strtoull(arg, NULL, 10) * MIB, pool, NULL) : rc);
    } else if (!strcmp(verb, "pool_export")) {
        CUresult rc = cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (rc == CUDA_SUCCESS)
            printf("ok %d\n", fd);
        else
            answer(rc);
    } else if (!strcmp(verb, "pool_ptr")) {
        CUmemPoolPtrExportData data;
        CUresult rc = cuMemPoolExportPointer(&data, block);
        if (rc == CUDA_SUCCESS)
            print_hex(&data, sizeof data);
        else
            answer(rc);
    } else if (!strcmp(verb, "pool_import")) {
        answer(cuMemPoolImportFromShareableHandle(&pool, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                                  0));
    } else if (!strcmp(verb, "pool_open")) {
        CUmemPoolPtrExportData data;
        parse_hex(arg, &data, sizeof data);
        answer(cuMemPoolImportPointer(&opened, pool, &data));
    } else if (!strcmp(verb, "free_opened")) {
        CUresult rc = cuMemFree_v2(opened);
        opened = 0;
        answer(rc);
    } else if (!strcmp(verb, "free_async")) {
        bool opened_one = arg && !strcmp(arg, "opened");
        answer(cuMemFreeAsync(opened_one ? opened : block, NULL));
        if (opened_one)
            opened = 0;
    } else if (!strcmp(verb, "trim")) {
        answer(cuMemPoolTrimTo(pool, 0));
    } else if (!strcmp(verb, "pool_destroy")) {
        answer(cuMemPoolDestroy(pool));
    } else if (!strcmp(verb, "event")) {
        CUipcEventHandle h;
        CUresult rc = cuEventCreate(&event, (unsigned)strtoul(arg ? arg : "6", NULL, 10));
        if (rc == CUDA_SUCCESS && (rc = cuIpcGetEventHandle(&h, event)) == CUDA_SUCCESS)
            print_hex(&h, sizeof h);
        else
            answer(rc);
    } else if (!strcmp(verb, "event_open")) {
        CUipcEventHandle h;
        parse_hex(arg, &h, sizeof h);
        CUresult rc = cuIpcOpenEventHandle(&event, h);
        answer(rc == CUDA_SUCCESS ? cuEventQuery(event) : rc);
    } else if (!strcmp(verb, "record")) {
        answer(cuEventRecord(event, NULL));
    } else if (!strcmp(verb, "wait_event")) {
        CUresult rc = cuStreamWaitEvent(NULL, event, 0);
        answer(rc == CUDA_SUCCESS ? cuStreamSynchronize(NULL) : rc);
    } else if (!strcmp(verb, "event_destroy")) {
        answer(cuEventDestroy_v2(event));
    } else if (!strcmp(verb, "info")) {
        size_t free_bytes = 0, total = 0;
        CUresult rc = cuMemGetInfo_v2(&free_bytes, &total);
        if (rc == CUDA_SUCCESS)
            printf("ok %zu %zu\n", free_bytes, total);
        else
            answer(rc);
    } else if (!strcmp(verb, "pid")) {
        printf("ok %d\n", (int)getpid());
    } else {
        printf("err unknown command %s\n", verb);
    }
}

int main(int argc, char **argv)
{
    device = argc > 1 ? atoi(argv[1]) : 0;
    CUdevice dev;
    CUcontext ctx;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, device) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("err no context\n");
        return 1;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    char line[512];
    while (fgets(line, sizeof line, stdin))
        command(line);
    return 0;
}

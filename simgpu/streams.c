/* simgpu's work on a device: launches (plain, Ex, cooperative, graphs),
 * streams, events, stream capture and synchronisation, all on the device
 * timelines of timeline.c.
 *
 * A launch returns at once; its kernel is queued on its device after all the
 * work that every process queued there before (timeline.c), and its stream
 * remembers when it ends.  So a stream is done when the clock passes its last
 * end, and synchronising sleeps until then.  An event recorded in a busy
 * stream completes with the stream's work before it; in an idle one, when the
 * device reaches it.  Either way, if the stream's next kernel is queued before
 * the event has completed, the event completes as that kernel starts: a real
 * GPU runs a stream's commands back to back once it runs the stream, so an
 * event just before a kernel marks when the kernel began, whatever else the
 * device ran meanwhile.  A process may have SIM_LAUNCH_QUEUE launches pending on a device;
 * the next launch waits for the oldest to end, as a real driver blocks the
 * launching thread when its push buffer is full.
 *
 * The default streams: the legacy one (NULL or CU_STREAM_LEGACY in a plain
 * entry point) is one per context; the per-thread one (CU_STREAM_PER_THREAD, or
 * NULL in a _ptsz entry point) one per thread and device.  A graph runs its
 * kernels back to back (simgpu runs one kernel at a time anyway). */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "driver.h"

enum {
    SIM_STREAM_MAGIC = 0x52545353,  /* "SSTR" */
    SIM_EVENT_MAGIC = 0x54564553,   /* "SEVT" */
    SIM_GRAPH_MAGIC = 0x50524753,   /* "SGRP" */
    SIM_NODE_MAGIC = 0x444f4e53,    /* "SNOD" */
    SIM_EXEC_MAGIC = 0x43584553,    /* "SEXC" */
    SIM_LAUNCH_QUEUE = 1024,
    SIM_SM_COUNT = 132,             /* cuDeviceGetAttribute's MULTIPROCESSOR_COUNT */
    SIM_SM_THREADS = 2048,
    SIM_SM_BLOCKS = 32,
    SIM_EVENT_FLAGS = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS,
    SIM_EVENT_RECORD_EXTERNAL = 1,  /* CU_EVENT_RECORD_EXTERNAL, CU_EVENT_WAIT_EXTERNAL */
    SIM_GRAPH_INSTANTIATE_FLAGS = 0xF,
};

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    int priority;
    uint64_t tail_ns;               /* the end of its last work (atomic) */
    CUgraph capture;                /* the graph it is capturing into, or NULL (atomic) */
    struct sim_link link;           /* guarded by sim_events.mutex */
};

enum sim_event_state {
    SIM_EVENT_NEW,                  /* never recorded: complete */
    SIM_EVENT_RECORDED,
    SIM_EVENT_CAPTURED,             /* last recorded in a capturing stream */
};

/* Never returned to malloc: an event destroyed goes to a free list and keeps
 * its serial, so a stream's link to it is safe to read and found stale. */
struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    uint32_t state;                 /* enum sim_event_state (atomic, stored after at_ns) */
    uint64_t at_ns;                 /* when it completes (atomic) */
    uint64_t serial;                /* bumped by every record; guarded by sim_events.mutex */
    struct CUevent_st *next_free;
};

struct CUgraphNode_st {
    uint32_t magic;
    CUgraph graph;
    uint64_t duration_ns;
    struct sim_graph_mem_op mem;    /* of a memory node (graph_memory.c); alloc NULL for others */
    struct CUgraphNode_st *next;
};

struct CUgraph_st {
    uint32_t magic;
    struct CUgraphNode_st *nodes;   /* guarded by sim_graphs_mutex */
};

struct CUgraphExec_st {
    uint32_t magic;
    uint64_t duration_ns;           /* of all its kernels */
    bool auto_free;                 /* CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH */
    struct sim_graph_mem_op *mem;   /* its memory nodes' steps, in node order */
    size_t n_mem;
};

static pthread_mutex_t sim_graphs_mutex = PTHREAD_MUTEX_INITIALIZER;

static struct {
    pthread_mutex_t mutex;          /* guards the free list, serials and links */
    struct CUevent_st *free;
} sim_events = {.mutex = PTHREAD_MUTEX_INITIALIZER};

/* This process's pending launches per device: when each ends, oldest first. */
static struct {
    pthread_mutex_t mutex;
    uint64_t end_ns[SIM_MAX_DEVICES][SIM_LAUNCH_QUEUE];
    uint32_t head[SIM_MAX_DEVICES];
    uint32_t count[SIM_MAX_DEVICES];
} sim_queue = {.mutex = PTHREAD_MUTEX_INITIALIZER};

/* The per-thread default stream's last end and link, per device. */
static _Thread_local uint64_t sim_per_thread_tail[SIM_MAX_DEVICES];
static _Thread_local struct sim_link sim_per_thread_link[SIM_MAX_DEVICES];

static void sim_streams_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_graphs_mutex);
    pthread_mutex_lock(&sim_events.mutex);
    pthread_mutex_lock(&sim_queue.mutex);
}

static void sim_streams_atfork_parent(void)
{
    pthread_mutex_unlock(&sim_queue.mutex);
    pthread_mutex_unlock(&sim_events.mutex);
    pthread_mutex_unlock(&sim_graphs_mutex);
}

/* The child's device holds none of its launches: they are the parent's. */
static void sim_streams_atfork_child(void)
{
    memset(sim_queue.count, 0, sizeof sim_queue.count);
    pthread_mutex_unlock(&sim_queue.mutex);
    pthread_mutex_unlock(&sim_events.mutex);
    pthread_mutex_unlock(&sim_graphs_mutex);
}

__attribute__((constructor)) static void sim_streams_load(void)
{
    pthread_atfork(sim_streams_atfork_prepare, sim_streams_atfork_parent, sim_streams_atfork_child);
}

static void sim_atomic_max(uint64_t *p, uint64_t value)
{
    uint64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < value && !__atomic_compare_exchange_n(p, &cur, value, true, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        continue;
}

/* ---- the launch queue ------------------------------------------------------------- */

/* Under the queue's mutex: forgets the launches that have ended. */
static void sim_queue_drop_ended(uint32_t dev, uint64_t now)
{
    while (sim_queue.count[dev] && sim_queue.end_ns[dev][sim_queue.head[dev]] <= now) {
        sim_queue.head[dev] = (sim_queue.head[dev] + 1) % SIM_LAUNCH_QUEUE;
        sim_queue.count[dev]--;
    }
}

/* Waits while the process's queue on `dev` is full. */
static void sim_queue_wait(uint32_t dev)
{
    pthread_mutex_lock(&sim_queue.mutex);
    sim_queue_drop_ended(dev, sim_now_ns());
    while (sim_queue.count[dev] == SIM_LAUNCH_QUEUE) {
        uint64_t oldest = sim_queue.end_ns[dev][sim_queue.head[dev]];
        pthread_mutex_unlock(&sim_queue.mutex);
        sim_sleep_until(oldest);
        pthread_mutex_lock(&sim_queue.mutex);
        sim_queue_drop_ended(dev, sim_now_ns());
    }
    pthread_mutex_unlock(&sim_queue.mutex);
}

static void sim_queue_push(uint32_t dev, uint64_t end_ns)
{
    pthread_mutex_lock(&sim_queue.mutex);
    sim_queue_drop_ended(dev, sim_now_ns());
    if (sim_queue.count[dev] == SIM_LAUNCH_QUEUE) { /* threads that waited together */
        sim_queue.head[dev] = (sim_queue.head[dev] + 1) % SIM_LAUNCH_QUEUE;
        sim_queue.count[dev]--;
    }
    sim_queue.end_ns[dev][(sim_queue.head[dev] + sim_queue.count[dev]) % SIM_LAUNCH_QUEUE] = end_ns;
    sim_queue.count[dev]++;
    pthread_mutex_unlock(&sim_queue.mutex);
}

/* ---- lanes: where a stream's work is remembered -------------------------------------- */

struct sim_lane {
    CUcontext ctx;
    uint64_t *tail_ns;
    struct sim_link *link;
    CUstream stream;                /* an explicit stream, or NULL for a default one */
};

static bool sim_default_stream(CUstream s)
{
    return !s || s == SIM_STREAM_LEGACY || s == SIM_STREAM_PER_THREAD;
}

/* `per_thread`: the call came through a _ptsz entry point, where NULL is the
 * per-thread stream.  The default streams need a current context. */
static CUresult sim_lane_of(CUstream s, bool per_thread, struct sim_lane *lane)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!s)
        s = per_thread ? SIM_STREAM_PER_THREAD : SIM_STREAM_LEGACY;
    if (s == SIM_STREAM_LEGACY || s == SIM_STREAM_PER_THREAD) {
        CUresult res = sim_current_context(&lane->ctx);
        if (res != CUDA_SUCCESS)
            return res;
        bool legacy = s == SIM_STREAM_LEGACY;
        lane->tail_ns = legacy ? &lane->ctx->legacy_tail_ns : &sim_per_thread_tail[lane->ctx->device];
        lane->link = legacy ? &lane->ctx->legacy_link : &sim_per_thread_link[lane->ctx->device];
        lane->stream = NULL;
        return CUDA_SUCCESS;
    }
    if (s->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!__atomic_load_n(&s->ctx->alive, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    lane->ctx = s->ctx;
    lane->tail_ns = &s->tail_ns;
    lane->link = &s->link;
    lane->stream = s;
    return CUDA_SUCCESS;
}

static CUgraph sim_capturing(const struct sim_lane *lane)
{
    return lane->stream ? __atomic_load_n(&lane->stream->capture, __ATOMIC_ACQUIRE) : NULL;
}

/* The lane's next work starts at `start_ns`: an event recorded just before it
 * that has not completed yet completes then. */
static void sim_link_follow(const struct sim_lane *lane, uint64_t now_ns, uint64_t start_ns)
{
    pthread_mutex_lock(&sim_events.mutex);
    struct CUevent_st *e = lane->link->event;
    if (e && e->magic == SIM_EVENT_MAGIC && e->serial == lane->link->serial &&
        __atomic_load_n(&e->state, __ATOMIC_ACQUIRE) == SIM_EVENT_RECORDED) {
        uint64_t at = __atomic_load_n(&e->at_ns, __ATOMIC_ACQUIRE);
        if (at > now_ns && start_ns > at)
            __atomic_store_n(&e->at_ns, start_ns, __ATOMIC_RELEASE);
    }
    lane->link->event = NULL;
    pthread_mutex_unlock(&sim_events.mutex);
}

/* Queues `duration_ns` of work in the lane's stream. */
static CUresult sim_run(const struct sim_lane *lane, uint64_t duration_ns)
{
    uint32_t dev = lane->ctx->device;
    uint64_t end;
    if (!duration_ns) {
        end = sim_timeline_reached(dev);
    } else {
        sim_queue_wait(dev);
        int rc;
        while ((rc = sim_timeline_enqueue(dev, duration_ns, &end)) == -EAGAIN)
            sim_sleep_until(end);
        if (rc)
            return CUDA_ERROR_OPERATING_SYSTEM; /* the state file's lock is unusable (logged) */
        sim_queue_push(dev, end);
    }
    sim_link_follow(lane, sim_now_ns(), end - duration_ns);
    sim_atomic_max(lane->tail_ns, end);
    sim_atomic_max(&lane->ctx->tail_ns, end);
    return CUDA_SUCCESS;
}

static CUresult sim_wait_lane(const struct sim_lane *lane)
{
    if (sim_capturing(lane))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_sleep_until(__atomic_load_n(lane->tail_ns, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

CUresult sim_context_synchronize(CUcontext ctx)
{
    sim_sleep_until(__atomic_load_n(&ctx->tail_ns, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

/* ---- graphs ------------------------------------------------------------------------------ */

static bool sim_graph_valid(CUgraph g)
{
    return g && g->magic == SIM_GRAPH_MAGIC;
}

static CUresult sim_graph_add_node(CUgraph g, uint64_t duration_ns, struct sim_graph_mem_op mem, CUgraphNode *out)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n)
        return CUDA_ERROR_OUT_OF_MEMORY;
    n->magic = SIM_NODE_MAGIC;
    n->graph = g;
    n->duration_ns = duration_ns;
    n->mem = mem;
    pthread_mutex_lock(&sim_graphs_mutex);
    n->next = g->nodes;
    g->nodes = n;
    pthread_mutex_unlock(&sim_graphs_mutex);
    if (out)
        *out = n;
    return CUDA_SUCCESS;
}

static CUresult sim_graph_add(CUgraph g, uint64_t duration_ns, CUgraphNode *out)
{
    return sim_graph_add_node(g, duration_ns, (struct sim_graph_mem_op){0}, out);
}

static bool sim_deps_valid(CUgraph g, const CUgraphNode *dependencies, size_t count)
{
    if (count && !dependencies)
        return false;
    for (size_t i = 0; i < count; i++)
        if (!dependencies[i] || dependencies[i]->magic != SIM_NODE_MAGIC || dependencies[i]->graph != g)
            return false;
    return true;
}

CUresult sim_graph_add_memory_node(CUgraph graph, const CUgraphNode *dependencies, size_t count,
                                   struct sim_graph_alloc *alloc, bool is_free, CUgraphNode *out)
{
    if (!out || !sim_graph_valid(graph) || !sim_deps_valid(graph, dependencies, count))
        return CUDA_ERROR_INVALID_VALUE;
    sim_graph_alloc_hold(alloc, 1);
    CUresult res = sim_graph_add_node(graph, 0, (struct sim_graph_mem_op){alloc, is_free}, out);
    if (res != CUDA_SUCCESS)
        sim_graph_alloc_hold(alloc, -1);
    return res;
}

struct sim_graph_alloc *sim_graph_node_alloc(CUgraphNode node)
{
    return node->magic == SIM_NODE_MAGIC && !node->mem.is_free ? node->mem.alloc : NULL;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraph || flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = calloc(1, sizeof *g);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    g->magic = SIM_GRAPH_MAGIC;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_graph_valid(hGraph))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_graphs_mutex);
    struct CUgraphNode_st *n = hGraph->nodes;
    hGraph->magic = 0;
    pthread_mutex_unlock(&sim_graphs_mutex);
    /* Outside the graphs mutex: the memory mutex is never taken under it. */
    while (n) {
        struct CUgraphNode_st *next = n->next;
        if (n->mem.alloc)
            sim_graph_alloc_hold(n->mem.alloc, -1);
        n->magic = 0;
        free(n);
        n = next;
    }
    free(hGraph);
    return CUDA_SUCCESS;
}

/* ---- launches ------------------------------------------------------------------------------ */

struct sim_grid {
    unsigned int gx, gy, gz, bx, by, bz, shared_bytes;
};

static CUresult sim_check_grid(const struct sim_grid *g, void **params, void **extra)
{
    if (!g->gx || !g->gy || !g->gz || !g->bx || !g->by || !g->bz || g->gy > 65535 || g->gz > 65535 ||
        g->gx > INT_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    if (g->bx > 1024 || g->by > 1024 || g->bz > 64 || (uint64_t)g->bx * g->by * g->bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    if (g->shared_bytes > 227 * 1024 || (params && extra))
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* A cooperative grid must be resident all at once. */
static bool sim_fits_at_once(const struct sim_grid *g)
{
    uint64_t threads = (uint64_t)g->bx * g->by * g->bz;
    uint64_t per_sm = SIM_SM_THREADS / threads < SIM_SM_BLOCKS ? SIM_SM_THREADS / threads : SIM_SM_BLOCKS;
    return (uint64_t)g->gx * g->gy * g->gz <= per_sm * SIM_SM_COUNT;
}

static CUresult sim_launch(CUfunction f, const struct sim_grid *grid, CUstream stream, bool per_thread,
                           void **params, void **extra, bool cooperative)
{
    CUcontext current;
    CUresult res = sim_current_context(&current);
    if (res != CUDA_SUCCESS)
        return res;
    uint64_t duration;
    if (sim_kernel_duration(f, &duration) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_HANDLE;
    struct sim_lane lane;
    res = sim_lane_of(stream, per_thread, &lane);
    if (res == CUDA_SUCCESS)
        res = sim_check_grid(grid, params, extra);
    if (res != CUDA_SUCCESS)
        return res;
    if (cooperative && !sim_fits_at_once(grid))
        return CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE;
    CUgraph capture = sim_capturing(&lane);
    if (capture)
        return sim_graph_add(capture, duration, NULL);
    return sim_run(&lane, duration);
}

#define SIM_GRID {gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, false, kernelParams, extra, false);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, true, kernelParams, extra, false);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams)
{
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, false, kernelParams, NULL, true);
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    struct sim_grid grid = SIM_GRID;
    return sim_launch(f, &grid, hStream, true, kernelParams, NULL, true);
}

#undef SIM_GRID

/* Launch attributes are accepted and not read (a cooperative attribute does
 * not check that the grid fits). */
static CUresult sim_launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra,
                              bool per_thread)
{
    if (!config || (config->numAttrs && !config->attrs))
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_grid grid = {config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                            config->blockDimY, config->blockDimZ, config->sharedMemBytes};
    return sim_launch(f, &grid, config->hStream, per_thread, kernelParams, extra, false);
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return sim_launch_ex(config, f, kernelParams, extra, false);
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    return sim_launch_ex(config, f, kernelParams, extra, true);
}

/* A kernel node: its function (v2: or its CUkernel) and grid are checked as a launch's. */
static CUresult sim_add_kernel_node(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                    size_t numDependencies, CUfunction f, const struct sim_grid *grid,
                                    void **params, void **extra)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!phGraphNode || !sim_graph_valid(hGraph) || !sim_deps_valid(hGraph, dependencies, numDependencies))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t duration;
    if (sim_kernel_duration(f, &duration) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult res = sim_check_grid(grid, params, extra);
    return res == CUDA_SUCCESS ? sim_graph_add(hGraph, duration, phGraphNode) : res;
}

CUresult cuGraphAddKernelNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                              size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v1 *nodeParams)
{
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_KERNEL_NODE_PARAMS_v1 *p = nodeParams;
    struct sim_grid grid = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ,
                            p->sharedMemBytes};
    return sim_add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, p->func, &grid,
                               p->kernelParams, p->extra);
}

CUresult cuGraphAddKernelNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                 size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS_v2 *nodeParams)
{
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_KERNEL_NODE_PARAMS_v2 *p = nodeParams;
    struct sim_grid grid = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ,
                            p->sharedMemBytes};
    CUfunction f = p->func ? p->func : (CUfunction)(void *)p->kern;
    return sim_add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, f, &grid,
                               p->kernelParams, p->extra);
}

/* The graph as it is now: later changes to it do not change the executable. */
static CUresult sim_instantiate(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phGraphExec || !sim_graph_valid(hGraph))
        return CUDA_ERROR_INVALID_VALUE;
    CUgraphExec e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = SIM_EXEC_MAGIC;
    e->auto_free = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    pthread_mutex_lock(&sim_graphs_mutex);
    for (const struct CUgraphNode_st *n = hGraph->nodes; n; n = n->next) {
        e->duration_ns += n->duration_ns;
        e->n_mem += n->mem.alloc != NULL;
    }
    if (e->n_mem && !(e->mem = calloc(e->n_mem, sizeof *e->mem))) {
        pthread_mutex_unlock(&sim_graphs_mutex);
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* The list is newest first; the steps run oldest first. */
    size_t i = e->n_mem;
    for (const struct CUgraphNode_st *n = hGraph->nodes; n; n = n->next)
        if (n->mem.alloc)
            e->mem[--i] = n->mem;
    pthread_mutex_unlock(&sim_graphs_mutex);
    for (i = 0; i < e->n_mem; i++)
        sim_graph_alloc_hold(e->mem[i].alloc, 1);
    *phGraphExec = e;
    return CUDA_SUCCESS;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize)
{
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    if (phErrorNode)
        *phErrorNode = NULL;
    return sim_instantiate(phGraphExec, hGraph, 0);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    if (flags & ~(unsigned long long)SIM_GRAPH_INSTANTIATE_FLAGS)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_instantiate(phGraphExec, hGraph, flags);
}

static bool sim_exec_valid(CUgraphExec e)
{
    return e && e->magic == SIM_EXEC_MAGIC;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_exec_valid(hGraphExec))
        return CUDA_ERROR_INVALID_VALUE;
    hGraphExec->magic = 0;
    for (size_t i = 0; i < hGraphExec->n_mem; i++)
        sim_graph_alloc_hold(hGraphExec->mem[i].alloc, -1);
    free(hGraphExec->mem);
    free(hGraphExec);
    return CUDA_SUCCESS;
}

static CUresult sim_graph_launch(CUgraphExec e, CUstream stream, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(stream, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!sim_exec_valid(e))
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_capturing(&lane))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (e->n_mem && (res = sim_graph_memory_run(e->mem, e->n_mem, e->auto_free)) != CUDA_SUCCESS)
        return res;
    return sim_run(&lane, e->duration_ns);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return sim_graph_launch(hGraphExec, hStream, false);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return sim_graph_launch(hGraphExec, hStream, true);
}

/* ---- streams ---------------------------------------------------------------------------- */

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phStream || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUstream s = calloc(1, sizeof *s);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = SIM_STREAM_MAGIC;
    s->ctx = ctx;
    s->flags = flags;
    s->priority = priority;
    *phStream = s;
    return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

/* Its queued work still runs, as on the driver. */
CUresult cuStreamDestroy_v2(CUstream hStream)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (sim_default_stream(hStream) || hStream->magic != SIM_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    CUgraph capture = __atomic_exchange_n(&hStream->capture, NULL, __ATOMIC_ACQ_REL);
    if (capture)
        cuGraphDestroy(capture);
    hStream->magic = 0;
    free(hStream);
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    return cuStreamDestroy_v2(hStream);
}

static CUresult sim_stream_synchronize(CUstream s, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    return res == CUDA_SUCCESS ? sim_wait_lane(&lane) : res;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    return sim_stream_synchronize(hStream, false);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    return sim_stream_synchronize(hStream, true);
}

static CUresult sim_stream_query(CUstream s, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (sim_capturing(&lane))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    return sim_now_ns() >= __atomic_load_n(lane.tail_ns, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamQuery(CUstream hStream)
{
    return sim_stream_query(hStream, false);
}

CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    return sim_stream_query(hStream, true);
}

static bool sim_event_valid(CUevent e)
{
    return e && e->magic == SIM_EVENT_MAGIC;
}

/* Work queued after the wait starts after the event; one kernel runs at a time
 * anyway, so only the stream's own end moves. */
static CUresult sim_stream_wait_event(CUstream s, CUevent e, unsigned int flags, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned int)SIM_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    if (__atomic_load_n(&e->state, __ATOMIC_ACQUIRE) == SIM_EVENT_RECORDED && !sim_capturing(&lane))
        sim_atomic_max(lane.tail_ns, e->at_ns);
    return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return sim_stream_wait_event(hStream, hEvent, Flags, false);
}

CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return sim_stream_wait_event(hStream, hEvent, Flags, true);
}

/* ---- stream capture ---------------------------------------------------------------------- */

/* Only explicit streams are captured here. */
static CUresult sim_begin_capture(CUstream s, CUstreamCaptureMode mode, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!lane.stream)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g;
    res = cuGraphCreate(&g, 0);
    if (res != CUDA_SUCCESS)
        return res;
    CUgraph none = NULL;
    if (!__atomic_compare_exchange_n(&lane.stream->capture, &none, g, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        cuGraphDestroy(g);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    return sim_begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    return sim_begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return sim_begin_capture(hStream, mode, false);
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return sim_begin_capture(hStream, mode, true);
}

static CUresult sim_end_capture(CUstream s, CUgraph *phGraph, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    CUgraph g = lane.stream ? __atomic_exchange_n(&lane.stream->capture, NULL, __ATOMIC_ACQ_REL) : NULL;
    if (!g)
        return CUDA_ERROR_ILLEGAL_STATE;
    *phGraph = g;
    return CUDA_SUCCESS;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return sim_end_capture(hStream, phGraph, false);
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return sim_end_capture(hStream, phGraph, true);
}

static CUresult sim_is_capturing(CUstream s, CUstreamCaptureStatus *status, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!status)
        return CUDA_ERROR_INVALID_VALUE;
    *status = sim_capturing(&lane) ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return sim_is_capturing(hStream, captureStatus, false);
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return sim_is_capturing(hStream, captureStatus, true);
}

/* ---- events ------------------------------------------------------------------------------ */

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CUcontext ctx;
    CUresult res = sim_current_context(&ctx);
    if (res != CUDA_SUCCESS)
        return res;
    if (!phEvent || (Flags & ~(unsigned int)SIM_EVENT_FLAGS) ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim_events.mutex);
    CUevent e = sim_events.free;
    if (e)
        sim_events.free = e->next_free;
    pthread_mutex_unlock(&sim_events.mutex);
    if (!e && !(e = calloc(1, sizeof *e)))
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = ctx;
    e->flags = Flags;
    e->state = SIM_EVENT_NEW;
    e->at_ns = 0;
    __atomic_store_n(&e->magic, SIM_EVENT_MAGIC, __ATOMIC_RELEASE);
    *phEvent = e;
    return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&sim_events.mutex);
    CUresult res = CUDA_ERROR_INVALID_HANDLE;
    if (sim_event_valid(hEvent)) {
        hEvent->magic = 0;
        hEvent->next_free = sim_events.free;
        sim_events.free = hEvent;
        res = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sim_events.mutex);
    return res;
}

CUresult cuEventDestroy(CUevent hEvent)
{
    return cuEventDestroy_v2(hEvent);
}

/* In a busy stream, the event completes with the stream's work before it; in
 * an idle one, when the device reaches it, after all that is queued there;
 * and, until then, it waits for the stream's next kernel (sim_link_follow). */
static CUresult sim_event_record(CUevent e, CUstream s, unsigned int flags, bool per_thread)
{
    struct sim_lane lane;
    CUresult res = sim_lane_of(s, per_thread, &lane);
    if (res != CUDA_SUCCESS)
        return res;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned int)SIM_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_capturing(&lane)) {
        __atomic_store_n(&e->state, SIM_EVENT_CAPTURED, __ATOMIC_RELEASE);
        return CUDA_SUCCESS;
    }
    uint64_t tail = __atomic_load_n(lane.tail_ns, __ATOMIC_ACQUIRE);
    uint64_t at = tail > sim_now_ns() ? tail : sim_timeline_reached(lane.ctx->device);
    pthread_mutex_lock(&sim_events.mutex);
    __atomic_store_n(&e->at_ns, at, __ATOMIC_RELEASE);
    __atomic_store_n(&e->state, SIM_EVENT_RECORDED, __ATOMIC_RELEASE);
    lane.link->event = e;
    lane.link->serial = ++e->serial;
    pthread_mutex_unlock(&sim_events.mutex);
    return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return sim_event_record(hEvent, hStream, 0, false);
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return sim_event_record(hEvent, hStream, 0, true);
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return sim_event_record(hEvent, hStream, flags, false);
}

CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return sim_event_record(hEvent, hStream, flags, true);
}

/* CUDA_SUCCESS with *at_ns when the event is recorded; a never-recorded event
 * is complete (at_ns 0). */
static CUresult sim_event_time(CUevent e, uint64_t *at_ns)
{
    if (!sim_initialized())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!sim_event_valid(e))
        return CUDA_ERROR_INVALID_HANDLE;
    uint32_t state = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
    if (state == SIM_EVENT_CAPTURED)
        return CUDA_ERROR_CAPTURED_EVENT;
    *at_ns = state == SIM_EVENT_RECORDED ? __atomic_load_n(&e->at_ns, __ATOMIC_RELAXED) : 0;
    return CUDA_SUCCESS;
}

CUresult cuEventQuery(CUevent hEvent)
{
    uint64_t at;
    CUresult res = sim_event_time(hEvent, &at);
    if (res != CUDA_SUCCESS)
        return res;
    return sim_now_ns() >= at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    uint64_t at;
    CUresult res = sim_event_time(hEvent, &at);
    if (res == CUDA_SUCCESS)
        sim_sleep_until(at);
    return res;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    uint64_t start, end;
    CUresult res = sim_event_time(hStart, &start);
    if (res == CUDA_SUCCESS)
        res = sim_event_time(hEnd, &end);
    if (res != CUDA_SUCCESS)
        return res;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (!start || !end || ((hStart->flags | hEnd->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now_ns();
    if (now < start || now < end)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)((double)((int64_t)(end - start)) / 1e6);
    return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

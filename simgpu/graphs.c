/* simgpu's graphs: building them (kernel nodes, and memory nodes of
 * graph_memory.c's allocations), instantiating and launching them.  A graph
 * runs its kernels back to back (simgpu runs one kernel at a time anyway).
 *
 * This file owns graphs, their nodes and executables, which hold
 * graph_memory.c's allocations; it calls graph_memory.c and launch_rules.c,
 * and neither calls it (launches.c adds captured kernels here). */
#include <pthread.h>
#include <stdlib.h>

#include "work.h"

enum { SIM_GRAPH_INSTANTIATE_FLAGS = 0xF };

static pthread_mutex_t sim_graphs_mutex = PTHREAD_MUTEX_INITIALIZER;

static void sim_graphs_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_graphs_mutex);
}

static void sim_graphs_atfork_done(void)
{
    pthread_mutex_unlock(&sim_graphs_mutex);
}

__attribute__((constructor)) static void sim_graphs_load(void)
{
    pthread_atfork(sim_graphs_atfork_prepare, sim_graphs_atfork_done, sim_graphs_atfork_done);
}

bool sim_graph_valid(CUgraph g)
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

CUresult sim_graph_add(CUgraph g, uint64_t duration_ns, CUgraphNode *out)
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

/* Adds a memory node to `graph` after checking the graph and its dependencies:
 * an alloc node of `alloc` (`is_free` false) or a free node of it.  The node
 * takes a hold on `alloc` (sim_graph_alloc_hold), dropped with its graph. */
static CUresult sim_graph_add_memory_node(CUgraph graph, const CUgraphNode *dependencies, size_t count,
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

/* The allocation of an alloc node; NULL for any other node. */
static struct sim_graph_alloc *sim_graph_node_alloc(CUgraphNode node)
{
    return node->magic == SIM_NODE_MAGIC && !node->mem.is_free ? node->mem.alloc : NULL;
}

CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    SIM_CALLED();
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
    SIM_CALLED();
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
    SIM_CALLED();
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
    SIM_CALLED();
    if (!nodeParams)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_KERNEL_NODE_PARAMS_v2 *p = nodeParams;
    struct sim_grid grid = {p->gridDimX, p->gridDimY, p->gridDimZ, p->blockDimX, p->blockDimY, p->blockDimZ,
                            p->sharedMemBytes};
    CUfunction f = p->func ? p->func : (CUfunction)(void *)p->kern;
    return sim_add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, f, &grid,
                               p->kernelParams, p->extra);
}

/* Device memory only, with no handle types for IPC (cuda.h); graph_memory.c
 * checks the parameters and reserves the address. */
CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    SIM_CALLED();
    struct sim_graph_alloc *a;
    CUresult res = sim_graph_alloc_new(nodeParams, &a);
    if (res != CUDA_SUCCESS)
        return res;
    res = sim_graph_add_memory_node(hGraph, dependencies, numDependencies, a, false, phGraphNode);
    if (res != CUDA_SUCCESS) {
        sim_graph_alloc_hold(a, 0); /* no holder: forgotten */
        return res;
    }
    nodeParams->dptr = sim_graph_alloc_params(a)->dptr;
    return CUDA_SUCCESS;
}

CUresult cuGraphMemAllocNodeGetParams(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS *params_out)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    struct sim_graph_alloc *a = hNode ? sim_graph_node_alloc(hNode) : NULL;
    if (!a || !params_out)
        return CUDA_ERROR_INVALID_VALUE;
    *params_out = *sim_graph_alloc_params(a);
    return CUDA_SUCCESS;
}

/* Only an address an alloc node returned may be freed by a free node. */
CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                               size_t numDependencies, CUdeviceptr dptr)
{
    SIM_CALLED();
    CUresult res = sim_mem_initialized();
    if (res != CUDA_SUCCESS)
        return res;
    struct sim_graph_alloc *a = sim_graph_alloc_at(dptr); /* kept while the node is being added */
    if (!a)
        return CUDA_ERROR_INVALID_VALUE;
    res = sim_graph_add_memory_node(hGraph, dependencies, numDependencies, a, true, phGraphNode);
    sim_graph_alloc_hold(a, -1);
    return res;
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
    SIM_CALLED();
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    if (phErrorNode)
        *phErrorNode = NULL;
    return sim_instantiate(phGraphExec, hGraph, 0);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    SIM_CALLED();
    return cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    SIM_CALLED();
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
    SIM_CALLED();
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
    uint64_t began = sim_launch_began();
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
    sim_launch_cpu(began); /* a graph's launch, like a kernel's (launches.c) */
    return sim_run(&lane, e->duration_ns);
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    SIM_CALLED();
    return sim_graph_launch(hGraphExec, hStream, false);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    SIM_CALLED();
    return sim_graph_launch(hGraphExec, hStream, true);
}


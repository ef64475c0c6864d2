/* Graph memory (alloc nodes, cuGraphAddMemAllocNode): charged like a
 * stream-ordered pool (pool_hooks.c).
 *
 * A launch takes the memory of a graph's alloc nodes from its device's graph
 * memory pool, which grows in 2 MiB pages and keeps what free nodes (or
 * cuMemFree*) give back reserved for later launches until
 * cuDeviceGraphMemTrim.  So what the container holds is each device's pool
 * reserve (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), and that is what we
 * charge.  What a graph asks for we add up as its alloc nodes are added, and
 * an executable inherits its graph's sum when instantiated; before a launch we
 * reserve what the pool's unused reserve cannot cover, chunk-rounded, and
 * after it settle the charge to the pool's growth.
 *
 * Alloc nodes we do not see being added (captured cuMemAllocAsync,
 * cuGraphAddNode, cloned or child graphs) leave an executable unknown here:
 * it launches unchecked, and its pool growth is charged at the next launch of
 * a known one or at a trim. */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"
#include "resume_ask.h"

/* Real drivers and simgpu grow the graph pool in 2 MiB pages. */
#define GRAPH_CHUNK (2ULL << 20)

/* What a graph's (or an executable's) alloc nodes ask for, per device. */
struct asks {
    const void *key;
    uint64_t bytes[VGL_MAX_DEVICES];
    int beyond;                     /* a device past VGL_MAX_DEVICES a node asks memory of; 0: none */
};

struct table {
    struct asks *v;
    size_t n, cap;
};

static struct {
    pthread_mutex_t lock;           /* guards all of it, and a launch from reading the pool to settling */
    struct table graphs, execs;
    uint64_t charged[VGL_MAX_DEVICES]; /* each device's pool reserve, as charged */
} gm = {.lock = PTHREAD_MUTEX_INITIALIZER};

static struct asks *find(struct table *t, const void *key)
{
    for (size_t i = 0; i < t->n; i++)
        if (t->v[i].key == key)
            return &t->v[i];
    return NULL;
}

/* The entry of `key`, made empty if new; NULL when out of memory. */
static struct asks *entry(struct table *t, const void *key)
{
    struct asks *a = find(t, key);
    if (a)
        return a;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        struct asks *v = realloc(t->v, cap * sizeof *v);
        if (!v)
            return NULL;
        t->v = v;
        t->cap = cap;
    }
    a = &t->v[t->n];
    *a = (struct asks){.key = key};
    __atomic_store_n(&t->n, t->n + 1, __ATOMIC_RELAXED); /* read unlocked by vgl_graph_launch */
    return a;
}

static void drop(struct table *t, const void *key)
{
    struct asks *a = find(t, key);
    if (a) {
        *a = t->v[t->n - 1];
        __atomic_store_n(&t->n, t->n - 1, __ATOMIC_RELAXED);
    }
}

static bool pool_attribute(int device, CUgraphMem_attribute attr, uint64_t *value)
{
    cuuint64_t v;
    if (vgl_real.cuDeviceGetGraphMemAttribute(device, attr, &v) != CUDA_SUCCESS)
        return false;
    *value = v;
    return true;
}

/* Brings a device's charge to its graph pool's reserve.  Under gm.lock, with
 * the slot. */
static void settle(int device)
{
    uint64_t reserved, charged = gm.charged[device];
    if (!pool_attribute(device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) || reserved == charged)
        return;
    vgl_follow_reserve((uint32_t)device, charged, reserved);
    gm.charged[device] = reserved;
}

CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    int device = nodeParams->poolProps.location.id;
    if (nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || device < 0)
        return rc; /* not device memory */
    pthread_mutex_lock(&gm.lock);
    struct asks *a = entry(&gm.graphs, hGraph);
    if (a && device >= VGL_MAX_DEVICES)
        a->beyond = device; /* its launches are refused, as every allocation there */
    else if (a)
        a->bytes[device] += nodeParams->bytesize;
    pthread_mutex_unlock(&gm.lock);
    if (!a) {
        static unsigned logged;
        vgl_log_bounded(VGL_LOG_WARN, &logged, "out of memory to track a graph's alloc node: its "
                        "launches go unchecked, and are charged only after they grow the graph pool");
    }
    return rc;
}

/* A graph's (or an executable's) asks are taken out before the driver
 * destroys it, since the driver may hand its handle to another thread's new
 * graph at once; put back if the driver refused.  False: none were kept. */
static bool take(struct table *t, const void *key, struct asks *out)
{
    pthread_mutex_lock(&gm.lock);
    const struct asks *a = find(t, key);
    if (a) {
        *out = *a;
        drop(t, key);
    }
    pthread_mutex_unlock(&gm.lock);
    return a != NULL;
}

static void put_back(struct table *t, const struct asks *kept)
{
    pthread_mutex_lock(&gm.lock);
    struct asks *a = entry(t, kept->key);
    if (a)
        *a = *kept;
    pthread_mutex_unlock(&gm.lock);
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    VGL_ASKS();
    struct asks kept;
    bool had = VGL_UNLIKELY(vgl_config.enabled) && take(&gm.graphs, hGraph, &kept);
    CUresult rc = vgl_real.cuGraphDestroy(hGraph);
    if (had && rc != CUDA_SUCCESS)
        put_back(&gm.graphs, &kept);
    return rc;
}

/* An executable asks for what its graph's alloc nodes did when it was made. */
static CUresult instantiated(CUresult rc, CUgraphExec *exec, CUgraph graph)
{
    if (VGL_LIKELY(!vgl_config.enabled) || rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&gm.lock);
    drop(&gm.execs, *exec); /* a handle reused after a cuGraphExecDestroy that went unseen */
    const struct asks *g = find(&gm.graphs, graph);
    if (g) {
        struct asks copy = *g;
        struct asks *e = entry(&gm.execs, *exec);
        if (e) {
            *e = copy;
            e->key = *exec;
        }
    }
    pthread_mutex_unlock(&gm.lock);
    return rc;
}

CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                            size_t bufferSize)
{
    VGL_ASKS();
    return instantiated(vgl_real.cuGraphInstantiate(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                               char *logBuffer, size_t bufferSize)
{
    VGL_ASKS();
    return instantiated(vgl_real.cuGraphInstantiate_v2(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
                        phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    VGL_ASKS();
    return instantiated(vgl_real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags), phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                      CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    VGL_ASKS();
    return instantiated(vgl_real.cuGraphInstantiateWithParams(phGraphExec, hGraph, instantiateParams),
                        phGraphExec, hGraph);
}

CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                           CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    VGL_ASKS();
    return instantiated(vgl_real.cuGraphInstantiateWithParams_ptsz(phGraphExec, hGraph, instantiateParams),
                        phGraphExec, hGraph);
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    VGL_ASKS();
    struct asks kept;
    bool had = VGL_UNLIKELY(vgl_config.enabled) && take(&gm.execs, hGraphExec, &kept);
    CUresult rc = vgl_real.cuGraphExecDestroy(hGraphExec);
    if (had && rc != CUDA_SUCCESS)
        put_back(&gm.execs, &kept);
    return rc;
}

CUresult vgl_graph_launch(CUgraphExec exec, CUstream stream, CUresult (*launch)(CUgraphExec, CUstream))
{
    static const char call[] = "cuGraphLaunch";
    if (VGL_LIKELY(!vgl_config.enabled) || __atomic_load_n(&gm.execs.n, __ATOMIC_RELAXED) == 0)
        return launch(exec, stream);
    pthread_mutex_lock(&gm.lock);
    const struct asks *e = find(&gm.execs, exec);
    if (!e) {
        pthread_mutex_unlock(&gm.lock);
        return launch(exec, stream);
    }
    struct asks asks = *e;
    struct vgl_charge c[VGL_MAX_DEVICES];
    CUresult rc = CUDA_SUCCESS;
    for (int d = 0; d < VGL_MAX_DEVICES; d++)
        c[d].device = -1;
    if (!vgl_ready()) {
        pthread_mutex_unlock(&gm.lock);
        return vgl_charge_begin(call, -1, 0, &c[0]); /* refuses, and says why */
    }
    if (asks.beyond) {
        pthread_mutex_unlock(&gm.lock);
        return vgl_charge_begin(call, asks.beyond, 0, &c[0]); /* refuses, and says why */
    }
    for (int d = 0; d < VGL_MAX_DEVICES && rc == CUDA_SUCCESS; d++) {
        if (!asks.bytes[d])
            continue;
        settle(d);
        uint64_t used;
        uint64_t spare = pool_attribute(d, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) && used < gm.charged[d]
                             ? gm.charged[d] - used
                             : 0;
        if (asks.bytes[d] > spare)
            rc = vgl_charge_begin(call, d, (asks.bytes[d] - spare + GRAPH_CHUNK - 1) / GRAPH_CHUNK * GRAPH_CHUNK,
                                  &c[d]);
    }
    if (rc == CUDA_SUCCESS)
        rc = launch(exec, stream);
    for (int d = 0; d < VGL_MAX_DEVICES; d++) {
        uint64_t now;
        if (rc == CUDA_SUCCESS && asks.bytes[d] &&
            pool_attribute(d, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &now) && now > gm.charged[d]) {
            uint64_t growth = now - gm.charged[d];
            if (c[d].device < 0)
                vgl_charge_open(&c[d], call, d);
            /* Grown past our headroom (fragmentation): the memory is held all
             * the same, so it is counted, and later allocations are refused. */
            if (!vgl_charge_settle(&c[d], growth, false))
                vgl_charge_settle(&c[d], growth, true);
            gm.charged[d] = now;
            vgl_charge_keep(&c[d]);
        } else {
            vgl_charge_cancel(&c[d]);
        }
    }
    pthread_mutex_unlock(&gm.lock);
    return rc;
}

CUresult cuDeviceGraphMemTrim(CUdevice_v1 device)
{
    VGL_ASKS();
    CUresult rc = vgl_real.cuDeviceGraphMemTrim(device);
    if (VGL_UNLIKELY(vgl_config.enabled) && rc == CUDA_SUCCESS && vgl_self.slot && device >= 0 &&
        device < VGL_MAX_DEVICES) {
        pthread_mutex_lock(&gm.lock);
        settle(device);
        pthread_mutex_unlock(&gm.lock);
    }
    return rc;
}

/* The graphs are the child's still, but not the pool's charge: that was the
 * parent's slot's. */
static void forget_in_child(void)
{
    pthread_mutex_init(&gm.lock, NULL);
    for (int d = 0; d < VGL_MAX_DEVICES; d++)
        gm.charged[d] = 0;
}

VGL_AFTER_FORK(forget_in_child)

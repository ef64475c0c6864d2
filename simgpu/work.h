/* What simgpu's files of device work share: launches.c, launch_rules.c,
 * lanes.c, launch_queue.c, streams.c, events.c, capture.c and graphs.c. */
#ifndef SIMGPU_WORK_H
#define SIMGPU_WORK_H

#include "driver.h"

enum {
    SIM_STREAM_MAGIC = 0x52545353,  /* "SSTR" */
    SIM_EVENT_MAGIC = 0x54564553,   /* "SEVT" */
    SIM_GRAPH_MAGIC = 0x50524753,   /* "SGRP" */
    SIM_NODE_MAGIC = 0x444f4e53,    /* "SNOD" */
    SIM_EXEC_MAGIC = 0x43584553,    /* "SEXC" */
    SIM_EVENT_RECORD_EXTERNAL = 1,  /* CU_EVENT_RECORD_EXTERNAL, CU_EVENT_WAIT_EXTERNAL */
};

struct CUstream_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    int priority;
    uint64_t last_work;             /* the ticket of its last work on the device (atomic; timeline.c) */
    CUgraph capture;                /* the graph it is capturing into, or NULL (atomic) */
};

enum sim_event_state {
    SIM_EVENT_NEW,                  /* never recorded: complete */
    SIM_EVENT_RECORDED,
    SIM_EVENT_CAPTURED,             /* last recorded in a capturing stream */
};

/* Never returned to malloc: an event destroyed goes to a free list, so a
 * stale handle is an error, not a use after free. */
struct CUevent_st {
    uint32_t magic;
    CUcontext ctx;
    unsigned int flags;
    uint32_t state;                 /* enum sim_event_state (atomic, stored after ticket) */
    uint32_t device;
    uint64_t ticket;                /* its marker on the device's timeline (atomic) */
    uint64_t at_ns;                 /* when that completed, once seen; 0: not seen yet (atomic) */
    uint64_t ipc_id;                /* shared with other processes (cuIpcGetEventHandle); 0: not */
    bool ipc_owner;                 /* this process made it (its destruction ends the sharing) */
    struct CUevent_st *next_free;
};
/* An interprocess event's last record, from whichever process made it
 * (events.c): before its state, device or ticket is read. */
void sim_event_refresh(CUevent e);

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

/* Where a stream's work is remembered: an explicit stream, or a default one. */
struct sim_lane {
    CUcontext ctx;
    uint64_t *last_work;            /* the ticket of the stream's last work; also its name on the timeline */
    CUstream stream;                /* an explicit stream, or NULL for a default one */
};

/* launch_rules.c */
/* A launch's grid, as cuLaunchKernel takes it. */
struct sim_grid {
    unsigned int gx, gy, gz, bx, by, bz, shared_bytes;
};
/* CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE for a grid or parameters no launch takes. */
CUresult sim_check_grid(const struct sim_grid *g, void **params, void **extra);
/* When a launch began (sim_now_ns), or 0 where launches take no CPU time. */
uint64_t sim_launch_began(void);
/* The rest of a launch's CPU time (SIMGPU_LAUNCH_US), begun at `began_ns`
 * (sim_launch_began): spent before the work is queued. */
void sim_launch_cpu(uint64_t began_ns);

/* lanes.c */
/* Whether `s` names a default stream (NULL, legacy or per-thread). */
bool sim_default_stream(CUstream s);
/* The lane of `s`.  `per_thread`: the call came through a _ptsz entry point,
 * where NULL is the per-thread stream.  The default streams need a current
 * context. */
CUresult sim_lane_of(CUstream s, bool per_thread, struct sim_lane *lane);
/* The graph the lane's stream is capturing into, or NULL. */
CUgraph sim_capturing(const struct sim_lane *lane);
/* Queues a kernel of `duration_ns` in the lane's stream. */
CUresult sim_run(const struct sim_lane *lane, uint64_t duration_ns);
/* Queues `duration_ns` of work for `engine` in the lane's stream (a copy or a
 * memset: one of the copy engines). */
CUresult sim_run_on(const struct sim_lane *lane, enum sim_engine engine, uint64_t duration_ns);
/* Queues a marker in the lane's stream, after ticket `after` if not 0: *ticket. */
CUresult sim_mark(const struct sim_lane *lane, uint64_t after, uint64_t *ticket);
/* Waits until the lane's work is done (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED while capturing). */
CUresult sim_wait_lane(const struct sim_lane *lane);
/* Whether the lane's work is done. */
bool sim_lane_idle(const struct sim_lane *lane);
/* Raises *p to `value` if it is lower (atomic). */
void sim_atomic_max(uint64_t *p, uint64_t value);

/* launch_queue.c */
/* Waits while the process's queue of launches on `dev` is full. */
void sim_queue_wait(uint32_t dev);
/* Adds the launch of `ticket` to the process's queue on `dev`. */
void sim_queue_push(uint32_t dev, uint64_t ticket);

/* events.c */
bool sim_event_valid(CUevent e);

/* graphs.c */
bool sim_graph_valid(CUgraph g);
/* Adds a node of `duration_ns` to `g` (*out: the node, if out is not NULL). */
CUresult sim_graph_add(CUgraph g, uint64_t duration_ns, CUgraphNode *out);

#endif

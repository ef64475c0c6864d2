/* simgpu's launch queue: a process may have SIM_LAUNCH_QUEUE launches pending
 * on a device; the next launch waits for the oldest to end, as a real driver
 * blocks the launching thread when its push buffer is full.  (Launches of
 * several streams may end out of order: the oldest is waited for all the same.) */
#include <pthread.h>
#include <string.h>

#include "work.h"

enum { SIM_LAUNCH_QUEUE = 1024 };

/* This process's pending launches per device: their tickets, oldest first. */
static struct {
    pthread_mutex_t mutex;
    uint64_t ticket[SIM_MAX_DEVICES][SIM_LAUNCH_QUEUE];
    uint32_t head[SIM_MAX_DEVICES];
    uint32_t count[SIM_MAX_DEVICES];
} sim_queue = {.mutex = PTHREAD_MUTEX_INITIALIZER};

static void sim_queue_atfork_prepare(void)
{
    pthread_mutex_lock(&sim_queue.mutex);
}

static void sim_queue_atfork_parent(void)
{
    pthread_mutex_unlock(&sim_queue.mutex);
}

/* The child's device holds none of its launches: they are the parent's. */
static void sim_queue_atfork_child(void)
{
    memset(sim_queue.count, 0, sizeof sim_queue.count);
    pthread_mutex_unlock(&sim_queue.mutex);
}

__attribute__((constructor)) static void sim_queue_load(void)
{
    pthread_atfork(sim_queue_atfork_prepare, sim_queue_atfork_parent, sim_queue_atfork_child);
}

void sim_queue_wait(uint32_t dev)
{
    pthread_mutex_lock(&sim_queue.mutex);
    while (sim_queue.count[dev] == SIM_LAUNCH_QUEUE) {
        uint64_t oldest = sim_queue.ticket[dev][sim_queue.head[dev]], at;
        pthread_mutex_unlock(&sim_queue.mutex);
        sim_timeline_wait(dev, oldest, 0, &at);
        pthread_mutex_lock(&sim_queue.mutex);
        if (sim_queue.count[dev] == SIM_LAUNCH_QUEUE && sim_queue.ticket[dev][sim_queue.head[dev]] == oldest) {
            sim_queue.head[dev] = (sim_queue.head[dev] + 1) % SIM_LAUNCH_QUEUE;
            sim_queue.count[dev]--;
        }
    }
    pthread_mutex_unlock(&sim_queue.mutex);
}

void sim_queue_push(uint32_t dev, uint64_t ticket)
{
    pthread_mutex_lock(&sim_queue.mutex);
    if (sim_queue.count[dev] == SIM_LAUNCH_QUEUE) { /* threads that waited together */
        sim_queue.head[dev] = (sim_queue.head[dev] + 1) % SIM_LAUNCH_QUEUE;
        sim_queue.count[dev]--;
    }
    sim_queue.ticket[dev][(sim_queue.head[dev] + sim_queue.count[dev]) % SIM_LAUNCH_QUEUE] = ticket;
    sim_queue.count[dev]++;
    pthread_mutex_unlock(&sim_queue.mutex);
}

/* simgpu's launch queue: a process may have SIM_LAUNCH_QUEUE launches pending
 * on a device; the next launch waits for the oldest to end, as a real driver
 * blocks the launching thread when its push buffer is full. */
#include <pthread.h>
#include <string.h>

#include "work.h"

enum { SIM_LAUNCH_QUEUE = 1024 };

/* This process's pending launches per device: when each ends, oldest first. */
static struct {
    pthread_mutex_t mutex;
    uint64_t end_ns[SIM_MAX_DEVICES][SIM_LAUNCH_QUEUE];
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

/* Under the queue's mutex: forgets the launches that have ended. */
static void sim_queue_drop_ended(uint32_t dev, uint64_t now)
{
    while (sim_queue.count[dev] && sim_queue.end_ns[dev][sim_queue.head[dev]] <= now) {
        sim_queue.head[dev] = (sim_queue.head[dev] + 1) % SIM_LAUNCH_QUEUE;
        sim_queue.count[dev]--;
    }
}

void sim_queue_wait(uint32_t dev)
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

void sim_queue_push(uint32_t dev, uint64_t end_ns)
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

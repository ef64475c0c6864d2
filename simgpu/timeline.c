/* Simulated GPU time: one timeline per device in the machine-wide state file.
 *
 * A device runs one kernel at a time, in the order that all processes on the
 * machine launched them, as time-sliced contexts share a real GPU.  A launch
 * is given the stretch of time after everything queued before it, so its end
 * is known when it is launched, and streams, events and synchronisation only
 * compare the clock with such ends.  Nothing runs: the time of a kernel is
 * credited to its process, and to the utilisation samples NVML reports, as the
 * clock passes it, by whichever process next looks at the timeline. */
#include <errno.h>
#include <time.h>

#include "state.h"

_Static_assert(sizeof(struct sim_segment) == 32, "segment layout");
_Static_assert(sizeof(struct sim_sample) == 24 + 24 * SIM_SAMPLE_PROCS, "sample layout");

uint64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

void sim_sleep_until(uint64_t deadline_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ULL),
                          .tv_nsec = (long)(deadline_ns % 1000000000ULL)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        continue;
}

static uint64_t sim_max(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t sim_min(uint64_t a, uint64_t b) { return a < b ? a : b; }

/* Ends the sample periods that are over by `until` and starts the one that
 * holds it.  A long idle stretch is skipped to the last SIM_SAMPLES periods:
 * the ones before would be overwritten at once. */
static void sim_close_periods(struct sim_timeline *tl, uint64_t until)
{
    struct sim_sample *cur = &tl->current;
    if (!cur->end_ns) {
        cur->end_ns = until - until % SIM_SAMPLE_NS + SIM_SAMPLE_NS;
        return;
    }
    while (cur->end_ns <= until) {
        uint32_t slot = (tl->sample_head + tl->sample_count) % SIM_SAMPLES;
        if (tl->sample_count == SIM_SAMPLES)
            tl->sample_head = (tl->sample_head + 1) % SIM_SAMPLES;
        else
            tl->sample_count++;
        tl->samples[slot] = *cur;
        uint64_t end = cur->end_ns + SIM_SAMPLE_NS;
        uint64_t behind = (until - cur->end_ns) / SIM_SAMPLE_NS;
        if (behind > SIM_SAMPLES)
            end += (behind - SIM_SAMPLES) * SIM_SAMPLE_NS;
        *cur = (struct sim_sample){.end_ns = end};
    }
}

static bool sim_same(const struct sim_pid *a, const struct sim_pid *b)
{
    return a->ns == b->ns && a->pid == b->pid;
}

/* Credits [from, to) of the device's time to `who`, period by period. */
static void sim_credit(struct sim_timeline *tl, uint64_t from, uint64_t to, const struct sim_pid *who)
{
    while (from < to) {
        sim_close_periods(tl, from);
        struct sim_sample *cur = &tl->current;
        uint64_t upto = sim_min(to, cur->end_ns);
        uint64_t ns = upto - from;
        cur->busy_ns += ns;
        tl->busy_ns += ns;
        uint32_t i = 0;
        while (i < cur->nprocs && !sim_same(&cur->procs[i].who, who))
            i++;
        if (i == cur->nprocs && i < SIM_SAMPLE_PROCS) {
            cur->procs[i].who = *who;
            cur->procs[i].busy_ns = 0;
            cur->nprocs++;
        }
        if (i < cur->nprocs)
            cur->procs[i].busy_ns += ns;
        from = upto;
    }
}

/* Credits everything the device ran before `now` and drops finished segments. */
static void sim_advance(struct sim_timeline *tl, uint64_t now)
{
    while (tl->count) {
        const struct sim_segment *s = &tl->queue[tl->head];
        uint64_t from = sim_max(s->start_ns, tl->accounted_ns);
        uint64_t to = sim_min(s->end_ns, now);
        if (from < to)
            sim_credit(tl, from, to, &s->who);
        if (s->end_ns > now)
            break;
        tl->head = (tl->head + 1) % SIM_TIMELINE_SLOTS;
        tl->count--;
    }
    tl->accounted_ns = sim_max(tl->accounted_ns, now);
    sim_close_periods(tl, now);
}

static struct sim_timeline *sim_lock_timeline(uint32_t device, struct sim_file **out)
{
    struct sim_file *f = sim_state_lock_file();
    if (!f)
        return NULL;
    if (device >= f->device_count) {
        sim_state_unlock_file(f);
        return NULL;
    }
    *out = f;
    return &f->timelines[device];
}

int sim_timeline_enqueue(uint32_t device, uint64_t duration_ns, uint64_t *end_ns)
{
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    uint64_t now = sim_now_ns();
    sim_advance(tl, now);
    if (tl->count == SIM_TIMELINE_SLOTS) {
        *end_ns = tl->queue[tl->head].end_ns;
        sim_state_unlock_file(f);
        return -EAGAIN;
    }
    uint64_t start = sim_max(now, tl->tail_ns);
    struct sim_segment *s = &tl->queue[(tl->head + tl->count) % SIM_TIMELINE_SLOTS];
    *s = (struct sim_segment){.start_ns = start, .end_ns = start + duration_ns, .who = sim_state_self()};
    tl->count++;
    __atomic_store_n(&tl->tail_ns, s->end_ns, __ATOMIC_RELEASE);
    *end_ns = s->end_ns;
    sim_state_unlock_file(f);
    return 0;
}

uint64_t sim_timeline_reached(uint32_t device)
{
    uint64_t now = sim_now_ns();
    struct sim_file *f = sim_state_file();
    if (!f || device >= f->device_count)
        return now;
    return sim_max(now, __atomic_load_n(&f->timelines[device].tail_ns, __ATOMIC_ACQUIRE));
}

int sim_timeline_utilization(uint32_t device, unsigned int *percent)
{
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    sim_advance(tl, sim_now_ns());
    /* The last second, as far as samples reach back. */
    enum { PERIODS = 1000000000ULL / SIM_SAMPLE_NS };
    uint32_t n = tl->sample_count < PERIODS ? tl->sample_count : PERIODS;
    uint64_t busy = 0;
    for (uint32_t i = 0; i < n; i++)
        busy += tl->samples[(tl->sample_head + tl->sample_count - 1 - i) % SIM_SAMPLES].busy_ns;
    sim_state_unlock_file(f);
    *percent = n ? (unsigned int)((busy * 100 + n * SIM_SAMPLE_NS / 2) / (n * SIM_SAMPLE_NS)) : 0;
    return 0;
}

int sim_timeline_samples(uint32_t device, uint64_t since_us, struct sim_proc_sample *out, uint32_t max)
{
    struct timespec mono, real;
    clock_gettime(CLOCK_MONOTONIC, &mono);
    clock_gettime(CLOCK_REALTIME, &real);
    /* CLOCK_REALTIME minus CLOCK_MONOTONIC, in us: NVML stamps samples with the wall clock. */
    int64_t offset_us = ((int64_t)real.tv_sec - (int64_t)mono.tv_sec) * 1000000 +
                        ((int64_t)real.tv_nsec - (int64_t)mono.tv_nsec) / 1000;
    struct sim_file *f;
    struct sim_timeline *tl = sim_lock_timeline(device, &f);
    if (!tl)
        return -EINVAL;
    sim_advance(tl, sim_now_ns());
    uint32_t n = 0;
    for (uint32_t i = 0; i < tl->sample_count; i++) {
        const struct sim_sample *s = &tl->samples[(tl->sample_head + i) % SIM_SAMPLES];
        uint64_t stamp = (uint64_t)((int64_t)(s->end_ns / 1000) + offset_us);
        if (stamp <= since_us)
            continue;
        for (uint32_t p = 0; p < s->nprocs; p++) {
            if (n < max)
                out[n] = (struct sim_proc_sample){
                    .who = s->procs[p].who,
                    .sm_percent = (unsigned int)((s->procs[p].busy_ns * 100 + SIM_SAMPLE_NS / 2) / SIM_SAMPLE_NS),
                    .timestamp_us = stamp,
                };
            n++;
        }
    }
    sim_state_unlock_file(f);
    struct sim_host_pids host = {0};
    for (uint32_t i = 0; i < n && i < max; i++)
        out[i].pid = sim_driver_pid(&out[i].who, &host);
    sim_host_pids_free(&host);
    return (int)n;
}

void sim_timeline_repair(struct sim_timeline *tl)
{
    if (tl->head >= SIM_TIMELINE_SLOTS || tl->count > SIM_TIMELINE_SLOTS) {
        tl->head = 0;
        tl->count = 0;
    }
    if (tl->count) {
        const struct sim_segment *last = &tl->queue[(tl->head + tl->count - 1) % SIM_TIMELINE_SLOTS];
        tl->tail_ns = sim_max(tl->tail_ns, last->end_ns);
    }
    if (tl->sample_head >= SIM_SAMPLES || tl->sample_count > SIM_SAMPLES) {
        tl->sample_head = 0;
        tl->sample_count = 0;
    }
    if (tl->current.nprocs > SIM_SAMPLE_PROCS)
        tl->current.nprocs = SIM_SAMPLE_PROCS;
}

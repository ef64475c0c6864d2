/* The cost model (shim/src/cost_model.c) alone: measurements and runs fed as numbers,
 * built with AddressSanitizer and UBSan by tests/test_compute_share.py.
 * Prints "N passed, N failed". */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "internal.h"

#define US 1000LL
#define MS 1000000LL
#define S 1000000000ULL

static int k1, k2; /* launch targets: their addresses */

static struct vgl_costs *fresh(void)
{
    return calloc(1, sizeof(struct vgl_costs));
}

static int64_t cost_of(struct vgl_costs *costs, const void *key)
{
    int64_t ns;
    return vgl_cost_known(costs, key, &ns) ? ns : -1;
}

static void learn(struct vgl_costs *costs, const void *key, int64_t ns, uint64_t now)
{
    struct vgl_settlement settled;
    vgl_cost_learn(costs, key, ns, VGL_ON_GPU, now, &settled);
}

/* A measurement from where the launch returned, on the host's clock. */
static void learn_on_host(struct vgl_costs *costs, const void *key, int64_t ns, uint64_t now)
{
    struct vgl_settlement settled;
    vgl_cost_learn(costs, key, ns, VGL_ON_HOST, now, &settled);
}

/* A group of runs on several streams, its union per launch. */
static void learn_over_runs(struct vgl_costs *costs, const void *key, int64_t ns, uint64_t now)
{
    struct vgl_settlement settled;
    vgl_cost_learn(costs, key, ns, VGL_OVER_RUNS, now, &settled);
}

/* A launch-bound program: its start event completed before the launch (the
 * stream was idle), 6 us before the kernel ended; the host took 4 us from
 * recording it to the launch's return.  The kernel took 2 us, not 6. */
static void test_an_idle_stream_begins_at_the_launch_return(void)
{
    int64_t start = vgl_interval_start(100 * US, 5 * S, 5 * S + 4 * US);
    CHECK(start == 104 * US, "start %lld", (long long)start);
    CHECK(106 * US - start == 2 * US, "kernel %lld", (long long)(106 * US - start));
}

/* A GPU-bound one: its start event had not completed before the launch (the
 * kernel was queued behind earlier work): the event's time is the start. */
static void test_a_busy_stream_begins_at_its_event(void)
{
    CHECK(vgl_interval_start(100 * US, 0, 5 * S + 4 * US) == 100 * US, "event's time");
}

static void test_a_kernel_never_measured_costs_the_first_charge(void)
{
    struct vgl_costs *costs = fresh();
    int64_t ns;
    CHECK(!vgl_cost_known(costs, &k1, &ns) && ns == vgl_timings.first_cost_ns, "not known: %lld", (long long)ns);
    learn(costs, &k1, 20 * US, S);
    CHECK(cost_of(costs, &k1) == 20 * US, "learnt: %lld", (long long)cost_of(costs, &k1));
    free(costs);
}

/* Intervals only grow with waiting (other processes' time slices): the cost
 * is the least of recent ones. */
static void test_the_least_of_recent_measurements(void)
{
    struct vgl_costs *costs = fresh();
    learn(costs, &k1, 3 * MS, S);
    for (int i = 0; i < 6; i++)
        learn(costs, &k1, i % 2 ? 3 * MS : MS, S + (uint64_t)i * MS);
    CHECK(cost_of(costs, &k1) == MS, "least: %lld", (long long)cost_of(costs, &k1));
    free(costs);
}

/* One measurement the host's clock made too short (the thread descheduled
 * as the launch returned) is not a cost; one of the GPU's clock alone is
 * never too short, and counts at once. */
static void test_one_short_measurement_on_the_host_clock_is_not_taken(void)
{
    struct vgl_costs *costs = fresh();
    for (int i = 0; i < 4; i++)
        learn_on_host(costs, &k1, 2 * US, S + (uint64_t)i);
    learn_on_host(costs, &k1, 200, S + 10);
    learn_on_host(costs, &k1, 2 * US, S + 11);
    CHECK(cost_of(costs, &k1) == 2 * US, "cost %lld", (long long)cost_of(costs, &k1));
    learn(costs, &k1, US, S + 12);
    CHECK(cost_of(costs, &k1) == US, "cost %lld", (long long)cost_of(costs, &k1));
    free(costs);
    /* Nor the second of a kernel's measurements. */
    costs = fresh();
    learn_on_host(costs, &k1, 2 * US, S);
    learn_on_host(costs, &k1, 200, S + 1);
    CHECK(cost_of(costs, &k1) == 2 * US, "cost %lld", (long long)cost_of(costs, &k1));
    free(costs);
}

/* A launch-bound program on two streams: every group of runs teaches its
 * union per launch on the GPU's clock, 12 us with the idle gaps, while a
 * launch timed alone, from its return, took 2 us.  Over windows that roll,
 * the groups' lessons do not enter the median of the host's measurements:
 * the cost is the kernel's, not the gaps'. */
static void test_runs_with_idle_gaps_do_not_outvote_a_launch_timed_alone(void)
{
    struct vgl_costs *costs = fresh();
    for (uint64_t w = 0; w < 4; w++)
        for (uint64_t i = 0; i < 6; i++) {
            uint64_t now = S + w * S + 3 * i;
            learn_over_runs(costs, &k1, 12 * US, now);
            learn_over_runs(costs, &k1, 12 * US, now + 1);
            learn_on_host(costs, &k1, 2 * US, now + 2);
        }
    CHECK(cost_of(costs, &k1) == 2 * US, "cost %lld", (long long)cost_of(costs, &k1));
    free(costs);
}

/* A kernel that became slower is charged so within two windows. */
static void test_a_slower_kernel_is_charged_so_within_two_windows(void)
{
    struct vgl_costs *costs = fresh();
    learn(costs, &k1, MS, S);
    for (uint64_t t = S; t < 4 * S; t += 100 * MS)
        learn(costs, &k1, 2 * MS, t + 1);
    CHECK(cost_of(costs, &k1) == 2 * MS, "cost %lld", (long long)cost_of(costs, &k1));
    free(costs);
}

/* A kernel measured seldom (every two seconds) is charged the least of
 * several measurements, most of them stretched by other processes' slices. */
static void test_a_seldom_measured_kernel_keeps_its_least(void)
{
    struct vgl_costs *costs = fresh();
    learn(costs, &k1, 20 * MS, S);
    for (uint64_t i = 1; i <= 3; i++)
        learn(costs, &k1, 40 * MS, S + 2 * i * S);
    CHECK(cost_of(costs, &k1) == 20 * MS, "cost %lld", (long long)cost_of(costs, &k1));
    free(costs);
}

/* A kernel's launches until it has been measured three times, measured or
 * not, are held back and settled at its cost then: processes started
 * together stretch one another's first measurements. */
static void test_the_first_launches_are_settled_at_the_third_measurement(void)
{
    struct vgl_costs *costs = fresh();
    struct vgl_settlement s;
    CHECK(!vgl_cost_held_back(costs, &k1, MS), "a kernel not being measured: settled as charged");
    CHECK(vgl_cost_measure_first(costs, &k1, 1, S, &s) && !s.charged_ns, "the first is measured");
    CHECK(!vgl_cost_measure_first(costs, &k1, 1, S + 1, &s), "the next waits for it");
    CHECK(vgl_cost_held_back(costs, &k1, vgl_timings.first_cost_ns) && vgl_cost_held_back(costs, &k1, vgl_timings.first_cost_ns),
          "it and the measured one are held back");
    vgl_cost_learn(costs, &k1, 80 * MS, VGL_ON_GPU, S + 2, &s);
    CHECK(!s.charged_ns && !s.used_ns, "not settled at the first");
    CHECK(cost_of(costs, &k1) == 80 * MS, "though launches after it are charged so");
    CHECK(vgl_cost_held_back(costs, &k1, 80 * MS), "and held back");
    vgl_cost_learn(costs, &k1, 20 * MS, VGL_ON_GPU, S + 3, &s);
    CHECK(!s.charged_ns, "nor at the second");
    CHECK(vgl_cost_held_back(costs, &k1, 80 * MS), "the third measured");
    vgl_cost_learn(costs, &k1, 20 * MS, VGL_ON_GPU, S + 4, &s);
    CHECK(s.charged_ns == 2 * vgl_timings.first_cost_ns + 2 * 80 * MS && s.used_ns == 4 * 20 * MS && s.device == 1,
          "at the third: %lld charged, %lld used", (long long)s.charged_ns, (long long)s.used_ns);
    CHECK(!vgl_cost_held_back(costs, &k1, 20 * MS), "settled as charged from then");
    vgl_cost_learn(costs, &k1, 20 * MS, VGL_ON_GPU, S + 5, &s);
    CHECK(!s.charged_ns, "once");
    /* A first measurement that never comes back is tried again after a second. */
    CHECK(vgl_cost_measure_first(costs, &k2, 0, S, &s), "k2 measured");
    CHECK(vgl_cost_measure_first(costs, &k2, 0, 3 * S, &s), "and again");
    free(costs);
}

/* Every launch is measured until two measurements in a row hold; then one
 * after 8, 32 and 128 launches; a cost that moves up starts again. */
static void test_the_cadence(void)
{
    struct vgl_cadence c = {.sampled_ns = S};
    CHECK(vgl_cadence_due(&c, S, MS), "due at first");
    vgl_cadence_learnt(&c, 1);
    CHECK(vgl_cadence_due(&c, S, MS), "a new cost: due");
    vgl_cadence_learnt(&c, 0);
    CHECK(vgl_cadence_due(&c, S, MS), "held once: due");
    vgl_cadence_learnt(&c, -1);
    uint32_t gaps[3];
    for (int i = 0; i < 3; i++) {
        vgl_cadence_sampled(&c, S);
        uint32_t n = 0;
        while (!vgl_cadence_due(&c, S, MS)) {
            vgl_cadence_skipped(&c);
            n++;
        }
        gaps[i] = n;
        vgl_cadence_learnt(&c, 0);
    }
    CHECK(gaps[0] == 8 && gaps[1] == 32 && gaps[2] == 128, "gaps %u %u %u", gaps[0], gaps[1], gaps[2]);
    vgl_cadence_learnt(&c, 1);
    vgl_cadence_sampled(&c, S);
    CHECK(vgl_cadence_due(&c, S, MS), "a cost moved up: every launch again");
    /* A kernel measured seldom is measured two cost windows after the last
     * all the same; a long one, at every launch. */
    struct vgl_cadence slow = {.every = 128, .sampled_ns = S};
    uint64_t two_windows = 2 * vgl_timings.cost_window_ns;
    CHECK(!vgl_cadence_due(&slow, S + two_windows - 1, MS) && vgl_cadence_due(&slow, S + two_windows, MS),
          "two cost windows after the last");
    int64_t long_kernel = vgl_timings.long_kernel_ns;
    CHECK(vgl_cadence_due(&slow, S, long_kernel) && !vgl_cadence_due(&slow, S, long_kernel - 1),
          "a long kernel: at every launch");
}

static int64_t add(struct vgl_union *u, int64_t start, int64_t end, int64_t charged, bool known, const void *key,
                   struct vgl_lesson *lesson, bool *taught)
{
    struct vgl_span r = {.start_ns = start, .gpu_start_ns = start, .end_ns = end, .charged_ns = charged,
                         .launches = 1, .known = known, .key = key};
    return vgl_union_add(u, &r, lesson, taught);
}

/* A launch timed alone on an idle stream, its start moved from its event
 * (at 0) to its launch's return, which a descheduled thread made late (at
 * 5 us; its kernel ended at 6 us): it adds to the busy time from there, but
 * its group, alone, teaches from the event, on the GPU's clock alone, never
 * shorter than the kernel (it taught 1 us a launch, past the median of the
 * host's measurements). */
static void test_a_late_return_teaches_no_union_too_short(void)
{
    struct vgl_union u = {0};
    struct vgl_lesson lesson;
    bool taught;
    struct vgl_span timed = {.start_ns = 5 * US, .gpu_start_ns = 0, .end_ns = 6 * US, .charged_ns = 2 * US,
                             .launches = 1, .known = true, .key = &k1};
    CHECK(vgl_union_add(&u, &timed, &lesson, &taught) == US && !taught, "busy from its return");
    CHECK(vgl_union_close(&u, &lesson) && lesson.per_launch_ns == 6 * US, "taught %lld a launch",
          (long long)lesson.per_launch_ns);
}

/* Two streams' runs that overlap count once, and teach their union per launch. */
static void test_overlapping_runs_count_once(void)
{
    struct vgl_union u = {0};
    struct vgl_lesson lesson;
    bool taught;
    CHECK(add(&u, 0, MS, MS, false, &k1, &lesson, &taught) == MS && !taught, "first run");
    CHECK(add(&u, MS / 2, 3 * MS / 2, MS, false, &k1, &lesson, &taught) == MS / 2 && !taught, "half of it overlaps");
    CHECK(add(&u, 2 * MS, 3 * MS, MS, false, &k1, &lesson, &taught) == MS && taught, "a new group");
    CHECK(lesson.key == &k1 && lesson.per_launch_ns == 3 * MS / 4, "1.5 ms for two launches: %lld",
          (long long)lesson.per_launch_ns);
    CHECK(vgl_union_close(&u, &lesson) && lesson.per_launch_ns == MS, "the last group: %lld",
          (long long)lesson.per_launch_ns);
    CHECK(!vgl_union_close(&u, &lesson), "none left");
}

/* A run read back after a later one that began after it adds its own stretch. */
static void test_a_run_read_out_of_order_adds_its_stretch(void)
{
    struct vgl_union u = {0};
    struct vgl_lesson lesson;
    bool taught;
    add(&u, 2 * MS, 3 * MS, MS, false, &k1, &lesson, &taught);
    CHECK(add(&u, MS, 5 * MS / 2, MS, false, &k1, &lesson, &taught) == MS, "1 ms before the group");
}

/* Known launches are counted at most what they were charged, over runs:
 * a span that holds the stream's idle time is not busy time. */
static void test_known_runs_count_at_most_their_charge(void)
{
    struct vgl_union u = {0};
    struct vgl_lesson lesson;
    bool taught;
    CHECK(add(&u, 0, 10 * US, 2 * US, true, &k1, &lesson, &taught) == 2 * US, "a span with idle gaps");
    CHECK(add(&u, 20 * US, 21 * US, 2 * US, true, &k1, &lesson, &taught) == US, "a shorter one");
    CHECK(add(&u, 30 * US, 33 * US, 2 * US, true, &k1, &lesson, &taught) == 3 * US, "what the last left over");
}

/* A run closes at 64 launches, or 20 ms of charges (640 ms where its
 * kernels average 5 ms or more). */
static void test_when_a_run_closes(void)
{
    int64_t run = vgl_timings.run_ns, long_run = vgl_timings.long_run_ns;
    CHECK(!vgl_run_full(run - MS, 10) && vgl_run_full(run, 10), "a run's charge of short kernels");
    CHECK(!vgl_run_full(63 * US, 63) && vgl_run_full(64 * US, 64), "64 launches");
    CHECK(!vgl_run_full(long_run - 60 * MS, 60) && vgl_run_full(long_run, 60), "a long run's of long kernels");
}

/* A run is first asked about once its known charges have passed twice over
 * (at once where a cost is not known), then after as long as it was late:
 * at least poll_known_ns, or poll_first_ns for a kernel not measured yet. */
static void test_the_polling_pace(void)
{
    uint64_t known = vgl_timings.poll_known_ns, first = vgl_timings.poll_first_ns;
    CHECK(vgl_run_due(true, 3 * MS, S) == S + 6 * MS && vgl_run_due(false, 3 * MS, S) == S, "first asked");
    CHECK(vgl_run_poll(true, S, S + known + 5 * MS) == S + 2 * (known + 5 * MS), "as long as it was late");
    CHECK(vgl_run_poll(true, S, S + 1) == S + 1 + known, "poll_known_ns at least");
    CHECK(vgl_run_poll(false, S, S + 1) == S + 1 + first, "poll_first_ns where the cost is not known");
}

/* Whether a stream was idle is asked for kernels under idle_asked_below_ns,
 * or not known; runs follow one another on several streams, from a reference
 * younger than reference_ns. */
static void test_when_idle_is_asked_and_runs_follow(void)
{
    int64_t below = vgl_timings.idle_asked_below_ns;
    uint64_t reference = vgl_timings.reference_ns;
    CHECK(vgl_idle_asked(false, 5 * MS) && vgl_idle_asked(true, below - 1) && !vgl_idle_asked(true, below),
          "idle asked");
    CHECK(!vgl_runs_follow(1, 0) && vgl_runs_follow(2, reference - 1) && !vgl_runs_follow(2, reference), "follow");
}

int main(void)
{
    test_an_idle_stream_begins_at_the_launch_return();
    test_a_busy_stream_begins_at_its_event();
    test_a_kernel_never_measured_costs_the_first_charge();
    test_the_least_of_recent_measurements();
    test_one_short_measurement_on_the_host_clock_is_not_taken();
    test_runs_with_idle_gaps_do_not_outvote_a_launch_timed_alone();
    test_a_slower_kernel_is_charged_so_within_two_windows();
    test_a_seldom_measured_kernel_keeps_its_least();
    test_the_first_launches_are_settled_at_the_third_measurement();
    test_the_cadence();
    test_overlapping_runs_count_once();
    test_a_run_read_out_of_order_adds_its_stretch();
    test_a_late_return_teaches_no_union_too_short();
    test_known_runs_count_at_most_their_charge();
    test_when_a_run_closes();
    test_the_polling_pace();
    test_when_idle_is_asked_and_runs_follow();
    return check_summary();
}

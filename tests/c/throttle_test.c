/* The compute budget (shim/src/throttle.c) alone, on a fake clock, built with
 * AddressSanitizer and UBSan by tests/test_compute_share.py.  Prints "N passed, N failed". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"
#include "internal.h"

#define MS 1000000LL
#define S 1000000000LL

static struct vgl_device_state *fresh(uint32_t pct)
{
    struct vgl_device_state *dev = calloc(1, sizeof *dev);
    dev->cores_pct = pct;
    return dev;
}

/* A client that launches `cost_ns` kernels as fast as it is let, from
 * `start_ns` for `span_ns` of fake time: the GPU time it was let start. */
static int64_t greedy(struct vgl_device_state *dev, int64_t start_ns, int64_t span_ns, int64_t cost_ns)
{
    int64_t now = start_ns, used = 0;
    while (now < start_ns + span_ns) {
        int64_t wait = vgl_throttle_admit(dev, (uint64_t)now, cost_ns);
        if (wait < 0) {
            CHECK(wait >= 0, "wait %lld", (long long)wait);
            break;
        }
        if (wait == 0)
            used += cost_ns;
        else
            now += wait;
    }
    return used;
}

static void test_no_share_never_waits(void)
{
    for (uint32_t pct = 0; pct <= 100; pct += 100) {
        struct vgl_device_state *dev = fresh(pct);
        CHECK(vgl_throttle_share(dev) == 0, "share of %u", pct);
        int waited = 0;
        for (int i = 0; i < 1000; i++)
            waited += vgl_throttle_admit(dev, (uint64_t)(1 + i), 10 * MS) != 0;
        CHECK(waited == 0 && dev->budget_ns == 0, "cores %u: %d waits, budget %lld", pct, waited,
              (long long)dev->budget_ns);
        free(dev);
    }
}

/* Whatever the kernels' length, a greedy client gets its share of the time
 * (plus at most one window's budget and one kernel at the start). */
static void test_the_share_holds(void)
{
    static const uint32_t shares[] = {10, 25, 50, 90};
    static const int64_t costs[] = {20000, MS, 20 * MS};
    for (size_t i = 0; i < sizeof shares / sizeof shares[0]; i++) {
        for (size_t j = 0; j < sizeof costs / sizeof costs[0]; j++) {
            struct vgl_device_state *dev = fresh(shares[i]);
            int64_t used = greedy(dev, S, 10 * S, costs[j]);
            int64_t want = 10 * S * shares[i] / 100;
            int64_t slack = (int64_t)vgl_timings.budget_window_ns * shares[i] / 100 + 2 * costs[j];
            CHECK(used >= want - want / 1000 - costs[j] && used <= want + slack, "%u%% of 10 s with %lld ns kernels: %lld ns",
                  shares[i], (long long)costs[j], (long long)used);
            free(dev);
        }
    }
}

/* A kernel longer than the budget runs, and the next waits for the debt. */
static void test_a_long_kernel_leaves_a_debt(void)
{
    struct vgl_device_state *dev = fresh(10);
    CHECK(vgl_throttle_admit(dev, S, 50 * MS) == 0, "the first launch goes");
    int64_t wait = vgl_throttle_admit(dev, S, MS);
    /* It started with a full budget: 10 ms at 10 %. */
    CHECK(wait >= 399 * MS && wait <= 401 * MS, "40 ms owed at 10%%: wait %lld ns", (long long)wait);
    CHECK(vgl_throttle_admit(dev, (uint64_t)(S + wait), MS) == 0, "paid by then");
    free(dev);
}

/* The charge is an estimate; the measured time is what counts. */
static void test_settling(void)
{
    struct vgl_device_state *dev = fresh(50);
    CHECK(vgl_throttle_admit(dev, S, 0) == 0, "admitted");
    dev->budget_ns = 0; /* spent what it started with */
    CHECK(vgl_throttle_admit(dev, S, 4 * MS) == 0, "admitted");
    CHECK(dev->budget_ns == -4 * MS, "charged: %lld", (long long)dev->budget_ns);
    vgl_throttle_settle(dev, 4 * MS, 1 * MS);
    CHECK(dev->budget_ns == -1 * MS, "3 ms back: %lld", (long long)dev->budget_ns);
    vgl_throttle_settle(dev, 1 * MS, 3 * MS);
    CHECK(dev->budget_ns == -3 * MS, "2 ms more owed: %lld", (long long)dev->budget_ns);
    int64_t wait = vgl_throttle_admit(dev, S, MS);
    CHECK(wait >= 6 * MS && wait <= 6 * MS + 1, "3 ms at 50%%: wait %lld", (long long)wait);
    free(dev);
}

/* A container starts with the budget an idle one keeps. */
static void test_it_starts_full(void)
{
    struct vgl_device_state *dev = fresh(25);
    CHECK(vgl_throttle_admit(dev, S, MS) == 0, "admitted");
    int64_t full = (int64_t)vgl_timings.budget_window_ns * 25 / 100;
    CHECK(dev->budget_ns == full - MS, "budget %lld, window %lld", (long long)dev->budget_ns, (long long)full);
    free(dev);
}

/* An idle container keeps one window of budget, not its whole idle time. */
static void test_idle_time_is_not_hoarded(void)
{
    struct vgl_device_state *dev = fresh(25);
    vgl_throttle_admit(dev, S, 0);
    vgl_throttle_admit(dev, 1000 * S, 0);
    int64_t full = (int64_t)vgl_timings.budget_window_ns * 25 / 100;
    CHECK(dev->budget_ns == full, "budget %lld, window %lld", (long long)dev->budget_ns, (long long)full);
    free(dev);
}

/* A refund (launches charged more than their kernels took) is kept past the
 * cap; the clock only adds up to it. */
static void test_a_refund_is_kept_past_the_cap(void)
{
    struct vgl_device_state *dev = fresh(25);
    vgl_throttle_admit(dev, S, 0);
    vgl_throttle_admit(dev, 2 * S, 0);
    int64_t full = (int64_t)vgl_timings.budget_window_ns * 25 / 100;
    vgl_throttle_settle(dev, 10 * MS, 0);
    vgl_throttle_admit(dev, 3 * S, 0);
    CHECK(dev->budget_ns == full + 10 * MS, "budget %lld, window %lld", (long long)dev->budget_ns,
          (long long)full);
    free(dev);
}

/* A refill stamped far ahead of the caller's clock (a process of the
 * container whose clock runs 1000 s ahead, or a region written by hand)
 * holds no launch back until the caller's clock gets there: the budget
 * refills from the caller's time on, and the share holds. */
static void test_a_refill_from_the_future_stalls_no_one(void)
{
    struct vgl_device_state *dev = fresh(25);
    vgl_throttle_admit(dev, 1000 * S, 0);
    int64_t used = greedy(dev, S, 10 * S, MS);
    int64_t expected = 10 * S * 25 / 100 + (int64_t)vgl_timings.budget_window_ns * 25 / 100;
    CHECK(used >= expected * 9 / 10 && used <= expected + MS, "used %lld of %lld", (long long)used,
          (long long)expected);
    free(dev);
}

/* `vgpulimit set --cores` changes cores_pct under running processes. */
static void test_a_live_change(void)
{
    struct vgl_device_state *dev = fresh(25);
    int64_t before = greedy(dev, S, 4 * S, MS);
    dev->cores_pct = 75;
    int64_t after = greedy(dev, 5 * S, 4 * S, MS);
    CHECK(before < 11 * S / 10 && after > 29 * S / 10, "25%% then 75%% of 4 s: %lld, %lld ns", (long long)before,
          (long long)after);
    dev->cores_pct = 0;
    CHECK(vgl_throttle_admit(dev, 10 * S, 10 * S) == 0, "no share: no wait");
    free(dev);
}

/* Threads (as processes would) draw from one budget on a shared clock: none
 * gets past the share between them. */
enum { THREADS = 4, DRAWS = 50000 };
static struct vgl_device_state *shared_dev;
static int64_t shared_clock = S;
static int64_t shared_used;

static void *drawer(void *arg)
{
    (void)arg;
    for (int i = 0; i < DRAWS; i++) {
        int64_t now = __atomic_add_fetch(&shared_clock, 2000, __ATOMIC_RELAXED);
        if (vgl_throttle_admit(shared_dev, (uint64_t)now, 20000) != 0)
            continue;
        /* Some launches turn out shorter than charged. */
        int64_t measured = i % 7 ? 20000 : 10000;
        vgl_throttle_settle(shared_dev, 20000, measured);
        __atomic_add_fetch(&shared_used, measured, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void test_racing_drawers(void)
{
    shared_dev = fresh(30);
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, drawer, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    int64_t span = shared_clock - S;
    int64_t want = span * 30 / 100;
    int64_t slack = (int64_t)vgl_timings.budget_window_ns * 30 / 100 + THREADS * 20000;
    CHECK(shared_used <= want + slack && shared_used >= want - slack, "30%% of %lld ns: %lld ns",
          (long long)span, (long long)shared_used);
    free(shared_dev);
}

int main(void)
{
    test_no_share_never_waits();
    test_the_share_holds();
    test_a_long_kernel_leaves_a_debt();
    test_settling();
    test_it_starts_full();
    test_idle_time_is_not_hoarded();
    test_a_refund_is_kept_past_the_cap();
    test_a_live_change();
    test_a_refill_from_the_future_stalls_no_one();
    test_racing_drawers();
    return check_summary();
}

/* This process's live device allocations, so that a free, release, destroy or
 * trim returns exactly what was charged.  One table per kind of handle
 * (pointers, VMM handles, arrays, pools): their values may coincide.  Open
 * addressing with backward-shift deletion; a key we do not know is simply
 * not found.
 *
 * A key is only ever recorded by the thread the driver just gave it to, and
 * taken out by a thread about to give it back, before the driver is asked
 * (charge.c, vmm_hooks.c): the driver may hand a freed handle to another
 * thread at once, whose record must not meet the old one. */
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

struct table {
    struct vgl_allocation *entries;
    size_t capacity; /* a power of two */
    size_t count;
};

static struct table tables[VGL_ALLOC_KINDS];

/* Every allocation and free takes this lock, for a few dozen instructions:
 * a word taken by one exchange and given back by a plain store costs
 * measurably less there than a mutex (benchmarks/overhead.py).  A holder on
 * another CPU is done at once; one preempted needs this CPU, and one of a
 * lower real-time priority needs more than a yield. */
static int lock;

static void give_way(unsigned spins)
{
    if (spins < 64)
        return;
    if (spins < 128)
        sched_yield();
    else
        nanosleep(&(struct timespec){0, 50000}, NULL);
}

static void lock_tables(void)
{
    while (__atomic_exchange_n(&lock, 1, __ATOMIC_ACQUIRE))
        for (unsigned spins = 0; __atomic_load_n(&lock, __ATOMIC_RELAXED); spins++)
            give_way(spins);
}

static void unlock_tables(void) { __atomic_store_n(&lock, 0, __ATOMIC_RELEASE); }

static size_t home_of(const struct table *t, uint64_t key)
{
    /* Handles are aligned pointers: mix the bits before masking. */
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (t->capacity - 1);
}

static size_t slot_of(const struct table *t, uint64_t key)
{
    size_t i = home_of(t, key);
    while (t->entries[i].key && t->entries[i].key != key)
        i = (i + 1) & (t->capacity - 1);
    return i;
}

static void put(struct table *t, struct vgl_allocation e)
{
    size_t i = slot_of(t, e.key);
    if (!t->entries[i].key)
        t->count++;
    t->entries[i] = e;
}

static bool grow(struct table *t)
{
    struct table old = *t;
    size_t capacity = old.capacity ? old.capacity * 2 : 256;
    struct vgl_allocation *fresh = calloc(capacity, sizeof *fresh);
    if (!fresh)
        return false;
    *t = (struct table){fresh, capacity, 0};
    for (size_t i = 0; i < old.capacity; i++)
        if (old.entries[i].key)
            put(t, old.entries[i]);
    free(old.entries);
    return true;
}

bool vgl_allocations_put(enum vgl_allocation_kind kind, uint64_t key, int32_t device, uint64_t bytes,
                         uint64_t link)
{
    struct table *t = &tables[kind];
    lock_tables();
    bool ok = true;
    size_t i = t->capacity ? slot_of(t, key) : 0;
    if (t->capacity && t->entries[i].key) {
        t->entries[i] = (struct vgl_allocation){key, bytes, link, device, t->entries[i].refs};
    } else if ((t->count + 1) * 2 <= t->capacity) {
        /* The free slot found is where put() would look: no second probe. */
        t->entries[i] = (struct vgl_allocation){key, bytes, link, device, 1};
        t->count++;
    } else if ((ok = grow(t))) {
        put(t, (struct vgl_allocation){key, bytes, link, device, 1});
    }
    unlock_tables();
    return ok;
}

/* Backward shift: move later members of the run into the hole at i. */
static void remove_at(struct table *t, size_t i)
{
    size_t hole = i, mask = t->capacity - 1;
    for (size_t j = (i + 1) & mask; t->entries[j].key; j = (j + 1) & mask) {
        size_t home = home_of(t, t->entries[j].key);
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            t->entries[hole] = t->entries[j];
            hole = j;
        }
    }
    t->entries[hole] = (struct vgl_allocation){0};
    t->count--;
}

/* Finds `key`, adds `delta` to its holders, removes it when none is left
 * (or when `take`), and copies it to *out.  False: not found. */
static bool update(enum vgl_allocation_kind kind, uint64_t key, int delta, bool take,
                   struct vgl_allocation *out)
{
    struct table *t = &tables[kind];
    bool found = false;
    lock_tables();
    if (t->capacity && key) {
        size_t i = slot_of(t, key);
        found = t->entries[i].key != 0;
        if (found) {
            *out = t->entries[i];
            out->refs += delta;
            t->entries[i].refs = out->refs;
            if (take || t->entries[i].refs <= 0)
                remove_at(t, i);
        }
    }
    unlock_tables();
    return found;
}

bool vgl_allocations_get(enum vgl_allocation_kind kind, uint64_t key, int32_t *device, uint64_t *bytes)
{
    struct vgl_allocation a;
    if (!update(kind, key, 0, false, &a))
        return false;
    *device = a.device;
    *bytes = a.bytes;
    return true;
}

bool vgl_allocations_find(enum vgl_allocation_kind kind, uint64_t key, struct vgl_allocation *out)
{
    return update(kind, key, 0, false, out);
}

bool vgl_allocations_take(enum vgl_allocation_kind kind, uint64_t key, struct vgl_allocation *out)
{
    return update(kind, key, 0, true, out);
}

bool vgl_allocations_restore(enum vgl_allocation_kind kind, const struct vgl_allocation *a)
{
    struct table *t = &tables[kind];
    lock_tables();
    bool ok = (t->count + 1) * 2 <= t->capacity || grow(t);
    if (ok)
        put(t, *a);
    unlock_tables();
    return ok;
}

int vgl_allocations_hold(enum vgl_allocation_kind kind, uint64_t key, int delta, int32_t *device,
                         uint64_t *bytes)
{
    struct vgl_allocation a;
    if (!update(kind, key, delta, false, &a))
        return -1;
    *device = a.device;
    *bytes = a.bytes;
    return a.refs < 0 ? 0 : a.refs;
}

/* The parent's allocations are not the child's. */
static void forget_in_child(void)
{
    lock = 0;
    for (int kind = 0; kind < VGL_ALLOC_KINDS; kind++) {
        free(tables[kind].entries);
        tables[kind] = (struct table){0};
    }
}

VGL_AFTER_FORK(forget_in_child)

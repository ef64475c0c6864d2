/* This process's live device allocations, so that a free, release, destroy or
 * trim returns exactly what was charged.  One table per kind of handle
 * (pointers, VMM handles, arrays, pools): their values may coincide.  Open
 * addressing with backward-shift deletion; a key we do not know is simply
 * not found. */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

struct entry {
    uint64_t key;  /* 0: empty (no kind of handle is 0) */
    uint64_t bytes;
    uint64_t link; /* a key of another kind this one refers to (a mapping's handle) */
    int32_t device;
    int32_t refs;  /* holders of the charge: a VMM handle's own, and each mapping of it */
};

struct table {
    struct entry *entries;
    size_t capacity; /* a power of two */
    size_t count;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct table tables[VGL_ALLOC_KINDS];

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

static void put(struct table *t, struct entry e)
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
    struct entry *fresh = calloc(capacity, sizeof *fresh);
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
    pthread_mutex_lock(&lock);
    bool ok = (t->count + 1) * 2 <= t->capacity || grow(t);
    if (ok)
        put(t, (struct entry){key, bytes, link, device, 1});
    pthread_mutex_unlock(&lock);
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
    t->entries[hole] = (struct entry){0};
    t->count--;
}

/* Finds `key`, adds `delta` to its holders, removes it when none is left
 * (or when `take`), and copies it to *out.  False: not found. */
static bool update(enum vgl_allocation_kind kind, uint64_t key, int delta, bool take, struct entry *out)
{
    struct table *t = &tables[kind];
    bool found = false;
    pthread_mutex_lock(&lock);
    if (t->capacity && key) {
        size_t i = slot_of(t, key);
        found = t->entries[i].key != 0;
        if (found) {
            t->entries[i].refs += delta;
            *out = t->entries[i];
            if (take || t->entries[i].refs <= 0)
                remove_at(t, i);
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

bool vgl_allocations_get(enum vgl_allocation_kind kind, uint64_t key, int32_t *device, uint64_t *bytes)
{
    struct entry e;
    if (!update(kind, key, 0, false, &e))
        return false;
    *device = e.device;
    *bytes = e.bytes;
    return true;
}

bool vgl_allocations_take(enum vgl_allocation_kind kind, uint64_t key, int32_t *device, uint64_t *bytes)
{
    struct entry e;
    if (!update(kind, key, 0, true, &e))
        return false;
    *device = e.device;
    *bytes = e.bytes;
    return true;
}

bool vgl_allocations_take_link(enum vgl_allocation_kind kind, uint64_t key, uint64_t *bytes,
                               uint64_t *link)
{
    struct entry e;
    if (!update(kind, key, 0, true, &e))
        return false;
    *bytes = e.bytes;
    *link = e.link;
    return true;
}

int vgl_allocations_hold(enum vgl_allocation_kind kind, uint64_t key, int delta, int32_t *device,
                         uint64_t *bytes)
{
    struct entry e;
    if (!update(kind, key, delta, false, &e))
        return -1;
    *device = e.device;
    *bytes = e.bytes;
    return e.refs < 0 ? 0 : e.refs;
}

/* The parent's allocations are not the child's. */
static void forget_in_child(void)
{
    pthread_mutex_init(&lock, NULL);
    for (int kind = 0; kind < VGL_ALLOC_KINDS; kind++) {
        free(tables[kind].entries);
        tables[kind] = (struct table){0};
    }
}

VGL_AFTER_FORK(forget_in_child)

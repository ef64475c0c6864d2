/* This process's device allocations: pointer → (device, bytes charged), so a
 * free returns exactly what its allocation took.  Open addressing with
 * backward-shift deletion; a pointer we do not know is simply not found. */
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

struct entry {
    uint64_t ptr; /* 0: empty */
    uint64_t bytes;
    int32_t device;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *table;
static size_t capacity; /* a power of two */
static size_t count;

static size_t slot_of(uint64_t ptr)
{
    /* Device pointers are aligned: mix the bits before masking. */
    ptr ^= ptr >> 33;
    ptr *= 0xff51afd7ed558ccdULL;
    ptr ^= ptr >> 33;
    return (size_t)ptr & (capacity - 1);
}

static void put(struct entry e)
{
    size_t i = slot_of(e.ptr);
    while (table[i].ptr && table[i].ptr != e.ptr)
        i = (i + 1) & (capacity - 1);
    if (!table[i].ptr)
        count++;
    table[i] = e;
}

static bool grow(void)
{
    struct entry *old = table;
    size_t old_capacity = capacity;
    size_t new_capacity = capacity ? capacity * 2 : 256;
    struct entry *fresh = calloc(new_capacity, sizeof *fresh);
    if (!fresh)
        return false;
    table = fresh;
    capacity = new_capacity;
    count = 0;
    for (size_t i = 0; i < old_capacity; i++)
        if (old[i].ptr)
            put(old[i]);
    free(old);
    return true;
}

bool vgl_allocations_add(uint64_t ptr, int32_t device, uint64_t bytes)
{
    pthread_mutex_lock(&lock);
    bool ok = (count + 1) * 2 <= capacity || grow();
    if (ok)
        put((struct entry){ptr, bytes, device});
    pthread_mutex_unlock(&lock);
    return ok;
}

bool vgl_allocations_take(uint64_t ptr, int32_t *device, uint64_t *bytes)
{
    bool found = false;
    pthread_mutex_lock(&lock);
    if (capacity) {
        size_t i = slot_of(ptr);
        while (table[i].ptr && table[i].ptr != ptr)
            i = (i + 1) & (capacity - 1);
        if (table[i].ptr) {
            found = true;
            *device = table[i].device;
            *bytes = table[i].bytes;
            /* Backward-shift: move later members of the run into the hole. */
            size_t hole = i;
            for (size_t j = (i + 1) & (capacity - 1); table[j].ptr; j = (j + 1) & (capacity - 1)) {
                size_t home = slot_of(table[j].ptr);
                bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
                if (movable) {
                    table[hole] = table[j];
                    hole = j;
                }
            }
            table[hole] = (struct entry){0};
            count--;
        }
    }
    pthread_mutex_unlock(&lock);
    return found;
}

void vgl_allocations_forget(void)
{
    pthread_mutex_init(&lock, NULL);
    free(table);
    table = NULL;
    capacity = 0;
    count = 0;
}

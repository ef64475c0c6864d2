/* The one parser of limits: a memory cap as a size (base/number.c), a
 * percentage or a fraction of the device; a compute share; its policy.
 * Strict: the whole text must be one accepted form. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base.h"
#include "vgpulimit/limits.h"

#define PPM_WHOLE 1000000u

/* Short enough that a refusal naming a flag and its value fits one line of
 * 160 columns; `vgpulimit run --help` and docs/environment.md say the rest. */
static const char MEMORY_FORMS[] =
    "4GiB, 512Mi, 3000m (MiB), 4G (10^9 B), 50%, 0.5 (more in --help)";
static const char CORES_FORMS[] = "a whole percentage of the GPU's time from 1 to 100 (30 or 30%)";

const char *vgl_memory_forms(void) { return MEMORY_FORMS; }
const char *vgl_wait_forms(void) { return "0, or a duration with a unit up to 1h: 500ms, 2s, 1.5m"; }
const char *vgl_cores_forms(void) { return CORES_FORMS; }
const char *vgl_cores_policy_forms(void) { return "hard, borrow, none (HAMi-core's FORCE, DEFAULT, DISABLE)"; }
const char *vgl_priority_forms(void) { return "high, normal, low"; }
const char *vgl_hami_priority_forms(void) { return "0 (high) or 1 (low)"; }

int vgl_parse_memory(const char *text, struct vgl_mem_limit *out)
{
    char buf[64];
    int err = vgl_trimmed(text, buf, sizeof buf);
    if (err)
        return err;

    struct vgl_decimal d;
    const char *rest = vgl_parse_decimal(buf, &d, &err);
    if (!rest)
        return err;

    if (strcmp(rest, "%") == 0) {
        if (d.whole > 100 || (d.whole == 100 && d.nano != 0))
            return -ERANGE;
        uint64_t ppm = d.whole * 10000 + d.nano / 100000;
        if (ppm == 0)
            return -ERANGE;
        *out = (struct vgl_mem_limit){.ppm = (uint32_t)ppm};
        return 0;
    }
    if (*rest == '\0' && d.has_point) {
        /* A bare number with a point is a fraction of the device (Run:ai --gpu 0.2). */
        if (d.whole > 1 || (d.whole == 1 && d.nano != 0))
            return -ERANGE;
        uint64_t ppm = d.whole * PPM_WHOLE + d.nano / 1000;
        if (ppm == 0)
            return -ERANGE;
        *out = (struct vgl_mem_limit){.ppm = (uint32_t)ppm};
        return 0;
    }
    uint64_t bytes;
    err = vgl_size_of(&d, rest, &bytes);
    if (!err)
        *out = (struct vgl_mem_limit){.bytes = bytes};
    return err;
}

int vgl_parse_cores(const char *text, uint32_t *out_pct)
{
    char buf[16];
    int err = vgl_trimmed(text, buf, sizeof buf);
    if (err)
        return err;
    size_t n = strlen(buf);
    if (buf[n - 1] == '%')
        buf[--n] = '\0';
    if (n == 0 || n > 3)
        return n > 3 && strspn(buf, "0123456789") == n ? -ERANGE : -EINVAL;
    uint32_t pct = 0;
    for (size_t i = 0; i < n; i++) {
        if (buf[i] < '0' || buf[i] > '9')
            return -EINVAL;
        pct = pct * 10 + (uint32_t)(buf[i] - '0');
    }
    if (pct < 1 || pct > 100)
        return -ERANGE;
    *out_pct = pct;
    return 0;
}

int vgl_parse_wait(const char *text, uint64_t *out_ns)
{
    static const struct {
        const char *unit;
        uint64_t ns;
    } UNITS[] = {{"ms", 1000000ull}, {"s", 1000000000ull}, {"m", 60000000000ull}, {"h", 3600000000000ull}};
    char buf[32];
    int err = vgl_trimmed(text, buf, sizeof buf);
    if (err)
        return err;
    if (strcmp(buf, "0") == 0) {
        *out_ns = 0;
        return 0;
    }
    struct vgl_decimal d;
    const char *rest = vgl_parse_decimal(buf, &d, &err);
    if (!rest)
        return err;
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strcmp(rest, UNITS[i].unit) != 0)
            continue;
        if (d.whole > 3600000)
            return -ERANGE;
        uint64_t ns = d.whole * UNITS[i].ns + (uint64_t)((unsigned __int128)d.nano * UNITS[i].ns / 1000000000u);
        if (ns > VGL_MAX_WAIT_NS)
            return -ERANGE;
        *out_ns = ns;
        return 0;
    }
    return -EINVAL;
}

uint64_t vgl_cap_bytes(const struct vgl_mem_limit *limit, uint64_t total_bytes)
{
    if (limit->bytes)
        return total_bytes && limit->bytes > total_bytes ? total_bytes : limit->bytes;
    if (limit->ppm)
        /* 128-bit product: totals reach 2^47 and ppm 2^20. */
        return (uint64_t)((unsigned __int128)total_bytes * limit->ppm / PPM_WHOLE);
    return UINT64_MAX;
}

int vgl_parse_cores_policy(const char *text, uint32_t *out_policy)
{
    static const char *const NAMES[][2] = {{"hard", "force"}, {"borrow", "default"}, {"none", "disable"}};
    char buf[16];
    int err = vgl_trimmed(text, buf, sizeof buf);
    if (err)
        return -EINVAL;
    for (uint32_t i = 0; i < 3; i++) {
        if (strcasecmp(buf, NAMES[i][0]) == 0 || strcasecmp(buf, NAMES[i][1]) == 0) {
            *out_policy = i;
            return 0;
        }
    }
    return -EINVAL;
}

int vgl_parse_priority(const char *text, uint32_t *out_priority)
{
    static const char *const NAMES[] = {"normal", "high", "low"}; /* enum vgl_priority, in order */
    char buf[16];
    if (vgl_trimmed(text, buf, sizeof buf))
        return -EINVAL;
    for (uint32_t i = 0; i < 3; i++) {
        if (strcasecmp(buf, NAMES[i]) == 0) {
            *out_priority = i;
            return 0;
        }
    }
    return -EINVAL;
}

int vgl_parse_hami_priority(const char *text, uint32_t *out_priority)
{
    char buf[16];
    if (vgl_trimmed(text, buf, sizeof buf) || (strcmp(buf, "0") != 0 && strcmp(buf, "1") != 0))
        return -EINVAL;
    *out_priority = buf[0] == '0' ? VGL_PRIORITY_HIGH : VGL_PRIORITY_LOW;
    return 0;
}

uint32_t vgl_priority_rank(uint32_t priority)
{
    return priority == VGL_PRIORITY_HIGH ? 2 : priority == VGL_PRIORITY_LOW ? 0 : 1;
}

const char *vgl_format_bytes(uint64_t bytes, char *buf, uint32_t len)
{
    static const struct {
        const char *name;
        uint64_t size;
    } UNITS[] = {{"TiB", 1ULL << 40}, {"GiB", 1ULL << 30}, {"MiB", 1ULL << 20}, {"KiB", 1ULL << 10}};
    const size_t n = sizeof UNITS / sizeof UNITS[0];
    for (size_t i = 0; i < n; i++) {
        if (bytes >= UNITS[i].size && bytes % UNITS[i].size == 0 && bytes / UNITS[i].size < 10000) {
            snprintf(buf, len, "%llu %s", (unsigned long long)(bytes / UNITS[i].size), UNITS[i].name);
            return buf;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (bytes >= UNITS[i].size) {
            snprintf(buf, len, "%.1f %s", (double)bytes / (double)UNITS[i].size, UNITS[i].name);
            return buf;
        }
    }
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
}

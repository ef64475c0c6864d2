/* The one parser of limits.  Strict: the whole text must be one accepted form;
 * a unit that does not fit, trailing junk or an overflow is an error, never a
 * guess (the incumbent read "8GB" as 8 bytes and "1.5g" as 1 GiB). */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

#include "vgpulimit/limits.h"

#define PPM_WHOLE 1000000u

static const char MEMORY_FORMS[] =
    "bytes (1073741824), binary units (4Gi, 4GiB, 512Mi; k/m/g/t in lower case as HAMi "
    "and Docker: 3000m = 3000 MiB), decimal units (4G, 4GB = 4*10^9), a percentage of the "
    "device (50%) or a fraction of it (0.5)";
static const char CORES_FORMS[] = "a whole percentage of the GPU's time from 1 to 100 (30 or 30%)";

const char *vgl_memory_forms(void) { return MEMORY_FORMS; }
const char *vgl_cores_forms(void) { return CORES_FORMS; }
const char *vgl_cores_policy_forms(void) { return "hard, borrow, none (HAMi-core's FORCE, DEFAULT, DISABLE)"; }

struct unit {
    const char *suffix;
    uint64_t multiplier;
};

#define KI (1ULL << 10)
#define MI (1ULL << 20)
#define GI (1ULL << 30)
#define TI (1ULL << 40)
static const struct unit UNITS[] = {
    {"", 1},           {"B", 1},
    {"Ki", KI},        {"KiB", KI},        {"Mi", MI},        {"MiB", MI},
    {"Gi", GI},        {"GiB", GI},        {"Ti", TI},        {"TiB", TI},
    {"k", KI},         {"kb", KI},         {"m", MI},         {"mb", MI},
    {"g", GI},         {"gb", GI},         {"t", TI},         {"tb", TI},
    {"K", 1000ULL},    {"KB", 1000ULL},    {"M", 1000000ULL}, {"MB", 1000000ULL},
    {"G", 1000000000ULL}, {"GB", 1000000000ULL},
    {"T", 1000000000000ULL}, {"TB", 1000000000000ULL},
};

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* A decimal number "123" or "12.5": whole part and up to 9 fraction digits,
 * as whole * 10^9 + nano.  Returns the end, or NULL when there is no number. */
struct decimal {
    uint64_t whole;
    uint64_t nano; /* fraction, in 10^-9 */
    bool has_point;
};

static const char *parse_decimal(const char *s, struct decimal *out, int *err)
{
    *out = (struct decimal){0};
    const char *p = s;
    while (is_digit(*p)) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (out->whole > (UINT64_MAX - digit) / 10) {
            *err = -ERANGE;
            return NULL;
        }
        out->whole = out->whole * 10 + digit;
        p++;
    }
    bool any_digit = p != s;
    if (*p == '.') {
        out->has_point = true;
        p++;
        uint64_t scale = 100000000; /* first fraction digit, in 10^-9 */
        const char *frac = p;
        while (is_digit(*p)) {
            out->nano += (uint64_t)(*p - '0') * scale; /* digits past the 9th are dropped */
            scale /= 10;
            p++;
        }
        any_digit = any_digit || p != frac;
    }
    if (!any_digit) {
        *err = -EINVAL;
        return NULL;
    }
    return p;
}

/* value * multiplier without overflow: 0, or -ERANGE. */
static int scale_decimal(const struct decimal *d, uint64_t multiplier, uint64_t *out)
{
    if (d->whole != 0 && multiplier > UINT64_MAX / d->whole)
        return -ERANGE;
    uint64_t whole = d->whole * multiplier;
    uint64_t frac = (uint64_t)((unsigned __int128)d->nano * multiplier / 1000000000u);
    if (whole > UINT64_MAX - frac)
        return -ERANGE;
    *out = whole + frac;
    return 0;
}

/* Copies `text` without leading and trailing blanks into buf, and without
 * leading zeros before another digit: "0030" is 30, "000" still 0, "0.5" 0.5. */
static int trimmed(const char *text, char *buf, size_t len)
{
    if (!text)
        return -EINVAL;
    while (*text == ' ' || *text == '\t')
        text++;
    while (text[0] == '0' && is_digit(text[1]))
        text++;
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '\t' || text[n - 1] == '\n'))
        n--;
    if (n == 0 || n >= len)
        return -EINVAL;
    memcpy(buf, text, n);
    buf[n] = '\0';
    return 0;
}

int vgl_parse_memory(const char *text, struct vgl_mem_limit *out)
{
    char buf[64];
    int err = trimmed(text, buf, sizeof buf);
    if (err)
        return err;

    struct decimal d;
    const char *rest = parse_decimal(buf, &d, &err);
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
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strcmp(rest, UNITS[i].suffix) != 0)
            continue;
        if (UNITS[i].multiplier == 1 && d.has_point)
            return -EINVAL; /* a fraction of a byte */
        uint64_t bytes;
        err = scale_decimal(&d, UNITS[i].multiplier, &bytes);
        if (err)
            return err;
        if (bytes == 0 || bytes > (UINT64_MAX >> 1))
            return -ERANGE;
        *out = (struct vgl_mem_limit){.bytes = bytes};
        return 0;
    }
    return -EINVAL;
}

int vgl_parse_cores(const char *text, uint32_t *out_pct)
{
    char buf[16];
    int err = trimmed(text, buf, sizeof buf);
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
    int err = trimmed(text, buf, sizeof buf);
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

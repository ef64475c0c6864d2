/* Numbers as people write them: strict, the whole text one accepted form; a
 * unit that does not fit, trailing junk or an overflow is an error, never a
 * guess (the incumbent read "8GB" as 8 bytes and "1.5g" as 1 GiB). */
#include <errno.h>
#include <string.h>

#include "base.h"

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

const char *vgl_parse_decimal(const char *s, struct vgl_decimal *out, int *err)
{
    *out = (struct vgl_decimal){0};
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
static int scale_decimal(const struct vgl_decimal *d, uint64_t multiplier, uint64_t *out)
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

int vgl_trimmed(const char *text, char *buf, size_t len)
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

int vgl_size_of(const struct vgl_decimal *d, const char *suffix, uint64_t *bytes)
{
    for (size_t i = 0; i < sizeof UNITS / sizeof UNITS[0]; i++) {
        if (strcmp(suffix, UNITS[i].suffix) != 0)
            continue;
        if (UNITS[i].multiplier == 1 && d->has_point)
            return -EINVAL; /* a fraction of a byte */
        int err = scale_decimal(d, UNITS[i].multiplier, bytes);
        if (err)
            return err;
        return *bytes == 0 || *bytes > (UINT64_MAX >> 1) ? -ERANGE : 0;
    }
    return -EINVAL;
}

int vgl_parse_size(const char *text, uint64_t *bytes)
{
    char buf[64];
    int err = vgl_trimmed(text, buf, sizeof buf);
    if (err)
        return err;
    struct vgl_decimal d;
    const char *rest = vgl_parse_decimal(buf, &d, &err);
    return rest ? vgl_size_of(&d, rest, bytes) : err;
}

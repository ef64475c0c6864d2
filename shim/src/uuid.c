/* A device's UUID as text, the one form nvidia-smi -L and NVML print: read
 * for limits given by UUID, written for the shim's device mapping and the
 * region's views. */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "vgpulimit/limits.h"

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int vgl_parse_uuid(const char *text, uint8_t out[16])
{
    static const char FORM[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    if (!text || strlen(text) != sizeof FORM - 1 || (strncmp(text, "GPU-", 4) != 0 && strncmp(text, "MIG-", 4) != 0))
        return -EINVAL;
    int n = 0;
    for (size_t i = 4; i < sizeof FORM - 1; i++) {
        if (FORM[i] == '-') {
            if (text[i] != '-')
                return -EINVAL;
            continue;
        }
        int hi = hex_digit(text[i]), lo = hex_digit(text[i + 1]);
        if (hi < 0 || lo < 0 || FORM[i + 1] != 'x')
            return -EINVAL;
        out[n++] = (uint8_t)(hi << 4 | lo);
        i++;
    }
    /* NVML never gives a device the zero UUID, and the region reads it as an
     * unused entry: a limit for it would cap nothing. */
    static const uint8_t zero[16];
    return memcmp(out, zero, sizeof zero) == 0 ? -ERANGE : 0;
}

void vgl_format_uuid(const uint8_t u[16], char out[41])
{
    static const char HEX[] = "0123456789abcdef";
    static const char FORM[] = "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
    int n = 0;
    for (size_t i = 0; i < sizeof FORM; i++) {
        if (FORM[i] != 'x') {
            out[i] = FORM[i];
            continue;
        }
        out[i] = HEX[(u[n / 2] >> (n % 2 ? 0 : 4)) & 0xf];
        n++;
    }
}

void vgl_format_mig_uuid(const uint8_t u[16], char out[41])
{
    vgl_format_uuid(u, out);
    memcpy(out, "MIG", 3);
}

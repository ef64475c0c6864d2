/* The limit parser (limits.c) on its own, built with AddressSanitizer and
 * UBSan by tests/test_core.py.  Prints "N passed, N failed". */
#include "core_fixture.h"

static void test_parser(void)
{
    static const struct {
        const char *text;
        int err;
        uint64_t bytes;
        uint32_t ppm;
    } cases[] = {
        {"1073741824", 0, GIB, 0},  {"1GiB", 0, GIB, 0},      {"1Gi", 0, GIB, 0},
        {"1g", 0, GIB, 0},          {"1gb", 0, GIB, 0},       {"3000m", 0, 3000 * MIB, 0},
        {"3000Mi", 0, 3000 * MIB, 0}, {"1G", 0, 1000000000ULL, 0}, {"1GB", 0, 1000000000ULL, 0},
        {"1.5g", 0, GIB + GIB / 2, 0}, {" 2GiB ", 0, 2 * GIB, 0}, {"512B", 0, 512, 0},
        {"50%", 0, 0, 500000},      {"12.5%", 0, 0, 125000},  {"0.2", 0, 0, 200000},
        {"1.0", 0, 0, 1000000},     {"100%", 0, 0, 1000000},
        {"lots", -EINVAL, 0, 0},    {"8GBs", -EINVAL, 0, 0},  {"", -EINVAL, 0, 0},
        {"1.5", -ERANGE, 0, 0},     {"0", -ERANGE, 0, 0},     {"0%", -ERANGE, 0, 0},
        {"101%", -ERANGE, 0, 0},    {"-1G", -EINVAL, 0, 0},   {"1.5B", -EINVAL, 0, 0},
        {"99999999999999999999", -ERANGE, 0, 0}, {"20000000Ti", -ERANGE, 0, 0},
        {"1 GiB", -EINVAL, 0, 0},   {"1gi", -EINVAL, 0, 0},   {".", -EINVAL, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct vgl_mem_limit limit = {0};
        int err = vgl_parse_memory(cases[i].text, &limit);
        CHECK(err == cases[i].err, "\"%s\": error %d, expected %d", cases[i].text, err, cases[i].err);
        if (!err && !cases[i].err)
            CHECK(limit.bytes == cases[i].bytes && limit.ppm == cases[i].ppm,
                  "\"%s\": %llu bytes %u ppm", cases[i].text, (unsigned long long)limit.bytes, limit.ppm);
    }
    uint32_t pct = 0;
    CHECK(vgl_parse_cores("30", &pct) == 0 && pct == 30, "30");
    CHECK(vgl_parse_cores("30%", &pct) == 0 && pct == 30, "30%%");
    CHECK(vgl_parse_cores("0", &pct) == -ERANGE, "0");
    CHECK(vgl_parse_cores("101", &pct) == -ERANGE, "101");
    CHECK(vgl_parse_cores("1000", &pct) == -ERANGE, "1000");
    CHECK(vgl_parse_cores("3o", &pct) == -EINVAL, "3o");

    struct vgl_mem_limit half = {.ppm = 500000}, big = {.bytes = 64 * GIB}, none = {0};
    CHECK(vgl_cap_bytes(&half, 16 * GIB) == 8 * GIB, "50%% of 16 GiB");
    CHECK(vgl_cap_bytes(&big, 16 * GIB) == 16 * GIB, "a cap above the device");
    CHECK(vgl_cap_bytes(&none, 16 * GIB) == UINT64_MAX, "no cap");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: limits_test SCRATCH_DIR [parser]...\n");
        return 2;
    }
    vgl_log_level = VGL_LOG_ERROR;
    if (wanted(argc, argv, "parser"))
        test_parser();
    return check_summary();
}

/* SIMGPU_NVML_ANSWER: what NVML functions answer, for tests of their callers
 * (config.c says its form and reads it, in both libraries, so that a bad
 * script stops cuInit as it stops nvmlInit; nvml_api.c plays it).  What is
 * wrong goes back as a message, as mig.c's does, for config.c to log. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"

/* A whole decimal number from 0 to `hi`, nothing else around it. */
static bool sim_whole(const char *text, long hi, long *out)
{
    if (*text < '0' || *text > '9')
        return false;
    errno = 0;
    char *end;
    long v = strtol(text, &end, 10);
    if (errno || *end || v > hi)
        return false;
    *out = v;
    return true;
}

/* SIMGPU_NVML_ANSWER's vocabulary: nvml.h's return codes without NVML_ERROR_. */
static const struct {
    const char *name;
    int32_t code;
} sim_nvml_returns[] = {
    {"SUCCESS", 0}, {"UNINITIALIZED", 1}, {"INVALID_ARGUMENT", 2}, {"NOT_SUPPORTED", 3},
    {"NO_PERMISSION", 4}, {"ALREADY_INITIALIZED", 5}, {"NOT_FOUND", 6}, {"INSUFFICIENT_SIZE", 7},
    {"INSUFFICIENT_POWER", 8}, {"DRIVER_NOT_LOADED", 9}, {"TIMEOUT", 10}, {"IRQ_ISSUE", 11},
    {"LIBRARY_NOT_FOUND", 12}, {"FUNCTION_NOT_FOUND", 13}, {"CORRUPTED_INFOROM", 14}, {"GPU_IS_LOST", 15},
    {"RESET_REQUIRED", 16}, {"OPERATING_SYSTEM", 17}, {"LIB_RM_VERSION_MISMATCH", 18}, {"IN_USE", 19},
    {"MEMORY", 20}, {"NO_DATA", 21}, {"VGPU_ECC_NOT_SUPPORTED", 22}, {"INSUFFICIENT_RESOURCES", 23},
    {"FREQ_NOT_SUPPORTED", 24}, {"ARGUMENT_VERSION_MISMATCH", 25}, {"DEPRECATED", 26}, {"NOT_READY", 27},
    {"GPU_NOT_FOUND", 28}, {"INVALID_STATE", 29}, {"RESET_TYPE_NOT_SUPPORTED", 30}, {"UNKNOWN", 999},
};

/* nvml_api.def's names, and whether each has a count out-argument (its count
 * column is not NULL). */
static const char *const sim_nvml_names[SIM_NVML_FNS] = {
#define SIM_NVML(name, params, args, count) #name,
#include "nvml_api.def"
#undef SIM_NVML
};
static const char *const sim_nvml_count_args[SIM_NVML_FNS] = {
#define SIM_NVML(name, params, args, count) #count,
#include "nvml_api.def"
#undef SIM_NVML
};

/* The code an answer's name or number gives; SIM_NVML_REAL for "real"; false: neither. */
static bool sim_nvml_code(const char *text, int32_t *code)
{
    long v;
    if (strcmp(text, "real") == 0) {
        *code = SIM_NVML_REAL;
        return true;
    }
    if (sim_whole(text, INT32_MAX, &v)) {
        *code = (int32_t)v;
        return true;
    }
    for (size_t i = 0; i < sizeof sim_nvml_returns / sizeof *sim_nvml_returns; i++) {
        if (strcmp(sim_nvml_returns[i].name, text) == 0) {
            *code = sim_nvml_returns[i].code;
            return true;
        }
    }
    return false;
}

/* One answer, "NOT_FOUND", "6", "real" or "INSUFFICIENT_SIZE=N"; false with *why. */
static bool sim_parse_nvml_answer(char *text, bool has_count, struct sim_nvml_answer *out, const char **why)
{
    char *equals = strchr(text, '=');
    if (equals)
        *equals = '\0';
    *out = (struct sim_nvml_answer){0};
    if (!sim_nvml_code(text, &out->code)) {
        *why = "not an answer";
        return false;
    }
    if (!equals)
        return true;
    long v;
    if (strcmp(text, "INSUFFICIENT_SIZE") != 0)
        *why = "only INSUFFICIENT_SIZE takes =N";
    else if (!has_count)
        *why = "INSUFFICIENT_SIZE=N for a function with no count out-argument";
    else if (!sim_whole(equals + 1, UINT32_MAX, &v))
        *why = "N is not a count";
    else {
        out->set_count = true;
        out->count = (uint32_t)v;
        return true;
    }
    return false;
}

bool sim_nvml_scripts_parse(const char *value, struct sim_nvml_script scripts[SIM_NVML_FNS], char *message,
                            size_t size)
{
    char *copy = strdup(value);
    if (!copy) {
        snprintf(message, size, "SIMGPU_NVML_ANSWER: out of memory");
        return false;
    }
    const char *why = NULL;
    char *item = copy, *next;
    for (; item; item = next) {
        if ((next = strchr(item, ',')))
            *next++ = '\0';
        char *colon = strchr(item, ':');
        if (!colon) {
            why = "no ':' after the function";
            break;
        }
        *colon = '\0';
        uint32_t fn = 0;
        while (fn < SIM_NVML_FNS && strcmp(sim_nvml_names[fn], item) != 0)
            fn++;
        if (fn == SIM_NVML_FNS) {
            why = "not an NVML function simgpu answers";
            break;
        }
        struct sim_nvml_script *script = &scripts[fn];
        if (script->n) {
            why = "the function is named twice";
            break;
        }
        bool has_count = strcmp(sim_nvml_count_args[fn], "NULL") != 0;
        char *answer = colon + 1, *more;
        for (; answer && !why; answer = more) {
            if ((more = strchr(answer, ';')))
                *more++ = '\0';
            if (script->n == SIM_NVML_SCRIPT_MAX)
                why = "more than 16 answers";
            else if (sim_parse_nvml_answer(answer, has_count, &script->answers[script->n], &why))
                script->n++;
        }
        if (why)
            break;
    }
    if (why) {
        /* Only the faulty item, as given: a whole script may be long. */
        const char *given = value + (item - copy);
        int len = (int)strcspn(given, ",");
        snprintf(message, size, "SIMGPU_NVML_ANSWER: %s in \"%.*s\"; expected FUNCTION:ANSWER[;ANSWER...][,FUNCTION:...], "
                "an answer being an NVML return name without NVML_ERROR_ (NOT_FOUND, NOT_SUPPORTED, ...), "
                "a decimal code, INSUFFICIENT_SIZE=N (which also sets the count) or real",
                why, len < 200 ? len : 200, given);
    }
    free(copy);
    return !why;
}

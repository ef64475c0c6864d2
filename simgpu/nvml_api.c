/* simgpu's NVML entry points: each row of nvml_api.def exported, answering
 * what SIMGPU_NVML_ANSWER scripts for this call of the function, else what
 * simgpu answers (sim_<name>).
 *
 * A script exists so that tests can give a caller every answer the real NVML
 * documents (a size query's INSUFFICIENT_SIZE and count, NOT_FOUND,
 * NOT_SUPPORTED, NO_PERMISSION, UNINITIALIZED, FUNCTION_NOT_FOUND, GPU_IS_LOST,
 * ...) without a GPU that gives it.  A scripted answer writes nothing but the
 * count of INSUFFICIENT_SIZE=N, so a caller that reads an output the answer did
 * not promise reads what it left there itself.  Calls are counted per function
 * and per process (a forked child counts from none), whether NVML is
 * initialised or not; one function's call of another inside simgpu does not
 * count, as it does not reach the caller's entry point. */
#include <pthread.h>
#include <stddef.h>

#include "nvml.h"

static uint64_t sim_nvml_calls[SIM_NVML_FNS];

/* The scripted answer of this call of `fn`, if any; `count` is the
 * function's count out-argument, or NULL. */
static bool sim_nvml_scripted(enum sim_nvml_fn fn, unsigned int *count, nvmlReturn_t *answer)
{
    const struct sim_config *cfg = sim_config();
    if (!cfg || cfg->nvml_scripts[fn].n == 0)
        return false;
    const struct sim_nvml_script *script = &cfg->nvml_scripts[fn];
    uint64_t call = __atomic_fetch_add(&sim_nvml_calls[fn], 1, __ATOMIC_RELAXED);
    const struct sim_nvml_answer *a = &script->answers[call < script->n ? call : script->n - 1];
    if (a->code == SIM_NVML_REAL)
        return false;
    if (a->set_count && count)
        *count = a->count;
    *answer = (nvmlReturn_t)a->code;
    return true;
}

#define SIM_NVML(name, params, args, count)                        \
    nvmlReturn_t name params                                       \
    {                                                              \
        nvmlReturn_t answer;                                       \
        if (sim_nvml_scripted(SIM_NVML_FN_##name, count, &answer)) \
            return answer;                                         \
        return sim_##name args;                                    \
    }
#include "nvml_api.def"
#undef SIM_NVML

static void sim_nvml_calls_atfork_child(void)
{
    for (uint32_t fn = 0; fn < SIM_NVML_FNS; fn++)
        __atomic_store_n(&sim_nvml_calls[fn], 0, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void sim_nvml_api_load(void)
{
    pthread_atfork(NULL, NULL, sim_nvml_calls_atfork_child);
}

/* An NVML that starts and knows nothing: a libnvidia-ml.so.1 beside the null
 * driver.  Without one the shim refuses capped allocations (it cannot count
 * the context's cost), and the benchmark would time refusals; with it the
 * shim allocates, and finds no process list to read its cost from, which is
 * looked at no more than a real one is (every 200 ms). */
#include "vgpulimit/nvml_abi.h"

#define API __attribute__((visibility("default")))

API nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }

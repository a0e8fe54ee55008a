// attn_cpu_bench: Google Benchmark cases for the CPU backend, one file per operator under cpu/.
// Each case reports GFLOP/s and GB/s through counters (see bench/cpu/bench_util.h).
#include "benchmark/benchmark.h"

BENCHMARK_MAIN();

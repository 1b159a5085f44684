// Binding the calling thread's OpenMP team to CPUs (cpu_threads.py says when and why; built by cpu_ext.load).
//
// pin_threads(cpus) -> tids: cpus[i] is the CPU set of team thread i (i = 0: the calling thread). The team is
// torch's: every at::parallel_for, MKL GEMM and hintkv kernel started from this thread runs on it (libgomp keeps
// one pool of workers per master thread), so each thread sets its own affinity inside one parallel region of
// exactly len(cpus) threads, as vLLM's init_cpu_threads_env does. Returns each thread's Linux thread id, in
// team order, so the caller can check the masks (os.sched_getaffinity(tid)).
// torch: cpu_ext.HEADERS, put first when it is built
#include <ATen/Parallel.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <vector>

std::vector<int64_t> pin_threads(std::vector<std::vector<int64_t>> cpus) {
    const int64_t n = static_cast<int64_t>(cpus.size());
    TORCH_CHECK(n > 0 && n == at::get_num_threads(), "pin_threads: ", n, " CPU sets for ", at::get_num_threads(),
                " threads (set torch's thread count first)");
    std::vector<int64_t> tids(n, -1);
    std::vector<int> errs(n, 0);
    std::atomic<int64_t> ran{0};
    // grain 1 over n items on n threads: team thread t runs exactly item t (torch's static split)
    at::parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            cpu_set_t mask;
            CPU_ZERO(&mask);
            for (int64_t c : cpus[i]) CPU_SET(static_cast<int>(c), &mask);
            errs[i] = sched_setaffinity(0, sizeof(mask), &mask) == 0 ? 0 : errno;
            tids[i] = static_cast<int64_t>(syscall(SYS_gettid));
            ran.fetch_add(1);
        }
    });
    for (int64_t i = 0; i < n; ++i)
        TORCH_CHECK(errs[i] == 0, "pin_threads: sched_setaffinity for thread ", i, " failed (errno ", errs[i], ")");
    TORCH_CHECK(ran.load() == n, "pin_threads: ran ", ran.load(), " of ", n, " items");
    return tids;
}

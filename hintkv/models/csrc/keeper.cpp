// Idle-priority spinners that keep the engine's CPUs out of the idle state while a step runs (engine/cpu_keeper.py
// says when and why; built by cpu_ext.load).
//
// keeper_start(cpus, policy) -> tids: one thread per entry (cpus[i] >= 0: pinned to that CPU, -1: left to the OS),
//   each switched to `policy` (SCHED_IDLE; tests pass a bad one), sleeping on a futex until a step holds them.
//   Returns their Linux thread ids. Once per process: a second call with the same CPUs returns the same threads,
//   with others raises. If a thread cannot switch its policy or CPU, every thread of the set exits without spinning
//   and the call raises (a later call may try again).
// keeper_enter() / keeper_leave(linger_ns): a step holds the keepers between the two (holders counted: engines of
//   one process share the set); when the last holder leaves they spin linger_ns more, then sleep. While lingering
//   (no step holds them) a keeper spins only on a CPU nobody else wants: over each kWindowNs of the linger it must
//   have run at least kMinShare of the time, else it sleeps until the next enter() (a yield). Any thread that runs
//   on its CPU (another session's above all: under autogroup a SCHED_IDLE keeper shares its CPU with another
//   session's thread as evenly as a normal thread would) ends its linger within a window or two.
// keeper_stats() -> [spin rounds, futex sleeps, holders, yields]: what the keepers did (tests).
//
// A keeper never holds a lock and touches no tensor: it spins while the deadline lies ahead, checking the clock every
// 64 pauses, then sleeps on the futex word every enter() bumps. SCHED_IDLE has weight 3 against a normal thread's
// 1024: a thread that wakes preempts it at once, and a thread that stays runnable still cedes it ~0.3% of the CPU
// (slices of ~3 ms, review_keeper21 finding 4).
// torch: cpu_ext.HEADERS, put first when it is built
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <atomic>
#include <mutex>
#include <cerrno>
#include <climits>
#include <thread>
#include <vector>

namespace {

struct Keeper {
    std::mutex lock;                  // enter / leave: holders and the deadline change together
    int32_t holders = 0;
    std::atomic<int64_t> until{0};    // CLOCK_MONOTONIC ns to spin until
    std::atomic<int32_t> word{0};     // futex word: bumped by every enter()
    std::atomic<int32_t> sleepers{0};
    std::atomic<int64_t> spins{0}, sleeps{0}, yields{0};
    std::atomic<int32_t> ready{0};    // threads past their set-up
    std::atomic<bool> failed{false};  // a set-up failed: every thread of the set exits
    std::vector<int64_t> cpus, tids;  // sized before any thread starts: threads write their own slot
    std::vector<int> errs;
};

Keeper* keeper = nullptr;  // the started set, never stopped: its threads sleep on the futex while not needed

int64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

constexpr int64_t kWindowNs = 5000000;  // a lingering keeper's share is read over 5 ms
constexpr double kMinShare = 0.7;        // a competitor's slice (~3 ms) in a window takes it under

int64_t thread_cpu_ns() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

void wake_all(Keeper* k) {
    k->word.fetch_add(1, std::memory_order_acq_rel);
    syscall(SYS_futex, reinterpret_cast<int32_t*>(&k->word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void run(Keeper* k, size_t i, int policy) {
    k->tids[i] = static_cast<int64_t>(syscall(SYS_gettid));
    sched_param param{};
    int err = sched_setscheduler(0, policy, &param) == 0 ? 0 : errno;  // this thread only (pid 0: the caller)
    if (err == 0 && k->cpus[i] >= 0) {
        cpu_set_t mask;
        CPU_ZERO(&mask);
        CPU_SET(static_cast<int>(k->cpus[i]), &mask);
        err = sched_setaffinity(0, sizeof(mask), &mask) == 0 ? 0 : errno;
    }
    k->errs[i] = err;
    k->ready.fetch_add(1, std::memory_order_release);
    bool lingering = false;  // spinning after the last holder left: the window below is read
    int64_t window_wall = 0, window_cpu = 0;
    for (;;) {
        const int32_t w = k->word.load(std::memory_order_acquire);
        if (err != 0 || k->failed.load(std::memory_order_acquire)) return;  // never spin at the wrong priority
        const int64_t until = k->until.load(std::memory_order_acquire), t = now_ns();
        bool yield = false;
        if (t < until && until != INT64_MAX) {
            if (!lingering) {
                lingering = true;
                window_wall = t, window_cpu = thread_cpu_ns();
            } else if (t - window_wall >= kWindowNs) {
                const int64_t cpu = thread_cpu_ns();
                yield = static_cast<double>(cpu - window_cpu) < kMinShare * static_cast<double>(t - window_wall);
                window_wall = t, window_cpu = cpu;
            }
        } else {
            lingering = false;
        }
        if (t < until && !yield) {
            for (int j = 0; j < 64; ++j) __builtin_ia32_pause();
            k->spins.fetch_add(1, std::memory_order_relaxed);
            continue;
        }
        lingering = false;
        if (yield) k->yields.fetch_add(1, std::memory_order_relaxed);
        k->sleepers.fetch_add(1);
        k->sleeps.fetch_add(1, std::memory_order_relaxed);
        // returns at once if enter() (or a failed start) bumped the word since we read it
        syscall(SYS_futex, reinterpret_cast<int32_t*>(&k->word), FUTEX_WAIT_PRIVATE, w, nullptr, nullptr, 0);
        k->sleepers.fetch_sub(1);
    }
}

}  // namespace

std::vector<int64_t> keeper_start(std::vector<int64_t> cpus, int64_t policy) {
    if (keeper != nullptr) {
        TORCH_CHECK(keeper->cpus == cpus, "keeper_start: the keepers already run on other CPUs (one set a process)");
        return keeper->tids;
    }
    TORCH_CHECK(!cpus.empty(), "keeper_start: no CPUs");
    auto* k = new Keeper();  // never freed: a thread that started keeps its pointer
    k->cpus = cpus;
    k->tids.assign(cpus.size(), 0);
    k->errs.assign(cpus.size(), 0);
    size_t started = 0;
    try {
        for (; started < cpus.size(); ++started) std::thread(run, k, started, static_cast<int>(policy)).detach();
    } catch (const std::exception& e) {
        k->failed.store(true);
        while (k->ready.load() < static_cast<int32_t>(started)) usleep(50);
        wake_all(k);
        TORCH_CHECK(false, "keeper_start: cannot start a thread: ", e.what());
    }
    // sleep, not spin: under SCHED_FIFO a spinning creator would hold the CPU an idle-priority keeper waits for
    while (k->ready.load(std::memory_order_acquire) < static_cast<int32_t>(cpus.size())) usleep(50);
    for (size_t i = 0; i < cpus.size(); ++i)
        if (k->errs[i] != 0) {
            k->failed.store(true);
            wake_all(k);
            TORCH_CHECK(false, "keeper_start: keeper ", i, " could not take its policy or CPU (errno ", k->errs[i], ")");
        }
    keeper = k;
    return k->tids;
}

void keeper_enter() {
    if (keeper == nullptr) return;
    {
        std::lock_guard<std::mutex> g(keeper->lock);
        ++keeper->holders;
        keeper->until.store(INT64_MAX, std::memory_order_release);
    }
    keeper->word.fetch_add(1, std::memory_order_acq_rel);
    if (keeper->sleepers.load() > 0)
        syscall(SYS_futex, reinterpret_cast<int32_t*>(&keeper->word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void keeper_leave(int64_t linger_ns) {
    if (keeper == nullptr) return;
    std::lock_guard<std::mutex> g(keeper->lock);
    if (keeper->holders > 0 && --keeper->holders == 0)
        keeper->until.store(now_ns() + linger_ns, std::memory_order_release);
}

std::vector<int64_t> keeper_stats() {
    if (keeper == nullptr) return {0, 0, 0, 0};
    std::lock_guard<std::mutex> g(keeper->lock);
    return {keeper->spins.load(), keeper->sleeps.load(), keeper->holders, keeper->yields.load()};
}

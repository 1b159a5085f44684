// Idle-priority spinners that keep the engine's CPUs out of the idle state while a step runs (engine/cpu_keeper.py
// says when and why; built by cpu_ext.load).
//
// keeper_start(cpus) -> tids: one thread per entry (cpus[i] >= 0: pinned to that CPU, -1: left to the OS), each
//   SCHED_IDLE, sleeping on a futex until keeper_hold() asks it to spin. Returns their Linux thread ids. Once per
//   process (a second call returns the same threads).
// keeper_hold(ns): spin until now + ns (monotonic clock; ns < 0: until the next hold); wakes sleeping keepers.
// keeper_stats() -> [spin rounds, futex sleeps]: what the keepers did (tests).
//
// A keeper never holds a lock and touches no tensor: it spins on `pause` while the deadline lies ahead, checking
// the clock every 64 pauses, then sleeps on the futex word that hold() bumps. SCHED_IDLE: any other runnable
// thread of the machine preempts it at once, so it runs only on a CPU that would otherwise idle.
#include <torch/extension.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <atomic>
#include <cerrno>
#include <climits>
#include <thread>
#include <vector>

namespace {

struct Keeper {
    std::atomic<int64_t> until{0};    // CLOCK_MONOTONIC ns to spin until
    std::atomic<int32_t> word{0};     // futex word: bumped by every hold()
    std::atomic<int32_t> sleepers{0};
    std::atomic<int64_t> spins{0}, sleeps{0};
    std::vector<int64_t> tids;
};

Keeper* keeper = nullptr;  // started once, never stopped: its threads sleep on the futex while not needed

int64_t now_ns() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

void run(Keeper* k, int64_t cpu, std::atomic<int64_t>* tid_out) {
    sched_param param{};
    sched_setscheduler(0, SCHED_IDLE, &param);  // this thread only (Linux: pid 0 is the caller's thread)
    if (cpu >= 0) {
        cpu_set_t mask;
        CPU_ZERO(&mask);
        CPU_SET(static_cast<int>(cpu), &mask);
        sched_setaffinity(0, sizeof(mask), &mask);
    }
    tid_out->store(static_cast<int64_t>(syscall(SYS_gettid)));
    for (;;) {
        const int32_t w = k->word.load(std::memory_order_acquire);
        if (now_ns() < k->until.load(std::memory_order_acquire)) {
            for (int i = 0; i < 64; ++i) __builtin_ia32_pause();
            k->spins.fetch_add(1, std::memory_order_relaxed);
            continue;
        }
        k->sleepers.fetch_add(1);
        k->sleeps.fetch_add(1, std::memory_order_relaxed);
        // returns at once if hold() bumped the word since we read it
        syscall(SYS_futex, reinterpret_cast<int32_t*>(&k->word), FUTEX_WAIT_PRIVATE, w, nullptr, nullptr, 0);
        k->sleepers.fetch_sub(1);
    }
}

}  // namespace

std::vector<int64_t> keeper_start(std::vector<int64_t> cpus) {
    if (keeper != nullptr) return keeper->tids;
    TORCH_CHECK(!cpus.empty(), "keeper_start: no CPUs");
    auto* k = new Keeper();
    std::vector<std::atomic<int64_t>> tids(cpus.size());
    for (auto& t : tids) t.store(0);
    for (size_t i = 0; i < cpus.size(); ++i) std::thread(run, k, cpus[i], &tids[i]).detach();
    for (auto& t : tids)
        while (t.load() == 0) std::this_thread::yield();
    for (auto& t : tids) k->tids.push_back(t.load());
    keeper = k;
    return k->tids;
}

void keeper_hold(int64_t ns) {
    if (keeper == nullptr) return;
    keeper->until.store(ns < 0 ? INT64_MAX : now_ns() + ns, std::memory_order_release);
    keeper->word.fetch_add(1, std::memory_order_acq_rel);
    if (keeper->sleepers.load() > 0)
        syscall(SYS_futex, reinterpret_cast<int32_t*>(&keeper->word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

std::vector<int64_t> keeper_stats() {
    if (keeper == nullptr) return {0, 0};
    return {keeper->spins.load(), keeper->sleeps.load()};
}

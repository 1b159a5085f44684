"""Cost profiles of the simulator: what one machine + model measured, as plain data.

    p = load_profile("h200-llama3-8b")        # or "h200-llama3-70b", "local", a .json path
    p.prefill_points                           # [(new tokens, cached tokens, ms), ...]

A `Profile` holds measurements only; `sim.costs.CostModel` interpolates them. Sources:

- `h200-llama3-8b`: ../shared/calibration/h200-llama3-8b-shape.json (copied to `data/`): one
  H200, eager PyTorch, bf16 Llama-3-8B shape. Prefill grid (new x cached), cold prefills, decode
  grid (batch x context), pinned host<->device copies, disk, and the copy/compute overlap.
- `h200-llama3-70b`: derived from the 10-of-80-layer measurements of the same file. Every layer
  of a decoder costs the same, so each measured figure is scaled by 80/10 = 8 (embedding and LM
  head are a few % of the 70B's FLOPs and are ignored). The points not measured on 70B are built
  from the 8B model's split (`CostModel`: cold part + attention to the cached prefix) with the
  70B/8B ratios that were measured: the cold part x the cold-prefill ratio (9.2 at 2048 tokens,
  8.7 at 8192, interpolated between), the attention part x the ratio of new512_cached8192's
  attention part (~4.5: 2x the query width, 2.5x the layers), decode x the b1_ctx8192 ratio
  (~6.9). KV is 327,680 bytes a token. It is the compute of one H200 as if the model fitted; a
  tensor-parallel deployment over k GPUs divides the compute by up to k.
- `local`: written by `hintkv sim calibrate` (the real engine on this machine) to
  `~/.cache/hintkv/sim/local.json`, or any path given to `--profile`.

Links are named "src->dst" over device, host, disk, pool; each has a bandwidth and a latency.
`copy_overlap` is the fraction of a device<->host copy hidden behind compute.
`device_kv_tokens` is the default device pool: for the H200 profiles, 0.9 x 141 GB minus the
8B model's 16 GB of weights, in KV tokens (845K for 8B; the 70B profile keeps the same KV bytes,
338K tokens: it models one device's worth of compute and memory for KV).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

DATA = Path(__file__).parent / "data"
CALIBRATION = DATA / "h200-llama3-8b-shape.json"
LOCAL_PATH = Path(os.environ.get("HINTKV_SIM_LOCAL", Path.home() / ".cache/hintkv/sim/local.json"))


@dataclass(frozen=True, slots=True)
class Link:
    gbps: float  # GB/s (10^9 bytes)
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.gbps) and self.gbps > 0):
            raise ValueError(f"a link's gbps must be a finite number > 0, got {self.gbps!r}")
        if not (math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"a link's latency_ms must be a finite number >= 0, got {self.latency_ms!r}")

    def ms(self, nbytes: int) -> float:
        return self.latency_ms + nbytes / (self.gbps * 1e6) if nbytes > 0 else 0.0


@dataclass(slots=True)
class Profile:
    name: str
    source: str  # where the figures come from
    kv_bytes_per_token: int
    prefill_points: list[tuple[int, int, float]]  # (new, cached, ms); cached 0 is a cold prefill
    decode_points: list[tuple[int, int, float]]  # (batch, context, ms) of one decode step
    links: dict[str, Link] = field(default_factory=dict)  # "device->host", "host->disk", ...
    copy_overlap: float = 0.0  # fraction of device<->host copy time hidden behind compute
    step_overhead_ms: float = 0.0  # per engine step outside the forward (scheduler, sampling)
    device_kv_tokens: int = 0  # KV tokens the device holds beside the weights (the default pool)
    extra: dict = field(default_factory=dict)  # free-form notes kept with the figures
    idle_wakeup_ms: float = 0.0  # extra for a step an idle engine starts (its thread was asleep)

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0:
            raise ValueError("kv_bytes_per_token must be > 0")
        if not any(c == 0 for _, c, _ in self.prefill_points):
            raise ValueError("a profile needs cold prefill points (cached = 0)")
        if not self.decode_points:
            raise ValueError("a profile needs decode points")
        if not 0 <= self.copy_overlap <= 1:
            raise ValueError("copy_overlap must be in [0, 1]")
        # every cost a finite, positive time (review rev27 A4, B1: a NaN passed the monotonicity check and the
        # simulator ran with it silently; a negative or zero step made time run backwards or stand still)
        for field_name, points, sizes in (("prefill_points", self.prefill_points, ("new", "cached")),
                                          ("decode_points", self.decode_points, ("batch", "context"))):
            for a, b, ms in points:
                if not (math.isfinite(ms) and ms > 0):
                    raise ValueError(f"{field_name}: ({sizes[0]} {a}, {sizes[1]} {b}) costs {ms!r} ms; "
                                     "every point must be a finite time > 0")
                if a < 1 or b < 0:
                    raise ValueError(f"{field_name}: ({sizes[0]} {a}, {sizes[1]} {b}): {sizes[0]} must be >= 1 "
                                     f"and {sizes[1]} >= 0")
        for name in ("step_overhead_ms", "idle_wakeup_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.device_kv_tokens < 0:
            raise ValueError(f"device_kv_tokens must be >= 0, got {self.device_kv_tokens}")

    def link(self, src: str, dst: str) -> Link:
        name = f"{src}->{dst}"
        if name not in self.links:
            raise KeyError(f"profile {self.name!r} has no link {name!r}; has {sorted(self.links)}")
        return self.links[name]

    def to_json(self) -> dict:
        d = asdict(self)
        d["links"] = {k: asdict(v) for k, v in self.links.items()}
        return d

    @classmethod
    def from_json(cls, d: dict) -> Profile:
        return cls(name=d["name"], source=d["source"], kv_bytes_per_token=int(d["kv_bytes_per_token"]),
                   prefill_points=[(int(n), int(c), float(ms)) for n, c, ms in d["prefill_points"]],
                   decode_points=[(int(b), int(c), float(ms)) for b, c, ms in d["decode_points"]],
                   links={k: Link(**v) for k, v in d.get("links", {}).items()},
                   copy_overlap=float(d.get("copy_overlap", 0.0)),
                   step_overhead_ms=float(d.get("step_overhead_ms", 0.0)),
                   device_kv_tokens=int(d.get("device_kv_tokens", 0)),
                   idle_wakeup_ms=float(d.get("idle_wakeup_ms", 0.0)),
                   extra=dict(d.get("extra", {})))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _key_points(table: dict, prefix: str = "new") -> list[tuple[int, int, float]]:
    """'new512_cached2048' -> (512, 2048, ms)."""
    out = []
    for k, ms in table.items():
        a, b = k.split("_")
        out.append((int(a.removeprefix(prefix)), int(b.removeprefix("cached")), float(ms)))
    return out


def _decode_points(table: dict) -> list[tuple[int, int, float]]:
    """'batch8_ctx2048' -> (8, 2048, ms)."""
    out = []
    for k, ms in table.items():
        a, b = k.split("_")
        out.append((int(a.removeprefix("batch")), int(b.removeprefix("ctx")), float(ms)))
    return out


def fit_link(points: list[tuple[int, float]]) -> Link:
    """Least-squares latency + bytes/bandwidth through measured (bytes, ms) copies."""
    n = len(points)
    mx = sum(b for b, _ in points) / n
    my = sum(ms for _, ms in points) / n
    slope = sum((b - mx) * (ms - my) for b, ms in points) / sum((b - mx) ** 2 for b, _ in points)
    return Link(1 / (slope * 1e6), max(0.0, my - slope * mx))


def _h200_links(cal: dict) -> dict[str, Link]:
    c = cal["copy_GBps"]
    l8 = cal["llama3_8b"]
    reload = fit_link([(int(n) * l8["kv_bytes_per_token"], ms)
                       for n, ms in l8["reload_prefix_from_pinned_host_ms"].items()])
    return {
        "host->device": reload,  # the measured prefix reloads (pinned host -> device, all layers)
        "device->host": Link(c["d2h_pinned_GBps"], reload.latency_ms),
        "host->disk": Link(c["disk_write_fsync_GBps"], 0.1),
        "disk->host": Link(c["disk_read_GBps"], 0.1),
        # Not measured on the H200 host: Mooncake Store over RDMA is reported at 20+ GB/s per NIC;
        # we assume one 200 Gb/s NIC (25 GB/s) and 0.5 ms per batched call. Say so in reports.
        "host->pool": Link(25.0, 0.5),
        "pool->host": Link(25.0, 0.5),
    }


H200_BYTES = 141e9
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of device memory for weights + KV
LLAMA3_8B_WEIGHT_BYTES = 16.06e9  # 8.03B parameters in bf16


def _kv_tokens(kv_bytes_per_token: int) -> int:
    """KV tokens one H200 holds beside Llama-3-8B's weights (845K at 128 KiB a token)."""
    return int((H200_BYTES * GPU_MEMORY_UTILIZATION - LLAMA3_8B_WEIGHT_BYTES) / kv_bytes_per_token)


def _overlap(l8: dict) -> float:
    """Fraction of an 8192-token reload hidden behind a 2048-token prefill on two streams."""
    alone = l8["prefill_ms_new_tokens_on_cached_prefix"]["new2048_cached0"]
    both = l8["overlap_prefill2048_with_reload8192_ms"]
    copy = l8["reload_prefix_from_pinned_host_ms"]["8192"]
    return max(0.0, min(1.0, 1 - (both - alone) / copy))


def h200_llama3_8b() -> Profile:
    cal = json.loads(CALIBRATION.read_text())
    l8 = cal["llama3_8b"]
    points = _key_points(l8["prefill_ms_new_tokens_on_cached_prefix"])
    have = {(n, c) for n, c, _ in points}
    points += [(int(n), 0, float(ms)) for n, ms in l8["prefill_ms_cold"].items() if (int(n), 0) not in have]
    return Profile("h200-llama3-8b", f"measured: {CALIBRATION.name} ({cal['gpu']}, {cal['torch']})",
                   int(l8["kv_bytes_per_token"]), sorted(points), sorted(_decode_points(l8["decode_step_ms"])),
                   _h200_links(cal), _overlap(l8), 0.0, _kv_tokens(int(l8["kv_bytes_per_token"])),
                   {"reload_prefix_from_pinned_host_ms": l8["reload_prefix_from_pinned_host_ms"]})


def h200_llama3_70b() -> Profile:
    """See the module docstring: measured 10-of-80-layer figures x 8; the rest by ratio."""
    # the split of a prefill into its cold and attention parts
    from hintkv.sim.costs import CostModel

    cal = json.loads(CALIBRATION.read_text())
    l70 = cal["llama3_70b_shape"]
    m = {k: 8 * v for k, v in l70["measured_on_10_of_80_layers_ms"].items()}
    base = h200_llama3_8b()
    cm8 = CostModel(base)
    r2048, r8192 = m["prefill2048"] / cm8.cold_ms(2048), m["prefill8192"] / cm8.cold_ms(8192)

    def cold_ratio(n: int) -> float:
        if n <= 2048:
            return r2048
        if n >= 8192:
            return r8192
        return r2048 + (r8192 - r2048) * (n - 2048) / (8192 - 2048)

    r_attn = (m["new512_cached8192"] - cm8.cold_ms(512) * cold_ratio(512)) / cm8.attn_ms(512, 8192)
    r_decode = m["decode_b1_ctx8192"] / cm8.decode_ms(1, 8192)
    measured = {(2048, 0): m["prefill2048"], (8192, 0): m["prefill8192"],
                (512, 8192): m["new512_cached8192"]}
    points = [(n, c, measured.get((n, c), cm8.cold_ms(n) * cold_ratio(n) + cm8.attn_ms(n, c) * r_attn))
              for n, c, _ in base.prefill_points]
    decode = [(b, c, m["decode_b1_ctx8192"] if (b, c) == (1, 8192) else ms * r_decode)
              for b, c, ms in base.decode_points]
    return Profile("h200-llama3-70b", "derived: 10-of-80-layer figures of "
                   f"{CALIBRATION.name} x 8; unmeasured points = 8B x the measured 70B/8B ratio "
                   "of their kind", int(l70["kv_bytes_per_token"]), points, decode,
                   dict(base.links), base.copy_overlap, 0.0, _kv_tokens(int(l70["kv_bytes_per_token"])),
                   {"ratios": {"cold2048": r2048, "cold8192": r8192, "attention": r_attn,
                               "decode": r_decode}})


BUILTIN = {"h200-llama3-8b": h200_llama3_8b, "h200-llama3-70b": h200_llama3_70b}


def profile_names() -> list[str]:
    return [*BUILTIN, "local"]


def load_profile(name: str) -> Profile:
    """A built-in profile, `local` (from `hintkv sim calibrate`), or a profile JSON file."""
    if name in BUILTIN:
        return BUILTIN[name]()
    path = LOCAL_PATH if name == "local" else Path(name)
    if not path.is_file():
        hint = " (run `hintkv sim calibrate` first)" if name == "local" else ""
        raise ValueError(f"unknown profile {name!r}: not one of {profile_names()} and no file {path}{hint}")
    try:
        return Profile.from_json(json.loads(path.read_text()))
    except (KeyError, TypeError, ValueError) as exc:  # a missing field, a wrong shape, a bad value: say where
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ValueError(f"profile {path}: {what}") from exc

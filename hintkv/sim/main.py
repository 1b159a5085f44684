"""The `hintkv sim` command: `hintkv sim calibrate ...`, `hintkv sim profiles`, `hintkv sim [run] ...`.

    hintkv sim profiles                       # each profile's figures at a few points
    hintkv sim calibrate --quick              # measure the `local` profile on this machine
"""

from __future__ import annotations

import importlib
import sys

from hintkv.sim.costs import CostModel
from hintkv.sim.profile import load_profile, profile_names

COMMANDS = {"calibrate": "hintkv.sim.calibrate", "run": "hintkv.sim.run"}


def print_profiles() -> int:
    from hintkv.bench.common import print_table

    rows = []
    for name in profile_names():
        try:
            cm = CostModel(load_profile(name))
        except ValueError as exc:
            print(f"{name}: {exc}")
            continue
        p = cm.profile
        rows.append({"profile": name, "kv_KiB/token": p.kv_bytes_per_token / 1024,
                     "prefill_2048_ms": cm.prefill_ms(2048), "new512_cached32K_ms": cm.prefill_ms(512, 32768),
                     "new512_cached100K_ms": cm.prefill_ms(512, 100_000),
                     "decode_b8_ctx8K_ms": cm.decode_ms(8, 8192),
                     "reload_32K_host_ms": cm.tokens_ms("host", "device", 32768),
                     "copy_overlap": p.copy_overlap})
    print_table(rows, list(rows[0]))
    for name in profile_names():
        try:
            print(f"{name}: {load_profile(name).source}")
        except ValueError:
            pass
    return 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "profiles":
        return print_profiles()
    cmd = argv[0] if argv and argv[0] in COMMANDS else "run"
    rest = argv[1:] if argv and argv[0] in COMMANDS else argv
    module = importlib.import_module(COMMANDS[cmd])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The `hintkv` command line: flags map onto EngineConfig; bench dispatch reports bad names."""

from __future__ import annotations

import pytest

from hintkv.cli import build_parser, engine_config_from_args, main
from hintkv.config import EngineConfig


def test_serve_flags_build_the_engine_config():
    args = build_parser().parse_args(
        [
            "serve", "--model", "dummy:tiny", "--served-model-name", "tiny", "--dtype", "float32",
            "--device", "cpu", "--block-size", "32", "--kv-cache-tokens", "4096",
            "--max-model-len", "2048", "--max-num-seqs", "4", "--max-num-batched-tokens", "512",
            "--eviction-policy", "lru", "--seed", "7", "--api-key", "k1", "--api-key", "k2",
            "--port", "9000", "--host", "0.0.0.0", "--no-hints",
        ]
    )  # fmt: skip
    cfg = engine_config_from_args(args)
    assert cfg == EngineConfig(
        model="dummy:tiny",
        served_model_name="tiny",
        dtype="float32",
        device="cpu",
        block_size=32,
        kv_cache_tokens=4096,
        max_model_len=2048,
        max_num_seqs=4,
        max_num_batched_tokens=512,
        eviction_policy="lru",
        seed=7,
        hints=False,
    )
    assert args.api_keys == ["k1", "k2"] and (args.host, args.port) == ("0.0.0.0", 9000)


@pytest.mark.parametrize("flag", ["--ignore-hints", "--no-hints"])
def test_ignore_hints_flag_and_its_alias(flag):
    assert engine_config_from_args(build_parser().parse_args(["serve", flag])).hints is False
    assert engine_config_from_args(build_parser().parse_args(["serve"])).hints is True


def test_serve_defaults():
    args = build_parser().parse_args(["serve"])
    assert (args.host, args.port, args.model, args.api_keys) == (
        "127.0.0.1",
        8000,
        "SmolLM2-135M-Instruct",
        [],
    )
    assert engine_config_from_args(args).block_size == 16


def test_invalid_config_is_a_usage_error(capsys):
    assert main(["serve", "--dtype", "fp8"]) == 2
    assert "dtype" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["no_such_benchmark", "../etc"])
def test_unknown_benchmark_is_a_usage_error(name, capsys):
    assert main(["bench", name, "--quick"]) == 2
    assert "benchmark" in capsys.readouterr().err


def test_bench_passes_remaining_arguments():
    args = build_parser().parse_args(["bench", "engine", "--quick", "--models", "dummy:tiny"])
    assert (args.name, args.args) == ("engine", ["--quick", "--models", "dummy:tiny"])


def test_every_config_field_is_a_flag_with_help():
    """Flags are generated from EngineConfig / ServerOptions: one default, one help text."""
    import dataclasses

    from hintkv.server.options import ServerOptions

    parser = build_parser()
    serve = next(a for a in parser._subparsers._group_actions[0].choices.values()
                 if a.prog.endswith("serve"))
    by_dest = {a.dest: a for a in serve._actions}
    for cls in (EngineConfig, ServerOptions):
        for f in dataclasses.fields(cls):
            assert f.name in by_dest, f.name
            assert f.metadata.get("help"), f.name
    defaults = build_parser().parse_args(["serve"])
    assert engine_config_from_args(defaults) == EngineConfig()


@pytest.mark.parametrize("command", ["serve", "router", "pool", "sim"])
def test_help_renders(command, capsys):
    """`hintkv COMMAND --help` prints every flag's help (argparse %-formats each help text: a bare
    percent sign in one broke `hintkv serve --help` once)."""
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_server_options_from_flags():
    from hintkv.cli import config_from_args
    from hintkv.server.options import ServerOptions

    args = build_parser().parse_args(
        ["serve", "--public-metrics", "--max-body-bytes", "1000", "--tenant-rate-limit", "2.5",
         "--max-queued-requests", "3", "--api-key", "k"])
    opts = config_from_args(ServerOptions, args)
    assert opts == ServerOptions(api_keys=("k",), public_metrics=True, max_body_bytes=1000,
                                 tenant_rate_limit=2.5, max_queued_requests=3)
    assert main(["serve", "--max-body-bytes", "0"]) == 2


@pytest.mark.parametrize(("model", "said"), [
    ("nope:x", "cannot load model 'nope:x'"),  # was a traceback once the engine started
    ("dummy:nope", "no preset 'nope'"),  # was a KeyError traceback
])
def test_a_model_that_cannot_load_is_a_usage_error_before_anything_loads(model, said, capsys):
    assert main(["serve", "--model", model]) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("length", [-5, 0])
def test_max_model_len_below_one_is_refused(length):
    """-5 was served, refusing every request; 0 was read as unset."""
    with pytest.raises(ValueError, match="max_model_len must be >= 1"):
        EngineConfig(model="dummy:tiny", max_model_len=length)


@pytest.mark.parametrize("command", [["serve"], ["router", "--backend", "http://127.0.0.1:9"]])
def test_a_port_out_of_range_is_a_usage_error(command, capsys):
    with pytest.raises(SystemExit) as exc:  # 99999 was taken: the server said it ran on http://...:99999
        build_parser().parse_args([*command, "--port", "99999"])
    assert exc.value.code == 2 and "a port is 0-65535, not 99999" in capsys.readouterr().err

"""SGLang launch settings as flags (:mod:`mamba_radix.launch_config`): seed 001's JSON file loads as it is,
each key sets its flag, keys that change nothing modelled are listed as ignored, a typo is an error naming
the closest key, YAML works with PyYAML (and says "JSON" without it), and the command line wins."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mamba_radix.errors import ConfigError
from mamba_radix.launch_config import SGLANG_SERVER_ARGS, expand_config, load_settings, settings_to_argv

# seed 001, section 3.2: the settings file as the seed prints it
SEED_SETTINGS = (
    '{ "model_path": "/models/kimi-k3", "tp_size": 8, "kv_cache_dtype": "fp8_e4m3", "mamba_ssm_dtype": '
    '"bfloat16", "mamba_full_memory_ratio": 0.15, "mamba_radix_cache_strategy": "extra_buffer", '
    '"mamba_track_interval": 256, "chunked_prefill_size": 6144, "max_running_requests": 64, '
    '"enable_linear_replayssm_spec": true, "speculative_dspark_block_size": 7, "linear_replayssm_cache_len": 16, '
    '"cuda_graph_max_bs_decode": 64, "enable_overlap_schedule": true }'
)
COMMANDS = ("simulate", "sweep", "plan")


@pytest.fixture
def seed_file(tmp_path: Path) -> Path:
    path = tmp_path / "settings.json"
    path.write_text(SEED_SETTINGS)
    return path


def _pairs(argv: list[str]) -> dict[str, str]:
    return dict(zip(argv[::2], argv[1::2], strict=True))


def test_the_seeds_file_sets_simulates_flags(seed_file: Path) -> None:
    argv, ignored = settings_to_argv(load_settings(seed_file), "simulate")
    assert _pairs(argv) == {
        "--model": "kimi-k3",
        "--tp-size": "8",
        "--kv-cache-dtype": "fp8_e4m3",
        "--mamba-ssm-dtype": "bfloat16",
        "--mamba-full-memory-ratio": "0.15",
        "--mamba-radix-cache-strategy": "extra_buffer",
        "--mamba-track-interval": "256",
        "--chunked-prefill-size": "6144",
        "--max-running-requests": "64",
        "--disable-overlap-schedule": "false",  # enable_overlap_schedule: true
        # speculative decoding sizes the pools (ReplaySSM rings, the verify window); it is not simulated
        "--enable-linear-replayssm-spec": "true",
        "--speculative-dspark-block-size": "7",
        "--linear-replayssm-cache-len": "16",
    }
    # CUDA graphs are no part of what simulate models
    assert ignored == ["cuda_graph_max_bs_decode"]


def test_the_seeds_file_sets_plans_speculative_flags(seed_file: Path) -> None:
    argv, ignored = settings_to_argv(load_settings(seed_file), "plan")
    pairs = _pairs(argv)
    assert pairs["--enable-linear-replayssm-spec"] == "true"
    assert pairs["--speculative-dspark-block-size"] == "7"
    assert pairs["--linear-replayssm-cache-len"] == "16"
    assert ignored == ["cuda_graph_max_bs_decode"]


@pytest.mark.parametrize(
    ("typo", "closest"),
    [("chunked_prefil_size", "chunked_prefill_size"), ("mamba_track_intervall", "mamba_track_interval")],
)
def test_a_typo_is_an_error_naming_the_closest_key(typo: str, closest: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings_to_argv({"tp_size": 8, typo: 1}, "simulate", "config s.json")
    text = str(err.value)
    assert typo in text and f"did you mean {closest}?" in text and "config s.json" in text


def test_every_sglang_server_argument_is_known_and_hyphens_work() -> None:
    assert {
        "host",
        "port",
        "cuda_graph_max_bs_decode",
        "model_path",
        "disable_overlap_schedule",
    } <= SGLANG_SERVER_ARGS
    argv, ignored = settings_to_argv(
        {"host": "0.0.0.0", "port": 30000, "page-size": 16, "log_level": None}, "plan"
    )
    assert argv == ["--page-size", "16"] and ignored == ["host", "port", "log_level (null)"]


def test_model_path_maps_to_a_preset_by_its_last_part() -> None:
    argv, _ = settings_to_argv({"model_path": "Qwen/Qwen3-Next-80B-A3B-Instruct/"}, "plan")
    assert argv == ["--model", "qwen3-next-80b-a3b"]
    argv, ignored = settings_to_argv({"model_path": "/models/llama-3"}, "simulate")
    assert argv == [] and ignored[0].startswith("model_path (no model preset is named 'llama-3'")


@pytest.mark.parametrize("command", ["simulate", "plan"])
def test_sglangs_int8_checkpoint_settings_map_to_our_format(command: str) -> None:
    argv, ignored = settings_to_argv(
        {"enable_int8_mamba_checkpoint": True, "int8_mamba_ckpt_size": 300}, command
    )
    assert argv == ["--checkpoint-format", "int8", "--checkpoint-slots", "300"] and ignored == []
    argv, _ = settings_to_argv({"enable_int8_mamba_checkpoint": False}, command)
    assert argv == []
    with pytest.raises(ConfigError, match="enable_int8_mamba_checkpoint must be true or false"):
        settings_to_argv({"enable_int8_mamba_checkpoint": "yes"}, command)


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"chunked_prefill_size": "lots"}, ("chunked_prefill_size", "integer")),
        ({"kv_cache_dtype": "fp4"}, ("kv_cache_dtype", "must be one of")),
        ({"enable_overlap_schedule": "yes"}, ("enable_overlap_schedule", "true or false")),
        ({"tp_size": [8]}, ("tp_size", "one value")),
    ],
)
def test_a_bad_value_names_its_key(settings: dict[str, object], words: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as err:
        settings_to_argv(settings, "simulate")
    assert all(w in str(err.value) for w in words), str(err.value)


def test_files_json_yaml_and_their_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("yaml")
    yml = tmp_path / "s.yaml"
    yml.write_text("tp-size: 8\nmamba_ssm_dtype: bfloat16\n")
    assert load_settings(yml) == {"tp-size": 8, "mamba_ssm_dtype": "bfloat16"}
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "empty.json").write_text("")
    for name, words in [
        ("missing.json", "config file not found"),
        ("list.json", "must hold an object"),
    ]:
        with pytest.raises(ConfigError, match=words):
            load_settings(tmp_path / name)
    assert load_settings(tmp_path / "empty.json") == {}  # YAML reads an empty file as nothing set
    # without PyYAML: JSON only, said in one line
    monkeypatch.setitem(sys.modules, "yaml", None)
    with pytest.raises(ConfigError) as err:
        load_settings(yml)
    assert "PyYAML" in str(err.value) and "JSON" in str(err.value)
    bad = tmp_path / "bad.json"
    bad.write_text('{"tp_size": 8,,}')
    with pytest.raises(ConfigError) as err:
        load_settings(bad)
    assert "not valid JSON (line 1" in str(err.value) and "\n" not in str(err.value)


def test_the_command_line_wins_over_the_file(seed_file: Path) -> None:
    from mamba_radix.cli import build_parser

    argv = [
        "simulate",
        "--config",
        str(seed_file),
        "--chunked-prefill-size",
        "4096",
        "--disable-overlap-schedule",
    ]
    expanded, _ = expand_config(argv, COMMANDS)
    assert expanded[0] == "simulate" and expanded[-len(argv) + 1 :] == argv[1:]
    args = build_parser().parse_args(expanded)
    assert args.chunked_prefill_size == 4096 and args.disable_overlap_schedule is True
    assert args.mamba_track_interval == 256 and args.model == "kimi-k3" and args.config == str(seed_file)
    # --config=FILE works too; sweep takes the values as one-item lists
    expanded, _ = expand_config(["sweep", f"--config={seed_file}", "--out", "x"], COMMANDS)
    args = build_parser().parse_args(expanded)
    assert args.chunked_prefill_size == [6144] and args.mamba_full_memory_ratio == [0.15]


def test_expand_leaves_other_argv_alone_and_refuses_two_files(seed_file: Path) -> None:
    assert expand_config(["simulate", "--limit", "3"], COMMANDS) == (["simulate", "--limit", "3"], [])
    assert expand_config(["experiment", "--config", "x"], COMMANDS) == (["experiment", "--config", "x"], [])
    assert expand_config(["simulate", "--config", "x", "--help"], COMMANDS)[1] == []
    with pytest.raises(ConfigError, match="given 2 times"):
        expand_config(["plan", "--config", str(seed_file), "--config", str(seed_file)], COMMANDS)
    with pytest.raises(ConfigError, match="needs a file name"):
        expand_config(["plan", "--config"], COMMANDS)


def test_the_seed_file_is_json_as_printed() -> None:
    assert json.loads(SEED_SETTINGS)["enable_overlap_schedule"] is True

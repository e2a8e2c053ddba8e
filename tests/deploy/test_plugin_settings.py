"""The vLLM plugin's settings and start-up refusals (no vLLM needed): where the policy comes from,
which policy files it takes, and the line it logs."""

import json

import pytest

from mlabench.deploy.plugin_settings import (
    ENV_MODE, ENV_POLICY, ENV_SHORT_EXTENDS, PluginConfigError, PluginSettings, describe_policy,
    load_plugin_policy, reorder_batch_threshold,
)
from mlabench.errors import ConfigError
from mlabench.policy.device_table import heuristic_policy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

POLICY = REPO / "results/h200/deploy/qo1/tune-kimi-k3-tp8-20261201-152425-462/policy.json"


def _policy_copy(tmp_path, **changes):
    data = json.loads(POLICY.read_text())
    for key, value in changes.items():
        if key == "backend":
            data["backend"] = value
        else:
            data["shape"][key] = value
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    return path


def test_additional_config_wins_over_the_environment():
    s = PluginSettings.resolve({"mlabench": {"split_policy": "a.json", "split_mode": "host"}},
                               {ENV_POLICY: "b.json", ENV_MODE: "device"})
    assert (s.policy_path, s.mode, s.origin) == ("a.json", "host", "--additional-config")


def test_environment_then_default():
    s = PluginSettings.resolve({}, {ENV_POLICY: "b.json"})
    assert (s.policy_path, s.mode, s.origin) == ("b.json", "device", "environment")
    s = PluginSettings.resolve(None, {})
    assert (s.policy_path, s.mode, s.origin) == (None, "device", "default")


@pytest.mark.parametrize("config, env, words", [
    ({"mlabench": {"split_mode": "fast"}}, {}, "split_mode must be one of host, device"),
    ({}, {ENV_MODE: "sometimes"}, "(environment), got 'sometimes'"),
    ({"mlabench": {"policy": "x.json"}}, {}, "unknown key(s) policy"),
    ({"mlabench": "x.json"}, {}, "must be an object"),
    ({"mlabench": {"short_extends": "triton"}}, {}, "short_extends must be one of fa3, prefill"),
    ({}, {ENV_SHORT_EXTENDS: "eager"}, "(environment), got 'eager'"),
])
def test_bad_settings_are_one_line(config, env, words):
    with pytest.raises(PluginConfigError) as err:
        PluginSettings.resolve(config, env)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_short_extends_go_to_fa3_unless_told_prefill():
    default = PluginSettings.resolve(None, {})
    assert default.short_extends == "fa3" and reorder_batch_threshold(default) == 512
    told = PluginSettings.resolve({"mlabench": {"short_extends": "prefill"}}, {ENV_SHORT_EXTENDS: "fa3"})
    assert told.short_extends == "prefill" and reorder_batch_threshold(told) == 1
    env = PluginSettings.resolve({}, {ENV_SHORT_EXTENDS: "prefill"})
    assert (env.short_extends, env.mode, env.policy_path, env.origin) == ("prefill", "device", None, "environment")
    line = describe_policy(env, heuristic_policy(132), 12)
    assert line.endswith("short extends: vLLM's prefill path")
    assert "short extends: vLLM's FA3 kernel (steps with extends of 2-512 tokens)" in describe_policy(
        default, heuristic_policy(132), 12)


def test_the_committed_policy_is_taken_with_its_tables():
    policy = load_plugin_policy(PluginSettings(str(POLICY), "device", "environment"), 12, 64, 132)
    assert sorted(policy.tables) == [1, 16]
    assert policy.lookup(1, 100000) == 128 and policy.lookup(16, 100000) == 8
    line = describe_policy(PluginSettings(str(POLICY), "device", "environment"), policy, 12)
    assert str(POLICY) in line and "device memory" in line and "batch 16: 1-16 splits" in line


@pytest.mark.parametrize("change, words", [
    ({"backend": "triton-splitkv"}, "backend triton-splitkv (the plugin runs gluon-splitkv)"),
    ({"num_heads": 16}, "16 heads (this server has 12 per GPU)"),
    ({"page_size": 16}, "page size 16 (this server's is 64)"),
    ({"qo_len": 4}, "4 query tokens"),
])
def test_a_policy_for_another_kernel_or_shape_is_refused(tmp_path, change, words):
    path = _policy_copy(tmp_path, **change)
    with pytest.raises(PluginConfigError) as err:
        load_plugin_policy(PluginSettings(str(path), "device", "environment"), 12, 64, 132)
    message = str(err.value)
    assert words in message and "refused" in message and "\n" not in message


def test_no_file_runs_vllms_rule_and_a_bare_table_is_taken(tmp_path):
    default = load_plugin_policy(PluginSettings(None, "device", "default"), 12, 64, 132)
    assert default.tables == heuristic_policy(132).tables
    assert "no policy file" in describe_policy(PluginSettings(None, "host", "default"), default, 12)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([[4096, 16], [131072, 64]]))
    assert load_plugin_policy(PluginSettings(str(bare), "device", "environment"), 12, 64, 132).lookup(1, 5000) == 64


def test_a_missing_policy_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_plugin_policy(PluginSettings(str(tmp_path / "none.json"), "device", "environment"), 12, 64, 132)
    assert "\n" not in str(err.value)

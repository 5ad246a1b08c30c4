"""Typed run configuration (ground/config.py): loading, validation messages, link lookup, overrides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ground.config import (
    ConfigError,
    LinkProfile,
    LinkSpec,
    RunConfig,
    TrainConfig,
    config_from_json,
    load_config,
    merge,
    parse_override,
    partial_link_notes,
    read_config_file,
    save_config,
    to_dict,
)


def error(data: dict) -> str:
    with pytest.raises(ConfigError) as ei:
        load_config(data)
    return str(ei.value)


# ---------------------------------------------------------------- defaults


def test_defaults_load() -> None:
    cfg = load_config()
    assert cfg == RunConfig()
    assert load_config({}) == cfg
    assert cfg.train.mode == "local"
    assert cfg.train.compression == "none"
    assert cfg.cluster.sites == ("a", "b", "c")
    assert cfg.wan.site_link == LinkSpec(LinkProfile(20, 2, 0), LinkProfile(20, 2, 0))
    assert cfg.wan.service_link == LinkSpec(LinkProfile(5, 0, 0), LinkProfile(5, 0, 0))
    assert cfg.wan.link_overrides == ()
    assert cfg.wan.curve is True


def test_given_fields_replace_defaults_and_others_stay() -> None:
    cfg = load_config({"train": {"mode": "sync", "inner_lr": 1}, "cluster": {"sites": ["x", "y"]}})
    assert cfg.train.mode == "sync"
    assert cfg.train.inner_lr == 1.0 and isinstance(cfg.train.inner_lr, float)
    assert cfg.train.per_site_batch == TrainConfig().per_site_batch
    assert cfg.cluster.sites == ("x", "y")


def test_config_is_frozen() -> None:
    cfg = load_config()
    with pytest.raises(AttributeError):
        cfg.train.mode = "sync"  # type: ignore[misc]


# ---------------------------------------------------------------- errors name the field


def test_unknown_field_names_its_section() -> None:
    assert error({"train": {"mdoe": "sync"}}).startswith("train: unknown field(s) ['mdoe']")


def test_unknown_top_level_field() -> None:
    assert error({"trian": {}}).startswith("config: unknown field(s) ['trian']")


def test_unknown_nested_field_names_the_dotted_path() -> None:
    msg = error({"wan": {"site_link": {"up": {"latncy_ms": 5}}}})
    assert msg.startswith("wan.site_link.up: unknown field(s) ['latncy_ms']")
    assert "latency_ms" in msg  # lists the known fields


@pytest.mark.parametrize(
    "data,expected",
    [
        ({"train": {"per_site_batch": "8"}}, "train.per_site_batch: expected an integer, got '8'"),
        ({"train": {"per_site_batch": True}}, "train.per_site_batch: expected an integer, got True"),
        ({"train": {"per_site_batch": 8.0}}, "train.per_site_batch: expected an integer, got 8.0"),
        ({"train": {"inner_lr": "0.1"}}, "train.inner_lr: expected a number, got '0.1'"),
        ({"train": {"inner_lr": False}}, "train.inner_lr: expected a number, got False"),
        ({"train": {"mode": "async"}}, "train.mode: 'async' is not one of ['sync', 'local', 'scripted', 'adaptive']"),
        ({"train": {"compression": "zstd"}}, "train.compression: 'zstd' is not one of ['none', 'fp16', 'int8']"),
        ({"wan": {"curve": 1}}, "wan.curve: expected true/false, got 1"),
        ({"run_id": 5}, "run_id: expected a string, got 5"),
        ({"cluster": {"sites": "abc"}}, "cluster.sites: expected a list, got str"),
        ({"cluster": {"sites": ["a", 1]}}, "cluster.sites[1]: expected a string, got 1"),
        ({"train": "fast"}, "train: expected a mapping, got str"),
        ({"wan": {"site_link": {"down": {"bandwidth_kbps": "1M"}}}},
         "wan.site_link.down.bandwidth_kbps: expected an integer, got '1M'"),
    ],
)
def test_wrong_type_names_the_field(data: dict, expected: str) -> None:
    assert error(data) == expected


# ---------------------------------------------------------------- links


OVERRIDES = {
    "wan": {
        "site_link": {"up": {"latency_ms": 40}, "down": {"latency_ms": 41}},
        "service_link": {"up": {"latency_ms": 3}, "down": {"latency_ms": 4}},
        "link_overrides": {
            "c_to_a": {"up": {"latency_ms": 100, "bandwidth_kbps": 500}},
            "a_to_b": {"up": {"latency_ms": 80, "jitter_ms": 5}, "down": {"latency_ms": 81}},
            "b_to_coord": {"down": {"bandwidth_kbps": 10}},
        },
    }
}


def test_link_overrides_parse_into_sorted_link_specs() -> None:
    cfg = load_config(OVERRIDES)
    assert cfg.wan.link_overrides == (
        ("a_to_b", LinkSpec(LinkProfile(80, 5, 0), LinkProfile(81, 0, 0))),
        ("b_to_coord", LinkSpec(LinkProfile(), LinkProfile(0, 0, 10))),
        ("c_to_a", LinkSpec(LinkProfile(100, 0, 500), LinkProfile())),
    )
    hash(cfg)  # stays hashable


def test_link_spec_prefers_override_then_service_then_site_link() -> None:
    cfg = load_config(OVERRIDES)
    site = LinkSpec(LinkProfile(40, 0, 0), LinkProfile(41, 0, 0))
    service = LinkSpec(LinkProfile(3, 0, 0), LinkProfile(4, 0, 0))
    assert cfg.link_spec("a_to_b") == LinkSpec(LinkProfile(80, 5, 0), LinkProfile(81, 0, 0))  # override
    assert cfg.link_spec("b_to_coord") == LinkSpec(LinkProfile(), LinkProfile(0, 0, 10))  # override beats service
    assert cfg.link_spec("a_to_coord") == service
    assert cfg.link_spec("c_to_store") == service
    assert cfg.link_spec("b_to_a") == site  # overrides are per direction name
    assert cfg.link_spec("b_to_c") == site
    assert cfg.link_spec("coord_to_a") == site  # only names *ending* in _to_coord/_to_store are service links


def test_link_overrides_must_be_a_mapping() -> None:
    assert error({"wan": {"link_overrides": [["a_to_b", {}]]}}) == (
        "wan.link_overrides: expected a mapping of link name to {up, down}")


def test_bad_value_inside_link_override_names_the_link() -> None:
    assert error({"wan": {"link_overrides": {"a_to_b": {"up": {"latency_ms": "x"}}}}}) == (
        "wan.link_overrides.a_to_b.up.latency_ms: expected an integer, got 'x'")
    assert error({"wan": {"link_overrides": {"a_to_b": {"sideways": {}}}}}).startswith(
        "wan.link_overrides.a_to_b: unknown field(s) ['sideways']")


# ---------------------------------------------------------------- round trips


def test_to_dict_then_load_config_is_equal() -> None:
    data = merge(OVERRIDES, {"run_id": "r1", "train": {"mode": "sync", "compression": "int8", "inner_lr": 0.01},
                             "cluster": {"sites": ["x", "y", "z", "w"]}})
    cfg = load_config(data)
    d = to_dict(cfg)
    assert d["wan"]["link_overrides"]["a_to_b"] == {"up": {"latency_ms": 80, "jitter_ms": 5, "bandwidth_kbps": 0},
                                                     "down": {"latency_ms": 81, "jitter_ms": 0, "bandwidth_kbps": 0}}
    assert d["cluster"]["sites"] == ["x", "y", "z", "w"]
    json.dumps(d)  # plain JSON-able
    assert load_config(d) == cfg
    assert load_config(json.loads(json.dumps(d))) == cfg


def test_defaults_round_trip() -> None:
    assert load_config(to_dict(RunConfig())) == RunConfig()


def test_save_and_read_back(tmp_path: Path) -> None:
    cfg = load_config(OVERRIDES)
    save_config(cfg, tmp_path / "config.json")
    assert config_from_json(tmp_path / "config.json") == cfg


# ---------------------------------------------------------------- CLI overrides


@pytest.mark.parametrize(
    "text,expected",
    [
        ("train.mode=sync", {"train": {"mode": "sync"}}),  # not JSON: kept as a string
        ("train.per_site_batch=16", {"train": {"per_site_batch": 16}}),
        ("train.inner_lr=0.5", {"train": {"inner_lr": 0.5}}),
        ("wan.curve=false", {"wan": {"curve": False}}),
        ('cluster.sites=["a","b"]', {"cluster": {"sites": ["a", "b"]}}),
        ('run_id="7"', {"run_id": "7"}),
        ("wan.site_link.up.latency_ms=30", {"wan": {"site_link": {"up": {"latency_ms": 30}}}}),
        ("run_id=a=b", {"run_id": "a=b"}),  # only the first '=' separates
        ('wan.link_overrides={"a_to_b": {"up": {"latency_ms": 9}}}',
         {"wan": {"link_overrides": {"a_to_b": {"up": {"latency_ms": 9}}}}}),
    ],
)
def test_parse_override(text: str, expected: dict) -> None:
    assert parse_override(text) == expected


def test_override_without_equals_is_refused() -> None:
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        parse_override("train.mode")


def test_overrides_merge_into_a_loadable_config() -> None:
    data: dict[str, Any] = {"train": {"mode": "local", "per_site_batch": 4}}
    for text in ("train.mode=sync", "wan.site_link.up.latency_ms=30", "train.compression=fp16"):
        data = merge(data, parse_override(text))
    cfg = load_config(data)
    assert (cfg.train.mode, cfg.train.per_site_batch, cfg.train.compression) == ("sync", 4, "fp16")
    assert cfg.wan.site_link.up == LinkProfile(30, 0, 0)


def test_override_value_of_wrong_type_is_caught_by_load_config() -> None:
    assert error(parse_override("train.per_site_batch=eight")) == (
        "train.per_site_batch: expected an integer, got 'eight'")


# ---------------------------------------------------------------- files


def test_read_yaml_file(tmp_path: Path) -> None:
    p = tmp_path / "run.yaml"
    p.write_text("train:\n  mode: sync\n  inner_lr: 0.01\nwan:\n  curve: false\n")
    assert load_config(read_config_file(p)) == load_config(
        {"train": {"mode": "sync", "inner_lr": 0.01}, "wan": {"curve": False}})


def test_read_json_file_and_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "run.json"
    p.write_text('{"train": {"mode": "sync"}}')
    assert read_config_file(p) == {"train": {"mode": "sync"}}
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert read_config_file(empty) == {}


def test_invalid_yaml_raises_config_error_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "broken.yaml"
    p.write_text("train: {mode: sync\n  inner_lr: [0.1\n")
    with pytest.raises(ConfigError) as ei:
        read_config_file(p)
    assert str(ei.value).startswith(f"{p}: not valid YAML/JSON")


def test_non_mapping_file_raises_config_error_naming_the_file(tmp_path: Path) -> None:
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError) as ei:
        read_config_file(p)
    assert str(ei.value) == f"{p}: top level must be a mapping"


def test_a_link_profile_given_in_part_loses_the_default_latency_and_says_so() -> None:
    """README's example: capping one direction's bandwidth makes both directions' latency 0, not 20 +- 2
    ms (the meaning configs, benchmarks and frozen studies rely on): the notes name every loss."""
    data = parse_override("wan.site_link.up.bandwidth_kbps=1250")
    assert load_config(data).wan.site_link == LinkSpec(LinkProfile(0, 0, 1250), LinkProfile(0, 0, 0))
    notes = partial_link_notes(data)
    assert notes == [
        "wan.site_link.up given in part: latency_ms=0, jitter_ms=0, not the default's latency_ms=20, jitter_ms=2 "
        "(a link profile given in part takes 0 for what it leaves out; give them to keep the default)",
        "wan.site_link.down not given: latency_ms=0, jitter_ms=0, not the default's latency_ms=20, jitter_ms=2 "
        "(a link profile given in part takes 0 for what it leaves out; give them to keep the default)"]
    whole = {"latency_ms": 20, "jitter_ms": 2, "bandwidth_kbps": 1250}
    assert partial_link_notes({"wan": {"site_link": {"up": whole, "down": whole}}}) == []
    # the service link's default has no jitter: leaving jitter out loses nothing; leaving `down` out loses 5 ms
    assert partial_link_notes({"wan": {"service_link": {"up": {"latency_ms": 2}}}}) == [
        "wan.service_link.down not given: latency_ms=0, not the default's latency_ms=5 "
        "(a link profile given in part takes 0 for what it leaves out; give it to keep the default)"]
    assert partial_link_notes({}) == [] and partial_link_notes({"wan": {"heartbeat_timeout_ms": 2000}}) == []
    assert partial_link_notes({"wan": {"site_link": {"up": 5}}})[0].startswith("wan.site_link.down not given")

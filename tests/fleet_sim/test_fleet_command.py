"""`python -m bench.fleet`'s command line: what it is told to write, it writes; a scenario it does not
know is refused before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.fleet.__main__ import main


def test_docs_in_a_new_folder_are_written_there(tmp_path: Path) -> None:
    docs = tmp_path / "new" / "docs"
    main(["--hours", "0.1", "--bundle", "1000", "--only", "terraform as is", "--docs", str(docs)])
    assert (docs / "bench-fleet.md").read_text().startswith("# Fleet simulation")
    assert (docs / "fleet-day.png").read_bytes().startswith(b"\x89PNG")


def test_an_unknown_scenario_is_refused_naming_the_known_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--hours", "0.1", "--only", "terraform as it is", "--docs", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'terraform as it is'" in err and "'terraform as is'" in err
    assert not list(tmp_path.iterdir())


def test_measure_out_in_a_new_folder_is_written_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m bench.fleet.measure --out` in a new folder: minutes of measuring, then
    FileNotFoundError, the figures lost (they were printed only after the write)."""
    from bench.fleet import measure

    figures = {"decode_step_s": {"1": 0.01}}
    monkeypatch.setattr(measure, "measure", lambda model_dir: figures)
    out = tmp_path / "new" / "cpu_steps.json"
    measure.main(["--model", str(tmp_path), "--out", str(out)])
    assert json.loads(out.read_text()) == figures

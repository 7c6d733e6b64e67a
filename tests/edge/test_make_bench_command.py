"""`make bench` (`python -m bench`): a path it does not know is refused, not served as another."""

from __future__ import annotations

import pytest

from bench.__main__ import main


def test_an_unknown_path_is_refused_before_any_edge_starts(capsys: pytest.CaptureFixture[str]) -> None:
    # `--paths tritn` started an edge on the local engines, labelled its rows "tritn", then ran
    # the fault drills (two minutes) on top.
    with pytest.raises(SystemExit) as exit_:
        main(["--paths", "local,tritn", "--duration", "0.1"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "'tritn'" in err and "local" in err and "triton" in err

"""`python -m bench.drills --only`: a drill name it does not know is refused before anything starts."""

from __future__ import annotations

import pytest

from bench.drills import DRILLS, main


def test_an_unknown_drill_is_refused_naming_the_known_ones(capsys: pytest.CaptureFixture[str]) -> None:
    # It was a KeyError traceback, after the demo model was built and the drills before it in
    # the list had run (`--only overload,drian`: the overload drill's 30 s first).
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "overload,drian"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "drian" in err and all(name in err for name in DRILLS)

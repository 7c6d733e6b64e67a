"""`python -m bench.prefix --variants`: a variant number past the table is refused before anything
runs (it was an IndexError), naming the numbers there are."""

from __future__ import annotations

import pytest

from bench.prefix import VARIANTS, main


def test_a_variant_past_the_table_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "demo", "--variants", "1", str(len(VARIANTS))])
    assert exit_.value.code == 2
    assert f"0 to {len(VARIANTS) - 1}" in capsys.readouterr().err

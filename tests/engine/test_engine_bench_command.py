"""`python -m bench.engine --only`'s command line: a rerun of some sections that has nowhere to keep
the others is refused before it measures anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.engine import main

REPO = Path(__file__).resolve().parents[2]


def test_only_with_no_saved_results_and_no_page_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It measured for minutes, then read the page at --out to splice its sections into and died
    there (FileNotFoundError): the page a fresh --out names does not exist yet."""
    out = tmp_path / "engine.md"
    saved = tmp_path / "saved.pickle"
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "roofline", "--out", str(out), "--saved", str(saved), "--model", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--only" in err and str(out) in err
    assert not out.exists() and not saved.exists()


def test_only_with_a_misspelt_section_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--only roofline,servd` beside a page at --out: roofline measured for minutes, servd was
    skipped, then splicing it into the page died with KeyError 'servd' (with saved results it was
    skipped without a word, the page's command naming it as rerun)."""
    out = tmp_path / "engine.md"
    out.write_text("# a page from an earlier run\n")
    saved = tmp_path / "saved.pickle"
    with pytest.raises(SystemExit) as exit_:
        main(["--only", "roofline,servd", "--out", str(out), "--saved", str(saved), "--model", str(tmp_path)])
    assert exit_.value.code == 2
    assert "unknown 'servd'; known: roofline, layout, served, join, batching" in capsys.readouterr().err
    assert not saved.exists()


def test_a_second_only_rerun_from_a_fresh_checkout_splices_into_the_page(
    tmp_path: Path, demo_dir: Path
) -> None:
    """On a fresh checkout (no saved results) `--only layout` spliced its section into the page and
    saved its results, which held that section alone; the next `--only` rerun took them for a whole
    run's, measured, then died writing the page from them (IndexError in the roofline plot: seen as
    `python -m bench.engine --only layout` twice, and `--quick --only batching` after 1.2 minutes)."""
    page = (REPO / "docs" / "bench-engine.md").read_text()
    out = tmp_path / "engine.md"
    out.write_text(page)
    saved = tmp_path / "saved.pickle"
    argv = ["--only", "layout", "--out", str(out), "--saved", str(saved), "--model", str(demo_dir)]
    main(argv)
    main(argv)
    rewritten = out.read_text()
    # The sections not rerun are the page's own, kept as they were.
    for heading in ("## 1. ", "## 3. ", "## 4. ", "## 5. "):
        start = page.index(heading)
        end = page.find("\n## ", start + 1)
        section = page[start : end if end >= 0 else len(page)]
        assert section in rewritten
    assert rewritten.count("--only layout at ") == 2

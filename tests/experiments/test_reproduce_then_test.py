"""`make reproduce` then `make test`: a run that rewrites the figures renders the docs' result blocks from
them, so the summary check (tests/experiments/test_summary.py) passes after it."""
import shutil
from pathlib import Path

import pytest

from specrepro.experiments import reproduce, summary

ROOT = Path(__file__).resolve().parents[2]


def test_only_a_run_that_rewrites_the_committed_figures_renders_the_committed_docs():
    assert reproduce.docs_to_render("cpu") == [ROOT / "README.md", ROOT / "docs" / "results.md"]
    assert reproduce.docs_to_render("smoke") == []  # figures/smoke/: the docs do not cite them
    assert reproduce.docs_to_render("cpu", output_root="elsewhere") == []
    assert reproduce.docs_to_render("cpu", shard=(0, 2)) == []  # one shard's figures are not the run's


def test_render_names_a_missing_figure_instead_of_failing(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- summary:table1 -->\nold\n<!-- /summary -->\n")
    assert reproduce.render_docs(tmp_path / "figures", [doc]) == []
    assert "table1.json is missing" in capsys.readouterr().out and "old" in doc.read_text()


@pytest.mark.notebooks
def test_reproduce_then_the_summary_check_passes(tmp_path):
    """The sequence on the smoke profile, with copies of the docs standing in for the committed ones: the two
    notebooks whose files the blocks cite run into a fresh folder, the run renders the copies, and the check
    that `make test` runs passes on them; before the render it fails (the smoke numbers are not the committed
    ones), so the render is what makes it pass."""
    docs = [tmp_path / d for d in reproduce.DOCS]
    before = {}
    for src, dst in zip(reproduce.DOCS, docs):
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / src, dst)
        before[dst] = dst.read_text()
    out = tmp_path / "run"
    reproduce.main(["--profile", "smoke", "--only", "02_lookahead_sweep", "03_table1", "--output-root", str(out),
                    "--render", *map(str, docs)])
    figures = out / "figures"
    check = ["--figures", str(figures), "--check", *map(str, docs)]
    assert summary.main(check) == 0
    for doc, text in before.items():  # the docs as they were: what make test met before the render
        assert summary.render_file(text, figures) != text
        # only the blocks changed: the prose around them is the committed one
        assert summary.BLOCK.sub("", text) == summary.BLOCK.sub("", doc.read_text())

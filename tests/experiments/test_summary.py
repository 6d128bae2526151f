"""The README's and docs/results.md's result blocks are the rendering of the committed figures' files."""
import shutil
from pathlib import Path

import pytest

from specrepro.experiments import summary

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/results.md"]


def test_committed_blocks_match_the_committed_figures(capsys):
    for doc in DOCS:
        assert summary.BLOCK.search((ROOT / doc).read_text()), f"{doc} lost its summary blocks"
    rc = summary.main(["--figures", str(ROOT / "figures"), "--check", *[str(ROOT / d) for d in DOCS]])
    assert rc == 0, capsys.readouterr().err + " (python -m specrepro.experiments.summary --write README.md docs/results.md)"


@pytest.fixture
def figures(tmp_path):
    out = tmp_path / "figures"
    out.mkdir()
    for name in ("table1", "lookahead_sweep"):
        for ext in ("csv", "json"):
            shutil.copy(ROOT / "figures" / f"{name}.{ext}", out / f"{name}.{ext}")
    return out


def set_first_sps_speedup(csv: Path, value: str) -> None:
    """Write `value` into the speedup column of the first SpS row of a table1.csv."""
    lines = csv.read_text().splitlines()
    header = lines[0].split(",")
    i = next(j for j, line in enumerate(lines) if ",SpS," in line)
    cells = lines[i].split(",")
    cells[header.index("speedup")] = value
    lines[i] = ",".join(cells)
    csv.write_text("\n".join(lines) + "\n")


def test_a_changed_number_makes_the_check_fail(figures, tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("before\n<!-- summary:table1 -->\nold\n<!-- /summary -->\nafter\n")
    assert summary.main(["--figures", str(figures), "--check", str(doc)]) == 1
    assert summary.main(["--figures", str(figures), "--write", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("before\n") and text.endswith("<!-- /summary -->\nafter\n") and "old" not in text
    assert summary.main(["--figures", str(figures), "--check", str(doc)]) == 0
    # one speedup changed in the CSV: the rendered table differs, so the check fails
    set_first_sps_speedup(figures / "table1.csv", "9.87654")
    assert "9.88" in summary.table1(figures)
    assert summary.main(["--figures", str(figures), "--check", str(doc)]) == 1


def test_figure1_marks_the_best_k_and_fills_the_papers_k4(figures):
    text = summary.figure1(figures)
    assert text.count("(best)") == 2  # one per task
    k4 = next(line for line in text.splitlines() if line.startswith("| 4 |"))
    assert "1.92x" in k4 and "2.46x" in k4


def test_missing_files_and_unknown_blocks_are_named(tmp_path, figures):
    with pytest.raises(FileNotFoundError, match="table1.json is missing"):
        summary.table1(tmp_path)
    with pytest.raises(ValueError, match="unknown summary block 'tabel1'"):
        summary.render_file("<!-- summary:tabel1 -->\n<!-- /summary -->", figures)


def test_the_detectable_difference_has_the_stated_power():
    """Simulated paired differences with the true mean the function names are detected about 80% of the time
    at the Bonferroni level (a one-sample t-test standing in for the normal approximation); half that true
    mean is detected far less often."""
    import numpy as np
    from scipy.stats import ttest_1samp

    rng = np.random.default_rng(0)
    n, sd, tests = 30, 0.05, 8
    half = 1.96 * sd / n ** 0.5
    shift = summary.detectable_difference(-half, half, tests)
    assert shift == pytest.approx((2.7344 + 0.8416) * sd / n ** 0.5, rel=1e-3)

    def power(mean):
        x = rng.normal(mean, sd, size=(4000, n))
        return float(np.mean(ttest_1samp(x, 0, axis=1).pvalue < 0.05 / tests))

    assert 0.72 <= power(shift) <= 0.84  # t with 29 degrees of freedom: a little under the normal's 0.80
    assert power(shift / 2) < 0.3


def test_a_block_at_a_subfolder_renders_that_folders_files(figures, tmp_path):
    """`<!-- summary:NAME@SUB -->` renders from figures/SUB (the AVX2 build's run beside the default one)."""
    sub = figures / "avx2"
    sub.mkdir()
    for ext in ("csv", "json"):
        shutil.copy(figures / f"table1.{ext}", sub / f"table1.{ext}")
    set_first_sps_speedup(sub / "table1.csv", "7.65432")
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- summary:table1 -->\n<!-- /summary -->\n<!-- summary:table1@avx2 -->\n<!-- /summary -->\n")
    assert summary.main(["--figures", str(figures), "--write", str(doc)]) == 0
    default, avx2 = doc.read_text().split("<!-- summary:table1@avx2 -->")
    assert "7.65" in avx2 and "7.65" not in default
    kept = "<!-- summary:table1@nowhere -->\nas it was\n<!-- /summary -->"
    assert summary.render_file(kept, figures) == kept  # a build whose run is not in these figures: kept


def test_run_minutes_reads_each_notebooks_start_and_end(tmp_path):
    import json

    for i, name in enumerate(summary.NOTEBOOK_FILES.values()):
        meta = {"started": f"2026-01-01 00:{10 * i:02d}:00", "finished": f"2026-01-01 00:{10 * i + 5:02d}:30"}
        (tmp_path / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": []}))
        (tmp_path / f"{name}.csv").write_text("a\n1\n")
    text = summary.run_minutes(tmp_path)
    assert text.startswith("notebooks 22 min in all") and "03_table1 5.5" in text
    meta = json.loads((tmp_path / "table1.json").read_text())
    del meta["meta"]["finished"]
    (tmp_path / "table1.json").write_text(json.dumps(meta))
    assert "did not record" in summary.run_minutes(tmp_path)


def test_cpu_kinds_has_a_row_per_build_named_by_its_flags(figures):
    import json

    one = summary.cpu_kinds(figures)
    assert one.count("\n") == 2 and "bfloat16" in one  # header, rule, the default run
    sub = figures / "avx2"
    sub.mkdir()
    for ext in ("csv", "json"):
        shutil.copy(figures / f"lookahead_sweep.{ext}", sub / f"lookahead_sweep.{ext}")
    data = json.loads((sub / "lookahead_sweep.json").read_text())
    data["meta"]["tune"]["native_cflags"] = "-mno-avx512f"
    (sub / "lookahead_sweep.json").write_text(json.dumps(data))
    (figures / "smoke").mkdir()  # a local smoke run's folder is not a build
    shutil.copy(sub / "lookahead_sweep.json", figures / "smoke" / "lookahead_sweep.json")
    rows = summary.cpu_kinds(figures).splitlines()[2:]
    assert len(rows) == 2 and "AVX2 kernels" in rows[1] and "AVX2 kernels" not in rows[0]

"""JupyterLab without a browser: how notebooks open and save, the one cache rule, the server's setup.

The browser itself is tests/experiments/test_lab_browser.py.
"""
import asyncio
import json
import os
import shutil
from pathlib import Path

import nbformat
import papermill.translators
import pytest

from specrepro.experiments import lab, records, reproduce

NAMES = reproduce.notebook_names()


def _open_and_save(folder: Path, name: str, edit=None) -> str:
    """Open folder/NAME.py as Lab does (jupytext's contents manager), add what Lab and a run add to a
    notebook (language_info, UI state in cell metadata, outputs, execution counts), save, return the text."""
    from jupytext import AsyncTextFileContentsManager

    cm = AsyncTextFileContentsManager(root_dir=str(folder))

    async def roundtrip():
        model = await cm.get(f"{name}.py", type="notebook")
        nb = model["content"]
        assert nb.metadata["kernelspec"]["name"] == "specrepro"
        nb.metadata["language_info"] = {"name": "python", "version": "3.11.2", "mimetype": "text/x-python"}
        nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
        for i, cell in enumerate(nb.cells):
            cell.metadata.update({"scrolled": True, "collapsed": False,
                                  "execution": {"iopub.status.busy": "2026-12-04T21:00:00Z"}})
            if cell.cell_type == "code":
                cell.execution_count = i + 1
                cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="out\n"),
                                nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
        if edit:
            edit(nb)
        await cm.save({"type": "notebook", "format": "json", "content": nb}, f"{name}.py")

    asyncio.run(roundtrip())
    return (folder / f"{name}.py").read_text()


def _copy_notebooks(tmp_path, config=True) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    for name in NAMES:
        shutil.copy(reproduce.NOTEBOOK_DIR / f"{name}.py", folder)
    if config:
        shutil.copy(reproduce.NOTEBOOK_DIR / "jupytext.toml", folder)
    return folder


@pytest.mark.parametrize("name", NAMES)
def test_saving_from_lab_rewrites_nothing(tmp_path, name):
    folder = _copy_notebooks(tmp_path)
    assert _open_and_save(folder, name) == (reproduce.NOTEBOOK_DIR / f"{name}.py").read_text()


def test_a_save_shows_only_the_users_change(tmp_path):
    name = "02_lookahead_sweep"
    folder = _copy_notebooks(tmp_path)

    def edit(nb):
        (cell,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        cell.source = cell.source.replace("max_new_tokens = 8 ", "max_new_tokens = 16 ")

    before = (reproduce.NOTEBOOK_DIR / f"{name}.py").read_text().splitlines()
    after = _open_and_save(folder, name, edit).splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after) and len(changed) == 1, changed
    assert changed[0][1].startswith("max_new_tokens = 16 ")


def test_without_the_config_a_save_is_not_clean(tmp_path):
    """The filters in notebooks/jupytext.toml are what keep the save clean (a control for the test above)."""
    folder = _copy_notebooks(tmp_path, config=False)
    saved = _open_and_save(folder, "01_losslessness")
    assert saved != (reproduce.NOTEBOOK_DIR / "01_losslessness.py").read_text()
    assert "language_info" in saved or "scrolled" in saved or "jupytext_version" in saved


def test_one_entry_per_notebook_and_the_project_kernel(tmp_path):
    assert not list(reproduce.NOTEBOOK_DIR.glob("*.ipynb")) or all(
        p.stem not in NAMES for p in reproduce.NOTEBOOK_DIR.glob("*.ipynb")), "generated .ipynb in notebooks/"
    for name in NAMES:  # the reviewed sources name the project's kernel
        assert "#     name: specrepro\n" in (reproduce.NOTEBOOK_DIR / f"{name}.py").read_text()
    written = reproduce.sync_notebooks(dest=tmp_path)
    assert [p.stem for p in written] == NAMES and all(p.parent == tmp_path for p in written)
    for p in written:
        nb = nbformat.read(p, as_version=4)
        assert "jupytext" not in nb.metadata  # nothing pairs the copy back to the .py
        assert nb.metadata["kernelspec"]["name"] == reproduce.KERNEL_NAME
        assert any("parameters" in c.metadata.get("tags", []) for c in nb.cells)
    assert reproduce.SYNC_DIR.parent.name == "runs"  # git-ignored, outside the folder Lab lists


def _namespace(name: str, injected: dict) -> dict:
    """A kernel's globals after the parameters cell and papermill's injected cell (papermill's own code)."""
    namespace = {}
    exec(_parameters_source(name), {}, namespace)
    exec(papermill.translators.translate_parameters("python3", "python", injected, ""), {}, namespace)
    return namespace


def _parameters_source(name: str) -> str:
    import jupytext

    nb = jupytext.read(reproduce.NOTEBOOK_DIR / f"{name}.py")
    return next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))


def test_one_cache_rule_for_every_way_a_notebook_runs():
    name = "02_lookahead_sweep"
    ((_, planned),) = reproduce.plan("smoke", [name])
    by_papermill = records.results_folder(name, _namespace(name, {**planned, "results_dir": "runs/smoke/results"}))
    by_reproduce = records.results_folder(name, _namespace(name, planned))  # it passes the folder keyed
    in_lab = records.results_folder(name, _namespace(name, {}))  # nbval and Lab: the cell's smoke defaults
    assert planned["results_dir"] == by_papermill == by_reproduce == in_lab
    assert in_lab.startswith(f"runs/smoke/results/{name}-")
    # the case that once went wrong: max_new_tokens changed in Lab must not reuse the 8-token items
    changed = records.results_folder(name, _namespace(name, {"max_new_tokens": 16}))
    assert changed != in_lab
    assert changed == dict(reproduce.plan("smoke", [name], {"max_new_tokens": 16}))[name]["results_dir"]
    # a default that no params file repeats counts too (the old rule keyed only the parameters passed)
    assert records.results_folder(name, _namespace(name, {"cost_repeats": 6})) != in_lab


def test_the_key_follows_the_code(monkeypatch):
    name = "01_losslessness"
    before = records.results_folder(name, _namespace(name, {}))
    monkeypatch.setattr(records, "code_digest", lambda: "another-version")
    assert records.results_folder(name, _namespace(name, {})) != before


def test_cache_rule_bad_input_is_clear():
    with pytest.raises(ValueError, match="no notebook"):
        records.notebook_defaults("05_missing")
    with pytest.raises(KeyError):  # a namespace without the notebook's parameters (not its globals())
        records.results_folder("01_losslessness", {"results_dir": "x"})


def test_smoke_outputs_say_they_measure_nothing(tmp_path):
    records.write_outputs(tmp_path, "t", [{"a": 1}], {"profile": "smoke"})
    assert "measure nothing" in json.loads((tmp_path / "t.json").read_text())["meta"]["note"]
    records.write_outputs(tmp_path, "u", [{"a": 1}], {"profile": "cpu"})
    assert "note" not in json.loads((tmp_path / "u.json").read_text())["meta"]
    assert "measure nothing" in records.profile_note("smoke") and records.profile_note("cpu") == ""
    for name in ("02_lookahead_sweep", "03_table1", "04_drafts"):  # shown above each results table
        assert "profile_note(profile)" in (reproduce.NOTEBOOK_DIR / f"{name}.py").read_text()


def test_lab_server_setup(monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "agg")
    env = lab.lab_environment()
    assert "MPLBACKEND" not in env  # the kernels get matplotlib's inline backend, so plt.show() shows
    spec_dir = Path(env["JUPYTER_PATH"].split(":")[0]) / "kernels" / "specrepro"
    spec = json.loads((spec_dir / "kernel.json").read_text())
    assert spec["display_name"] == "Python (specrepro)" and "env" not in spec
    assert str(reproduce.ROOT) in env["PYTHONPATH"].split(":")
    cmd = lab.lab_command("--no-browser")
    assert "--allow-root" in cmd and f"--ServerApp.root_dir={reproduce.NOTEBOOK_DIR}" in cmd
    settings = next(a.split("=", 1)[1] for a in cmd if a.startswith("--LabApp.app_settings_dir="))
    overrides = json.loads((Path(settings) / "overrides.json").read_text())
    assert overrides["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]["python"] == "Jupytext Notebook"
    assert os.environ["MPLBACKEND"] == "agg"  # the calling process is left as it was


def test_make_lab_starts_this_server():
    """The browser test starts lab.lab_command() with lab.lab_environment(): make lab must run the same."""
    makefile = (reproduce.ROOT / "Makefile").read_text()
    recipe = makefile.split("\nlab:", 1)[1].split("\n\n", 1)[0]
    assert "-m specrepro.experiments.lab" in recipe and "env -u MPLBACKEND" in recipe

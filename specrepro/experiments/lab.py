"""JupyterLab on the notebooks, set up the way Jupyter users expect (`make lab`).

    python -m specrepro.experiments.lab [JUPYTER LAB OPTIONS ...]

- A double click on `notebooks/NN_name.py` opens it as a notebook (jupytext's "Jupytext Notebook" viewer is
  the default for Python files, through a settings override), one entry per notebook: the generated
  `.ipynb` live in runs/notebooks/, outside the folder Lab shows.
- Saving writes the percent script back through notebooks/jupytext.toml's filters: deterministic, outputs
  never saved, so `git diff` shows only what the user changed.
- The notebooks name the kernel "specrepro" ("Python (specrepro)"): this Python, importing this checkout.
- The kernels keep matplotlib's own backend (MPLBACKEND, which scripted runs set to agg, is dropped).
- Works as root (containers): --allow-root.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..files import atomic_write_text
from .reproduce import NOTEBOOK_DIR, ROOT, install_kernel

JUPYTEXT_VIEWER = "Jupytext Notebook"  # the document factory jupyterlab-jupytext registers
OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {"defaultViewers": {"python": JUPYTEXT_VIEWER}},
    # no "get notified about Jupyter news?" pop-up over the notebook, no update checks (offline machines)
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


def settings_dir() -> Path:
    """Lab's application settings folder for this checkout, holding overrides.json (left out of the venv)."""
    path = ROOT / "runs" / "jupyter" / "lab" / "settings"
    atomic_write_text(path / "overrides.json", json.dumps(OVERRIDES, indent=1))
    return path


def lab_command(*extra: str) -> list[str]:
    """The command line of the server: JupyterLab on notebooks/ with this checkout's settings."""
    return [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={NOTEBOOK_DIR}",
            f"--LabApp.app_settings_dir={settings_dir()}", "--allow-root", *extra]


def lab_environment(env=None) -> dict:
    """The server's (and so its kernels') environment: the specrepro kernel on JUPYTER_PATH, this checkout
    on PYTHONPATH, and no MPLBACKEND."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env if env is not None else saved)
        install_kernel(scripted=False)
        out = dict(os.environ)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out.pop("MPLBACKEND", None)
    return out


def stale_copies() -> list[Path]:
    """.ipynb beside a notebook's .py in notebooks/ (what `specrepro-reproduce --sync` wrote there before):
    Lab would list that notebook twice, and jupytext refuses to open the paired copy."""
    return [p for p in sorted(NOTEBOOK_DIR.glob("*.ipynb")) if p.with_suffix(".py").exists()]


def main(argv=None) -> None:
    for p in stale_copies():
        print(f"[lab] {p.relative_to(ROOT)} is an old generated copy (git-ignored; the .py opens as the notebook "
              f"now): delete it", file=sys.stderr)
    cmd = lab_command(*(sys.argv[1:] if argv is None else argv))
    os.execve(cmd[0], cmd, lab_environment())


if __name__ == "__main__":
    main()

"""JupyterLab in a real browser: headless Chromium against the server `make lab` starts.

For notebooks 01 and 02: a double click in the file browser opens the .py as a notebook, the toolbar shows
the project's kernel, Run > Run All Cells runs every cell at the smoke defaults, the figure is an image in
the DOM and no cell output is an error; File > Save then leaves the .py byte for byte as it was. A
screenshot of each finished notebook goes to the test's tmp_path and to runs/lab-browser/ (with the
seconds each notebook took, in timings.json).

Needs Debian's `chromium` and `chromium-driver` (apt) and selenium (the dev extra); without them it says so
in one line and skips. Slow (minutes: the real SmolLM2 target in notebook 02).
"""
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from specrepro.experiments import lab, reproduce

pytestmark = [pytest.mark.slow, pytest.mark.notebooks]

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
KERNEL = reproduce.KERNEL_DISPLAY_NAME
NOTEBOOKS = ["01_losslessness", "02_lookahead_sweep"]
SHOTS = reproduce.ROOT / "runs" / "lab-browser"  # a copy of the screenshots that outlives tmp_path
RUN_TIMEOUT = 900  # seconds per notebook (02 loads the real target; the cores may be shared)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str):
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("no Chromium here (apt-get install -y chromium chromium-driver): the Lab browser test "
                    "did not run")
    pytest.importorskip("selenium", reason="selenium is not installed (pip install '.[dev]'): the Lab "
                        "browser test did not run")
    tmp = tmp_path_factory.mktemp("lab")
    port, token = _free_port(), secrets.token_hex(16)
    # the same command and environment as `make lab`, on a loopback port with a token; fresh user
    # settings and workspace, so no earlier session reopens tabs
    cmd = lab.lab_command("--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                          "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                          f"--LabApp.user_settings_dir={tmp / 'user-settings'}",
                          f"--LabApp.workspaces_dir={tmp / 'workspaces'}")
    log = open(tmp / "server.log", "wb")
    # as under make, which exports MPLBACKEND=agg to every recipe: the kernels must not inherit it
    env = lab.lab_environment({**os.environ, "MPLBACKEND": "agg"})
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                _get(f"{url}/api/status", token)
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise AssertionError(f"Lab did not start: {(tmp / 'server.log').read_text()[-3000:]}")
                time.sleep(1)
        yield {"url": url, "token": token, "proc": proc, "tmp": tmp}
    finally:  # always: the server and its kernels (their own process group)
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


@pytest.fixture(scope="module")
def browser(server):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={server['tmp'] / 'chromium'}", "--window-size=1500,1100"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        driver.get(f"{server['url']}/lab?token={server['token']}")
        yield driver
    finally:
        driver.quit()


def _wait(driver, condition, timeout, what):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.5).until(lambda d: condition(d), message=what)


def _menu(driver, menu: str, command: str):
    from selenium.webdriver.common.by import By

    (item,) = [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if e.text.strip() == menu]
    item.click()
    entry = _wait(driver, lambda d: d.find_element(By.CSS_SELECTOR, f'.lm-Menu-item[data-command="{command}"]'),
                  10, f"menu {menu} has no {command}")
    entry.click()


STATE_JS = """
const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
if (!panel) return null;
const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputPrompt')].map(e => e.textContent.trim());
const outputs = [...panel.querySelectorAll('.jp-OutputArea-output')].map(e => ({
    mime: e.getAttribute('data-mime-type') || '', text: e.textContent.slice(0, 2000)}));
const imgs = [...panel.querySelectorAll('.jp-OutputArea-output img')].filter(i => i.complete && i.naturalWidth > 0);
const kernel = panel.querySelector('.jp-Toolbar-kernelName');
const status = panel.querySelector('.jp-Notebook-ExecutionIndicator');
return {prompts, outputs, images: imgs.map(i => [i.naturalWidth, i.naturalHeight]),
        kernel: kernel ? kernel.textContent.trim() : '',
        widgets: panel.querySelectorAll('.jp-OutputArea-output .widget-hprogress, .jp-OutputArea-output progress').length,
        busy: status ? status.getAttribute('data-status') : ''};
"""


def _errors(outputs) -> list[str]:
    """Error outputs (Lab renders a traceback as stderr text), and the warning a missing ipywidgets prints."""
    bad = []
    for o in outputs:
        if o["mime"] == "application/vnd.jupyter.stderr" and (
                "Traceback" in o["text"] or "Error" in o["text"] or "IProgress" in o["text"]):
            bad.append(o["text"][:500])
    return bad


def _kernel_env(server_pid: int) -> list[dict]:
    """The environments of the server's ipykernel children (Linux /proc)."""
    out = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"ipykernel_launcher" not in (proc / "cmdline").read_bytes():
                continue
            ppid = int(next(l for l in (proc / "status").read_text().splitlines() if l.startswith("PPid:")).split()[1])
            if ppid == server_pid:
                raw = (proc / "environ").read_bytes().split(b"\0")
                out.append(dict(x.decode(errors="replace").split("=", 1) for x in raw if b"=" in x))
        except (OSError, StopIteration):
            continue
    return out


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_opens_runs_and_saves_clean_in_lab(server, browser, name, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    source = reproduce.NOTEBOOK_DIR / f"{name}.py"
    before = source.read_bytes()
    driver = browser
    try:
        entry = _wait(driver, lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, ".jp-DirListing-itemText")
                                              if e.text.strip() == f"{name}.py"), False),
                      120, f"{name}.py is not in Lab's file browser")
        listed = [e.text.strip() for e in driver.find_elements(By.CSS_SELECTOR, ".jp-DirListing-itemText")]
        assert listed.count(f"{name}.py") == 1 and f"{name}.ipynb" not in listed, listed  # one entry
        ActionChains(driver).double_click(entry).perform()
        # a notebook (not the text editor), with the project's kernel started and selected, no kernel dialog
        state = _wait(driver, lambda d: (s := d.execute_script(STATE_JS)) and s["kernel"] == KERNEL
                      and s["busy"] == "idle" and s, 180,
                      f"{name}.py did not open as a notebook with the {KERNEL!r} kernel idle")
        assert not driver.find_elements(By.CSS_SELECTOR, ".jp-Dialog"), "a dialog opened with the notebook"
        assert state["prompts"], "no code cells"
        start = time.time()
        _menu(driver, "Run", "runmenu:run-all")
        _wait(driver, lambda d: (s := d.execute_script(STATE_JS)) and s["busy"] == "idle"
              and all(p.strip("[]: ").isdigit() for p in s["prompts"]), RUN_TIMEOUT,
              f"{name}: not every cell finished within {RUN_TIMEOUT} s")
        seconds = time.time() - start
        state = driver.execute_script(STATE_JS)
        assert not _errors(state["outputs"]), _errors(state["outputs"])
        assert state["images"] and all(w > 100 and h > 100 for w, h in state["images"]), state["images"]
        if name == "02_lookahead_sweep":  # tqdm's progress bar is a widget, and the smoke note is shown
            assert state["widgets"] > 0, "no progress-bar widget"
            assert any("measure nothing" in o["text"] for o in state["outputs"]), "no smoke-profile note"
        envs = _kernel_env(server["proc"].pid)
        assert envs and all("MPLBACKEND" not in e for e in envs), "MPLBACKEND reached the Lab kernel"
        # the screenshot: the figure in view
        driver.execute_script("const i = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) "
                              ".jp-OutputArea-output img'); i.scrollIntoView({block: 'center'});")
        time.sleep(1)
        shot = tmp_path / f"{name}.png"
        driver.save_screenshot(str(shot))
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SHOTS / shot.name)
        timings = SHOTS / "timings.json"
        done = json.loads(timings.read_text()) if timings.exists() else {}
        timings.write_text(json.dumps({**done, name: round(seconds, 1)}, indent=1))
        # saving from Lab rewrites nothing: outputs, execution counts and UI state never reach the .py
        saved_at = source.stat().st_mtime_ns
        _menu(driver, "File", "docmanager:save")
        _wait(driver, lambda d: source.stat().st_mtime_ns != saved_at, 60, f"Lab did not save {name}.py")
        time.sleep(1)
        assert source.read_bytes() == before, f"saving {name} from Lab changed notebooks/{name}.py"
    finally:
        if source.read_bytes() != before:  # never leave a tracked file changed
            source.write_bytes(before)

"""How long a newcomer's first commands take: `make setup` without pip's cache, then the first `make lab`, in a
fresh clone of this checkout's commit with an empty $SPECREPRO_HOME.

    python -m specrepro.bench.durations [--smoke] [--out figures/bench/durations-setup-lab.json] [--keep DIR]

`make setup` runs with PIP_NO_CACHE_DIR=1, so every package comes from the package index (the time includes
the downloads: it depends on the network to the index as much as on the CPU). The first `make lab` is timed
from its start until the server answers an HTTP request for the Lab page; then it is stopped. The file
records the commit and machine (results.RunRecord) and the load averages: time it with nothing else running.
With --smoke, `PROFILE=smoke make reproduce` runs next in the same clone and home (the runner's progress lines
are kept in the file: each notebook's time).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ..engines.machine import RunRecord
from ..files import atomic_write_text

ROOT = Path(__file__).resolve().parents[2]
URL = re.compile(r"(http://(?:127\.0\.0\.1|localhost):\d+/lab\?token=[0-9a-f]+)")


def fresh_clone(into: Path) -> Path:
    """A clone of this checkout's HEAD (committed files only, as a newcomer's clone has)."""
    clone = into / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", head], check=True)
    return clone


def time_setup(clone: Path, env: dict) -> float:
    start = time.monotonic()
    out = subprocess.run(["make", "setup"], cwd=clone, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if out.returncode != 0:
        raise SystemExit(f"make setup failed (rc {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return seconds


def time_lab(clone: Path, env: dict, timeout: float = 300.0) -> float:
    """Seconds from `make lab` to the Lab page answering 200 (the server prints its URL, with its token)."""
    env = {**env, "BROWSER": "true"}  # the server opens no browser window
    start = time.monotonic()
    proc = subprocess.Popen(["make", "lab"], cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    url, seen = None, []
    try:
        while url is None:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit("make lab ended before its server printed a URL:\n" + "".join(seen[-40:]))
            seen.append(line)
            if m := URL.search(line):
                url = m.group(1)
            if time.monotonic() - start > timeout:
                raise SystemExit(f"no Lab URL after {timeout:.0f} s:\n" + "".join(seen[-40:]))
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10) as response:
                    if response.status == 200:
                        return time.monotonic() - start
            except OSError:
                pass
            if time.monotonic() - start > timeout:
                raise SystemExit(f"the Lab page at {url} did not answer in {timeout:.0f} s")
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def time_smoke(clone: Path, env: dict) -> tuple[float, list[str]]:
    """Seconds of `PROFILE=smoke make reproduce` after setup, and the runner's own lines ([reproduce] ...)."""
    start = time.monotonic()
    out = subprocess.run(["make", "reproduce", "PROFILE=smoke"], cwd=clone, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if out.returncode != 0:
        raise SystemExit(f"PROFILE=smoke make reproduce failed (rc {out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("[reproduce]")]
    return seconds, lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="figures/bench/durations-setup-lab.json")
    ap.add_argument("--keep", help="clone and home here (kept) instead of a temporary folder")
    ap.add_argument("--smoke", action="store_true", help="then time PROFILE=smoke make reproduce")
    args = ap.parse_args(argv)
    record = RunRecord(args)
    with tempfile.TemporaryDirectory(prefix="specrepro-durations-") as tmp:
        where = Path(args.keep) if args.keep else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        clone = fresh_clone(where)
        env = {**os.environ, "SPECREPRO_HOME": str(where / "home"), "PIP_NO_CACHE_DIR": "1"}
        env.pop("VIRTUAL_ENV", None)
        setup = time_setup(clone, env)
        print(f"make setup without pip's cache: {setup:.0f} s", flush=True)
        lab = time_lab(clone, env)
        print(f"the first make lab, until the Lab page answers: {lab:.1f} s", flush=True)
        smoke = time_smoke(clone, env) if args.smoke else None
        if smoke:
            print(f"PROFILE=smoke make reproduce: {smoke[0]:.0f} s", flush=True)
    data = {"meta": record.meta(what="a fresh clone of the commit, empty $SPECREPRO_HOME; make setup with "
                                     "PIP_NO_CACHE_DIR=1 (downloads included), then make lab until its page answers"),
            "seconds_make_setup_no_pip_cache": round(setup, 1), "seconds_first_make_lab": round(lab, 1)}
    if smoke:
        data.update(seconds_smoke_reproduce=round(smoke[0], 1), smoke_reproduce_lines=smoke[1])
    atomic_write_text(Path(args.out), json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

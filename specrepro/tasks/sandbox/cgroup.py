"""A cgroup per run: memory (swap included) and process count capped by the kernel, whatever the program
holds them in -- anonymous memory, tmpfs files, pipes, kernel objects -- and every process of the run
found and killed through it.

cgroup v2 where its memory controller can be used (its ``memory.max``, ``memory.swap.max`` = 0,
``pids.max``, ``cgroup.kill``); else cgroup v1's memory and pids hierarchies (``memory.limit_in_bytes`` with
``memory.memsw.limit_in_bytes`` equal to it, ``pids.max``). A leaf is made beside this process's own
cgroup (as its child), which needs write access there: root in a container, or a delegated subtree.
"""

from __future__ import annotations

import functools
import os
import secrets
import time
from dataclasses import dataclass

MARGIN_MB = 32  # over memory_mb, for the launcher's own pages and kernel objects


def mounts(mountinfo: str) -> dict[str, str]:
    """Mount points in /proc/self/mountinfo's text: "v2" for the cgroup2 hierarchy, and each v1 controller
    ("memory", "pids") by name."""
    found: dict[str, str] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields or len(fields) < fields.index("-") + 4:
            continue
        dash = fields.index("-")
        point, fstype, options = fields[4], fields[dash + 1], fields[dash + 3].split(",")
        if fstype == "cgroup2":
            found.setdefault("v2", point)
        elif fstype == "cgroup":
            for controller in ("memory", "pids"):
                if controller in options:
                    found.setdefault(controller, point)
    return found


def own_paths(cgroups: str) -> dict[str, str]:
    """This process's cgroup in each hierarchy, from /proc/self/cgroup's text: "v2" and the v1 controllers."""
    paths: dict[str, str] = {}
    for line in cgroups.splitlines():
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            paths["v2"] = path
        for controller in controllers.split(","):
            if controller in ("memory", "pids"):
                paths[controller] = path
    return paths


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


@functools.lru_cache(maxsize=1)
def parents() -> tuple[str, dict[str, str]] | None:
    """("v2", {"both": dir}) or ("v1", {"memory": dir, "pids": dir}): where leaves can be made, or None."""
    try:
        found, own = mounts(_read("/proc/self/mountinfo")), own_paths(_read("/proc/self/cgroup"))
    except OSError:
        return None
    if "v2" in found and "v2" in own:
        base = os.path.join(found["v2"], own["v2"].lstrip("/"))
        try:
            if {"memory", "pids"} <= set(_read(os.path.join(base, "cgroup.controllers")).split()):
                enabled = set(_read(os.path.join(base, "cgroup.subtree_control")).split())
                if not {"memory", "pids"} <= enabled:
                    _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids")
                return "v2", {"both": base}
        except OSError:
            pass
    if "memory" in found and "memory" in own:
        dirs = {c: os.path.join(found[c], own[c].lstrip("/")) for c in ("memory", "pids") if c in found and c in own}
        return "v1", dirs
    return None


@dataclass
class Leaf:
    """One run's cgroup(s): made with their limits, entered by the run's first process before it execs."""

    version: str
    dirs: dict[str, str]  # "both" (v2) or "memory" and "pids" (v1) -> the leaf's directory
    memory_bytes: int
    pids: int | None

    @classmethod
    def make(cls, memory_mb: int, max_pids: int) -> Leaf:
        """A fresh leaf with ``memory_mb`` + MARGIN_MB of memory (no swap) and ``max_pids`` processes. Raises
        OSError where the machine does not let this process make one."""
        found = parents()
        if found is None:
            raise OSError("no cgroup hierarchy with a memory controller is mounted where this process can use it")
        version, bases = found
        name = f"specrepro-{secrets.token_hex(8)}"
        leaf = cls(version, {}, (memory_mb + MARGIN_MB) << 20, None)
        try:
            for key, base in bases.items():
                path = os.path.join(base, name)
                os.mkdir(path, 0o755)
                leaf.dirs[key] = path
            leaf._limit(max_pids)
        except OSError:
            leaf.remove(time.monotonic() + 1.0)
            raise
        return leaf

    def _limit(self, max_pids: int) -> None:
        memory = self.dirs.get("both") or self.dirs["memory"]
        if self.version == "v2":
            _write(os.path.join(memory, "memory.max"), str(self.memory_bytes))
            if os.path.exists(os.path.join(memory, "memory.swap.max")):
                _write(os.path.join(memory, "memory.swap.max"), "0")
            _write(os.path.join(memory, "memory.oom.group"), "1")
        else:
            _write(os.path.join(memory, "memory.limit_in_bytes"), str(self.memory_bytes))
            if os.path.exists(os.path.join(memory, "memory.memsw.limit_in_bytes")):
                _write(os.path.join(memory, "memory.memsw.limit_in_bytes"), str(self.memory_bytes))
            else:
                _write(os.path.join(memory, "memory.swappiness"), "0")
        pids = self.dirs.get("both") or self.dirs.get("pids")
        if pids is not None:
            _write(os.path.join(pids, "pids.max"), str(max_pids))
            self.pids = max_pids

    @property
    def held(self) -> str:
        """What this leaf caps, for the run's record."""
        pids = f", {self.pids} processes" if self.pids is not None else ", processes not capped (no pids controller)"
        return f"cgroup {self.version}: {self.memory_bytes >> 20} MiB of memory, no swap{pids}"

    def enter(self) -> None:
        """Move the calling process into the leaf (runs in the child between fork and exec, still as root)."""
        for path in self.dirs.values():
            _write(os.path.join(path, "cgroup.procs"), "0")

    def members(self) -> set[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            try:
                found.update(int(p) for p in _read(os.path.join(path, "cgroup.procs")).split())
            except OSError:
                pass
        return found

    def peak(self) -> int | None:
        """The most memory the run held at once, in bytes (None where the kernel does not say)."""
        memory = self.dirs.get("both") or self.dirs.get("memory")
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            try:
                return int(_read(os.path.join(memory, name)))
            except (OSError, ValueError, TypeError):
                continue
        return None

    def kill_all(self) -> None:
        """cgroup v2's ``cgroup.kill``: SIGKILL to every process in the leaf at once (where the kernel has it;
        ``process.kill_everything`` then kills what ``members`` still lists, as it does on v1)."""
        kill_file = os.path.join(self.dirs.get("both", ""), "cgroup.kill")
        if self.version == "v2" and os.path.exists(kill_file):
            try:
                _write(kill_file, "1")
            except OSError:
                pass

    def remove(self, deadline: float) -> bool:
        """rmdir the leaf (it empties once its killed processes are reaped); False if time ran out first."""
        for key, path in list(self.dirs.items()):
            while True:
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        return False
                    time.sleep(0.005)
            del self.dirs[key]
        return True

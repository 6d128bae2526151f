"""What machine the numbers come from: CPU model and the instruction-set flags that decide kernel speed,
and a memory-bandwidth probe that gives the floor under a memory-bound forward pass.

The project's machines are not one CPU kind (AVX512-BF16 on some, AVX2 only on others), and a dtype or
kernel that wins on one can lose on the other, so every benchmark record carries `cpu_info()`.

The run record (`RunRecord`, re-exported by specrepro.experiments.results) is what every result file says
about the run that made it: the code (commit, dirty flag, code digest), this machine (`machine_info`), the
arguments with portable paths and the load averages at the start and the end (the cores may be shared).
"""
from __future__ import annotations

import os
import platform
import re
import statistics
import time

import torch

# environment variables that cap the instruction sets torch's kernels use (ATen, oneDNN, MKL): with them a
# CPU runs as an older kind (e.g. AVX2 only on an AVX512 machine), so they belong to the machine's identity
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")

# flags that change which matrix kernels a CPU library can use (x86: SIMD width, bf16/int8 dot products, AMX)
KERNEL_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "bf16")


def cpu_info() -> dict:
    """{"model", "flags" (the kernel-relevant subset, sorted), "cores" usable by this process, "arch",
    "isa_limits" (the ISA_LIMITS variables that are set)}."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                name, _, value = line.partition(":")
                name = name.strip()
                if name in ("model name", "Model") and not model:
                    model = value.strip()
                elif name in ("flags", "Features"):  # x86, Arm
                    flags.update(value.split())
    except OSError:  # not Linux: the platform module's words are all there is
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limits = {name: os.environ[name] for name in ISA_LIMITS if os.environ.get(name)}
    return {"model": model or platform.processor() or platform.machine(), "flags": sorted(flags.intersection(KERNEL_FLAGS)),
            "cores": cores, "arch": platform.machine(), "isa_limits": limits}


def describe_cpu(info: dict | None = None) -> str:
    """'AMD EPYC (2 cores; avx2 avx512_bf16 ...)': the line printed beside benchmark numbers."""
    info = info or cpu_info()
    limits = "".join(f"; {k}={v}" for k, v in info.get("isa_limits", {}).items())
    return f"{info['model']} ({info['cores']} cores; {' '.join(info['flags']) or 'no SIMD flags read'}{limits})"


def copy_bandwidth(megabytes: int = 256, reps: int = 5, device="cpu") -> float:
    """Memory bandwidth in GB/s as torch copies a buffer larger than any cache (bytes read + written), in
    the memory of `device` (a GPU's own memory for a model that runs there).

    Uses torch's current thread count, like the forward passes it is compared with.
    """
    device = torch.device(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    n = megabytes * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch: page faults are not bandwidth
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n * 4 / statistics.median(times) / 1e9


def weight_bytes(runner_or_model, dtype: torch.dtype | None = None) -> int:
    """Bytes a forward pass must stream at least once: every parameter (a tied head counted once)."""
    model = getattr(runner_or_model, "model", runner_or_model)
    dtype = dtype or getattr(runner_or_model, "dtype", None)
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        size = torch.finfo(dtype).bits // 8 if dtype is not None else p.element_size()
        total += p.numel() * size
    return total


def memory_floor(runner_or_model, dtype: torch.dtype | None = None, bandwidth_gbs: float | None = None) -> dict:
    """The time one memory-bound pass cannot beat: weight bytes / copy bandwidth, measured now."""
    bandwidth = bandwidth_gbs or copy_bandwidth()
    nbytes = weight_bytes(runner_or_model, dtype)
    return {"weight_bytes": nbytes, "copy_bandwidth_gbs": bandwidth, "floor_ms": 1e3 * nbytes / (bandwidth * 1e9)}


def machine_info() -> dict:
    """Where the numbers were measured: the CPU model and its kernel flags (avx2, avx512_bf16, amx...) too."""
    cpu = cpu_info()
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu["model"],
        "cpu_flags": cpu["flags"],
        "isa_limits": cpu["isa_limits"],
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "usable_cores": cpu["cores"],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        # every visible GPU with its memory: a split target's numbers depend on all of them
        "cuda_devices": [f"{torch.cuda.get_device_name(i)} ({torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB)"
                         for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else [],
    }


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


class RunRecord:
    """The record every result file carries. Make it before the run writes anything (the dirty flag must not
    see the run's own outputs) and put `meta()` into each file when it is written:

        record = RunRecord(args)          # argparse.Namespace, a dict, or None (a notebook's parameters
        ...                               # are recorded beside it by the notebook)
        write_json(out, {"meta": record.meta(tune=report), "rows": rows})
    """

    def __init__(self, args=None):
        from ..files import portable_args, provenance

        self.provenance = provenance()
        self.started = _utc_now()
        self.load_average_start = load_average()
        if args is not None and not isinstance(args, dict):
            args = vars(args)
        self.args = None if args is None else portable_args(dict(args))

    def meta(self, **extra) -> dict:
        """The record at this moment (the machine's thread count and load now: the end of the run so far),
        with `extra` beside it."""
        out = {"provenance": self.provenance, "machine": machine_info(), "started": self.started,
               "finished": _utc_now(), "load_average_start": self.load_average_start,
               "load_average_end": load_average()}
        if self.args is not None:
            out["args"] = self.args
        return {**out, **extra}


# what differs between two runs of the same settings on the same code (a resumed run and an uninterrupted one)
RUN_VARYING = ("started", "finished", "load_average_start", "load_average_end")


def end_of_run(meta: dict) -> dict:
    """A record made earlier (RunRecord.meta) with its end (time, load) set to now."""
    return {**meta, "finished": _utc_now(), "load_average_end": load_average()}


def check_record(data) -> list[str]:
    """What a result file (its parsed JSON) lacks of the run record: [] when it names the commit, the code
    digest and the machine (CPU model and flags). The record sits under "meta", or at the top of a file
    without one; files of the bench written before the record name the machine in their own words
    ("cpu_info", or the memory-floor probe's "machine"), which counts as naming it."""
    if not isinstance(data, dict):
        return ["commit", "code digest", "machine"]
    meta = data["meta"] if isinstance(data.get("meta"), dict) else data
    prov = meta.get("provenance") if isinstance(meta.get("provenance"), dict) else {}
    missing = []
    if not re.fullmatch(r"[0-9a-f]{40}", str(prov.get("commit"))):
        missing.append("commit")
    if not re.fullmatch(r"[0-9a-f]{12}", str(prov.get("code_digest"))):
        missing.append("code digest")

    def named(d, model="model", flags="flags"):
        return isinstance(d, dict) and bool(d.get(model)) and isinstance(d.get(flags), list)

    machine = meta.get("machine")
    if not (named(machine, "cpu_model", "cpu_flags") or named(data.get("cpu_info")) or named(data.get("machine"))
            or (isinstance(data.get("machine"), dict) and named(data["machine"].get("cpu_info")))):
        missing.append("machine")
    return missing

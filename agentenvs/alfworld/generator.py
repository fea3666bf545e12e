"""Generate ALFWorld games over the `alfworld` package's own PDDL domain, grammar and floorplans.

Each game is a folder with ``game.tw-pddl`` (``pddl_domain``: the shipped ``alfred.pddl``;
``grammar``: the shipped ``alfred.twl2`` with "UNKNOWN GOAL" replaced by the goal text;
``pddl_problem``: objects, locations, receptacles placed as in the floorplan's
``FloorPlan*-openable.json``, objects of the floorplan's ``-objects.json`` placed where
alfworld's ``VAL_RECEPTACLE_OBJECTS`` allows, affordances and the goal formula of
``alfworld.gen.goal_library``; ``solvable``) and ``traj_data.json`` (task type and targets), the
format the real engine loads. Nothing of the real game files is used.

Splits: ``train`` and ``valid_seen`` (in-distribution: new games in training floorplans) draw
from the training floorplans; ``valid_unseen`` (out-of-distribution) uses only floorplans that
no training game uses (:data:`OOD_FLOORPLANS`, the real benchmark's unseen rooms among them).
"""

from __future__ import annotations

import importlib
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hgpo.extras import exit_on_missing_extras, require_extras
from hgpo.options import ArgumentParser, bad, check_choice, check_int, check_writable_dir

TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
SPLITS = ("train", "valid_seen", "valid_unseen")
OOD_FLOORPLANS = (10, 20, 219, 226, 308, 318, 414, 424)
"""Floorplans kept out of training (the real valid_unseen uses 10, 219, 308 and 424)."""
OPENABLE = {"Fridge", "Cabinet", "Microwave", "Drawer", "Safe", "Box"}
LAMPS = ("DeskLamp", "FloorLamp")
_SPLIT_SALT = {"train": 0, "valid_seen": 1_000_003, "valid_unseen": 2_000_003}


def alfworld_data_dir() -> Path:
    """Folder of the installed ``alfworld`` package (a :class:`~hgpo.extras.MissingExtraError`,
    an ImportError naming ``pip install -e ".[alfworld]"``, if it is missing)."""
    return Path(_alfworld("").__file__).parent


def _alfworld(name: str) -> Any:
    """Module ``alfworld.<name>`` (``alfworld`` for ``""``), or the [alfworld] extra's error."""
    require_extras("the ALFWorld game generator (agentenvs.alfworld.generator)", "alfworld")
    return importlib.import_module(f"alfworld.{name}" if name else "alfworld")


def _mangle(name: str) -> str:
    for a, b in (
        ("|", "_bar_"),
        ("-", "_minus_"),
        ("+", "_plus_"),
        (".", "_dot_"),
        (",", "_comma_"),
    ):
        name = name.replace(a, b)
    return name


@dataclass
class GameSpec:
    """Everything the generator decided for one game (kept for the scripted expert)."""

    task_type: str
    floorplan: int
    goal: str
    obj: str
    recep: str
    lamp: str
    receptacles: dict[str, str] = field(default_factory=dict)
    """receptacle id -> location id"""
    contents: dict[str, str] = field(default_factory=dict)
    """object id -> receptacle id"""

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


class _Floorplans:
    def __init__(self) -> None:
        c = _alfworld("gen.constants")
        root = alfworld_data_dir()
        self.domain = (root / "data" / "alfred.pddl").read_text()
        self.grammar = (root / "data" / "alfred.twl2").read_text()
        self.layouts = root / "gen" / "layouts"
        self.val = {k: set(v) for k, v in c.VAL_RECEPTACLE_OBJECTS.items()}
        movable = set(c.MOVABLE_RECEPTACLES)
        self.pickup = {o for v in self.val.values() for o in v if "Sliced" not in o} | movable
        self.pickup -= set(LAMPS)
        self.plans = sorted(
            int(p.name[len("FloorPlan") : -len("-openable.json")])
            for p in self.layouts.glob("FloorPlan*-openable.json")
        )

    def load(self, fp: int) -> tuple[dict[str, list[float]], list[str]]:
        recs = json.loads((self.layouts / f"FloorPlan{fp}-openable.json").read_text())
        objs = json.loads((self.layouts / f"FloorPlan{fp}-objects.json").read_text())
        return recs, objs


_FP: _Floorplans | None = None


def _fp() -> _Floorplans:
    global _FP
    if _FP is None:
        _FP = _Floorplans()
    return _FP


def floorplans(split: str) -> list[int]:
    """Floorplans a split draws from (train and valid_seen share; valid_unseen is disjoint)."""
    check_choice("split", split, SPLITS)
    plans = _fp().plans
    if split == "valid_unseen":
        return [p for p in plans if p in OOD_FLOORPLANS]
    return [p for p in plans if p not in OOD_FLOORPLANS]


def _rtype(rid: str) -> str:
    parts = rid.split("|")
    return parts[-1] if parts[-1].endswith("Basin") else parts[0]


def _loc(v: list[float]) -> str:
    x, z, rot, hor = v
    return f"loc|{round(x / 0.25)}|{round(z / 0.25)}|{int(rot) // 90}|{int(hor)}"


def _coord(rng: random.Random) -> str:
    return "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))


def _try_game(rng: random.Random, fp: int, task_type: str) -> GameSpec | None:
    F = _fp()
    recs, objs = F.load(fp)
    receptacles = {rid: _loc(v) for rid, v in recs.items() if _rtype(rid) in F.val}
    if not receptacles:
        return None
    rtypes = sorted({_rtype(r) for r in receptacles})
    present = sorted({o for o in objs if o in F.pickup})
    lamps = [lamp for lamp in LAMPS if lamp in objs]
    holders = {t: [r for r in receptacles if t in F.val[_rtype(r)]] for t in present}
    present = [t for t in present if holders[t]]

    def need(rt: str) -> bool:
        return rt in rtypes

    cands = []
    for t in present:
        for R in rtypes:
            if t not in F.val[R]:
                continue
            if task_type == "pick_clean_then_place_in_recep" and not (
                need("SinkBasin") and t in F.val["SinkBasin"] and R != "SinkBasin"
            ):
                continue
            if task_type == "pick_heat_then_place_in_recep" and not (
                need("Microwave") and t in F.val["Microwave"] and R != "Microwave"
            ):
                continue
            if task_type == "pick_cool_then_place_in_recep" and not (
                need("Fridge") and t in F.val["Fridge"] and R != "Fridge"
            ):
                continue
            if len([h for h in holders[t] if _rtype(h) != R]) == 0:
                continue
            cands.append((t, R))
    if task_type == "look_at_obj_in_light":
        if not lamps:
            return None
        cands = sorted({(t, "") for t, _ in cands} | {(t, "") for t in present})
    if not cands:
        return None
    obj, recep = rng.choice(cands)
    lamp = rng.choice(lamps) if task_type == "look_at_obj_in_light" else ""
    contents: dict[str, str] = {}
    used: set[str] = set()
    for t in present:
        allowed = [h for h in holders[t] if _rtype(h) != recep] if t == obj else holders[t]
        if not allowed:
            continue
        n = (
            rng.randint(2, 3)
            if t == obj and task_type == "pick_two_obj_and_place"
            else (rng.randint(1, 2) if t == obj else rng.randint(0, 2))
        )
        for _ in range(n):
            oid = f"{t}|{_coord(rng)}"
            while oid in used:
                oid = f"{t}|{_coord(rng)}"
            used.add(oid)
            contents[oid] = rng.choice(allowed)
    if lamp:
        open_free = [r for r in receptacles if _rtype(r) not in OPENABLE]
        if not open_free:
            return None
        contents[f"{lamp}|{_coord(rng)}"] = rng.choice(open_free)
    # goal must not hold at the start: no target-type object may sit in a target receptacle
    if recep and any(o.split("|")[0] == obj and _rtype(r) == recep for o, r in contents.items()):
        return None
    glib = _alfworld("gen.goal_library")

    template = rng.choice(glib.gdict[task_type]["templates"])
    goal = template.format(obj=obj.lower(), recep=recep.lower(), toggle=lamp.lower(), mrecep="")
    return GameSpec(task_type, fp, goal, obj, recep, lamp, receptacles, contents)


def pddl_problem(spec: GameSpec, name: str = "generated") -> str:
    """The PDDL problem text of a game (objects, init facts, the goal library's goal)."""
    glib = _alfworld("gen.goal_library")

    F = _fp()
    otypes = sorted({o.split("|")[0] for o in spec.contents})
    rtypes = sorted({_rtype(r) for r in spec.receptacles})
    locs = sorted(set(spec.receptacles.values()))
    start = "loc|0|0|0|30"
    while start in locs:
        start = start.replace("|30", "|31") if start.endswith("|30") else start + "0"
    objects = ["agent1 - agent"]
    objects += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    objects += [f"{_mangle(o)} - object" for o in sorted(spec.contents)]
    objects += [f"{_mangle(r)} - receptacle" for r in sorted(spec.receptacles)]
    objects += [f"{_mangle(loc)} - location" for loc in [*locs, start]]
    init = [f"(atLocation agent1 {_mangle(start)})"]
    for r, loc in sorted(spec.receptacles.items()):
        rt = _rtype(r)
        init += [
            f"(receptacleType {_mangle(r)} {rt}Type)",
            f"(receptacleAtLocation {_mangle(r)} {_mangle(loc)})",
        ]
        if rt in OPENABLE:
            init.append(f"(openable {_mangle(r)})")
    for o, r in sorted(spec.contents.items()):
        t = o.split("|")[0]
        mo = _mangle(o)
        init += [
            f"(objectType {mo} {t}Type)",
            f"(inReceptacle {mo} {_mangle(r)})",
            f"(objectAtLocation {mo} {_mangle(spec.receptacles[r])})",
        ]
        if t in LAMPS:
            init.append(f"(toggleable {mo})")
            continue
        init.append(f"(pickupable {mo})")
        for prop, rt in (
            ("cleanable", "SinkBasin"),
            ("heatable", "Microwave"),
            ("coolable", "Fridge"),
        ):
            if t in F.val[rt]:
                init.append(f"({prop} {mo})")
    for rt in rtypes:
        for ot in otypes:
            if ot in F.val[rt]:
                init.append(f"(canContain {rt}Type {ot}Type)")
    goal = (
        glib.gdict[spec.task_type]["pddl"]
        .format(obj=spec.obj, recep=spec.recep, toggle=spec.lamp, mrecep="")
        .replace("#", "-")
    )
    return (
        f"(define (problem {name})\n(:domain alfred)\n(:objects\n  "
        + "\n  ".join(objects)
        + "\n)\n(:init\n  "
        + "\n  ".join(init)
        + "\n)\n"
        + goal
    )


def generate_game(seed: int, split: str = "train", task_type: str | None = None) -> GameSpec:
    """Draw one game of ``split`` from ``seed`` (task type uniform unless given)."""
    if task_type is not None:
        check_choice("task_type", task_type, TASK_TYPES)
    rng = random.Random(seed * 7_919 + _SPLIT_SALT[split] if split in SPLITS else seed)
    plans = floorplans(split)
    tt = task_type or TASK_TYPES[seed % len(TASK_TYPES)]
    for _ in range(500):
        spec = _try_game(rng, rng.choice(plans), tt)
        if spec is not None:
            return spec
    raise ValueError(f"could not generate task_type={tt!r} in split={split!r}")


def write_game(spec: GameSpec, folder: str | os.PathLike[str], name: str = "generated") -> Path:
    """Write ``game.tw-pddl`` and ``traj_data.json`` of ``spec`` into ``folder``."""
    F = _fp()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    game = {
        "pddl_domain": F.domain,
        "grammar": F.grammar.replace("UNKNOWN GOAL", spec.goal),
        "pddl_problem": pddl_problem(spec, name),
        "solvable": True,
    }
    (out / "game.tw-pddl").write_text(json.dumps(game))
    traj = {
        "task_type": spec.task_type,
        "scene": {"floor_plan": f"FloorPlan{spec.floorplan}"},
        "pddl_params": {
            "object_target": spec.obj,
            "parent_target": spec.recep,
            "toggle_target": spec.lamp,
            "mrecep_target": "",
            "object_sliced": False,
        },
        "turk_annotations": {"anns": [{"task_desc": spec.goal}]},
        "generator": spec.to_json(),
    }
    (out / "traj_data.json").write_text(json.dumps(traj))
    return out / "game.tw-pddl"


def generate_split(
    root: str | os.PathLike[str],
    split: str,
    n_games: int,
    seed: int = 0,
    task_type: str | None = None,
) -> list[Path]:
    """Write ``n_games`` games of ``split`` under ``root/split`` and return their game files.

    ``task_type``: every game of this type (default: the types in turn, as ``generate_game``).
    ``root/split`` is made even for 0 games: the trainer's ``alfworld_games_dir`` needs all three
    split folders.
    """
    n_games = check_int("n_games", n_games, lo=0)
    check_choice("split", split, SPLITS)
    (Path(root) / split).mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_games):
        spec = generate_game(seed * 1_000_000 + i, split, task_type)
        folder = (
            Path(root)
            / split
            / f"{spec.task_type}-{spec.obj}-None-{spec.recep or spec.lamp}-{spec.floorplan}"
            / f"trial_{seed}_{i:06d}"
        )
        paths.append(write_game(spec, folder, name=f"{split}_{seed}_{i}"))
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m agentenvs.alfworld.generator --out DIR``: write a games folder in the official
    layout (``DIR/train``, ``DIR/valid_seen``, ``DIR/valid_unseen``) for ``alfworld_games_dir``.

    Prints a JSON summary: games per split and how many held-out games repeat a training game's
    (task type, object, target, floorplan) (their layouts and object placements still differ).
    """
    ap = ArgumentParser(prog="python -m agentenvs.alfworld.generator", description=main.__doc__)
    ap.add_argument("--out", required=True, help="folder to write (must not hold games yet)")
    ap.add_argument(
        "--task-type", default=None, choices=TASK_TYPES, help="default: all types in turn"
    )
    ap.add_argument("--seed", type=int, default=0)
    for split in SPLITS:
        ap.add_argument(f"--{split.replace('_', '-')}", type=int, default=0, metavar="N")
    args = ap.parse_args(argv)
    root = Path(args.out)
    if any(root.glob("*/**/game.tw-pddl")):
        raise SystemExit(f"--out: {str(root)!r} already holds games; choose an empty folder")
    counts = {split: getattr(args, split) for split in SPLITS}
    for split, n in counts.items():
        if n < 0:
            raise SystemExit(str(bad(f"--{split.replace('_', '-')}", "an integer >= 0", n)))
    if any(counts.values()):  # games are drawn from the alfworld package's floorplans
        exit_on_missing_extras("python -m agentenvs.alfworld.generator", "alfworld")
    try:  # a folder that cannot be written fails here, before any game is drawn
        check_writable_dir("--out", str(root), "--out")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    keys: dict[str, set[tuple[str, str, str, int]]] = {}
    for split, n in counts.items():
        keys[split] = set()
        for path in generate_split(root, split, n, args.seed, args.task_type):
            g = json.loads((path.parent / "traj_data.json").read_text())["generator"]
            keys[split].add((g["task_type"], g["obj"], g["recep"] or g["lamp"], g["floorplan"]))
    summary = {
        "out": str(root),
        "task_type": args.task_type,
        "seed": args.seed,
        "games": counts,
        "goal_and_floorplan_also_in_train": {
            s: len(keys[s] & keys["train"]) for s in SPLITS if s != "train"
        },
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The environment families, and the registry ``make(name, **params)``.

Each constructor returns a frozen :class:`toyenvs.POMDP`. Its docstring states what the family
is for (which aliasing it creates) and its exact optimum. "Optimum" means the best expected
discounted return (gamma) with the hidden state observed, ``env.optimal_values(gamma)``; it is
an upper bound for every context policy and is reached when the K-step context tells apart the
hidden states the optimal plan must treat differently (conditions given per family).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from hgpo.options import bad, check_int, check_number
from toyenvs.core import GOAL_REWARD, POMDP, add_slip, split_tasks

__all__ = ["FAMILIES", "household", "keydoor", "make", "random_pomdp", "shop", "tmaze"]


def _horizon(value: Any, default: int) -> int:
    return default if value is None else check_int("horizon", value, lo=1)


# --------------------------------------------------------------------------------------------
def keydoor(
    size: int = 6,
    slip: float = 0.0,
    horizon: int | None = None,
    seed: int = 0,
    heldout_frac: float = 0.25,
) -> POMDP:
    """Key-door grid: fetch a key, open a door, reach the goal; the cell does not show the key.

    Purpose: the observation is the cell only, not whether the key is carried, so every cell
    the agent crosses both before and after the pickup is aliased (as "You arrive at fridge 1"
    reads the same whatever the agent holds). Step-level grouping pools "before key" and
    "after key" steps of the same cell, whose values differ.

    Layout (size x size, rows r top to bottom, columns c): a wall fills column w = size // 2
    except the door at row d = size // 2; key at (size-1, 0) in the left room; goal at
    (0, size-1) in the right room. Hidden state = (cell, has_key); observation = cell.
    Actions: up, down, left, right, pickup. Invalid (-0.1, state unchanged): moving off the grid
    or into the wall, entering the door without the key, pickup away from the key or twice.
    Entering the goal pays +10 and ends the episode. With ``slip`` a move is replaced by a
    uniformly drawn move (pickup never slips). Tasks = every left-room start cell but the key's
    (``seed`` draws the held-out share ``heldout_frac`` of them).

    Optimum (slip = 0): from start (r, c) the shortest plan takes
    L = (size-1-r) + c + 1 + 2 (size-1) steps (walk to the key, pick it up, walk to the door,
    walk to the goal), return 10 gamma^(L-1), provided L <= horizon. A context policy reaches
    it when its K-step context tells "key carried" apart on the cells the plan revisits
    (K >= 1 at the key cell, where the last action was the pickup; a policy with K >= horizon
    always can).
    """
    size = check_int("size", size, lo=4, hi=64)
    slip = check_number("slip", slip, lo=0.0, hi=1.0)
    horizon = _horizon(horizon, 5 * size)
    seed = check_int("seed", seed, lo=0)
    heldout_frac = check_number("heldout_frac", heldout_frac, lo=0.0, hi=0.99)
    w, door = size // 2, size // 2
    key, goal = (size - 1, 0), (0, size - 1)
    cells = [(r, c) for r in range(size) for c in range(size) if c != w or r == door]
    cell_id = {rc: i for i, rc in enumerate(cells)}
    n_cells = len(cells)
    S = 2 * n_cells  # state = cell * 2 + has_key
    moves = [(-1, 0), (1, 0), (0, -1), (0, 1)]
    A = 5
    nxt = np.repeat(np.arange(S)[:, None], A, axis=1)
    invalid = np.zeros((S, A), dtype=bool)
    for (r, c), i in cell_id.items():
        for k in (0, 1):
            s = 2 * i + k
            for a, (dr, dc) in enumerate(moves):
                tgt = (r + dr, c + dc)
                if tgt not in cell_id or (tgt == (door, w) and not k):
                    invalid[s, a] = True
                else:
                    nxt[s, a] = 2 * cell_id[tgt] + k
            if (r, c) == key and not k:
                nxt[s, 4] = s + 1
            else:
                invalid[s, 4] = True
    terminal = np.zeros(S, dtype=bool)
    reward = np.zeros(S)
    g = cell_id[goal]
    terminal[2 * g : 2 * g + 2] = True
    reward[2 * g : 2 * g + 2] = GOAL_REWARD
    next_state, next_prob = add_slip(nxt, invalid, slip, [0, 1, 2, 3])
    tasks = np.array(
        [2 * cell_id[(r, c)] for r in range(size) for c in range(w) if (r, c) != key],
        dtype=np.int64,
    )
    train, held = split_tasks(tasks, heldout_frac, seed)
    return POMDP(
        name="keydoor", obs_of_state=np.repeat(np.arange(n_cells), 2), next_state=next_state,
        next_prob=next_prob, invalid=invalid, reward_enter=reward, terminal=terminal,
        horizon=horizon, tasks=tasks, train_tasks=train, heldout_tasks=held,
        action_names=("up", "down", "left", "right", "pickup"),
        state_names=tuple(f"cell{rc} key={k}" for rc in cells for k in (0, 1)),
        obs_names=tuple(f"cell{rc}" for rc in cells),
        params=dict(size=size, slip=slip, horizon=horizon, seed=seed, heldout_frac=heldout_frac),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
def tmaze(length: int = 4, slip: float = 0.0, horizon: int | None = None) -> POMDP:
    """Memory corridor (T-maze): a cue at the start decides the turn at the far junction.

    Purpose: the corridor cells all read the same, so the cue is only in the context while
    K reaches back to it; ``length`` against K sets how much history helps.

    Cells 0 (cue: observation "cue-up" or "cue-down"), 1..length (observation "corridor"),
    length+1 (observation "junction"). Hidden state = (cell, cue). Actions: forward, back, up,
    down. Invalid (-0.1, stay): back at the cue cell, forward at the junction, up/down away from
    the junction. At the junction, the turn matching the cue pays +10, the other pays 0; both
    end the episode. ``slip`` replaces forward/back by a uniformly drawn one of the two.
    Tasks = the two cues (no held-out tasks). Default horizon 3 * (length + 2).

    Optimum (slip = 0): length + 1 forward moves and the right turn, L = length + 2 steps,
    return 10 gamma^(length+1). A K-step context policy reaches it iff K >= length + 1 (the cue
    is still in the context at the junction); with a shorter K it must guess (success 1/2) or
    carry the cue in invalid actions, at a cost.
    """
    length = check_int("length", length, lo=0, hi=1000)
    slip = check_number("slip", slip, lo=0.0, hi=1.0)
    horizon = _horizon(horizon, 3 * (length + 2))
    n_cells = length + 2
    S = 2 * n_cells + 2
    goal, fail = S - 2, S - 1
    A = 4
    nxt = np.repeat(np.arange(S)[:, None], A, axis=1)
    invalid = np.zeros((S, A), dtype=bool)
    obs = np.zeros(S, dtype=np.int64)
    for pos in range(n_cells):
        for cue in (0, 1):
            s = 2 * pos + cue
            obs[s] = cue if pos == 0 else (2 if pos <= length else 3)
            if pos < n_cells - 1:
                nxt[s, 0] = s + 2
            else:
                invalid[s, 0] = True
            if pos > 0:
                nxt[s, 1] = s - 2
            else:
                invalid[s, 1] = True
            if pos == n_cells - 1:
                nxt[s, 2] = goal if cue == 0 else fail
                nxt[s, 3] = goal if cue == 1 else fail
            else:
                invalid[s, 2:] = True
    obs[goal], obs[fail] = 4, 5
    terminal = np.zeros(S, dtype=bool)
    terminal[[goal, fail]] = True
    reward = np.zeros(S)
    reward[goal] = GOAL_REWARD
    next_state, next_prob = add_slip(nxt, invalid, slip, [0, 1])
    names = [f"cell{p} cue={'up' if c == 0 else 'down'}" for p in range(n_cells) for c in (0, 1)]
    return POMDP(
        name="tmaze", obs_of_state=obs, next_state=next_state, next_prob=next_prob,
        invalid=invalid, reward_enter=reward, terminal=terminal, horizon=horizon,
        tasks=np.array([0, 1]), train_tasks=np.array([0, 1]),
        heldout_tasks=np.zeros(0, dtype=np.int64),
        action_names=("forward", "back", "up", "down"),
        state_names=(*names, "goal", "fail"),
        obs_names=("cue-up", "cue-down", "corridor", "junction", "goal", "fail"),
        params=dict(length=length, slip=slip, horizon=horizon),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
_PROCESSORS = ("microwave", "fridge", "sinkbasin")
_ORDINARY = ("countertop", "cabinet", "shelf", "drawer", "table", "desk", "sofa", "bed")
TASK_TYPES = ("pick", "heat", "cool", "clean")


def household_graph(n_rooms: int, receptacles_per_room: int, seed: int) -> nx.Graph:
    """Rooms on a path, each with its receptacles; node attribute ``kind`` ("room" or a kind)."""
    rng = np.random.default_rng(seed)
    n_rec = n_rooms * receptacles_per_room
    kinds = list(_PROCESSORS) + [_ORDINARY[i % len(_ORDINARY)] for i in range(n_rec - 3)]
    kinds = [kinds[i] for i in rng.permutation(n_rec)]
    G = nx.Graph()
    for r in range(n_rooms):
        G.add_node(f"room{r}", kind="room")
        if r:
            G.add_edge(f"room{r - 1}", f"room{r}")
    count: dict[str, int] = {}
    for i, kind in enumerate(kinds):
        count[kind] = count.get(kind, 0) + 1
        name = f"{kind}{count[kind]}"
        G.add_node(name, kind=kind)
        G.add_edge(f"room{i // receptacles_per_room}", name)
    return G


def household(
    n_rooms: int = 2,
    receptacles_per_room: int = 3,
    n_tasks: int = 8,
    slip: float = 0.0,
    horizon: int = 30,
    seed: int = 0,
    heldout_frac: float = 0.25,
) -> POMDP:
    """Household graph (ALFWorld-like): pick / heat / cool / clean an object, then place it.

    Purpose: the observation at a location says which task is set (the instruction is always in
    the prompt), where the agent is and whether the object lies there, but not whether the
    agent holds it nor whether it is already heated / cooled / cleaned: "arrive at fridge 1"
    reads the same before and after cooling.

    World: a networkx graph (:func:`household_graph`): rooms on a path, each linked to
    ``receptacles_per_room`` receptacles, among them one microwave, one fridge, one sinkbasin.
    A task (``seed`` draws ``n_tasks`` distinct ones) = (type in pick/heat/cool/clean, the
    ordinary receptacle where the object lies, a different ordinary target receptacle).
    Hidden state = (task, location, object place or "in hand", processed flag). The agent
    starts in room0. Actions: "go to X" for every location X (valid along a graph edge), take
    (object here, hand empty), put (holding, at a receptacle), heat / cool / clean (holding, at
    microwave / fridge / sinkbasin; they set the flag only for the matching task type). Putting
    the object in the target when it is processed (or for a pick task) pays +10 and ends the
    episode; elsewhere the object is simply put down there. ``slip`` makes a "go to" move
    replaced by a random "go to" (invalid ones leave the agent in place, unpenalised).

    Optimum (slip = 0): L = dist(room0, object) + 1 + [dist(object, processor) + 1] +
    dist(processor or object, target) + 1 steps (the bracket for heat/cool/clean), return
    10 gamma^(L-1) if L <= horizon. Reaching it needs a context that still shows the take and
    the processing step when the plan revisits a location (K of a few steps).
    """
    n_rooms = check_int("n_rooms", n_rooms, lo=1, hi=16)
    rpr = check_int("receptacles_per_room", receptacles_per_room, lo=1, hi=16)
    if n_rooms * rpr < 5:
        raise bad(
            "n_rooms * receptacles_per_room", ">= 5 (3 processors + 2 ordinary)",
            f"{n_rooms} * {rpr}",
        )  # fmt: skip
    n_tasks = check_int("n_tasks", n_tasks, lo=1)
    slip = check_number("slip", slip, lo=0.0, hi=1.0)
    horizon = check_int("horizon", horizon, lo=1)
    seed = check_int("seed", seed, lo=0)
    heldout_frac = check_number("heldout_frac", heldout_frac, lo=0.0, hi=0.99)
    h = _house(n_rooms, rpr, n_tasks, seed)
    nxt, invalid, obs, names = _house_moves(h)
    goal = nxt.shape[0] - 1
    terminal = np.zeros(goal + 1, dtype=bool)
    terminal[goal] = True
    reward = np.zeros(goal + 1)
    reward[goal] = GOAL_REWARD
    next_state, next_prob = add_slip(nxt, invalid, slip, list(range(h.L)))
    start = h.loc_id["room0"]
    tasks = np.array([h.sid(k, start, h.rec_id[o], 0) for k, (_, o, _) in enumerate(h.tasks)])
    train, held = split_tasks(tasks, heldout_frac, seed)
    locs = h.locs
    return POMDP(
        name="household", obs_of_state=obs, next_state=next_state, next_prob=next_prob,
        invalid=invalid, reward_enter=reward, terminal=terminal, horizon=horizon, tasks=tasks,
        train_tasks=train, heldout_tasks=held,
        action_names=(*(f"go to {x}" for x in locs), "take", "put", "heat", "cool", "clean"),
        state_names=(*names, "goal"),
        params=dict(n_rooms=n_rooms, receptacles_per_room=rpr, n_tasks=n_tasks, slip=slip,
                    horizon=horizon, seed=seed, heldout_frac=heldout_frac,
                    graph=h.G, locations=tuple(locs),
                    task_list=tuple((TASK_TYPES[ty], locs[o], locs[t]) for ty, o, t in h.tasks)),
    )  # fmt: skip


@dataclass(frozen=True)
class _House:
    """A household's layout: its graph's locations (rooms and receptacles, by index), the
    receptacles' indices, each processor's location and the drawn tasks (type, location of the
    object's receptacle, location of the target). Hidden state = (task, location, object's
    receptacle index or R = in hand, processed flag): :meth:`sid`; the goal is the last state."""

    G: nx.Graph
    locs: list[str]
    loc_id: dict[str, int]
    rec_id: dict[int, int]  # location -> receptacle index
    recs: list[int]  # receptacle index -> location
    proc_loc: dict[int, int]  # task type (1 heat, 2 cool, 3 clean) -> its processor's location
    tasks: list[tuple[int, int, int]]

    @property
    def L(self) -> int:
        return len(self.locs)

    @property
    def R(self) -> int:
        return len(self.recs)

    def sid(self, task: int, loc: int, obj: int, proc: int) -> int:
        return ((task * self.L + loc) * (self.R + 1) + obj) * 2 + proc


def _house(n_rooms: int, rpr: int, n_tasks: int, seed: int) -> _House:
    """The layout of :func:`household_graph` and ``n_tasks`` distinct tasks drawn from
    ``seed`` (a named error when the layout has fewer)."""
    G = household_graph(n_rooms, rpr, seed)
    locs = list(G.nodes)
    kind = [G.nodes[x]["kind"] for x in locs]
    recs = [i for i in range(len(locs)) if kind[i] != "room"]
    ordinary = [i for i in recs if kind[i] in _ORDINARY]
    all_tasks = [(ty, o, t) for ty in range(4) for o in ordinary for t in ordinary if o != t]
    if n_tasks > len(all_tasks):
        raise bad("n_tasks", f"an integer in 1..{len(all_tasks)} for this layout", n_tasks)
    rng = np.random.default_rng(seed)
    chosen = [all_tasks[i] for i in np.sort(rng.choice(len(all_tasks), n_tasks, replace=False))]
    return _House(
        G=G, locs=locs, loc_id={x: i for i, x in enumerate(locs)},
        rec_id={loc: j for j, loc in enumerate(recs)}, recs=recs,
        proc_loc={1: kind.index("microwave"), 2: kind.index("fridge"), 3: kind.index("sinkbasin")},
        tasks=chosen,
    )  # fmt: skip


def _house_moves(h: _House) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """(next state int64[S, A], invalid bool[S, A], observation int64[S], state names but the
    goal's) of every hidden state; actions: go to each location, then take, put, heat, cool,
    clean. An invalid action leaves the state unchanged."""
    L, R = h.L, h.R
    S = len(h.tasks) * L * (R + 1) * 2 + 1
    goal = S - 1
    take, put = L, L + 1
    processing = ((1, L + 2), (2, L + 3), (3, L + 4))  # (task type, its action)
    nxt = np.repeat(np.arange(S)[:, None], L + 5, axis=1)
    invalid = np.ones((S, L + 5), dtype=bool)
    obs = np.zeros(S, dtype=np.int64)
    adj = [[h.loc_id[y] for y in h.G.neighbors(x)] for x in h.locs]
    names = []
    for task, (ty, _, target) in enumerate(h.tasks):
        for loc in range(L):
            for obj in range(R + 1):
                for proc in (0, 1):
                    s = h.sid(task, loc, obj, proc)
                    here = loc in h.rec_id and obj == h.rec_id[loc]
                    obs[s] = (task * L + loc) * 2 + int(here)
                    names.append(
                        f"task{task} at {h.locs[loc]} obj="
                        f"{'hand' if obj == R else h.locs[h.recs[obj]]} processed={proc}"
                    )
                    for j in adj[loc]:
                        invalid[s, j] = False
                        nxt[s, j] = h.sid(task, j, obj, proc)
                    if here:
                        invalid[s, take] = False
                        nxt[s, take] = h.sid(task, loc, R, proc)
                    if obj == R and loc in h.rec_id:
                        invalid[s, put] = False
                        if loc == target and (ty == 0 or proc):
                            nxt[s, put] = goal
                        else:
                            nxt[s, put] = h.sid(task, loc, h.rec_id[loc], proc)
                    for t_ty, act in processing:
                        if obj == R and loc == h.proc_loc[t_ty]:
                            invalid[s, act] = False
                            nxt[s, act] = h.sid(task, loc, obj, 1 if ty == t_ty else proc)
    obs[goal] = len(h.tasks) * L * 2
    return nxt, invalid, obs, names


# --------------------------------------------------------------------------------------------
def shop(
    n_items: int = 6,
    items_per_page: int = 2,
    n_options: int = 2,
    n_tasks: int = 6,
    horizon: int = 15,
    seed: int = 0,
    heldout_frac: float = 0.25,
) -> POMDP:
    """Shop tree (WebShop-like): search -> results pages -> item -> option -> buy.

    Purpose: an item page reads the same before and after an option is selected (repeated page
    views), and the results pages are revisited after backing out of a wrong item.

    A task (``seed`` draws ``n_tasks``) = a target (item, option) and the order in which the
    search ranks the ``n_items`` items (``items_per_page`` per results page). The observation
    is (task, page): the search page, results page p, or item page i; the selected option is
    hidden. Actions: search (search page -> results 0), next / prev (results pages), back (item
    -> its results page, results -> search), click j (j-th item of the page), select o (on an
    item page), buy (on an item page). Buying the target item with the target option selected
    pays +10; any other buy pays 0; both end the episode. Invalid (-0.1, stay): an action the
    page does not offer. Tasks start on the search page.

    Optimum: with the target on results page p, L = p + 4 steps (search, p x next, click,
    select, buy), return 10 gamma^(p+3) if L <= horizon. Reached by a context policy with
    K >= 1 (the last action tells whether the option was just selected); K = 0 cannot tell.
    """
    n_items = check_int("n_items", n_items, lo=1, hi=256)
    ipp = check_int("items_per_page", items_per_page, lo=1, hi=n_items)
    n_opt = check_int("n_options", n_options, lo=1, hi=16)
    n_tasks = check_int("n_tasks", n_tasks, lo=1, hi=10_000)
    horizon = check_int("horizon", horizon, lo=1)
    seed = check_int("seed", seed, lo=0)
    heldout_frac = check_number("heldout_frac", heldout_frac, lo=0.0, hi=0.99)
    rng = np.random.default_rng(seed)
    sh = _Shop(n_items, ipp, n_opt, n_tasks)
    S, A = sh.success + 2, sh.buy + 1
    nxt = np.repeat(np.arange(S)[:, None], A, axis=1)
    invalid = np.ones((S, A), dtype=bool)
    obs = np.zeros(S, dtype=np.int64)
    targets = []
    names: list[str] = []
    for task in range(n_tasks):
        perm = rng.permutation(n_items)
        target = int(rng.integers(n_items)), int(rng.integers(n_opt))
        targets.append(target)
        names += _shop_pages(sh, task, perm, nxt, invalid, obs)
        names += _shop_items(sh, task, perm, target, nxt, invalid, obs)
    obs[sh.success], obs[sh.success + 1] = n_tasks * sh.obs_per_task, n_tasks * sh.obs_per_task + 1
    terminal = np.zeros(S, dtype=bool)
    terminal[[sh.success, sh.success + 1]] = True
    reward = np.zeros(S)
    reward[sh.success] = GOAL_REWARD
    tasks = np.arange(n_tasks, dtype=np.int64) * sh.per_task
    train, held = split_tasks(tasks, heldout_frac, seed)
    return POMDP(
        name="shop", obs_of_state=obs, next_state=nxt, next_prob=np.ones((S, A, 1)),
        invalid=invalid, reward_enter=reward, terminal=terminal, horizon=horizon, tasks=tasks,
        train_tasks=train, heldout_tasks=held,
        action_names=("search", "next", "prev", "back", *(f"click{j}" for j in range(ipp)),
                      *(f"select{o}" for o in range(n_opt)), "buy"),
        state_names=(*names, "success", "fail"),
        params=dict(n_items=n_items, items_per_page=ipp, n_options=n_opt, n_tasks=n_tasks,
                    horizon=horizon, seed=seed, heldout_frac=heldout_frac,
                    targets=tuple(targets)),
    )  # fmt: skip


_SEARCH, _NEXT, _PREV, _BACK = range(4)  # the shop's first actions; then click j, select o, buy


@dataclass(frozen=True)
class _Shop:
    """A shop's sizes and numbering. Task k's states start at k * per_task: its search page,
    its results pages, then each item page once per selected option (-1: none); the last two
    states are success and fail. Actions: search, next, prev, back, click j (j < ipp),
    select o (o < n_opt), buy."""

    n_items: int
    ipp: int
    n_opt: int
    n_tasks: int

    @property
    def n_pages(self) -> int:
        return -(-self.n_items // self.ipp)

    @property
    def per_task(self) -> int:
        return 1 + self.n_pages + self.n_items * (self.n_opt + 1)

    @property
    def obs_per_task(self) -> int:
        return 1 + self.n_pages + self.n_items

    @property
    def success(self) -> int:
        return self.n_tasks * self.per_task

    @property
    def click0(self) -> int:
        return 4

    @property
    def select0(self) -> int:
        return 4 + self.ipp

    @property
    def buy(self) -> int:
        return self.select0 + self.n_opt

    def item_state(self, task: int, i: int, sel: int) -> int:
        return task * self.per_task + 1 + self.n_pages + i * (self.n_opt + 1) + sel + 1


def _shop_pages(sh: _Shop, task: int, perm: np.ndarray, nxt: np.ndarray, invalid: np.ndarray,
                obs: np.ndarray) -> list[str]:  # fmt: skip
    """Task ``task``'s search page and results pages (``perm``: the items in ranked order) into
    the tables; returns their names."""
    base = task * sh.per_task
    invalid[base, _SEARCH] = False
    nxt[base, _SEARCH] = base + 1
    obs[base] = task * sh.obs_per_task
    names = [f"task{task} search"]
    for p in range(sh.n_pages):
        s = base + 1 + p
        obs[s] = task * sh.obs_per_task + 1 + p
        names.append(f"task{task} results{p}")
        invalid[s, _BACK] = False
        nxt[s, _BACK] = base
        if p + 1 < sh.n_pages:
            invalid[s, _NEXT] = False
            nxt[s, _NEXT] = s + 1
        if p > 0:
            invalid[s, _PREV] = False
            nxt[s, _PREV] = s - 1
        for j in range(sh.ipp):
            if p * sh.ipp + j < sh.n_items:
                invalid[s, sh.click0 + j] = False
                nxt[s, sh.click0 + j] = sh.item_state(task, int(perm[p * sh.ipp + j]), -1)
    return names


def _shop_items(sh: _Shop, task: int, perm: np.ndarray, target: tuple[int, int],
                nxt: np.ndarray, invalid: np.ndarray, obs: np.ndarray) -> list[str]:  # fmt: skip
    """Task ``task``'s item pages (``target``: the item and option to buy) into the tables;
    returns their names."""
    page_of = np.empty(sh.n_items, dtype=np.int64)
    page_of[perm] = np.arange(sh.n_items) // sh.ipp
    names = []
    for i in range(sh.n_items):
        for sel in range(-1, sh.n_opt):
            s = sh.item_state(task, i, sel)
            obs[s] = task * sh.obs_per_task + 1 + sh.n_pages + i
            names.append(f"task{task} item{i} option={sel}")
            invalid[s, _BACK] = False
            nxt[s, _BACK] = task * sh.per_task + 1 + page_of[i]
            for o in range(sh.n_opt):
                invalid[s, sh.select0 + o] = False
                nxt[s, sh.select0 + o] = sh.item_state(task, i, o)
            invalid[s, sh.buy] = False
            nxt[s, sh.buy] = sh.success + int((i, sel) != target)  # success, else fail
    return names


# --------------------------------------------------------------------------------------------
def random_pomdp(
    n_states: int = 20,
    n_actions: int = 3,
    aliasing: float = 0.5,
    slip: float = 0.1,
    invalid_frac: float = 0.1,
    n_tasks: int = 4,
    horizon: int = 20,
    seed: int = 0,
    heldout_frac: float = 0.25,
) -> POMDP:
    """Random aliased POMDP: a seeded instance with dials for aliasing and stochasticity.

    Purpose: sweeps. ``aliasing`` is the share of non-goal states that share their observation
    with another state (pairs, plus one triple when the count is odd); ``slip`` is the
    probability that an action is replaced by a uniformly drawn one; ``invalid_frac`` the share
    of (state, action) pairs that are invalid.

    Construction: state n_states-1 is the goal (+10, terminal). A random chain through all
    other states, one action per link, guarantees the goal is reachable from every state; the
    other deterministic successors are uniform over all states. ``n_tasks`` distinct non-goal
    start states.

    Optimum: no closed form; ``env.optimal_values(gamma)`` (value iteration on the hidden
    state) is exact for the fully observed problem and an upper bound for context policies,
    reached when aliasing = 0 (every K).
    """
    n_states = check_int("n_states", n_states, lo=2, hi=100_000)
    n_actions = check_int("n_actions", n_actions, lo=1, hi=64)
    aliasing = check_number("aliasing", aliasing, lo=0.0, hi=1.0)
    slip = check_number("slip", slip, lo=0.0, hi=1.0)
    invalid_frac = check_number("invalid_frac", invalid_frac, lo=0.0, hi=1.0)
    n_tasks = check_int("n_tasks", n_tasks, lo=1, hi=n_states - 1)
    horizon = check_int("horizon", horizon, lo=1)
    seed = check_int("seed", seed, lo=0)
    heldout_frac = check_number("heldout_frac", heldout_frac, lo=0.0, hi=0.99)
    rng = np.random.default_rng(seed)
    S, A = n_states, n_actions
    goal = S - 1
    nxt = rng.integers(0, S, size=(S, A))
    invalid = rng.random((S, A)) < invalid_frac
    chain = rng.permutation(S - 1)
    link_action = rng.integers(0, A, size=S - 1)
    for i, s in enumerate(chain):
        nxt[s, link_action[i]] = chain[i + 1] if i + 1 < S - 1 else goal
        invalid[s, link_action[i]] = False
    n_alias = round(aliasing * (S - 1))
    if n_alias == 1:
        n_alias = 2 if S - 1 >= 2 else 0
    aliased = rng.permutation(S - 1)[:n_alias]
    obs = np.full(S, -1, dtype=np.int64)
    n_groups = n_alias // 2
    for k, s in enumerate(aliased):
        obs[s] = min(k // 2, n_groups - 1)
    rest = np.flatnonzero(obs < 0)
    obs[rest] = n_groups + np.arange(rest.size)
    terminal = np.zeros(S, dtype=bool)
    terminal[goal] = True
    reward = np.zeros(S)
    reward[goal] = GOAL_REWARD
    next_state, next_prob = add_slip(nxt, invalid, slip, list(range(A)))
    tasks = np.sort(rng.choice(S - 1, n_tasks, replace=False)).astype(np.int64)
    train, held = split_tasks(tasks, heldout_frac, seed)
    return POMDP(
        name="random", obs_of_state=obs, next_state=next_state, next_prob=next_prob,
        invalid=invalid, reward_enter=reward, terminal=terminal, horizon=horizon, tasks=tasks,
        train_tasks=train, heldout_tasks=held,
        action_names=tuple(f"a{a}" for a in range(A)),
        state_names=tuple(f"s{s}" for s in range(S)),
        params=dict(n_states=n_states, n_actions=n_actions, aliasing=aliasing, slip=slip,
                    invalid_frac=invalid_frac, n_tasks=n_tasks, horizon=horizon, seed=seed,
                    heldout_frac=heldout_frac),
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
FAMILIES: dict[str, Callable[..., POMDP]] = {
    "keydoor": keydoor,
    "tmaze": tmaze,
    "household": household,
    "shop": shop,
    "random": random_pomdp,
}


def make(name: str, **params: Any) -> POMDP:
    """Build a family instance by name: ``make("keydoor", size=6, slip=0.0, horizon=30)``.

    Raises:
        ValueError naming an unknown family (and the known ones), an unknown parameter (and
        the accepted ones), or a parameter whose value is out of range.
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known families: {sorted(FAMILIES)}")
    ctor = FAMILIES[name]
    accepted = list(inspect.signature(ctor).parameters)
    for key in params:
        if key not in accepted:
            raise ValueError(f"{name} has no parameter {key!r}; parameters: {accepted}")
    return ctor(**params)

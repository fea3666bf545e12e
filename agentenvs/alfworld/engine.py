"""TextWorld's PDDL engine with per-process caches of everything that is fixed per game.

Profile of one ALFWorld reset in the stock engine (``textworld.start`` + ``env.reset()``, about
1.7 s of CPU on this machine for a generated game):

- ``fast_downward.pddl2sas`` (PDDL -> SAS translation), run twice per ``PddlState`` (plain and
  optimised for replanning), and a ``PddlState`` is built at load *and* at every reset: four
  translations, about 0.29 s each;
- the grammar (``GameLogic``): tatsu parsing of the whole ``alfred.twl2`` grammar, about 0.33 s
  per load;
- text generation: ``ContextSensitiveGrammar.derive`` re-parses its start string with tatsu
  on every call, for the intro and once per admissible command at every reset and step
  (about 0.16 s per reset or step).

All three depend only on the game's text (domain, problem, grammar) or on the string being
parsed, so they are computed once per process and shared: every member of a rollout group, and
every later reset of the same game, reuses them. The translation and the parsed grammar are also
pickled to a disk cache (``$AGENTENVS_ALFWORLD_CACHE``, default
``~/.cache/agentenvs/alfworld/engine``; ``off`` disables it), keyed by a hash of their input
text and of the textworld / alfworld versions, so other workers and later runs load them in
about a millisecond instead of computing them again (about 1 s per game). The cache holds
pickles this code wrote: point it only at a folder you own.

Text generation is patched in the worker process (``_install_textgen_cache``): tatsu parses
are memoised (a deep copy is handed out), contexts are copied without deep-copying the game
state, and conditional queries are parsed once. The first reset after a load reuses the state
the load built. Only the mutable state is per environment: the fast-downward library copy
(its state lives in C globals), the ``PddlState`` facts and the entity names. What the engine
returns is unchanged: ``tests/agentenvs/test_alfworld_engine.py`` compares observations,
admissible commands and won flags with the stock engine step by step, over two episodes of
random admissible commands and an invalid one per game.

Snapshots (branching rollouts, :meth:`CachedPddlEnv.snapshot` / :meth:`CachedPddlEnv.restore`)
copy the engine's mutable state itself, not a replay of the commands:

- fast-downward's current state lives in C globals of the env's library copy (a state id in
  its state registry), which no other library copy can read. The snapshot keeps the value of
  every SAS variable, and a restore loads the game's SAS with its initial-state section
  replaced by them (``load_sas``: 0.3-2.3 ms on the generated games); the library then starts in
  the snapshot's state, with the same operators and ids. Derived variables (axioms) keep
  their default there: fast-downward evaluates the axioms of an initial state itself. The
  values are followed in Python at every step (:meth:`CachedPddlState.apply`, from the SAS
  operators' effects and their conditions) because the library's ``get_state`` costs time
  quadratic in the number of variables (7 ms on a 734-variable game, more than a step);
  a task whose effect conditions read derived variables is read from C instead;
- the ``PddlState`` facts, by value: those added and removed since the game's initial
  state (which the restoring process builds from the game's translation), and the variable
  bookkeeping that ``textworld.logic.State`` keeps beside them (its variable counts depend
  on the path taken, so they are copied as they are, not rebuilt from the facts), all as
  plain strings: Propositions and Variables store their hash, which differs between
  processes, so they are rebuilt on restore and never pickled;
- the last feedback and the move count. The admissible commands and the won flag are computed
  again from the restored state, as every step computes them.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import os
import pickle
import sys
import tempfile
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hgpo.extras import require_extras

try:
    import fast_downward
    import textworld
    from textworld.core import EnvInfos, GameState
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl import textgen
    from textworld.envs.pddl.pddl import PddlEnv
    from textworld.logic import Proposition, Variable
except ImportError:  # the [alfworld] extra is missing: say so, with the pip command
    require_extras("the ALFWorld engine (agentenvs.alfworld.engine)", "alfworld")
    raise

__all__ = ["CachedPddlEnv", "EngineSnapshot", "cache_info", "clear_caches", "start"]

_MAX_GAMES = 256  # games whose translation and grammar a process keeps (LRU)


class _LRU:
    """A small thread-safe LRU memo: ``get(key, make)`` returns the cached value or makes it."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                self.hits += 1
                return self._data[key]
        value = make()
        with self._lock:
            self.misses += 1
            self._data[key] = value
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0


_DISK_FORMAT = 1  # bump when what is pickled changes


def _disk_dir() -> Path | None:
    """The disk cache folder, or None when ``$AGENTENVS_ALFWORLD_CACHE`` is ``off``."""
    where = os.environ.get("AGENTENVS_ALFWORLD_CACHE", "")
    if where.lower() in ("off", "0", "none", "false"):
        return None
    if where:
        return Path(where)
    return Path.home() / ".cache" / "agentenvs" / "alfworld" / "engine"


@functools.cache
def _versions() -> str:
    from importlib.metadata import version

    return f"{_DISK_FORMAT}|textworld {version('textworld')}|alfworld {version('alfworld')}"


class _DiskStats:
    hits = 0
    writes = 0


def _on_disk(kind: str, parts: tuple[str, ...], make: Callable[[], Any]) -> Any:
    """``make()``, through a pickle on disk keyed by the hash of ``parts`` (see module doc)."""
    folder = _disk_dir()
    if folder is None:
        return make()
    h = hashlib.sha256(_versions().encode())
    for part in parts:
        h.update(b"\0" + part.encode())
    path = folder / f"{kind}-{h.hexdigest()}.pkl"
    try:
        with open(path, "rb") as f:
            value = pickle.load(f)
        _DiskStats.hits += 1
        return value
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        pass  # absent or unreadable: compute it
    value = make()
    tmp = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)  # atomic: concurrent workers never read a partial file
        _DiskStats.writes += 1
    except (OSError, pickle.PicklingError):  # no cache only costs the speed-up
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return value


_TRANSLATIONS = _LRU(_MAX_GAMES)  # (domain, problem) -> (task, sas, sas_replan)
_LOGICS = _LRU(_MAX_GAMES)  # (domain, grammar) -> GameLogic
_GAME_DATA = _LRU(_MAX_GAMES)  # game file path -> parsed JSON
_SAS_LAYOUTS = _LRU(_MAX_GAMES)  # SAS text -> _SasLayout
_PARSES = _LRU(50_000)  # textgen parse arguments -> converted symbols (copied on use)
_STOCK_TEXTGEN_PARSE = textgen._parse_and_convert


def _cached_textgen_parse(*args: Any, **kwargs: Any) -> Any:
    """``textgen._parse_and_convert`` memoised; callers get a deep copy (they set contexts)."""
    key = (args, tuple(sorted(kwargs.items())))
    return copy.deepcopy(_PARSES.get(key, lambda: _STOCK_TEXTGEN_PARSE(*args, **kwargs)))


def _copy_context(context: dict[str, Any]) -> dict[str, Any]:
    """``textgen.copy_context`` without deep copies: new ``variables`` / ``mapping`` dicts.

    The stock version deep-copies both dicts, whose values (entity infos, variables) text
    generation only reads; callers only add keys to the dicts (``query``), so fresh dicts keep
    contexts apart.
    """
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


def _clone_symbol(sym: Any) -> Any:
    """A copy of a grammar symbol tree that shares nothing mutable with it but the contexts."""
    new = copy.copy(sym)
    if isinstance(getattr(sym, "symbol", None), textgen.Symbol):
        new.symbol = _clone_symbol(sym.symbol)
    if isinstance(getattr(sym, "expression", None), textgen.Symbol):
        new.expression = _clone_symbol(sym.expression)
    return new


def _symbol_copy(self: Any, context: dict[str, Any]) -> Any:
    """``Symbol.copy``: the stock version deep-copies the symbol *with its context*, i.e. the
    whole game state, each time a conditional symbol derives; derivation sets every child's
    context before reading it, so cloning the symbol tree is enough."""
    out = _clone_symbol(self)
    out.context = _copy_context(context)
    return out


@functools.lru_cache(maxsize=4096)
def _conjunctive_query(expression: str) -> Any:
    return textworld.logic.Rule.parse_conjunctive_query(expression)


class _RuleParses:
    """Stands in for ``textworld.logic.Rule`` inside ``textgen``: its only use there is
    ``Rule.parse_conjunctive_query(text)``, memoised (the parsed rule is only read)."""

    parse_conjunctive_query = staticmethod(_conjunctive_query)


_PATCHED = False


def _install_textgen_cache() -> None:
    """Patch ``textworld.envs.pddl.textgen`` in this process (idempotent).

    ``derive()``, ``query()`` and ``ContextSensitiveGrammar.parse()`` look these module globals
    up at call time; ``Symbol.copy`` is a method. The output is unchanged, only the cost.
    """
    global _PATCHED
    if _PATCHED:
        return
    textgen._parse_and_convert = _cached_textgen_parse
    textgen.copy_context = _copy_context
    textgen.Symbol.copy = _symbol_copy
    textgen.Rule = _RuleParses
    _PATCHED = True


def cache_info() -> dict[str, tuple[int, int]]:
    """(hits, misses) of each in-memory cache of this process, and "disk": (loads, writes)."""
    out = {
        name: (c.hits, c.misses)
        for name, c in (
            ("translations", _TRANSLATIONS), ("logics", _LOGICS), ("game_data", _GAME_DATA),
            ("textgen_parses", _PARSES),
        )
    }  # fmt: skip
    out["disk"] = (_DiskStats.hits, _DiskStats.writes)
    return out


def clear_caches() -> None:
    """Empty every cache of this process (tests; memory)."""
    for c in (_TRANSLATIONS, _LOGICS, _GAME_DATA, _PARSES, _SAS_LAYOUTS):
        c.clear()
    _DiskStats.hits = _DiskStats.writes = 0


def _translate(domain: str, problem: str) -> tuple[Any, str, str]:
    """(task, sas, sas_replan) of a PDDL problem, as ``PddlState`` computes them."""

    def make() -> tuple[Any, str, str]:
        task, sas = fast_downward.pddl2sas(domain, problem, verbose=False)
        _, sas_replan = fast_downward.pddl2sas(domain, problem, verbose=False, optimize=True)
        return task, sas, sas_replan

    return _TRANSLATIONS.get(
        (domain, problem), lambda: _on_disk("translation", (domain, problem), make)
    )


def _logic(domain: str, grammar: str) -> pddl_logic.GameLogic:
    def make() -> pddl_logic.GameLogic:
        return pddl_logic.GameLogic(domain=domain, grammar=grammar)

    return _LOGICS.get((domain, grammar), lambda: _on_disk("logic", (domain, grammar), make))


Fact = tuple[str, tuple[tuple[str, str], ...]]
"""A Proposition as plain strings: (name, ((variable name, variable type), ...))."""


Effect = tuple[tuple[tuple[int, int], ...], int, int]
"""A SAS operator effect: (conditions as (variable, value) pairs, variable, new value)."""


@dataclass(frozen=True)
class _SasLayout:
    """What a snapshot needs of a SAS task: the text around its initial state, each
    variable's value names, which variables are derived (axioms), and each operator's
    effects (to follow the state in Python; None when an effect condition reads a derived
    variable, which only the C library evaluates)."""

    head: str  # everything before "begin_state"
    tail: str  # everything from "end_state" on
    values: tuple[dict[bytes, int], ...]  # per variable: value name (cp1252, as the C library
    # writes it) -> value index
    init: tuple[int, ...]  # the initial state section; a derived variable's is its default
    derived: frozenset[int]
    effects: tuple[tuple[Effect, ...], ...] | None  # per operator id (its order in the file)


def _parse_sas_layout(sas: str) -> _SasLayout:
    """Read fast-downward's SAS format (one item per line)::

    begin_variable / name / axiom layer (-1: not derived) / domain size / value names
    / end_variable ... begin_state / one value per variable / end_state ...
    begin_operator / name / n prevail / "var value" lines / n effects / effect lines
    "n_conditions [var value]... var pre post" / cost / end_operator ...
    """
    lines = sas.split("\n")
    values: list[dict[bytes, int]] = []
    derived: set[int] = set()
    i = 0
    while lines[i] != "begin_state":
        if lines[i] == "begin_variable":
            size = int(lines[i + 3])
            if int(lines[i + 2]) != -1:
                derived.add(len(values))
            values.append({lines[i + 4 + v].encode("cp1252"): v for v in range(size)})
            i += 4 + size
        else:
            i += 1
    end = lines.index("end_state", i)
    init = tuple(int(x) for x in lines[i + 1 : end])
    if len(init) != len(values):
        raise RuntimeError(f"SAS initial state has {len(init)} values for {len(values)} variables")
    effects: list[tuple[Effect, ...]] | None = []
    j = end
    while j < len(lines) and effects is not None:
        if lines[j] != "begin_operator":
            j += 1
            continue
        j += 3 + int(lines[j + 2])  # name, prevail count, prevail lines
        op: list[Effect] = []
        for line in lines[j + 1 : j + 1 + int(lines[j])]:
            nums = [int(x) for x in line.split()]
            pairs = nums[1 : 1 + 2 * nums[0]]
            conds = tuple(zip(pairs[0::2], pairs[1::2], strict=True))
            if any(v in derived for v, _ in conds):
                effects = None
                break
            op.append((conds, nums[-3], nums[-1]))
        if effects is not None:
            effects.append(tuple(op))
        j += 1 + int(lines[j])
    return _SasLayout(
        "\n".join(lines[:i]), "\n".join(lines[end:]), tuple(values), init, frozenset(derived),
        None if effects is None else tuple(effects),
    )  # fmt: skip


def _sas_layout(sas: str) -> _SasLayout:
    return _SAS_LAYOUTS.get(sas, lambda: _parse_sas_layout(sas))


@dataclass(frozen=True)
class EngineSnapshot:
    """The mutable state of one :class:`CachedPddlEnv` mid-episode, as plain values.

    values: the SAS initial-state section of the current state. facts_added, facts_removed:
    the PddlState's facts that are not / no longer in the game's initial facts (every
    restoring process builds those itself when it loads the game, identically: they come
    from the game's translation). var_counts, vars_by_name, vars_by_type:
    ``textworld.logic.State``'s
    variable bookkeeping (name -> count; name -> type; type -> names). feedback: the last
    observation. moves: the engine's move count. problem_hash: a hash of the game's PDDL
    problem (a restore into another game is refused).
    """

    problem_hash: str
    values: tuple[int, ...]
    facts_added: tuple[Fact, ...]
    facts_removed: tuple[Fact, ...]
    var_counts: tuple[tuple[str, int], ...]
    vars_by_name: tuple[tuple[str, str], ...]
    vars_by_type: tuple[tuple[str, tuple[str, ...]], ...]
    feedback: str
    moves: int


_i = sys.intern


def _var(v: Variable) -> tuple[str, str]:
    return (_i(v.name), _i(v.type))


def _fact(p: Proposition) -> Fact:
    return (_i(p.name), tuple(map(_var, p.arguments)))


def _proposition(f: Fact) -> Proposition:
    return Proposition(f[0], [Variable(n, t) for n, t in f[1]])


@functools.lru_cache(maxsize=64)
def _problem_hash(problem: str) -> str:
    return hashlib.sha256(problem.encode()).hexdigest()[:16]


class CachedPddlState(pddl_logic.PddlState):
    """``textworld``'s ``PddlState`` built from a cached PDDL -> SAS translation.

    Same body as ``PddlState.__init__`` (textworld 1.7) except that the two ``pddl2sas`` calls
    are looked up in the per-process cache. The translated task is only read.
    """

    def __init__(self, downward_lib: Any, pddl_problem: str, logic: pddl_logic.GameLogic) -> None:
        from collections import Counter, defaultdict

        self._facts = defaultdict(set)
        self._vars_by_name = {}
        self._vars_by_type = defaultdict(set)
        self._var_counts = Counter()
        self._logic = logic
        self.downward_lib = downward_lib
        self.pddl_problem = pddl_problem
        self.task, self.sas, self.sas_replan = _translate(logic.domain, pddl_problem)
        self._actions = {a.name: a for a in self.task.actions}
        for type_ in self.task.types:
            with contextlib.suppress(ValueError):  # already known
                self._logic.types.add(textworld.logic.Type(type_.name, type_.supertype_names))
        self.downward_lib.load_sas(self.sas.encode("utf-8"))
        self.downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
        self.name2type = {o.name: o.type_name for o in self.task.objects}

        def _atom2proposition(atom: Any) -> Proposition | None:
            if isinstance(atom, fast_downward.translate.pddl.conditions.Atom):
                if atom.predicate == "=":
                    return None
                args = [Variable(arg, self.name2type[arg]) for arg in atom.args]
                return Proposition(atom.predicate, args)
            if isinstance(atom, fast_downward.translate.pddl.f_expression.Assign):
                if atom.fluent.symbol == "total-cost":
                    return None
                name = f"{atom.expression.value}"
                if str.isdigit(name):  # distance relations are discarded
                    return None
                args = [Variable(arg, self.name2type[arg]) for arg in atom.fluent.args]
                return Proposition(name, args)
            return None

        self.add_facts([f for f in map(_atom2proposition, self.task.init) if f is not None])
        atoms = (pddl_logic.Atom * self.downward_lib.get_state_size())()
        self.downward_lib.get_state(atoms)
        facts = [atom.get_fact(self.name2type) for atom in atoms]
        self.add_facts([fact for fact in facts if not fact.is_negation])
        self._initial_facts = tuple(self.facts)  # what snapshots keep the difference to
        self._initial_set = frozenset(self._initial_facts)
        self._follow_init()

    def _follow_init(self) -> None:
        """Start following the library's state in Python from the SAS initial state."""
        layout = _sas_layout(self.sas)
        self._values = list(layout.init) if layout.effects is not None else None

    def apply(self, action: Any) -> Any:
        """``PddlState.apply``, and the same successor in the Python copy of the SAS state:
        every effect whose conditions hold in the state before fires (fast-downward's rule)."""
        op_id = self._operators[action.id].id
        changes = super().apply(action)
        if self._values is not None:
            before = tuple(self._values)
            effects = _sas_layout(self.sas).effects
            for conds, var, post in effects[op_id]:  # type: ignore[index]
                if all(before[v] == x for v, x in conds):
                    self._values[var] = post
        return changes

    def read_sas_values(self) -> tuple[int, ...]:
        """The library's state read from C (``get_state``, whose cost grows with the square of
        the number of variables: several ms on the larger games)."""
        layout = _sas_layout(self.sas)
        atoms = (pddl_logic.Atom * self.downward_lib.get_state_size())()
        self.downward_lib.get_state(atoms)
        return tuple(layout.values[i][a._name] for i, a in enumerate(atoms))

    def sas_values(self) -> tuple[int, ...]:
        """The initial-state section that starts the library in its current state: each
        variable's current value, a derived variable's default (fast-downward evaluates the
        axioms of an initial state itself, from the defaults the section gives)."""
        layout = _sas_layout(self.sas)
        current = self._values if self._values is not None else self.read_sas_values()
        return tuple(layout.init[v] if v in layout.derived else x for v, x in enumerate(current))

    def load_values(self, values: tuple[int, ...]) -> None:
        """Put the library into the state of :meth:`sas_values`: the game's SAS is loaded
        again with its initial state section replaced (same operators, same operator ids)."""
        layout = _sas_layout(self.sas)
        if len(values) != len(layout.values):
            raise ValueError(f"{len(values)} SAS values for {len(layout.values)} variables")
        init = "\n".join(["begin_state", *map(str, values)])
        self.downward_lib.load_sas(f"{layout.head}\n{init}\n{layout.tail}".encode())
        self.downward_lib.load_sas_replan(self.sas_replan.encode("utf-8"))
        if layout.effects is not None:
            self._values = list(values)

    def fact_state(self) -> tuple[tuple[Fact, ...], tuple[Fact, ...], tuple, tuple, tuple]:
        """(facts added, facts removed since the initial state, var_counts, vars_by_name,
        vars_by_type) as plain strings.

        Most facts never change (where things are, what they are), so only the difference
        to the game's initial facts is kept. The strings are interned, so that a pickle
        writes each name once (pickle shares identical objects, not equal ones).
        """
        current = set(self.facts)
        added = tuple(_fact(p) for p in current if p not in self._initial_set)
        removed = tuple(_fact(p) for p in self._initial_facts if p not in current)
        return (
            added,
            removed,
            tuple((_i(n), c) for n, c in self._var_counts.items()),
            tuple((_i(n), _i(v.type)) for n, v in self._vars_by_name.items()),
            tuple((_i(t), tuple(_i(v.name) for v in vs)) for t, vs in self._vars_by_type.items()),
        )

    def load_fact_state(
        self, added: Any, removed: Any, counts: Any, by_name: Any, by_type: Any
    ) -> None:
        """Replace the facts and variable bookkeeping by those of :meth:`fact_state`."""
        gone = {_proposition(f) for f in removed}
        self._facts = defaultdict(set)
        for prop in [p for p in self._initial_facts if p not in gone] + [
            _proposition(f) for f in added
        ]:
            self._facts[prop.signature].add(prop)
        self._var_counts = Counter(dict(counts))
        self._vars_by_name = {n: Variable(n, t) for n, t in by_name}
        self._vars_by_type = defaultdict(set)
        for t, names in by_type:
            self._vars_by_type[t] = {Variable(n, t) for n in names}


class CachedPddlEnv(PddlEnv):
    """``PddlEnv`` that shares the per-game translation, grammar and parses across instances.

    One instance keeps its fast-downward library copy across games: ``load`` of another game
    reuses it (the stock engine's ``textworld.start`` made a new copy per game).
    """

    def __init__(self, infos: EnvInfos | None = None) -> None:
        super().__init__(infos)
        self._state_is_initial = False
        _install_textgen_cache()

    def step(self, command: str) -> tuple[GameState, float, bool]:
        self._state_is_initial = False
        return super().step(command)

    def load(self, filename_or_data: str | dict[str, Any]) -> None:
        if isinstance(filename_or_data, str):

            def read() -> dict[str, Any]:
                with open(filename_or_data) as f:
                    return json.load(f)

            data = _GAME_DATA.get(filename_or_data, read)
            self._game_file = filename_or_data
        else:
            data = filename_or_data
            self._game_file = None
        self._game_data = data
        self.walkthrough = data.get("walkthrough", None)
        self._logic = _logic(data["pddl_domain"], data["grammar"])
        self._pddl_state = CachedPddlState(self.downward_lib, data["pddl_problem"], self._logic)
        self._entity_infos = self._get_entity_infos()
        self._state_is_initial = True  # the first reset can use it as is

    def snapshot(self) -> EngineSnapshot:
        """The engine's mutable state now (see the module docstring)."""
        st = self._pddl_state
        return EngineSnapshot(
            _problem_hash(st.pddl_problem), st.sas_values(), *st.fact_state(),
            self.state.feedback, self._moves,
        )  # fmt: skip

    def restore(self, snap: EngineSnapshot) -> GameState:
        """Put the loaded game into ``snap``'s state; returns the GameState a step into that
        state returned (feedback, admissible commands, won), computed again from the state."""
        st = self._pddl_state
        if snap.problem_hash != _problem_hash(st.pddl_problem):
            raise ValueError("restore: the snapshot is of another game than the one loaded")
        st.load_values(snap.values)
        st.load_fact_state(
            snap.facts_added, snap.facts_removed, snap.var_counts, snap.vars_by_name,
            snap.vars_by_type,
        )  # fmt: skip
        self._state_is_initial = False  # the next reset builds the initial state again
        self.prev_state = None
        self.state = GameState()
        self._last_action = None
        self._moves = snap.moves
        self.state.feedback = snap.feedback
        self.state.raw = snap.feedback
        self._gather_infos()
        self.state["score"] = 1 if self.state["won"] else 0
        self.state["done"] = self.state["won"] or self.state["lost"]
        return self.state

    def reset(self) -> GameState:
        # PddlEnv.reset (textworld 1.7) with the cached state constructor; the state that load()
        # just built (and its library) is still the initial one, so it is not built twice.
        if not self._state_is_initial:
            self._pddl_state = CachedPddlState(
                self.downward_lib, self._game_data["pddl_problem"], self._logic
            )
        self._state_is_initial = False
        self.prev_state = None
        self.state = GameState()
        self._last_action = None
        self._moves = 0
        context = {
            "state": self._pddl_state,
            "facts": list(self._pddl_state.facts),
            "variables": {},
            "mapping": {},
            "entity_infos": self._entity_infos,
        }
        self.state.feedback = self._logic.grammar.derive("#intro#", context)
        self.state.raw = self.state.feedback
        self._gather_infos()
        if "walkthrough" in self.request_infos.extras:
            self.state["extra.walkthrough"] = self.walkthrough or self._pddl_state.replan(
                self._entity_infos
            )
        return self.state


@functools.cache
def _wrappers() -> tuple[Any, ...]:
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    return functools.partial(AlfredDemangler, shuffle=False), AlfredInfos


def start(game_file: str, request_infos: EnvInfos) -> Any:
    """A wrapped ``CachedPddlEnv`` with ``game_file`` loaded (as alfworld's own loader wraps it:
    ``AlfredDemangler(shuffle=False)`` then ``AlfredInfos``)."""
    env: Any = CachedPddlEnv(request_infos)
    for wrapper in _wrappers():
        env = wrapper(env)
    env.load(game_file)
    return env

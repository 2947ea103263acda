"""Each vocabulary is written once, and a re-spelling anywhere in trayapp/ fails here.

The homes: units (`GB`, formatting) in `core/units.py`; KV-cache types in `core/quants.py`; server kinds
(label, default port, OpenAI-compatible or not) in `core/server_kinds.py`; phases, their priority and
`is_busy` / `is_active` / `is_ready`, in `core/phases.py`; value sources in `core/hardware_readings.py`;
`ModelKey`, and the server states and severities, in `core/model.py`. As `test_logger_names.py` does for
logger names, the scans read the source with `ast`: a tuple, list, set or dict that spells two names of a
vocabulary (all of them, for the states, severities and value sources, whose words are common) outside
its home is a second copy that will drift (the tray menu and the icon once ranked phases in different
orders; four modules each listed the KV types).
"""

from __future__ import annotations

import ast
import functools
import importlib
import itertools
import pkgutil
from pathlib import Path
from typing import get_args

import pytest

import trayapp
import trayapp.sources.servers
from tests.support import snapshots
from trayapp.core.glance import choose_model, server_phase
from trayapp.core.hardware_readings import VALUE_SOURCES
from trayapp.core.model import SERVER_STATES, SEVERITIES, ServerStatus
from trayapp.core.phases import (
    BUSY_PHASES,
    PHASE_PRIORITY,
    PHASES,
    Phase,
    is_active,
    is_busy,
    is_loaded,
    is_ready,
)
from trayapp.core.quants import KV_BYTES_PER_ELEMENT, KV_TYPES, KvType, kv_is_full_precision
from trayapp.core.server_kinds import SERVER_KINDS, USER_SERVER_KINDS, ServerKindName, server_label
from trayapp.core.units import format_bytes, format_gb, format_gb_of
from trayapp.sources.servers.common import HttpProbe

PACKAGE = Path(trayapp.__file__).resolve().parent


@functools.cache
def _trees() -> dict[str, ast.Module]:
    """Every module under trayapp/, parsed once: {path relative to trayapp/: tree}."""
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


# --------------------------------------------------------------------------- the scanners


def gb_literals(tree: ast.AST) -> list[int]:
    """Lines holding 10^9 as a literal: `1e9`, `1_000_000_000`, `10**9`, `1000**3`."""
    lines = []
    for node in ast.walk(tree):
        constant = isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == 1e9
        power = (
            isinstance(node, ast.BinOp)
            and isinstance(node.op, ast.Pow)
            and isinstance(node.left, ast.Constant)
            and isinstance(node.right, ast.Constant)
            and type(node.left.value) is int
            and type(node.right.value) is int
            and node.left.value**node.right.value == 10**9
        )
        if constant or power:
            lines.append(getattr(node, "lineno", 0))
    return sorted(lines)


def spelt_lists(tree: ast.AST, names: frozenset[str], at_least: int = 2) -> list[int]:
    """Lines where a tuple, list or set (a `Literal[...]` included), or a dict's keys, spell `at_least`
    of `names`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items: list[ast.expr | None] = list(node.elts)
        elif isinstance(node, ast.Dict):
            items = list(node.keys)
        else:
            continue
        spelt = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if len(spelt & names) >= at_least:
            lines.append(node.lineno)
    return sorted(lines)


def assigned_names(tree: ast.AST) -> set[str]:
    """The names a module assigns (module level, class bodies, functions)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def spellings_outside(home: str, names: frozenset[str]) -> dict[str, list[int]]:
    """{module: lines} where `names` are listed again outside `home`."""
    found = {path: spelt_lists(tree, names) for path, tree in _trees().items() if path != home}
    return {path: lines for path, lines in found.items() if lines}


def test_the_scanners_find_re_spellings() -> None:
    def parse(source: str) -> ast.Module:
        return ast.parse(source)

    gigabytes = "a = 1e9\nb = 10**9\nc = 1_000_000_000\nd = 1000 ** 3\ne = -1e9"
    assert gb_literals(parse(gigabytes)) == [1, 2, 3, 4, 5]
    assert gb_literals(parse("a = 1e6\nb = 2**30\nc = 1e-9\nd = True")) == []
    kv = frozenset(KV_TYPES)
    assert spelt_lists(parse('KV = ("f16", "q8_0")\nif t in {"f32", "bf16"}: pass'), kv) == [1, 2]
    assert spelt_lists(parse('T = Literal["q4_0", "q8_0"]\nD = {"f16": 2.0, "q8_0": 1.06}'), kv) == [1, 2]
    assert spelt_lists(parse('one = ("f16",)\nother = ("F16", "Q8_0")\nkind = "f16"'), kv) == []
    assert spelt_lists(parse('A = ("f16", "q8_0")\nB = ("f32", "f16", "q8_0")'), kv, at_least=3) == [2]
    names = "GB = 1\nclass P:\n    default_port: int = 80\ndef f():\n    ModelKey = 0"
    assert assigned_names(parse(names)) == {"GB", "default_port", "ModelKey"}


# Each vocabulary name is assigned in its home and nowhere else (a module imports it from there).
HOMES = {
    "GB": "core/units.py",
    "MB": "core/units.py",
    "GIB": "core/units.py",
    "MIB": "core/units.py",
    "KvType": "core/quants.py",
    "KV_TYPES": "core/quants.py",
    "KV_BYTES_PER_ELEMENT": "core/quants.py",
    "ServerKindName": "core/server_kinds.py",
    "ServerKind": "core/server_kinds.py",  # the dead Literal that was in core/model.py
    "SERVER_KINDS": "core/server_kinds.py",
    "SERVER_LABELS": "core/server_kinds.py",
    "USER_SERVER_KINDS": "core/server_kinds.py",
    "DEFAULT_PORTS": "core/server_kinds.py",
    "default_port": "core/server_kinds.py",  # probes once repeated the ports as a class attribute
    "PHASES": "core/phases.py",
    "PHASE_PRIORITY": "core/phases.py",
    "BUSY_PHASES": "core/phases.py",
    "ModelKey": "core/model.py",
    "SERVER_STATES": "core/model.py",
    "SEVERITIES": "core/model.py",
    "VALUE_SOURCES": "core/hardware_readings.py",
}


@pytest.mark.parametrize(("name", "home"), sorted(HOMES.items()))
def test_each_vocabulary_name_is_defined_in_its_home_only(name: str, home: str) -> None:
    defined_in = sorted(path for path, tree in _trees().items() if name in assigned_names(tree))
    assert [path for path in defined_in if path != home] == []


# --------------------------------------------------------------------------- units


# 10^9 that is not a gigabyte: each file's count is exact, so a new GB spelt there fails too.
NOT_GIGABYTES = {
    "core/modelfacts.py": (3, "parameter counts in billions: '8B', --params 8"),
    "sources/servers/ollama.py": (2, "the SI suffixes of Ollama's parameter sizes: '8.0B', '1G'"),
    "ui/dashboard/cards.py": (1, "a parameter count in billions: '8.0B params'"),
    "services/proxy/recorder_parse.py": (1, "nanoseconds per second: Ollama's durations"),
}


def test_a_gigabyte_is_spelt_only_in_core_units() -> None:
    found = {path: len(gb_literals(tree)) for path, tree in _trees().items() if path != "core/units.py"}
    assert {path: n for path, n in found.items() if n} == {path: n for path, (n, _) in NOT_GIGABYTES.items()}


def test_byte_formatting() -> None:
    assert format_bytes(4_920_000_000) == "4.9 GB"
    assert format_bytes(131_072_000) == "131.1 MB"
    assert format_bytes(2_048) == "2.0 kB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(None) == format_bytes(float("nan")) == "—"
    assert format_gb(4_920_000_000) == "4.9 GB"
    assert format_gb(4_920_000_000, digits=2) == "4.92 GB"  # bytes read per token
    assert format_gb(float("inf")) == format_gb(None) == "—"
    assert format_gb_of(18_040_000_000, 24_000_000_000) == "18.0/24 GB"


# --------------------------------------------------------------------------- KV-cache types


def test_kv_types_are_the_keys_of_the_bytes_table() -> None:
    assert KV_TYPES == get_args(KvType) == tuple(KV_BYTES_PER_ELEMENT)
    # llama.cpp's blocks: q8_0 holds 32 elements in 34 bytes, q4_0 32 in 18 (ggml-common.h)
    assert (KV_BYTES_PER_ELEMENT["f16"], KV_BYTES_PER_ELEMENT["q8_0"], KV_BYTES_PER_ELEMENT["q4_0"]) == (
        2.0,
        34 / 32,
        18 / 32,
    )


def test_kv_types_are_listed_only_in_core_quants() -> None:
    assert spellings_outside("core/quants.py", frozenset(KV_TYPES)) == {}


def test_a_full_precision_kv_cache_is_16_bits_or_more() -> None:
    assert [t for t in KV_TYPES if kv_is_full_precision(t)] == ["f32", "f16", "bf16"]
    assert not kv_is_full_precision("turbo3")  # unknown: no advice


# --------------------------------------------------------------------------- server kinds


def _probe_classes() -> list[type[HttpProbe]]:
    for module in pkgutil.iter_modules(trayapp.sources.servers.__path__):
        importlib.import_module(f"trayapp.sources.servers.{module.name}")
    classes, todo = [], [HttpProbe]
    while todo:
        cls = todo.pop()
        classes.append(cls)
        todo.extend(cls.__subclasses__())
    return [cls for cls in classes if isinstance(getattr(cls, "kind", None), str)]


def test_one_row_per_server_kind() -> None:
    assert get_args(ServerKindName) == tuple(SERVER_KINDS)
    assert server_label("lmstudio") == "LM Studio"
    assert server_label("koboldcpp") == "koboldcpp"  # no row: the name itself


def test_every_probe_class_has_a_row_and_every_kind_a_user_may_name_a_probe() -> None:
    kinds = {cls.kind for cls in _probe_classes()}
    assert kinds == set(USER_SERVER_KINDS) == set(SERVER_KINDS) - {"unknown"}


def test_server_kinds_are_listed_only_in_core_server_kinds() -> None:
    assert spellings_outside("core/server_kinds.py", frozenset(SERVER_KINDS)) == {}


# --------------------------------------------------------------------------- phases


def test_phases_and_their_order() -> None:
    assert get_args(Phase) == PHASES
    # What the user waits on first: text being generated, a prompt being read, a request stuck
    # mid-answer, then a model loading (no request served yet).
    assert PHASE_PRIORITY == ("decoding", "prefill", "stalled", "loading")
    assert set(PHASE_PRIORITY) - {"loading"} == BUSY_PHASES


@pytest.mark.parametrize(
    ("phase", "busy", "active", "ready", "loaded"),
    [
        ("unloaded", False, False, False, False),
        ("idle", False, False, True, True),
        ("sleeping", False, False, False, True),
        ("loading", False, True, False, False),
        ("prefill", True, True, True, True),
        ("decoding", True, True, True, True),
        ("stalled", True, True, True, True),
    ],
)
def test_phase_predicates(phase: str, busy: bool, active: bool, ready: bool, loaded: bool) -> None:
    predicates = (is_busy(phase), is_active(phase), is_ready(phase), is_loaded(phase))
    assert predicates == (busy, active, ready, loaded)


# Another vocabulary that shares words with phases.
PHASE_WORDS_ELSEWHERE = {
    "sources/servers/llamacpp_router.py": "the router's own model states (its /models `status`)",
    "sources/servers/llamacpp_events.py": "the router's own model states (its /models/sse events)",
}


def test_phases_are_listed_only_in_core_phases() -> None:
    assert set(spellings_outside("core/phases.py", frozenset(PHASES))) == set(PHASE_WORDS_ELSEWHERE)


# Words common enough that a subset is a choice ("ok" or "loading": reachable), not a copy: only the
# whole list spelt again is one.
@pytest.mark.parametrize(
    ("vocabulary", "home"),
    [
        (SERVER_STATES, "core/model.py"),
        (SEVERITIES, "core/model.py"),
        (VALUE_SOURCES, "core/hardware_readings.py"),
    ],
)
def test_server_states_severities_and_value_sources_are_listed_whole_only_in_their_home(
    vocabulary: tuple[str, ...], home: str
) -> None:
    names = frozenset(vocabulary)
    found = {path: spelt_lists(tree, names, at_least=len(names)) for path, tree in _trees().items()}
    assert {path for path, lines in found.items() if lines} == {home}


def _models(*phases: str) -> ServerStatus:
    return snapshots.server(*(snapshots.model(f"m{i}", phase, rate=None) for i, phase in enumerate(phases)))


@pytest.mark.parametrize(
    ("phases", "expected"),
    [
        (("loading", "stalled"), "stalled"),  # the menu once said "loading a model", the icon "stalled"
        (("idle", "loading"), "loading"),
        (("loading", "stalled", "prefill"), "prefill"),
        (("stalled", "idle", "decoding", "loading"), "decoding"),
    ],
)
def test_the_tray_menu_and_the_icon_pick_the_same_phase(phases: tuple[str, ...], expected: str) -> None:
    server = _models(*phases)
    chosen = choose_model(snapshots.snap(1.0, server))
    assert chosen is not None
    assert (server_phase(server), chosen[1].phase) == (expected, expected)


def test_the_menu_and_the_icon_agree_on_every_pair_of_phases() -> None:
    for phases in itertools.permutations(PHASES, 2):
        server = _models(*phases)
        chosen = choose_model(snapshots.snap(1.0, server))
        assert chosen is not None
        if any(is_active(p) for p in phases):
            assert server_phase(server) == chosen[1].phase, phases
        else:
            assert server_phase(server) is None, phases

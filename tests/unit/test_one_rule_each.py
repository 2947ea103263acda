"""Each vocabulary once: a rule has one home, and a scan of `trayapp/` fails on a re-spelling
elsewhere (as `test_logger_names.py` does for logger names)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from trayapp.core.loopback import (
    is_loopback,
    is_loopback_url,
    is_this_machine,
    is_this_machine_url,
    same_server,
    server_key,
)

TRAYAPP = Path(__file__).resolve().parents[2] / "trayapp"


def _modules(skip: str) -> list[tuple[str, ast.Module]]:
    """(path relative to trayapp/, parsed module) of every module but `skip`."""
    found = []
    for path in sorted(TRAYAPP.rglob("*.py")):
        relative = path.relative_to(TRAYAPP).as_posix()
        if relative != skip:
            found.append((relative, ast.parse(path.read_text(encoding="utf-8"), relative)))
    return found


# --------------------------------------------------------------------------- loopback and same server

LOOPBACK_HOME = "core/loopback.py"
LOOPBACK_LITERALS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", "::"})
LOOPBACK_RULE_NAMES = frozenset(
    {
        "is_local",
        "is_local_url",
        "is_loopback",
        "_is_loopback",
        "is_loopback_url",
        "is_this_machine",
        "host_key",
        "server_key",
        "_server_key",
        "same_server",
        "_same_server",
        "_same_url",
        "same_url",
    }
)


def _is_loopback_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and str(node.value).lower() in LOOPBACK_LITERALS


def _is_strip_slash(node: ast.AST) -> bool:
    """`x.rstrip("/")`: a URL made comparable by hand."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "rstrip"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == "/"
    )


def loopback_respellings(module: ast.Module) -> list[tuple[int, str]]:
    """(line, what) of each place `module` decides an address rule itself: a function named like a
    rule of the home module, a loopback literal in a comparison or a collection (a bind default
    such as `address = "127.0.0.1"` is a value, not a rule), `startswith("127.")`, or two URLs
    compared after `rstrip("/")`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in LOOPBACK_RULE_NAMES:
            found.append((node.lineno, f"defines {node.name}"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_loopback_literal(sub) for operand in operands for sub in ast.walk(operand)):
                found.append((node.lineno, "compares with a loopback literal"))
            elif any(_is_strip_slash(operand) for operand in operands):
                found.append((node.lineno, 'compares URLs after rstrip("/")'))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(map(_is_loopback_literal, node.elts)):
            found.append((node.lineno, "lists a loopback literal"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
            and any(
                isinstance(sub, ast.Constant) and isinstance(sub.value, str) and sub.value.startswith("127.")
                for arg in node.args
                for sub in ast.walk(arg)
            )
        ):
            found.append((node.lineno, 'startswith("127.")'))
    return sorted(dict(reversed(found)).items())  # one finding a line


def test_no_module_but_the_home_spells_a_loopback_or_same_server_rule() -> None:
    offenders = [
        f"trayapp/{path}:{line}: {what}"
        for path, module in _modules(skip=LOOPBACK_HOME)
        for line, what in loopback_respellings(module)
    ]
    assert offenders == [], f"use trayapp/{LOOPBACK_HOME}: " + "; ".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "def is_local(url):\n    return True\n",
        "def _same_url(a, b):\n    return a == b\n",
        "ok = host in ('localhost', '::1')\n",
        "ok = host == '127.0.0.1'\n",
        "ok = host.lower() != 'LOCALHOST'\n",
        "NAMES = frozenset({'127.0.0.1', '0.0.0.0'})\n",
        "ok = host.startswith('127.')\n",
        "ok = a.rstrip('/') == b.rstrip('/')\n",
    ],
)
def test_the_scan_sees_each_respelling(source: str) -> None:
    assert len(loopback_respellings(ast.parse(source))) == 1


@pytest.mark.parametrize(
    "source",
    [
        "ADDRESS = '127.0.0.1'\n",
        "def serve(address: str = '127.0.0.1') -> None: ...\n",
        "host = parts.hostname or '127.0.0.1'\n",
        "base = url.rstrip('/')\n",
    ],
)
def test_a_default_value_is_not_a_rule(source: str) -> None:
    assert loopback_respellings(ast.parse(source)) == []


@pytest.mark.parametrize(
    ("url_a", "url_b"),
    [
        ("http://localhost:8080", "http://127.0.0.1:8080"),
        ("http://127.0.0.1:8080", "http://[::1]:8080"),
        ("http://localhost:8080", "http://[::1]:8080"),
        ("http://LocalHost:8080/", "http://127.0.0.1:8080"),  # case, trailing slash
        ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),  # a path is not a server
        ("127.0.0.1:8080", "http://localhost:8080"),  # a bare host:port
        ("http://gpu-box", "http://gpu-box:80"),  # http's default port
        ("https://gpu-box", "https://gpu-box:443"),  # https's default port
        ("http://[::ffff:127.0.0.1]:8080", "http://127.0.0.1:8080"),  # IPv4-mapped
        ("http://[0:0:0:0:0:0:0:1]:8080", "http://[::1]:8080"),  # IPv6 spelled long
    ],
)
def test_same_server(url_a: str, url_b: str) -> None:
    assert same_server(url_a, url_b)
    assert same_server(url_b, url_a)


@pytest.mark.parametrize(
    ("url_a", "url_b"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8081"),  # another port
        ("http://gpu-box", "https://gpu-box"),  # 80 is not 443
        ("http://gpu-box:8080", "http://other-box:8080"),
        ("http://127.0.0.2:8080", "http://127.0.0.1:8080"),  # another loopback address, another socket
        ("http://0.0.0.0:8080", "http://127.0.0.1:8080"),  # a wildcard is a listen, not a server
    ],
)
def test_not_same_server(url_a: str, url_b: str) -> None:
    assert not same_server(url_a, url_b)


def test_server_key() -> None:
    assert server_key("http://LOCALHOST:11434/") == ("127.0.0.1", 11434)
    assert server_key("https://api.example.com/v1") == ("api.example.com", 443)
    assert server_key("http://host:99999") == ("host", None)  # a port out of range is unreadable


@pytest.mark.parametrize(
    ("host", "loopback", "this_machine"),
    [
        ("localhost", True, True),
        ("LOCALHOST", True, True),
        ("127.0.0.1", True, True),
        ("127.0.0.2", True, True),  # all of 127.0.0.0/8
        ("::1", True, True),
        ("[::1]", True, True),
        ("0.0.0.0", False, True),  # a wildcard listen answers every network: never "loopback"
        ("::", False, True),
        ("127.example.com", False, False),  # a name that merely starts with 127.
        ("192.168.1.10", False, False),
        ("gpu-box", False, False),
        ("", False, False),
    ],
)
def test_loopback_and_this_machine(host: str, loopback: bool, this_machine: bool) -> None:
    assert is_loopback(host) is loopback
    assert is_this_machine(host) is this_machine
    url = f"http://[{host.strip('[]')}]:8080" if ":" in host else f"http://{host}:8080"
    assert is_loopback_url(url) is loopback
    assert is_this_machine_url(url) is this_machine

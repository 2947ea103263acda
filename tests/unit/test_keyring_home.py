"""The OS keyring has one home, sources/secrets.py (#19, house-review §6 item 9): every other module
reads and stores secrets through it, so each "why there is no key" text and each keyring error is
handled in one place. sources/remote_agent.py used to call `keyring.get_password` itself."""

from __future__ import annotations

from tests.support.layering import PACKAGE, imported_names

KEYRING_HOME = "trayapp/sources/secrets.py"


def keyring_imports(source: str, module: str) -> list[int]:
    """The lines of `source` that import `keyring` or one of its submodules."""
    return sorted({line for line, name in imported_names(source, module) if name.split(".")[0] == "keyring"})


def test_the_scanner_finds_every_way_of_importing_keyring() -> None:
    source = (
        "import keyring\n"
        "from keyring.errors import KeyringError\n"
        "import keyring.backend as kb\n"
        "def later():\n    import keyring\n"
        "import keyrings_alt\n"  # another package, not keyring
        "from trayapp.sources import secrets\n"
    )
    assert keyring_imports(source, "trayapp.sources.remote_agent") == [1, 2, 3, 5]


def test_only_secrets_py_imports_keyring() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        module = ".".join(relative.with_suffix("").parts)
        lines = keyring_imports(path.read_text(encoding="utf-8"), module)
        if lines and relative.as_posix() != KEYRING_HOME:
            offenders.append(f"{relative}:{lines[0]}")
    assert not offenders, f"import keyring outside {KEYRING_HOME}: {offenders}"


def test_the_home_itself_is_found() -> None:
    """The rule would pass vacuously if the scan missed secrets.py or its imports."""
    source = (PACKAGE.parent / KEYRING_HOME).read_text(encoding="utf-8")
    assert keyring_imports(source, "trayapp.sources.secrets")

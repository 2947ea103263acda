"""`[[agents]]`: remote machines the tray watches through their `llm-tray agent` (docs/remote.md).

```toml
[[agents]]
url = "http://gpu-box:9465"     # the agent's snapshot endpoint (--snapshot-address/--snapshot-port)
name = "gpu-box"                # optional: the host part of url
token_env = "GPU_BOX_TOKEN"     # optional: the token from this environment variable
```

The token never goes in the file: it is in the OS keyring (service "llm-tray", user
`agent_keyring_user(url)`), or in the environment variable `token_env` names. config/settings.py
parses the section with `build_agent` (config/list_sections.py: a bad entry is reported and skipped).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from trayapp.config.list_sections import ENV_NAME, ConfigError

_MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_KEYS = {"url", "name", "token_env"}


@dataclass(frozen=True)
class AgentConfig:
    url: str  # http(s)://HOST:PORT of the agent's snapshot endpoint
    name: str  # the machine's name in the tray (unique)
    token_env: str | None = None  # read the token from this environment variable (else the keyring)


def agent_keyring_user(url: str) -> str:
    """The keyring entry of an agent's token (never the same as an endpoint's API key entry)."""
    return f"agent {url}"


def build_agent(data: Any, prefix: str, earlier: Sequence[AgentConfig]) -> AgentConfig:
    """One entry, checked against the good ones before it; raises ConfigError naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a table, got {data!r}")
    if "token" in data:
        raise ConfigError(
            f"{prefix}.token: tokens never go in the config file: store it in the OS keyring "
            "(Settings → Remote machines) or name an environment variable with token_env"
        )
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ConfigError(f"{prefix}.{unknown[0]}: unknown setting")
    for key in _KEYS:
        if key in data and not isinstance(data[key], str):
            raise ConfigError(f"{prefix}.{key}: expected a string, got {data[key]!r}")
    url = data.get("url")
    if not url:
        raise ConfigError(f"{prefix}.url: every agent needs a url, e.g. http://gpu-box:9465")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{prefix}.url: bad port in {url!r}") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise ConfigError(
            f"{prefix}.url: expected http://HOST:PORT (the agent's snapshot endpoint), got {url!r}"
        )
    name = data.get("name", parts.hostname)
    if not _MACHINE_NAME.match(name):
        raise ConfigError(
            f"{prefix}.name: {name!r} is not a machine name (letters, digits, '.', '-', '_'; "
            'give one with name = "gpu-box")'
        )
    token_env = data.get("token_env")
    if token_env is not None and not ENV_NAME.match(token_env):
        raise ConfigError(f"{prefix}.token_env: {token_env!r} is not an environment variable name")
    agent = AgentConfig(url=url.rstrip("/"), name=name, token_env=token_env)
    if any(a.name == agent.name for a in earlier):
        raise ConfigError(
            f"{prefix}.name: {agent.name!r} names another agent too: give each a name of its own"
        )
    if any(a.url == agent.url for a in earlier):
        raise ConfigError(f"{prefix}.url: {agent.url} is listed twice")
    return agent

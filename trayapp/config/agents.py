"""`[[agents]]`: remote machines the tray watches through their `llm-tray agent` (docs/remote.md).

```toml
[[agents]]
url = "http://gpu-box:9465"     # the agent's snapshot endpoint (--snapshot-address/--snapshot-port)
name = "gpu-box"                # optional: the host part of url
token_env = "GPU_BOX_TOKEN"     # optional: the token from this environment variable
```

The token never goes in the file: it is in the OS keyring (service "llm-tray", user
`agent_keyring_user(url)`), or in the environment variable `token_env` names. Self-contained
(config/settings.py imports it): bad entries are reported as messages and skipped, the rest still load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_MACHINE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_KEYS = {"url", "name", "token_env"}


class AgentConfigError(ValueError):
    """One bad `[[agents]]` entry, with its key path."""


@dataclass(frozen=True)
class AgentConfig:
    url: str  # http(s)://HOST:PORT of the agent's snapshot endpoint
    name: str  # the machine's name in the tray (unique)
    token_env: str | None = None  # read the token from this environment variable (else the keyring)


def agent_keyring_user(url: str) -> str:
    """The keyring entry of an agent's token (never the same as an endpoint's API key entry)."""
    return f"agent {url}"


def build_agent(data: Any, index: int) -> AgentConfig:
    """One entry, checked; raises AgentConfigError naming the key."""
    prefix = f"agents[{index}]"
    if not isinstance(data, dict):
        raise AgentConfigError(f"{prefix}: expected a table, got {data!r}")
    if "token" in data:
        raise AgentConfigError(
            f"{prefix}.token: tokens never go in the config file: store it in the OS keyring "
            "(Settings → Remote machines) or name an environment variable with token_env"
        )
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise AgentConfigError(f"{prefix}.{unknown[0]}: unknown setting")
    for key in _KEYS:
        if key in data and not isinstance(data[key], str):
            raise AgentConfigError(f"{prefix}.{key}: expected a string, got {data[key]!r}")
    url = data.get("url")
    if not url:
        raise AgentConfigError(f"{prefix}.url: every agent needs a url, e.g. http://gpu-box:9465")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise AgentConfigError(f"{prefix}.url: bad port in {url!r}") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.username is not None
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
    ):
        raise AgentConfigError(
            f"{prefix}.url: expected http://HOST:PORT (the agent's snapshot endpoint), got {url!r}"
        )
    name = data.get("name", parts.hostname)
    if not _MACHINE_NAME.match(name):
        raise AgentConfigError(
            f"{prefix}.name: {name!r} is not a machine name (letters, digits, '.', '-', '_'; "
            'give one with name = "gpu-box")'
        )
    token_env = data.get("token_env")
    if token_env is not None and not _ENV_NAME.match(token_env):
        raise AgentConfigError(f"{prefix}.token_env: {token_env!r} is not an environment variable name")
    return AgentConfig(url=url.rstrip("/"), name=name, token_env=token_env)


def parse_agents(value: Any, errors: list[str]) -> tuple[AgentConfig, ...]:
    """Good entries; each bad one is appended to `errors` and skipped."""
    if not isinstance(value, list):
        errors.append("agents: expected a list of [[agents]] tables")
        return ()
    agents: list[AgentConfig] = []
    for index, item in enumerate(value):
        try:
            agent = build_agent(item, index)
        except AgentConfigError as exc:
            errors.append(str(exc))
            continue
        if any(a.name == agent.name for a in agents):
            errors.append(
                f"agents[{index}].name: {agent.name!r} names another agent too: give each a name of its own"
            )
        elif any(a.url == agent.url for a in agents):
            errors.append(f"agents[{index}].url: {agent.url} is listed twice")
        else:
            agents.append(agent)
    return tuple(agents)

"""The list sections `[[endpoints]]`, `[[proxies]]` and `[[agents]]` share one parser
(config/list_sections.py): a bad entry is reported with its key path and skipped, the rest load."""

from __future__ import annotations

import pytest

from trayapp.config.agents import AgentConfig
from trayapp.config.settings import EndpointConfig, ProxyConfig, parse_settings

CASES = [
    (
        "endpoints",
        [{"url": "http://127.0.0.1:8080"}, {"name": "box"}, {"url": "http://127.0.0.1:8081"}],
        "endpoints[1].url: every endpoint needs a url",
        (EndpointConfig(url="http://127.0.0.1:8080"), EndpointConfig(url="http://127.0.0.1:8081")),
    ),
    (
        "proxies",
        [
            {"listen": "127.0.0.1:11435", "upstream": "http://127.0.0.1:11434"},
            {"listen": "127.0.0.1:11436"},
            {"listen": "127.0.0.1:8081", "upstream": "http://127.0.0.1:8080"},
        ],
        "proxies[1]: every proxy needs listen and upstream",
        (
            ProxyConfig(listen="127.0.0.1:11435", upstream="http://127.0.0.1:11434"),
            ProxyConfig(listen="127.0.0.1:8081", upstream="http://127.0.0.1:8080"),
        ),
    ),
    (
        "agents",
        [{"url": "http://a:1"}, {"name": "box"}, {"url": "http://b:2"}],
        "agents[1].url: every agent needs a url, e.g. http://gpu-box:9465",
        (AgentConfig(url="http://a:1", name="a"), AgentConfig(url="http://b:2", name="b")),
    ),
]


@pytest.mark.parametrize(("section", "entries", "error", "loaded"), CASES, ids=[c[0] for c in CASES])
def test_a_bad_entry_is_reported_by_key_path_and_the_others_load(
    section: str, entries: list[dict[str, str]], error: str, loaded: tuple[object, ...]
) -> None:
    settings, errors = parse_settings({section: entries})
    assert errors == [error]
    assert getattr(settings, section) == loaded


@pytest.mark.parametrize("section", ["endpoints", "proxies", "agents"])
def test_a_section_that_is_not_a_list_of_tables(section: str) -> None:
    settings, errors = parse_settings({section: "http://127.0.0.1:8080"})
    assert errors == [f"{section}: expected a list of [[{section}]] tables"]
    assert getattr(settings, section) == ()


def test_a_duplicate_is_refused_against_the_entries_before_it() -> None:
    settings, errors = parse_settings(
        {"agents": [{"url": "http://a:1"}, {"url": "http://a:1", "name": "other"}, {"url": "http://b:2"}]}
    )
    assert errors == ["agents[1].url: http://a:1 is listed twice"]
    assert [a.name for a in settings.agents] == ["a", "b"]

"""`llm-tray peers` (#23) as a user types it: the before-buying question answered from the shipped
table alone, and a name it does not know refused."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli


def test_before_buying_a_4090_for_a_32b_q4_k_m() -> None:
    result = run_cli("peers", "--gpu", "RTX 4090", "--params", "32", "--quant", "Q4_K_M", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["machine"]["bandwidth_gbps"] == 1008
    bytes_per_token = 32e9 * 4.89 / 8  # params × Q4_K_M's 4.89 bits per weight ÷ 8
    assert doc["model"]["bytes_per_token"] == pytest.approx(bytes_per_token, rel=1e-6)
    band, predicted = doc["band"], doc["predicted_tok_s"]
    assert band["basis"] == "RTX 4090, Q4" and band["n"] >= 3
    ceiling = 1008e9 / bytes_per_token  # 51.5 tok/s
    assert predicted["ceiling"] == pytest.approx(ceiling, abs=0.01)
    assert predicted["median"] == pytest.approx(ceiling * band["median_share"], abs=0.05)
    assert predicted["low"] <= predicted["median"] <= predicted["high"] <= ceiling
    assert doc["nearest"] and all(r["source_url"].startswith("https://") for r in doc["nearest"])
    assert doc["nearest"][0]["hardware"] == "RTX 4090"


def test_the_text_names_the_band_and_the_prediction() -> None:
    result = run_cli("peers", "--gpu", "RTX 4090", "--params", "32", "--quant", "Q4_K_M")
    assert result.returncode == 0, result.stderr
    assert "peers     RTX 4090, Q4: " in result.stdout
    assert "predicted " in result.stdout and "tok/s" in result.stdout
    assert "https://github.com/" in result.stdout


def test_an_unknown_gpu_is_refused() -> None:
    result = run_cli("peers", "--gpu", "Voodoo 5 6000", "--params", "7")
    assert result.returncode == 2
    assert "unknown GPU" in result.stderr

"""Helpers shared by the tests: a real llama-server (`llama`) and fake HTTP servers (`fake_http`)."""

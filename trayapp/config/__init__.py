"""What the user configured and where things live: `settings` (config.toml, validated), `agents`
(remote machines), `paths` (config and data folders, LLM_TRAY_HOME) and `secrets` (API keys and tokens
in the OS keyring or a named environment variable, never in a file)."""

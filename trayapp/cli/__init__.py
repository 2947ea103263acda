"""The command line: `main.main` (the `llm-tray` command) parses the arguments and runs one module per
subcommand here (`agent`, `bar`, `bench`, `ceiling`, `logs`, `proxy`, `autostart`), or the tray app."""

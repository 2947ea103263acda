"""The tray app's composition root: `tray_main.run_tray` starts `tray_app.TrayApp`, which wires the sampler
(services), the sinks and the views (ui) together; `actions`, `bench_service` and `proxy_service` are what
the tray runs for the user."""

"""The tray app's composition root: `tray_app.run_tray` wires the sampler (services), the sinks and the
views (ui) together; `actions`, `bench_service` and `proxy_service` are what the tray runs for the user."""

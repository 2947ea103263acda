"""Long-running work that the tray and the commands start: the sampler (`monitor`: sources → core →
sinks, once per tick), the recording proxy (`proxy/`), bench runs (`bench_job`, `bench_client`,
`bench_report`) and start-at-login (`autostart`)."""

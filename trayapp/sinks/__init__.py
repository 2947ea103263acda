"""What records and publishes: the store (`store/`, SQLite), exports and reports, the Prometheus
`/metrics` (`metrics`), the snapshot/SSE endpoint (`snapshot_server`, its request handler
`snapshot_handler`, its wire form in `wire`) and the file that says where the sampler answers
(`sampler_file`)."""

"""What reads the world: the servers (`servers/`, found by `discovery`), the GPU and the host
(`hardware`, `gpu`, `host`, `rambench`), model files (`modelfile`, `facts_loader`) and remote agents
(`remote_agent`). Each returns core's dataclasses; none records or shows anything."""

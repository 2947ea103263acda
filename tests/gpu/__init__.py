"""The GPU check (#21): llm-tray against nvidia-smi on a machine with an NVIDIA GPU (README, Tests)."""

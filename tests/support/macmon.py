"""Two lines as `macmon pipe -i 1000` prints them (the readme's "JSON output" format, trimmed)."""

MACMON_LINES = [
    '{"timestamp":"2025-02-24T20:38:15.427569+00:00","temp":{"cpu_temp_avg":43.7,"gpu_temp_avg":36.9},'
    '"cpu_power":0.20486385,"gpu_power":0.017451683,"ane_power":0.0,"all_power":0.22231553,'
    '"sys_power":5.876533,"ram_power":0.11635789,"gpu_ram_power":0.0009615385}',
    '{"timestamp":"2025-02-24T20:38:16.427569+00:00","temp":{"cpu_temp_avg":44.1,"gpu_temp_avg":40.2},'
    '"cpu_power":1.5,"gpu_power":20.25,"ane_power":0.0,"all_power":21.75,'
    '"sys_power":30.5,"ram_power":0.8,"gpu_ram_power":0.01}',
]

"""On-box evidence: topology (``probe``), NVML telemetry, collective latency (``commbench``) and
memory/launch calibration (``calibrate``). Everything here imports NVML and torch lazily so that
the package loads on a machine that has neither.
"""

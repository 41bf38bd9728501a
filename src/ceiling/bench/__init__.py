"""Streaming load generator (``ceiling bench``) and run comparison (``ceiling compare``).

Modules, one job each: ``config`` (what to run), ``sse`` (bytes -> events with their stream
offsets), ``client`` (HTTP, socket-time stamps), ``workloads`` (prompts, arrival schedules),
``metrics`` (one stream -> per-request numbers; a run -> summary), ``stats`` (t-intervals,
Welch, bootstrap), ``server_metrics`` (/metrics deltas), ``looplag``, ``telemetry`` (bridge to
the probe's sampler), ``runner`` (orchestration), ``assemble`` (measurements -> result),
``results`` (the file), ``compare`` (the verdict), ``render`` (tables).
"""

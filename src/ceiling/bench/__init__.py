"""Streaming load generator (``ceiling bench``) and run comparison (``ceiling compare``).

Modules, one job each: ``config`` (what to run), ``sse`` (bytes -> events with their stream
offsets), ``http`` (the streaming HTTP/1.1 protocol), ``pool`` (its connections), ``kstamp``
(kernel receive timestamps), ``client`` (endpoints, one streamed request), ``workloads``
(prompts, arrival schedules), ``load`` (driving one share of a level), ``workers`` /
``rayworkers`` (the load over processes or Ray actors, merged), ``metrics`` (one stream ->
per-request numbers; a run -> summary), ``stats`` (t-intervals, Welch, bootstrap),
``server_metrics`` (/metrics deltas), ``looplag``, ``telemetry`` (bridge to the probe's
sampler), ``runner`` (orchestration), ``assemble`` (measurements -> result), ``results`` (the
file), ``compare`` (the verdict), ``render`` (tables).
"""

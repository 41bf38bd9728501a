"""Streaming load generator (``ceiling bench``) and run comparison (``ceiling compare``).

Modules, one job each: ``sse`` splits the byte stream into timestamped events, ``client`` talks
HTTP, ``metrics`` turns one stream into per-request numbers and a run into a summary, ``stats``
holds the statistics, ``workloads`` the prompts and arrival schedules, ``runner`` the
orchestration, ``results`` the file format, ``compare`` the verdict.
"""

"""One way to talk to a server: one URL, credentials, proxy and timeout policy for every request
ceiling sends (bench, doctor's target, trace capture, sanity, launcher and deploy readiness).

- :mod:`ceiling.server.policy`: the policy (:func:`~ceiling.server.policy.target` turns a URL
  into the base URL, the Authorization header and the proxy a request uses); docs/server.md.
- :mod:`ceiling.server.sync`: the synchronous client (urllib) and its endpoints: models,
  metrics, readiness/health, version, profiler start/stop.
- :mod:`ceiling.server.aio`: the same policy for aiohttp (the bench's non-streaming calls).
- :mod:`ceiling.server.schema`: the nouns (pure: result modules import them without a socket).

Empty on purpose: importing the package must not import an HTTP stack (the schema's purity).
"""

"""The sanity gate: is the server computing the model, or fast garbage? (``ceiling sanity``)

``spec.py`` reads what to ask and the per-family thresholds (``data/sanity.yaml``);
``checks.py`` asks a running server (known answers, prompt perplexity, degenerate output, exact
length) and judges (``check_server`` -> ``SanityReport``); ``reference.py`` is the optional CPU
forward pass of the same weights; ``detect.py`` holds the degenerate-output detectors;
``gate.py`` is the gate that ``doctor`` and ``sweep`` run first (``doctor_gate``,
``SanityBroken``). The command, which may launch a variant first, is a flow
(``ceiling.flows.sanity``). See docs/sanity.md.
"""

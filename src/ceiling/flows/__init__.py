"""The flow layer: each command that runs several libraries in order lives here, and only here.

Below this layer the libraries do one job each and never import a flow or the CLI (the import
contract, ``tests/test_import_contract.py``): ``bench`` measures, ``run`` starts and stops
processes, ``probe`` reads the box, ``sanity`` asks known questions, ``engines`` knows the
engines, ``envcheck`` checks an environment, ``deploy`` renders and writes service files,
``diagnose`` decides (facts -> findings -> attribution -> verdict, no I/O), ``report`` renders.
A flow sequences them, records each stage and writes its result.

One naming pattern: each flow module's entry point is ``run(...)`` returning the result noun.

=================  ===========================================================================
module             ``run(...)``
=================  ===========================================================================
``doctor``         ``run(DoctorConfig, report) -> DoctorResult``: preflight, launch, inspect,
                   sanity, hardware, predict, bench, attribute, verdict (one ``_*_stage``
                   function per stage); ``doctor_checks``: its inputs, checked first;
                   ``hardware``, ``target``, ``flag_hypotheses``: its I/O helpers
``sweep``          ``run(plan, out_dir, ...) -> SweepResult``: preflight every variant, trials
                   (``sweep_trial``: launch, sanity, bench; locally or on Ray), the ledger, the
                   report
``preflight``      ``run(Variant) -> PreflightReport``: the engine's flag check
                   (``engines.preflight.check_variant``) + ``ceiling env`` of its Python;
                   ``run_files(paths) -> PreflightRun`` for ``ceiling preflight``
``launch``         ``run(Variant, ...)``: preflight, start, wait until ready, serve until Ctrl-C
``sanity``         ``run(SanityConfig) -> SanityReport``: inputs, launch a ``--variant`` (or take
                   ``--url``), what it serves, the sanity checks
``deploy``         ``run(variant_path, out, ...) -> DeployResult``: render, write, validate
=================  ===========================================================================

The libraries' own entry points: ``predict.api.predict``, ``bench.runner.run_bench``,
``sanity.checks.check_server``, ``probe.commands`` (``probe_to``, ``commbench_to``,
``calibrate_to``, ``telemetry_to``), ``diagnose.logs.inspect_with_gpu``,
``envcheck.check.env_report``, ``report.render`` / ``report.render_file``.
"""

"""predict's validation harness, apart from the product (issue 40).

Scores ``ceiling predict`` against published and recorded measurements: the decode rows
(:mod:`validation.calibration`, its nouns :mod:`validation.calibration_report`), the honest
accounting of those rows (:mod:`validation.accounting`), and the batch curve against
aiconfigurator-core's end-to-end records (:mod:`validation.batch_validation`, read by
:mod:`validation.silicon`). No command reaches it, so a pip install of ceiling does not ship it:
it imports ``ceiling``, never the reverse (tests/test_import_contract.py). The scripts under
``experiments/validation/`` and the tests run it from the repository root (pytest's
``pythonpath``).
"""

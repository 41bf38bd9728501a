"""Sweeps: a plan of variants run one after another, with a durable ledger and early stop.

``plan`` reads plan files, ``ledger`` is the SQLite record, ``early_stop`` decides when a
variant cannot beat the baseline, ``runner`` runs trials locally or on a Ray cluster.
"""

"""Sweeps: a plan of variants run one after another, with a durable ledger and early stop.

``plan`` reads plan files, ``ledger`` is the SQLite record, ``early_stop`` decides when a
variant cannot beat the baseline, ``trial`` runs one variant (here or as a Ray task) and
``runner`` drives the sweep and keeps the ledger.
"""

"""Pure policies: checkpoint retention plans, egress prices, quotes and guard decisions.

Modules here compute from their inputs and never touch the network, the state DB or the disk
(the shipped price table is package data). The I/O around them lives in ``backend.ledger`` and
the feature modules.
"""

"""Durable jobs on nodes (launch, re-attach, cancel, lost detection) and the s5cmd pull kind."""

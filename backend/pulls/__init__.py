"""``loadmaster pull``: copy s3:// objects into a directory on nodes with s5cmd, as durable jobs.

Console side: :mod:`~backend.pulls.plan` (list, probe, price: the plan shown before launch, with
:mod:`~backend.pulls.model`, :mod:`~backend.pulls.listing` and :mod:`~backend.pulls.fanout`) and
:mod:`~backend.pulls.launch` (one job per node). Node side: the ``pull`` job kind
(:mod:`~backend.pulls.job`, :mod:`~backend.pulls.destination`, :mod:`~backend.pulls.verify`,
:mod:`~backend.pulls.integrity`). Both: :mod:`~backend.pulls.objects`. A relay pull (one copy from
the store, fanned out between peers) is :mod:`backend.pulls.relay`.
"""

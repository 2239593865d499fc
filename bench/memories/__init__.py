"""Long-term memories measured: ``python -m bench.memories``.

Two jobs, each on a private server of its own (``bench.common``):

- at scale (``--memories 100000 --users 1000``): saves through ``POST
  /v1/agent/memories/batch`` (saves/s, and how many the service merged as duplicates),
  an agent's whole store of as many memories of its own copied inside PostgreSQL
  (``store``), then the latency of ``POST /v1/agent/memories/search`` over HTTP for one
  user's memories and for the whole store, per mode (``scale``). Texts: ``texts``.
- on LoCoMo (``--locomo ../shared/bench/locomo/locomo-dev.json``): each sample's
  observations saved as memories of one user, its questions searched among them, and the
  evidence turns the returned memories cite scored like ``bench.locomo``'s message search,
  which runs beside it on the same questions (``locomo``); then the hybrid fusion weights
  for memories compared in-process (``sweep``).

``report`` prints the tables and writes the JSON (``bench-results/``). ``python -m
bench.memories.breakdown --data-dir DIR`` times each statement of a search in-process,
against a server a run kept (``--keep-server``).
"""

"""Benchmarks of memsvc, run against a live server over its HTTP API.

Every benchmark either starts a private ``memsvc serve`` of its own (a fresh data directory,
embedded PostgreSQL, a free port, an agent API key made with ``memsvc apikey create``) and
stops it at the end, or talks to a running server given with ``--url`` and ``--api-key``.
Results are printed as a table and written as JSON under ``bench-results/`` (git-ignored).

- ``python -m bench.locomo``: retrieval quality and latency of ``/v1/agent/search/messages``
  on the LoCoMo development split (``../shared/bench/locomo/locomo-dev.json``, read in place,
  never copied into the repository)::

      .venv/bin/python -m bench.locomo --data ../shared/bench/locomo/locomo-dev.json \\
          --mode hybrid --mode semantic --mode keyword

  Add ``--keep-server`` to leave the loaded server running; it prints a URL and a key to
  re-evaluate with ``--url URL --api-key KEY --skip-load``. ``--limit-questions N`` makes a
  quick run. ``python -m bench.locomo --help`` lists everything.

- ``python -m bench.search``: search latency, ingest and embedding throughput at scale
  (``--messages 100000``); most of the corpus is copied straight into PostgreSQL
  (``bench.message_copy``: binary COPY in the columns of the Message model).

- ``python -m bench.memories``: long-term memories, saved and searched at scale
  (``--memories 100000 --users 1000``; an agent's whole store copied inside PostgreSQL),
  and retrieval through LoCoMo's observations beside message search, with the hybrid
  weights compared in-process (``--locomo ../shared/bench/locomo/locomo-dev.json``).

- ``python -m bench.tool_records``: the memory bank (issue 17): tokens the model receives
  per step of a 30-step synthetic tool task (``bench.tool_task``) with and without
  ``learning(strategy="memory_bank")``, and tool record search latency at 10,000 records.

- ``python -m bench.learning``: the latency ``learning()`` adds to a model call (the test
  suite's stand-in LLM, plain calls and calls inside a block in alternating rounds), sync
  and async, back to back and with a pause between calls; ``--compare PATH`` times another
  client module beside it.

- ``python -m bench.mcp``: the MCP server's ``memory_search`` round trip with the SDK's
  client, over streamable HTTP (``/mcp``) and over stdio (``memsvc mcp``), beside the REST
  search of the same queries (``--memories 10000 --calls 1000``).

``bench.common`` holds what the benchmarks share: the private server, waiting for health and
for the embedding backlog, API calls that fail with the status and body, percentiles, and
writing results. A benchmark on LoCoMo reads the data with ``bench.locomo.dataset`` and
scores rankings with ``bench.locomo.metrics``.
"""

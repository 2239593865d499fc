"""LoCoMo retrieval benchmark: does ``/v1/agent/search/messages`` find the turns that answer
a question?

Each LoCoMo sample (one long two-person conversation) becomes one agent conversation titled
with its ``sample_id``; each turn becomes one ``user`` message whose ``authorName`` is the
speaker and whose metadata keeps ``dia_id`` and the session number. Then every question of
categories 1-4 (5, adversarial, has no answer in the conversation) is searched in its own
conversation in each ``--mode``, and the top 10 messages are compared with the question's
evidence turns: hit@5, recall@5, recall@10 and MRR, overall and per category, plus the
search latency. See ``../shared/bench/locomo/README.md`` for the data and the baselines.

Choices:

- A turn that shares a photo has its BLIP caption appended: ``"<text> [shares a photo:
  <caption>]"`` (the caption is often what a question asks about).
- ``createdAt`` is the session's date (``"1:56 pm on 8 May, 2023"``, read as UTC) plus one
  second per turn, so turns keep distinct, ordered times (sessions are hours apart at least).
- Evidence ids are normalised (``"D:11:26"`` -> ``"D11:26"``, ``"D30:05"`` -> ``"D30:5"``,
  ``"D8:6; D9:17"`` -> both); pieces that are no turn id (``"D"``) or name no loaded turn are
  dropped and counted; a question left with no evidence is skipped and counted.
- Before the timed searches a few warm-up searches per mode (not counted) load the embedding
  model in the web workers, so the latencies are of a warm server.
- Appends carry an ``Idempotency-Key`` so a dropped connection can be retried safely.

Exit status: 0 done; 1 the benchmark failed (server, API); 2 bad arguments or no data file
(the data is not in the repository: absent data is a usage problem, not a pass); 130 Ctrl-C.

Run from the checkout: ``.venv/bin/python -m bench.locomo --help``.

The package, one job a module: ``dataset`` reads the file (samples, sessions, turns,
questions, observations); ``load`` puts it into memsvc through the agent API (or finds what
a previous run loaded); ``evaluate`` chooses the questions, searches them and scores the
results with ``metrics`` (hit@k, recall@k, reciprocal rank, means per category: pure
functions); ``report`` prints the tables and writes the JSON; ``__main__`` is the command.
Another benchmark on LoCoMo imports ``dataset`` and ``metrics`` rather than copying them.
"""

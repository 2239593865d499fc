"""Corpus statistics for keyword ranking.

Messages carry their own search data (``Message.embedding`` and the generated
``search_vector``). Ranking keywords well needs to know how rare a word is (BM25's inverse
document frequency), which PostgreSQL's ``ts_rank`` ignores; these two tables keep those
counts. They are updated when a message is embedded (so they lag new messages by the same
seconds as vectors do), counted down when an embedded message is deleted (a conversation, a
user's erase), and rebuilt from scratch by ``memsvc reindex``.
"""

from django.db import models


class TermStat(models.Model):
    """How many messages contain a lexeme (of the ``english`` text search configuration)."""

    lexeme = models.TextField(primary_key=True)
    document_count = models.BigIntegerField()

    class Meta:
        db_table = "search_term_stat"

    def __str__(self) -> str:
        return f"{self.lexeme}: {self.document_count}"


class CorpusStat(models.Model):
    """One row: the number of messages counted and their total length in lexeme positions."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1, editable=False)
    document_count = models.BigIntegerField(default=0)
    total_length = models.BigIntegerField(default=0)

    class Meta:
        db_table = "search_corpus_stat"
        constraints = [
            models.CheckConstraint(condition=models.Q(id=1), name="corpus_stat_single_row")
        ]

    def __str__(self) -> str:
        return f"{self.document_count} messages"

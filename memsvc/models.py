"""Tables of the service itself (not of a feature app)."""

from django.db import models


class RateLimitCounter(models.Model):
    """One rate-limit bucket's count in its current window (``memsvc.api.ratelimit``), when
    the database keeps the counts (local mode): every process of the service counts in the
    same row. The table is UNLOGGED (migration 0001): counts are worth no WAL and may be lost
    in a crash."""

    bucket = models.CharField(primary_key=True, max_length=400)
    window_start = models.BigIntegerField()  # seconds since the epoch
    hits = models.IntegerField()

    class Meta:
        db_table = "rate_limit_counter"

    def __str__(self) -> str:
        return f"{self.bucket}: {self.hits}"

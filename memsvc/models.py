"""Tables of the service itself (not of a feature app)."""

from django.db import models
from django.utils import timezone

from memsvc.api.principals import PRINCIPAL_MAX_LENGTH


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


IDEMPOTENCY_KEY_MAX_LENGTH = 255


class IdempotentRequest(models.Model):
    """The result of a request sent with an ``Idempotency-Key``: a retry gets it back.
    ``result_ids`` are the ids of the rows it wrote, in order: messages, or tool records
    (``request_hash`` tells the kinds of request apart: ``memsvc.api.idempotency``)."""

    principal_id = models.CharField(max_length=PRINCIPAL_MAX_LENGTH)
    key = models.CharField(max_length=IDEMPOTENCY_KEY_MAX_LENGTH)
    request_hash = models.CharField(max_length=64)
    result_ids = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        db_table = "idempotent_request"
        constraints = [
            models.UniqueConstraint(fields=["principal_id", "key"], name="idempotency_key_unique")
        ]

    def __str__(self) -> str:
        return f"{self.principal_id}: {self.key}"


class WorkerSeen(models.Model):
    """When a Celery worker last finished a task of a queue (``memsvc.celery.worker_seen``):
    health's answer to whether anything takes the tasks sent (a reachable broker says
    nothing of that). UNLOGGED (migration 0003), as the counters: a crash may lose it, the
    next task writes it again."""

    queue = models.CharField(primary_key=True, max_length=200)
    seen_at = models.DateTimeField()

    class Meta:
        db_table = "worker_seen"

    def __str__(self) -> str:
        return f"{self.queue}: {self.seen_at}"

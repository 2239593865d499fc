"""Reads of the search app."""

from conversations.models import Message


def pending_embedding_count() -> int:
    """Messages waiting for an embedding (counted on the partial index ``message_unembedded``)."""
    return Message.objects.filter(embedded_at__isnull=True).count()

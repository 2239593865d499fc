"""Small database expressions shared by the models of every app."""

from django.db import models
from django.db.models.lookups import Exact


def json_is_object(field: str, name: str) -> models.CheckConstraint:
    """A check constraint: the JSON column ``field`` holds an object (not a list or a scalar)."""
    return models.CheckConstraint(
        condition=Exact(
            models.Func(models.F(field), function="jsonb_typeof", output_field=models.TextField()),
            "object",
        ),
        name=name,
    )

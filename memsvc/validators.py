"""Validators shared by the models of every app."""

from django.core.exceptions import ValidationError


def no_nul_characters(value: str) -> None:
    """PostgreSQL cannot store NUL in text; refuse it with a clear message instead of a 500."""
    if "\x00" in value:
        raise ValidationError("must not contain NUL characters", code="nul_character")

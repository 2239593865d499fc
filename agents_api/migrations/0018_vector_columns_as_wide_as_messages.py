"""The memory and tool record vector columns as wide as the messages'.

0004 and 0009 made them ``vector(384)`` whatever ``MEMORY_EMBEDDING_DIMENSION`` said (the
width of the development machine's model was written into them), so with any other model
(Ollama's and OpenAI's defaults make 768 and 1536) every memory and tool record saved
failed. A column of another width than ``message.embedding`` is made as wide: its rows
cannot hold a vector of the configured model, so whatever they hold is dropped and they
wait for the sweep (``embedded_at`` cleared).
"""

from django.db import migrations

TABLES = ("memory", "tool_record")


def widths(cursor) -> dict[str, int]:
    cursor.execute(
        "SELECT attrelid::regclass::text, atttypmod FROM pg_attribute "
        "WHERE attrelid = ANY(%s::regclass[]) AND attname = 'embedding'",
        [["message", *TABLES]],
    )
    return dict(cursor.fetchall())


def as_wide_as_messages(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        found = widths(cursor)
        for table in TABLES:
            if found[table] != found["message"]:
                # (ALTER TABLE waits for no deferred check: none is left pending.)
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(
                    f"UPDATE {table} SET embedding = NULL, embedding_model = '', "  # noqa: S608 (ours)
                    "embedded_at = NULL WHERE embedding IS NOT NULL"
                )
                cursor.execute(
                    f"ALTER TABLE {table} ALTER COLUMN embedding "
                    f"TYPE vector({found['message']}) USING NULL"
                )


class Migration(migrations.Migration):
    dependencies = [
        ("agents_api", "0017_idempotent_request_result_ids"),
        ("conversations", "0005_title_one_line"),
    ]

    operations = [migrations.RunPython(as_wide_as_messages, migrations.RunPython.noop)]

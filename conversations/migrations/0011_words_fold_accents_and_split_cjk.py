"""The words index folds accents ("cafe" finds "café") and reads Chinese and Japanese
character by character (a run of them, written without spaces, was one word: "東京" found
only a message that said nothing else): the ``memsvc`` text search configuration (english
with ``unaccent``) and ``memsvc_words`` (``memsvc.db.TEXT_SEARCH_CONFIG``, ``WORDS_SQL``),
and the messages' ``search_vector`` made with them. The table is rewritten once, its
indexes built again (README, "Production"; docs/benchmarks.md, "Words in any accent")."""

import django.contrib.postgres.indexes
from django.db import migrations, models

from memsvc.db import words_column, words_column_replaced

# Each CJK symbol, kana (full and half width) and Chinese character (those beyond the first
# 65,536 too) becomes a word of its own. Hangul is left whole: Korean separates its words
# with spaces.
WORDS = r"""
CREATE EXTENSION IF NOT EXISTS unaccent;
CREATE TEXT SEARCH CONFIGURATION memsvc (COPY = english);
ALTER TEXT SEARCH CONFIGURATION memsvc
    ALTER MAPPING FOR hword, hword_part, word WITH unaccent, english_stem;
CREATE FUNCTION memsvc_words(text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN regexp_replace(
        $1,
        '([\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f\U00020000-\U0003ffff])',
        ' \1 ', 'g'
    );
"""
UNDO = "DROP FUNCTION memsvc_words(text); DROP TEXT SEARCH CONFIGURATION memsvc;"


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0010_message_written_for"),
    ]

    operations = [
        migrations.RunSQL(WORDS, reverse_sql=UNDO),
        *words_column_replaced(
            "message",
            words_column("author_name", models.Value(": "), "content"),
            django.contrib.postgres.indexes.GinIndex(
                fields=["search_vector"], name="message_search_vector", fastupdate=False
            ),
        ),
    ]

"""The words index reads "<" as the character it is (``memsvc.db.MARKUP_STAND_IN``):
PostgreSQL's parser took it for the start of markup, and skipped what looked like a tag
("<div>", "b and c" of "a<b and c>d") and all that followed an unclosed "<script" or
"<style": code and formulas in messages were lost to keyword search, and to highlights.
``memsvc_words`` hands the parser a noncharacter for each "<" (a blank to it), and the
messages' ``search_vector`` is made again with it: the table is rewritten once, its indexes
built again, as by 0011 (README, "Production")."""

import django.contrib.postgres.indexes
from django.db import migrations, models

from memsvc.db import words_column, words_column_replaced

_CJK = (
    r"'([\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
    r"\U00020000-\U0003ffff])'"
)
_WORDS = """
CREATE OR REPLACE FUNCTION memsvc_words(text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN regexp_replace({text}, {cjk}, ' \\1 ', 'g');
"""
# (and the stand-in itself, were a text to hold it, a U+FFFD: never taken back for a "<")
WORDS = _WORDS.format(text="translate($1, U&'<\\FDD0', U&'\\FDD0\\FFFD')", cjk=_CJK)
UNDO = _WORDS.format(text="$1", cjk=_CJK)


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0011_words_fold_accents_and_split_cjk"),
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

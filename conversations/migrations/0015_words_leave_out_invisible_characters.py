"""The words index reads a word with an invisible character inside it as the word it shows:
"infor\u00admation" (a soft hyphen), "straw\u200dberry" (a zero-width joiner) were found only
by a query holding the same character (review). ``memsvc_words`` leaves out Unicode's
default-ignorable characters (``memsvc.text.DEFAULT_IGNORABLE``), which draw nothing: a
zero-width space too ("Lu\u200bigi" shows "Luigi"); queries are read alike
(``memsvc.db.websearch_text``). The
messages' ``search_vector`` is made again with it: the table is rewritten once, its indexes
built again, as by 0011 and 0012 (README, "Production")."""

import django.contrib.postgres.indexes
from django.db import migrations, models

from memsvc.db import words_column, words_column_replaced

_CJK = (
    r"'([\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
    r"\U00020000-\U0003ffff])'"
)
_IGNORABLE = (
    r"'[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    r"\U0001d173-\U0001d17a\U000e0000-\U000e0fff]'"
)
_WORDS = """
CREATE OR REPLACE FUNCTION memsvc_words(text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN regexp_replace({text}, {cjk}, ' \\1 ', 'g');
"""
# A "<" the stand-in, the stand-in a U+FFFD (0012); the default-ignorable characters left
# out.
WORDS = _WORDS.format(
    text=f"regexp_replace(translate($1, U&'<\\FDD0', U&'\\FDD0\\FFFD'), {_IGNORABLE}, '', 'g')",
    cjk=_CJK,
)
UNDO = _WORDS.format(text="translate($1, U&'<\\FDD0', U&'\\FDD0\\FFFD')", cjk=_CJK)


REMADE = words_column_replaced(
    "message",
    words_column("author_name", models.Value(": "), "content"),
    django.contrib.postgres.indexes.GinIndex(
        fields=["search_vector"], name="message_search_vector", fastupdate=False
    ),
)


class Migration(migrations.Migration):
    dependencies = [
        ("conversations", "0014_old_processes_insert_without_the_new_columns"),
    ]

    # The function changed between the column's drop and its return, both ways: migrated
    # back, the column came back while the new function was still in place, and the words
    # index read every row the new way under the old function (review).
    dropped, added = REMADE[:2], REMADE[2:]
    operations = [*dropped, migrations.RunSQL(WORDS, reverse_sql=UNDO), *added]

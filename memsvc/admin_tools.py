"""Pieces shared by the admin pages of every app: they must stay fast at millions of rows."""

import contextlib
import json
import uuid
from collections import Counter

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.options import TO_FIELD_VAR
from django.contrib.admin.utils import NestedObjects, quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import FieldDoesNotExist, ValidationError
from django.core.paginator import Paginator
from django.db import router, transaction
from django.db.models.constants import LOOKUP_SEP
from django.forms.fields import InvalidJSONInput
from django.shortcuts import redirect
from django.urls import NoReverseMatch, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import capfirst

from memsvc import validators
from memsvc.api.errors import NotFound
from memsvc.api.fields import METADATA_MAX_BYTES, json_value_problem
from memsvc.api.parsers import FIELD_MAX_JSON_DEPTH, json_problem, too_deep
from memsvc.api.principals import Principal

# Above this many matching rows the admin says "10,000+" pages instead of counting them all.
COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """Counts at most ``COUNT_CAP + 1`` rows (``SELECT count(*) FROM (... LIMIT n)``).

    Django's admin counts the whole filtered queryset for its page links; on a table of
    millions of messages that full COUNT is the slowest part of the page. Pages past the
    cap stay reachable with ``?p=``; search and filters narrow the list.
    """

    @cached_property
    def count(self) -> int:
        return self.object_list[: COUNT_CAP + 1].count()


def metadata_object(value) -> None:
    """A ``metadata`` as the APIs take it (``MetadataField`` in a parsed body): an object of
    at most 16 KiB, without NUL characters, nested no deeper than a body's field may be
    (``json_problem``: 65 levels were saved, and the owner's export of it was refused by
    every import; review)."""
    problem = json_problem(value, FIELD_MAX_JSON_DEPTH)
    if problem:
        raise ValidationError(problem[1])
    problem = json_value_problem(value, max_bytes=METADATA_MAX_BYTES, objects_only=True)
    if problem:
        raise ValidationError(problem)


class MetadataFormField(forms.JSONField):
    """Django's, refusing a value nested deeper than Python's decoder goes (thousands of
    levels) as one too deep, where its ``RecursionError`` was a 500; ``metadata_object``
    refuses the rest."""

    def to_python(self, value):
        try:
            return super().to_python(value)
        except RecursionError:
            raise ValidationError(too_deep(FIELD_MAX_JSON_DEPTH)) from None

    def bound_data(self, data, initial):
        """The refused form shown again, as sent: too deep for the decoder, or holding what
        cannot be written out again (a lone surrogate: a 500 page; review)."""
        try:
            value = super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
        if not isinstance(value, InvalidJSONInput) and json_problem(value, FIELD_MAX_JSON_DEPTH):
            return InvalidJSONInput(data)
        return value


class MetadataChecked:
    """An admin whose form's ``metadata`` is checked as the APIs check it: a NUL escape was
    a 500 (PostgreSQL refuses it in jsonb), and 40 KB were saved past the 16 KiB cap.
    ``metadata_checked``: the check (``metadata_object``, or a model's own)."""

    metadata_checked = staticmethod(metadata_object)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "metadata":
            kwargs["form_class"] = MetadataFormField
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "metadata" and field is not None:
            field.validators.append(self.metadata_checked)
        return field


# The lookups the admin's own filters and links write in a list's query (``?channel__exact=``,
# ``?revoked_at__isempty=``, ``?agent__id__exact=``). Any other that the query named reached
# PostgreSQL with what the query held: ``content__regex=(``, ``expires_at__year=99999``,
# ``content__trigram_similar=`` were 500s, and a regular expression over every message.
ADMIN_LOOKUPS = frozenset({"exact", "iexact", "in", "isnull", "isempty", "gt", "gte", "lt", "lte"})


def lookups_named(model, lookup: str) -> list[str]:
    """What ``lookup`` (a list's query parameter) asks of the field it names, through its
    relations: ``agent__name__iregex`` -> ``["iregex"]``. Nothing for a parameter that names
    no field (a list filter's own, ``?embedded=``)."""
    parts = lookup.split(LOOKUP_SEP)
    for index, part in enumerate(parts):
        try:
            # (``pk`` names the primary key to a queryset, not to ``get_field``: its lookups
            # went unchecked, ``?pk__regex=``; review)
            field = model._meta.pk if part == "pk" else model._meta.get_field(part)
        except FieldDoesNotExist:
            return parts[index:] if index else []
        if not field.is_relation:
            return parts[index + 1 :]
        model = field.related_model
    return []


class Checked:
    """A ModelAdmin mixin, for memsvc's admins and Django's own (logins, groups) alike.

    An action's selection must name rows of the table by their ids. Django filters by what
    the form sent, and the action reading it was a 500 for an id the table cannot hold
    ("xyz" of a UUID key, 50 digits of an integer one, a NUL; review); now it is the
    admin's "nothing changed" notice, as for no selection.

    A list's query takes only the lookups its own filters write (``ADMIN_LOOKUPS``), and
    none of ``secret_fields`` (a key's HMAC, read a hex digit at a time through
    ``?secret_hmac__gte=``: review)."""

    secret_fields: tuple[str, ...] = ()

    def lookup_allowed(self, lookup, value, request=None):
        named = lookups_named(self.model, lookup)
        if len(named) > 1 or not ADMIN_LOOKUPS.issuperset(named):
            return False  # (Django answers 400: DisallowedModelAdminLookup)
        if lookup.split(LOOKUP_SEP)[0] in self.secret_fields:
            return False
        return super().lookup_allowed(lookup, value, request)

    def response_action(self, request, queryset):
        key = self.model._meta.pk
        try:
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                validators.no_nul_characters(value)
                key.clean(value, None)
        except ValidationError:
            self.message_user(
                request,
                "The selection names no rows of this list: no items have been changed.",
                messages.WARNING,
            )
            return None
        return super().response_action(request, queryset)


# How many rows of each kind a deletion's confirmation page lists under one row (the rest
# counted in a line, all counted in its summary).
DELETION_ROWS_SHOWN = 20


class _ShownNestedObjects(NestedObjects):
    """Django's rows a deletion takes, nested, but at most ``DELETION_ROWS_SHOWN`` of a kind
    under one row, and of the rows selected: a conversation of 20,000 messages made a page
    of 3 MB in 3.1 s, one of an agent of 50,000 memories 7.4 MB in 6.1 s, 20,000 messages
    selected 4.9 MB in 5.4 s (reviews), and more would have met the web processes' 30 s
    before the operator saw the button."""

    def nested(self, format_callback=None):
        seen = set()
        return self._some_of(self.edges.get(None, ()), seen, format_callback)

    def _nested(self, obj, seen, format_callback):
        if obj in seen:
            return []
        seen.add(obj)
        children = self._some_of(self.edges.get(obj, ()), seen, format_callback)
        return [format_callback(obj), *([children] if children else [])]

    def _some_of(self, rows, seen, format_callback) -> list:
        """``rows`` nested, at most ``DELETION_ROWS_SHOWN`` of a kind, the others counted."""
        nested, shown, more = [], Counter(), Counter()
        for row in rows:
            if row in seen:
                continue
            if shown[row._meta] < DELETION_ROWS_SHOWN:
                shown[row._meta] += 1
                nested.extend(self._nested(row, seen, format_callback))
            else:
                more[row._meta] += 1
        return nested + [
            f"… and {count:,} more {opts.verbose_name_plural}" for opts, count in more.items()
        ]


class ShownValues:
    """An admin (or an inline) whose forms tell what the operator changed from what the page
    showed them (each field's shown value sent back hidden beside it), not from the row as
    it is once the page is posted: a change landing meanwhile (the API's, another
    operator's) was undone by a save that did not touch it (review). A text is kept as
    typed, as the APIs keep it (a title's spaces were cut by a save that did not touch it:
    review)."""

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if field is not None:
            field.show_hidden_initial = True
            if isinstance(field, forms.CharField):
                field.strip = False
        return field


def _logged(request, objects, action_flag: int, message) -> list:
    """The admin's log entries (``LogEntry``, as Django's ``log_actions`` writes them) of an
    action on ``objects``, each naming its row by its kind and id, never by its text (written
    so at once: a text written and then replaced stays in the table's old row versions)."""
    entries = [
        LogEntry(
            user_id=request.user.pk,
            content_type_id=ContentType.objects.get_for_model(obj, for_concrete_model=False).pk,
            object_id=obj.pk,
            object_repr=f"{obj._meta.verbose_name} {obj.pk}"[:200],
            action_flag=action_flag,
            change_message=json.dumps(message) if isinstance(message, list) else message,
        )
        for obj in objects
    ]
    return LogEntry.objects.bulk_create(entries)


class ModelAdmin(ShownValues, Checked, admin.ModelAdmin):
    """Django's, taking in a list's query only the lookups its own filters write, and an
    action's selection only of ids (``Checked``); a deletion's confirmation lists a few rows
    of each kind under a row, and counts them all (``_ShownNestedObjects``); a row refused
    by what it is (``deletion_refused``) is refused with the reason."""

    # The admin's log ("Recent actions", kept for good) names a row by its kind and id, not
    # by its text: a message's first words, a title, a user's id stayed there after that
    # user's erase (review).
    def log_addition(self, request, obj, message):
        return _logged(request, [obj], ADDITION, message)[0]

    def log_change(self, request, obj, message):
        return _logged(request, [obj], CHANGE, message)[0]

    def log_deletions(self, request, queryset):
        return _logged(request, queryset, DELETION, "")

    def deletion_refused(self, obj) -> str | None:
        """Why ``obj`` is not deleted whatever the operator may do (a read-only block: its
        flag cleared first), or None. Said on the confirmation of a deletion that would take
        it (``templates/admin/delete_confirmation.html``), and on its own delete page to whom
        may delete such rows (Django's said "your account doesn't have permission" to a
        superuser, or answered a bare 403: review)."""
        return None

    def has_delete_permission(self, request, obj=None):
        refused = obj is not None and self.deletion_refused(obj)
        return not refused and super().has_delete_permission(request, obj)

    def delete_view(self, request, object_id, extra_context=None):
        # (Only to whom Django's own view would answer: the reason told a staff user who may
        # not delete such rows that this one exists: code review.)
        to_field = request.POST.get(TO_FIELD_VAR, request.GET.get(TO_FIELD_VAR))
        obj = None
        if super().has_delete_permission(request) and (
            to_field is None or self.to_field_allowed(request, to_field)
        ):
            obj = self.get_object(request, unquote(object_id), to_field)
        refused = obj is not None and self.deletion_refused(obj)
        if not refused:
            return super().delete_view(request, object_id, extra_context)
        self.message_user(
            request, f"{capfirst(self.opts.verbose_name)} not deleted: {refused}.", messages.ERROR
        )
        return redirect(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_change",
            quote(obj.pk),
        )

    def get_deleted_objects(self, objs, request):
        """Django's ``admin.utils.get_deleted_objects``, with ``_ShownNestedObjects``."""
        if not objs:
            return [], {}, set(), []
        collector = _ShownNestedObjects(using=router.db_for_write(self.model), origin=objs)
        collector.collect(objs)
        # Every row taken asked, shown or not (some are refused by what they are, a read-only
        # block: checked on the rows shown alone, an agent whose 26th block was read-only
        # was deleted with it; code review).
        perms_needed = set()
        for model, rows in collector.model_objs.items():
            if not self.admin_site.is_registered(model):
                continue
            model_admin = self.admin_site.get_model_admin(model)
            refused = [row for row in rows if not model_admin.has_delete_permission(request, row)]
            # (Django's own admins, the users' and groups', say no reason.)
            reason = getattr(model_admin, "deletion_refused", lambda row: None)
            reasons = sorted({reason(row) for row in refused} - {None})
            if refused:
                name = model._meta.verbose_name
                perms_needed.add(f"{name} ({'; '.join(reasons)})" if reasons else name)

        def shown(obj) -> str:
            opts = obj._meta
            if not self.admin_site.is_registered(type(obj)):
                return f"{capfirst(opts.verbose_name)}: {obj}"
            try:
                url = reverse(
                    f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
                    args=[quote(obj.pk)],
                )
            except NoReverseMatch:
                return f"{capfirst(opts.verbose_name)}: {obj}"
            return format_html('{}: <a href="{}">{}</a>', capfirst(opts.verbose_name), url, obj)

        counts = {
            model._meta.verbose_name_plural: len(rows)
            for model, rows in collector.model_objs.items()
        }
        protected = [shown(obj) for obj in collector.protected]
        return collector.nested(shown), counts, perms_needed, protected


class ReadOnlyAdmin(ModelAdmin):
    """Rows to look at: the admin neither adds, changes nor deletes them."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class LargeTableAdmin(ModelAdmin):
    """A ModelAdmin for tables that grow without bound. Its ``search_fields`` name ids by
    their exact value (``principal_id__exact``: an index's), not Django's ``=principal_id``
    (``UPPER(principal_id) = UPPER(...)``, which no index serves: 142 ms a search at 400,000
    memberships, and ``Alice`` found ``alice``'s rows; review), and texts by their words."""

    paginator = CappedCountPaginator
    show_full_result_count = False
    list_per_page = 50


class DeletedByService:
    """A ModelAdmin mixin for rows a service deletes one at a time (locks, what goes with
    them): ``delete_one(request, obj)``, for the delete page and the delete action, whose
    selection goes in one transaction. One deleted meanwhile (two operators confirming at
    once) is gone, as asked: the service's 404 was a 500 page (review)."""

    def delete_one(self, request, obj) -> None:
        raise NotImplementedError

    def delete_model(self, request, obj):
        with contextlib.suppress(NotFound):
            self.delete_one(request, obj)

    @transaction.atomic
    def delete_queryset(self, request, queryset):
        for obj in queryset.order_by("pk"):
            with contextlib.suppress(NotFound), transaction.atomic():
                self.delete_one(request, obj)


def asking_to_confirm(request) -> bool:
    """Whether ``get_deleted_objects`` is asked for a deletion's confirmation page (the
    delete page's, or the delete action's), not for the deletion confirmed (``post``)."""
    return not request.POST.get("post")


def said_before_deleting(model_admin, request, message: str) -> None:
    """``message`` (a warning) on a deletion's confirmation page; not once it is confirmed,
    when it would be shown after the deletion."""
    if asking_to_confirm(request):
        model_admin.message_user(request, message, messages.WARNING)


def merged_deletions(parts):
    """What several ``get_deleted_objects`` answers delete, as one answer for a
    confirmation page (a deletion that a service makes with what goes with it)."""
    deleted, counts, perms_needed, protected = [], {}, set(), []
    for part_deleted, part_counts, part_perms, part_protected in parts:
        deleted += part_deleted
        for name, count in part_counts.items():
            counts[name] = counts.get(name, 0) + count
        perms_needed |= part_perms
        protected += part_protected
    return deleted, counts, perms_needed, protected


class EmbeddedFilter(admin.SimpleListFilter):
    """Rows with a vector, or still waiting for one (``embedded_at``)."""

    title = "embedded"
    parameter_name = "embedded"

    def lookups(self, request, model_admin):
        return (("yes", "yes"), ("no", "no (pending)"))

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(embedded_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(embedded_at__isnull=True)
        return queryset


def as_uuid(term: str) -> uuid.UUID | None:
    """A search term that is an id, as one (searched by primary key, not by text)."""
    return validators.as_uuid(term.strip())


def operator(request) -> Principal:
    """The principal an admin change is made as: an operator is a user of the web pages,
    their username the principal id."""
    return Principal.user(request.user.get_username())

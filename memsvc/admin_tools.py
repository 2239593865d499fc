"""Pieces shared by the admin pages of every app: they must stay fast at millions of rows."""

import contextlib
import json
import uuid
from dataclasses import dataclass, field
from functools import reduce
from itertools import islice
from operator import or_ as operator_or

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.admin.options import TO_FIELD_VAR
from django.contrib.admin.utils import model_ngettext, quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import FieldDoesNotExist, PermissionDenied, ValidationError
from django.core.paginator import EmptyPage, Paginator
from django.db import transaction
from django.db.models import CASCADE, PROTECT, RESTRICT, Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.db.models.deletion import get_candidate_relations_to_delete
from django.forms.fields import InvalidJSONInput
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, reverse
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.text import capfirst
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from memsvc import validators
from memsvc.api.errors import NotFound
from memsvc.api.fields import METADATA_MAX_BYTES, json_value_problem
from memsvc.api.parsers import FIELD_MAX_JSON_DEPTH, json_problem, too_deep
from memsvc.api.principals import Principal

# Above this many matching rows the admin says "10,000+" pages instead of counting them all.
COUNT_CAP = 10_000


class AtLeast(int):
    """A count past ``COUNT_CAP``, written "10,000+" wherever a page shows it (the list's
    total, "Select all ...", a search's results), where it showed 10001 as the total of a
    table of 133,000 rows (review); a number to compare and to page by."""

    def __str__(self) -> str:
        return f"{COUNT_CAP:,}+"


class CappedCountPaginator(Paginator):
    """Counts at most ``COUNT_CAP + 1`` rows (``SELECT count(*) FROM (... LIMIT n)``,
    without the list's order, which sorted the whole table to count it by a column no
    index serves: 1 s at 133,000 messages; review).

    Django's admin counts the whole filtered queryset for its page links; on a table of
    millions of messages that full COUNT is the slowest part of the page. Past the cap the
    count is ``AtLeast``, and pages past the last linked stay reachable with ``?p=``
    (Django sent them back to the first page: review); search and filters narrow the list.
    """

    @cached_property
    def count(self) -> int:
        count = self.object_list.order_by()[: COUNT_CAP + 1].count()
        return AtLeast(count) if count > COUNT_CAP else count

    def validate_number(self, number):
        if not isinstance(self.count, AtLeast):
            return super().validate_number(number)
        try:
            return super().validate_number(number)
        except EmptyPage:
            number = int(number)
            if number < 1 or not self.object_list[(number - 1) * self.per_page :].exists():
                raise
            return number

    def page(self, number):
        if not isinstance(self.count, AtLeast):
            return super().page(number)
        # (Django's ends the last page at the count, which is no row's place here.)
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        return self._get_page(self.object_list[bottom : bottom + self.per_page], number, self)


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


# How many tables deep a deletion's cascade is followed (memsvc's goes four deep at most: an
# agent, its blocks, their revisions); a table's relation to itself (forks of forks) is
# followed to its end.
CASCADE_MAX_DEPTH = 8


@dataclass
class _Cascade:
    """What deleting some rows takes along, by model, each as the querysets that reach its
    rows (a conversation's forks by their group and by their parent: the rows of a model
    are their union, ``rows``); and what refuses it, by (model, ``PROTECT`` or
    ``RESTRICT``)."""

    taken: dict = field(default_factory=dict)
    blocking: dict = field(default_factory=dict)

    def rows(self, model) -> QuerySet:
        reached = [Q(pk__in=queryset.values("pk")) for queryset in self.taken[model]]
        return model._base_manager.filter(reduce(operator_or, reached)).order_by("pk")

    def blockers(self, model, on_delete) -> QuerySet:
        """The rows of ``model`` that refuse the deletion: all that ``PROTECT``, those that
        ``RESTRICT`` unless they go too (a fork made at a message deleted with it), as
        Django's collector decides."""
        reached = [Q(pk__in=q.values("pk")) for q in self.blocking[model, on_delete]]
        blocking = model._base_manager.filter(reduce(operator_or, reached))
        if on_delete is RESTRICT and model in self.taken:
            blocking = blocking.exclude(pk__in=self.rows(model).values("pk"))
        return blocking.order_by("pk")


def _cascade(rows: QuerySet) -> _Cascade:
    """What deleting ``rows`` takes along, counted by the database, not loaded: Django's
    collector loaded every row a deletion takes, as objects, to list them (an agent of
    60,000 memories: 43 s; every message of a table selected: 64 s and 3.6 GB; review),
    where the page shows a few of each kind and counts the rest. Each relation's rows are a
    subquery of its parent's; a relation of a table to itself (a conversation's forks) is
    read as ids, level by level (no subquery a hundred deep for a chain of forks). An
    ``on_delete`` that keeps the rows (``SET_NULL``, memsvc's own such as
    ``kept_about_the_owner``) takes nothing."""
    cascade = _Cascade()
    todo = [(rows.model, rows, 0)]
    seen: dict = {}  # model -> the ids read already of a relation to itself
    while todo:
        model, queryset, depth = todo.pop()
        cascade.taken.setdefault(model, []).append(queryset)
        if depth >= CASCADE_MAX_DEPTH:
            continue
        for relation in get_candidate_relations_to_delete(model._meta):
            on_delete = relation.field.remote_field.on_delete
            related = relation.related_model._base_manager.filter(
                **{f"{relation.field.name}__in": queryset}
            )
            if on_delete in (PROTECT, RESTRICT):
                key = (relation.related_model, on_delete)
                cascade.blocking.setdefault(key, []).append(related)
            elif on_delete is CASCADE:
                deeper = depth + 1
                if relation.related_model is model:
                    known = seen.setdefault(model, set())
                    ids = set(related.values_list("pk", flat=True)) - known
                    if not ids:
                        continue
                    known |= ids
                    related, deeper = model._base_manager.filter(pk__in=ids), depth
                todo.append((relation.related_model, related, deeper))
    return cascade


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


def _log_entry(request, model, pk, action_flag: int, message) -> LogEntry:
    """The admin's log entry (``LogEntry``, as Django's ``log_actions`` writes one) of an
    action on the row ``pk`` of ``model``, naming it by its kind and id, never by its text
    (written so at once: a text written and then replaced stays in the table's old row
    versions)."""
    return LogEntry(
        user_id=request.user.pk,
        content_type_id=ContentType.objects.get_for_model(model, for_concrete_model=False).pk,
        object_id=pk,
        object_repr=f"{model._meta.verbose_name} {pk}"[:200],
        action_flag=action_flag,
        change_message=json.dumps(message) if isinstance(message, list) else message,
    )


class ModelAdmin(ShownValues, Checked, admin.ModelAdmin):
    """Django's, taking in a list's query only the lookups its own filters write, and an
    action's selection only of ids (``Checked``); a deletion's confirmation lists a few rows
    of each kind under a row, and counts them all (``get_deleted_objects``); a row refused
    by what it is (``deletion_refused``) is refused with the reason."""

    # The admin's log ("Recent actions", kept for good) names a row by its kind and id, not
    # by its text: a message's first words, a title, a user's id stayed there after that
    # user's erase (review).
    def log_addition(self, request, obj, message):
        entry = _log_entry(request, obj, obj.pk, ADDITION, message)
        entry.save()
        return entry

    def log_change(self, request, obj, message):
        entry = _log_entry(request, obj, obj.pk, CHANGE, message)
        entry.save()
        return entry

    def log_deletions(self, request, queryset):
        """One entry a row, as Django's, written from the rows' ids (the rows were loaded
        whole, every message's text, for a deletion of a whole table: review)."""
        ids = (
            queryset.values_list("pk", flat=True).iterator(chunk_size=LOG_BATCH)
            if isinstance(queryset, QuerySet)
            else iter([obj.pk for obj in queryset])  # (the delete page's one row)
        )
        while batch := list(islice(ids, LOG_BATCH)):
            LogEntry.objects.bulk_create(
                _log_entry(request, self.model, pk, DELETION, "") for pk in batch
            )

    # Rows never deleted here whatever the operator may do, and why (a read-only block: its
    # flag cleared first): ``Q(read_only=True), "it is read-only: ..."``. One rule, asked of
    # one row (``deletion_refused``) and of a deletion's cascade (``deletion_refused_among``).
    deletion_refusal: tuple[Q, str] | None = None
    # Models whose ``deletion_refusal`` does not hold for rows deleted with this admin's (an
    # owner's membership goes with its group); their delete permission is still asked.
    goes_along: tuple[type, ...] = ()

    def deletion_refused(self, obj) -> str | None:
        """Why ``obj`` is not deleted (``deletion_refusal``), or None. Said on the
        confirmation of a deletion that would take it
        (``templates/admin/delete_confirmation.html``), and on its own delete page to whom
        may delete such rows (Django's said "your account doesn't have permission" to a
        superuser, or answered a bare 403: review)."""
        return self.deletion_refused_among(type(obj)._base_manager.filter(pk=obj.pk))

    def deletion_refused_among(self, rows: QuerySet) -> str | None:
        """``deletion_refused`` of any of ``rows`` (a deletion's cascade): None, or why."""
        if self.deletion_refusal is None:
            return None
        refused, why = self.deletion_refusal
        return why if rows.filter(refused).exists() else None

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
        """Django's ``admin.utils.get_deleted_objects``, counted (``_cascade``): under the
        rows chosen, at most ``DELETION_ROWS_SHOWN`` of a kind listed, the rest counted in a
        line, all counted in the summary. Every kind of row taken is asked its delete
        permission, and its refusal by what it is (``deletion_refused_among``), listed or
        not (an agent whose 26th block was read-only was deleted with it; code review)."""
        if not isinstance(objs, QuerySet):
            if not objs:
                return [], {}, set(), []
            objs = type(objs[0])._base_manager.filter(pk__in=[obj.pk for obj in objs])
        cascade = _cascade(objs)
        counts, perms_needed, chosen, below = {}, set(), [], []
        for model in cascade.taken:
            rows = cascade.rows(model)
            count = rows.count()
            if not count:
                continue
            opts = model._meta
            counts[opts.verbose_name_plural] = count
            (chosen if model is objs.model else below).extend(
                self._some_of(rows, count, opts.verbose_name_plural)
            )
            if not self.admin_site.is_registered(model):
                continue
            model_admin = self.admin_site.get_model_admin(model)
            # (Django's own admins, the users' and groups', say no reason.)
            refused_among = getattr(model_admin, "deletion_refused_among", lambda rows: None)
            reason = None if model in self.goes_along else refused_among(rows)
            if reason is not None or not model_admin.has_delete_permission(request):
                name = opts.verbose_name
                perms_needed.add(f"{name} ({reason})" if reason else name)
        protected = []
        for model, on_delete in cascade.blocking:
            blockers = cascade.blockers(model, on_delete)
            count = blockers.count()
            if count:
                protected += self._some_of(blockers, count, model._meta.verbose_name_plural)
        return [*chosen, *([below] if below else [])], counts, perms_needed, protected

    def _some_of(self, rows: QuerySet, count: int, plural: str) -> list[str]:
        """The first ``DELETION_ROWS_SHOWN`` of ``rows`` as links to their pages, then
        how many more."""
        shown = [self._shown(obj) for obj in rows[:DELETION_ROWS_SHOWN]]
        more = count - len(shown)
        return shown + ([f"… and {more:,} more {plural}"] if more > 0 else [])

    def _shown(self, obj) -> str:
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


@admin.action(
    permissions=["delete"], description=gettext_lazy("Delete selected %(verbose_name_plural)s")
)
def delete_selected(modeladmin, request, queryset):
    """Django's delete action (``admin.actions.delete_selected``), for any number of rows:
    a selection of every row of the list ("Select all") is confirmed as that, the list's
    search and filters, not as a hidden field per row (133,000 of them: a page of 13 MB, and
    past 1,000 its confirmation was refused by ``DATA_UPLOAD_MAX_NUMBER_FIELDS``, 400:
    review); the rows are counted, not loaded (Django's ``len(queryset)``)."""
    opts = modeladmin.model._meta
    most = getattr(modeladmin, "deleted_at_once_max", None)
    if most is not None and queryset[: most + 1].count() > most:
        modeladmin.message_user(
            request,
            f"At most {most:,} {opts.verbose_name_plural} are deleted at once here (each as "
            "the API deletes it, with what goes with it): narrow the list with its search "
            "or filters. Nothing was deleted.",
            messages.ERROR,
        )
        return None
    deletable, counts, perms_needed, protected = modeladmin.get_deleted_objects(queryset, request)
    if request.POST.get("post") and not protected:
        if perms_needed:
            raise PermissionDenied
        count = queryset.count()
        if count:
            # Logged with the deletion, or not at all (a deletion that failed was logged as
            # done: code review).
            with transaction.atomic():
                modeladmin.log_deletions(request, queryset)
                modeladmin.delete_queryset(request, queryset)
            modeladmin.message_user(
                request,
                _("Successfully deleted %(count)d %(items)s.")
                % {"count": count, "items": model_ngettext(opts, count)},
                messages.SUCCESS,
            )
        return None
    objects_name = model_ngettext(queryset)
    across = request.POST.get("select_across") == "1"
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": _("Cannot delete %(name)s") % {"name": objects_name}
        if perms_needed or protected
        else _("Delete multiple objects"),
        "subtitle": None,
        "objects_name": str(objects_name),
        "deletable_objects": [deletable],
        "model_count": counts.items(),
        "across": across,
        "count": counts.get(opts.verbose_name_plural, 0),
        # (Across, one row named, as Django's list asks an action: the list is the rest.)
        "selected": queryset.values_list("pk", flat=True)[: 1 if across else None],
        "perms_lacking": perms_needed,
        "protected": protected,
        "opts": opts,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "media": modeladmin.media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, "admin/delete_selected_confirmation.html", context)


# Log entries written at once by a deletion of many rows.
LOG_BATCH = 1_000
# The most rows a list's delete action takes where each is deleted by a service of its own
# (``DeletedByService``), in one transaction: "Select all" of 300,000 memberships would have
# held the web process past its time limits (code review).
DELETED_ONE_AT_A_TIME_MAX = 1_000


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
    selection goes in one transaction, of at most ``deleted_at_once_max`` rows. One deleted
    meanwhile (two operators confirming at once) is gone, as asked: the service's 404 was a
    500 page (review)."""

    deleted_at_once_max = DELETED_ONE_AT_A_TIME_MAX

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

import contextlib
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from rest_framework import serializers

from agents_api.letta_api.serializers import letta_settings_checked
from agents_api.models import (
    AGENT_DESCRIPTION_MAX_CHARS,
    BLOCK_DESCRIPTION_MAX_CHARS,
    GIVEN_NAME_RULES,
    Agent,
    ApiKey,
    Memory,
    MemoryBlock,
    MemoryBlockRevision,
    Scope,
    ToolRecord,
    UserErasure,
    UserMemorySetting,
)
from agents_api.services import (
    agent_delete,
    api_key_create,
    api_key_revoke,
    memories_delete,
    memory_block_delete,
    memory_delete,
    tool_records_delete,
)
from agents_api.services.letta import without_letta_settings
from agents_api.services.messages import local_conversation_renamed
from agents_api.sleeptime import with_place_kept
from conversations.models import Conversation, Membership
from conversations.selectors import groups_owned_by
from memsvc.admin_tools import (
    DeletedByService,
    EmbeddedFilter,
    LargeTableAdmin,
    MetadataChecked,
    ModelAdmin,
    ReadOnlyAdmin,
    as_uuid,
    merged_deletions,
    metadata_object,
    operator,
)
from memsvc.api.errors import NotFound, as_api_error
from memsvc.api.principals import agent_owner_problem
from memsvc.db import words_query
from memsvc.validators import path_segment


def _id_words_or_exact(queryset, search_term: str, exact_field: str):
    """An admin search of a searchable corpus: a row's id, else the words of its full-text
    index, or the exact value of ``exact_field``."""
    term = search_term.strip()
    if not term:
        return queryset
    row_id = as_uuid(term)
    if row_id is not None:
        return queryset.filter(id=row_id)
    return queryset.filter(Q(search_vector=words_query(term)) | Q(**{exact_field: term}))


class AgentFilter(admin.SimpleListFilter):
    """Rows of one agent (Django's address for it, ``agent__id__exact``).

    The agent is chosen by clicking its name in the list, or on the agent's own page, not
    from a menu of every agent: there may be many thousands, read on every page.
    """

    title = "agent"
    parameter_name = "agent__id__exact"

    def lookups(self, request, model_admin):
        # The one chosen, else none: a filter without a choice is left out, and so would
        # its value be (every row shown for an agent that is no more).
        if self.value() is None:
            return []
        agent_id = as_uuid(self.value())
        agent = Agent.objects.filter(pk=agent_id).only("name").first() if agent_id else None
        return [(self.value(), agent.name if agent else self.value())]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        return queryset.filter(agent_id=as_uuid(self.value()))  # none for what is no id


class AgentColumn:
    """A ModelAdmin mixin: the ``agent_link`` column, a row's agent as a link to the list of
    that agent's rows (``AgentFilter``)."""

    @admin.display(description="agent")
    def agent_link(self, row):
        query = urlencode({AgentFilter.parameter_name: row.agent_id})
        return format_html('<a href="?{}">{}</a>', query, row.agent)


class AgentForm(forms.ModelForm):
    """An agent as the APIs make one: a local agent's name is the last segment of its
    routes (``/agents/{name}``, ``memsvc mcp --agent``), so it holds no "/" (the local API's
    own rule), or no route would reach it; its Letta settings are as the Letta API keeps them
    (``letta_settings_checked``: ``{"letta": {"tags": 5}}`` made every Letta list a 500). A
    new one's owner is a user, as ``memsvc apikey create --owner`` takes it (``local``: the
    local API's)."""

    # Its owner is who reaches it through the Letta routes (``letta_agents``): given to
    # another agent's principal, that agent's key listed and changed it (outside review).
    # No API moves an agent to another owner; the admin names one only for a new agent.
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.instance._state.adding and "owner_principal" in self.fields:
            self.fields["owner_principal"].disabled = True

    def clean_owner_principal(self):
        owner = self.cleaned_data["owner_principal"]
        problem = agent_owner_problem(owner) if self.instance._state.adding else None
        if problem is not None:
            raise ValidationError(problem)
        return owner

    def clean_name(self):
        """Named as every API names an agent (``AgentNameField``): one line, no blank at
        either end, no "/" and not "." or "..", a segment of its routes (the admin took
        "bot\u2028x" and "a/b" for an agent of a user's, which no API makes: review). A
        name kept as it was is not checked again."""
        name = self.cleaned_data["name"]
        if self.instance._state.adding or "name" in self.changed_data:
            for rule in (path_segment, *GIVEN_NAME_RULES):
                rule(name)
        return name

    def clean(self):
        data = super().clean()
        if isinstance(data.get("metadata"), dict):
            try:
                data["metadata"] = letta_settings_checked(data["metadata"])
            except serializers.ValidationError as exc:
                self.add_error("metadata", as_api_error(exc).message)
        return data


def agent_metadata(value) -> None:
    """An agent's ``metadata`` as its APIs take it: the client's own part as any metadata
    (``metadata_object``), its Letta settings apart (``AgentForm``): a system prompt of 50,000
    characters, which Letta's routes take, counted against the 16 KiB of the client's, and
    such an agent could not be renamed in the admin (review)."""
    metadata_object(without_letta_settings(value) if isinstance(value, dict) else value)


@admin.register(Agent)
class AgentAdmin(MetadataChecked, DeletedByService, ModelAdmin):
    form = AgentForm
    metadata_checked = staticmethod(agent_metadata)
    list_display = ("name", "id", "owner_principal", "created_at")
    search_fields = ("name", "owner_principal__exact")
    # The agent's own conversation and its trust from loopback are the services' to set
    # (``local_conversation_for``, the local API's keyless agents, cleared by a key): an
    # agent pointed at another conversation would show its messages on the local API.
    readonly_fields = (
        "id",
        "principal_id",
        "created_at",
        "local_conversation",
        "loopback_trusted",
        "kept",
    )

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        # As Letta's routes take one (they show it: megabytes were read on each; review).
        if db_field.name == "description":
            kwargs["max_length"] = AGENT_DESCRIPTION_MAX_CHARS
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    # Renamed as Letta's route renames one: its own conversation's title, which names it,
    # follows (``local_conversation_renamed``; the save's UPDATE holds the agent's row lock
    # that it asks for). The form refuses a name its owner has already.
    def save_model(self, request, obj, form, change):
        if not change:
            super().save_model(request, obj, form, change)
            return
        # The sleeptime observer's place as it is now, read under the agent's row lock (the
        # observer's claims and give-backs take it): Letta's settings as its API takes them
        # hold none, and the metadata read when the page was posted undid a claim landing
        # meanwhile, and the turns were read again (reviews).
        # Only what the operator changed (another operator's rename landing meanwhile was
        # undone by a save of the description: review).
        with transaction.atomic():
            current = Agent.objects.select_for_update().get(pk=obj.pk)
            obj.metadata = with_place_kept(obj.metadata, current)
            if form.changed_data:
                obj.save(update_fields=form.changed_data)
            obj.refresh_from_db()  # (as it is now: the page's values of the rest are stale)
        if "name" in form.changed_data:
            local_conversation_renamed(obj, old_name=current.name)

    # Deleted as Letta's route deletes one: with its own conversation (``agent_delete``),
    # which the confirmation lists as the conversation's own would (with its group, forks
    # and messages), beside what cascades from the agent.
    def delete_one(self, request, obj):
        agent_delete(operator(request), agent=obj)

    @admin.display(description="what it keeps")
    def kept(self, agent):
        if agent._state.adding:
            return "-"
        query = urlencode({AgentFilter.parameter_name: agent.pk})
        return format_html_join(
            ", ",
            '<a href="{}?{}">{}</a>',
            (
                (reverse(f"admin:agents_api_{model}_changelist"), query, label)
                for model, label in [
                    ("memoryblock", "memory blocks"),
                    ("memory", "memories"),
                    ("toolrecord", "tool records"),
                ]
            ),
        )

    def get_deleted_objects(self, objs, request):
        # (``agent_delete``'s: the conversations of the groups it owns, its own one among
        # them, and its memberships of others' groups, which the page did not list, nor ask
        # the permission to delete: review)
        owned, elsewhere = Q(pk__in=[]), Q(pk__in=[])
        for agent in objs:
            groups = groups_owned_by(agent.principal_id)
            owned |= Q(group__in=groups)
            elsewhere |= Q(principal_id=agent.principal_id) & ~Q(group__in=groups)
        conversations = Conversation.objects.filter(owned).select_related("group")
        memberships = Membership.objects.filter(elsewhere).select_related("group")
        parts = [super().get_deleted_objects(objs, request)]
        for model, rows in ((Conversation, conversations), (Membership, memberships)):
            if rows:
                model_admin = self.admin_site.get_model_admin(model)
                parts.append(model_admin.get_deleted_objects(rows, request))
        return merged_deletions(parts)


class RevisionInline(admin.TabularInline):
    model = MemoryBlockRevision
    extra = 0
    fields = ("created_at", "actor_principal", "value")
    readonly_fields = fields
    can_delete = False
    ordering = ("-created_at",)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(MemoryBlock)
class MemoryBlockAdmin(AgentColumn, DeletedByService, LargeTableAdmin):
    list_display = ("label", "agent_link", "user_id", "size", "limit", "read_only", "updated_at")
    list_filter = (AgentFilter, "read_only")
    list_select_related = ("agent",)
    search_fields = ("label", "user_id__exact", "agent__name")
    raw_id_fields = ("agent",)
    # A block's value changes through the services (a revision for each change, the limit
    # held): here its value and limit are read, its description and read-only flag set.
    readonly_fields = (
        "agent",
        "user_id",
        "label",
        "value",
        "limit",
        "awaiting_attach",
        "created_at",
        "updated_at",
    )
    inlines = (RevisionInline,)

    def has_add_permission(self, request):
        return False

    # Deleted as the API deletes one (``memory_block_delete``: locked, so a change in
    # progress ends first); a read-only block only once its flag is cleared here (Django
    # refuses a selection holding one whole, and the agent it is of).
    deletion_refusal = (Q(read_only=True), "it is read-only: clear its “read only” flag first")

    def delete_one(self, request, obj):
        memory_block_delete(operator(request), block=obj)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "description":  # as the API takes one
            kwargs["max_length"] = BLOCK_DESCRIPTION_MAX_CHARS
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        """Only what the form changed (the description, the read-only flag) is saved: the
        rest, as read when the page was posted, would undo a service's change landing
        meanwhile (a value kept as a revision, then silently gone). Not through
        ``memory_block_update``, which changes no read-only block nor its flag, and refuses
        an operator a block of a user who turned memory off."""
        if form.changed_data:
            obj.updated_at = timezone.now()
            obj.save(update_fields=[*form.changed_data, "updated_at"])

    @admin.display(description="chars")
    def size(self, block):
        return len(block.value)


@admin.register(MemoryBlockRevision)
class MemoryBlockRevisionAdmin(LargeTableAdmin):
    list_display = ("block", "actor_principal", "created_at")
    list_select_related = ("block",)
    raw_id_fields = ("block",)
    search_fields = ("actor_principal__exact",)

    # A block's history is what its writers did (the services record it): read here, never
    # written (an added or edited revision told of a change nobody made).
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class NewApiKeyForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        initial=[Scope.READ, Scope.WRITE],
    )

    class Meta:
        model = ApiKey
        fields = ("agent", "name", "scopes")


@admin.register(ApiKey)
class ApiKeyAdmin(ModelAdmin):
    """Keys are made here through the same service as ``memsvc apikey create``; the secret is
    shown once, in the confirmation message, and never stored."""

    list_display = ("prefix", "agent", "name", "scope_list", "created_at", "last_used_at", "state")
    list_select_related = ("agent",)
    secret_fields = ("secret_hmac",)
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("public_id__exact", "agent__name", "name")
    raw_id_fields = ("agent",)
    readonly_fields = ("public_id", "prefix", "scopes", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke",)

    def get_form(self, request, obj=None, **kwargs):
        if obj is None:
            kwargs["form"] = NewApiKeyForm
        return super().get_form(request, obj, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("agent", "name", "scopes")
        return ("agent", "name", *self.readonly_fields)

    def get_readonly_fields(self, request, obj=None):
        return ("agent", *self.readonly_fields) if obj else ()

    def save_model(self, request, obj, form, change):
        if change:
            if "name" in form.changed_data:  # (else the page's, stale: code review)
                obj.save(update_fields=["name"])
            return
        api_key, full_key = api_key_create(
            agent=form.cleaned_data["agent"],
            scopes=form.cleaned_data["scopes"],
            name=form.cleaned_data["name"],
        )
        obj.pk = api_key.pk
        obj.refresh_from_db()
        messages.warning(
            request, f"The new key is shown only now; copy it: {full_key}", extra_tags="api-key"
        )

    @admin.display(description="scopes")
    def scope_list(self, api_key):
        return ", ".join(api_key.scopes)

    @admin.display(description="state")
    def state(self, api_key):
        return "active" if api_key.is_active else f"revoked {api_key.revoked_at:%Y-%m-%d}"

    @admin.action(description="Revoke the selected keys")
    def revoke(self, request, queryset):
        for api_key in queryset.filter(revoked_at__isnull=True):
            api_key_revoke(api_key=api_key)
        self.message_user(request, f"revoked at {timezone.now():%Y-%m-%d %H:%M}")


class TagFilter(admin.SimpleListFilter):
    """Memories carrying one tag (the GIN index on tags answers it).

    Tags are chosen by clicking one in the list, not from a menu of every tag: listing the
    distinct tags would read the whole table on every page.
    """

    title = "tag"
    parameter_name = "tag"

    def lookups(self, request, model_admin):
        tag = request.GET.get(self.parameter_name)
        return [(tag, tag)] if tag else []

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(tags__contains=[self.value()])
        return queryset


@admin.register(Memory)
class MemoryAdmin(AgentColumn, LargeTableAdmin):
    """Long-term memories, to inspect and delete.

    Read-only otherwise: a change of text must go through ``memory_update``, which keeps the
    duplicate check, the content hash and the vector in step with it (the agent API does).
    """

    list_display = (
        "short_content",
        "agent_link",
        "user_id",
        "tag_links",
        "importance",
        "access_count",
        "last_accessed_at",
        "expires_at",
        "source",
        "embedded",
    )
    list_filter = (AgentFilter, "source", TagFilter, EmbeddedFilter)
    list_select_related = ("agent",)
    # Searched through the full-text index, or by exact user id; see get_search_results.
    search_fields = ("content",)
    search_help_text = "Words of the memory or its summary (full-text), a user id, or a memory id."
    exclude = ("embedding",)  # 384 floats are no use to read
    readonly_fields = ("id", "created_at")
    # The memories prune reaches first. Also what the expiry index serves: newest first
    # would sort the whole table for every page (created_at has no index of its own).
    ordering = ("expires_at",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*Memory.SEARCH_DATA)

    def get_search_results(self, request, queryset, search_term):
        return _id_words_or_exact(queryset, search_term, "user_id"), False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        with contextlib.suppress(NotFound):  # (deleted meanwhile: gone, as asked)
            memory_delete(operator(request), memory=obj)

    def delete_queryset(self, request, queryset):
        memories_delete(operator(request), memories=queryset)

    @admin.display(description="content")
    def short_content(self, memory):
        return Truncator(memory.content).chars(80)

    @admin.display(description="tags")
    def tag_links(self, memory):
        return format_html_join(
            ", ", '<a href="?{}">{}</a>', ((urlencode({"tag": t}), t) for t in memory.tags)
        )

    @admin.display(description="embedded", boolean=True)
    def embedded(self, memory):
        return memory.embedded_at is not None


@admin.register(ToolRecord)
class ToolRecordAdmin(AgentColumn, LargeTableAdmin):
    """Tool records of the memory bank, to inspect and delete. Read-only otherwise: the
    summary and its vector are the observer's to keep in step."""

    list_display = (
        "tool_name",
        "agent_link",
        "task_id",
        "step",
        "short_summary",
        "summary_source",
        "embedded",
        "created_at",
    )
    list_filter = (AgentFilter, "summary_source", EmbeddedFilter)
    list_select_related = ("agent",)
    search_fields = ("summary",)
    search_help_text = (
        "Words of the summary, the tool's name or its raw output (full-text), a task id, "
        "or a trace id."
    )
    exclude = ("embedding",)
    readonly_fields = ("id", "created_at")
    # A task's records in order, as the index ``tool_record_task`` holds them.
    ordering = ("agent", "task_id", "created_at", "id")

    def get_queryset(self, request):
        return super().get_queryset(request).defer(*ToolRecord.SEARCH_DATA)

    def get_search_results(self, request, queryset, search_term):
        return _id_words_or_exact(queryset, search_term, "task_id"), False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def delete_model(self, request, obj):
        tool_records_delete(operator(request), records=ToolRecord.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        tool_records_delete(operator(request), records=queryset)

    @admin.display(description="summary")
    def short_summary(self, record):
        return Truncator(record.summary).chars(80)

    @admin.display(description="embedded", boolean=True)
    def embedded(self, record):
        return record.embedded_at is not None


@admin.register(UserMemorySetting)
class UserMemorySettingAdmin(ReadOnlyAdmin):
    """Read-only: a user turns memory on or off themselves (the memory page). Nor deleted
    here: no row is memory on."""

    list_display = ("user_id", "memory_enabled", "updated_at")
    list_filter = ("memory_enabled",)
    search_fields = ("user_id",)


@admin.register(UserErasure)
class UserErasureAdmin(ReadOnlyAdmin):
    """Who was erased, and when (``UserErasure``): read-only, as what an erase keeps."""

    list_display = ("user_id", "erased_at", "restored_at")
    search_fields = ("user_id",)

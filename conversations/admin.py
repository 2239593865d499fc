"""Admin pages for inspecting conversations and messages.

Message lists stay fast at millions of rows: no full COUNT (``LargeTableAdmin``), one join
for the conversation column, search through the GIN-indexed full-text column instead of
``ILIKE``, and foreign keys as raw ids instead of select boxes of every row.
"""

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator

from conversations import selectors
from conversations.models import (
    AccessLevel,
    Conversation,
    ConversationGroup,
    Membership,
    Message,
    OwnershipTransfer,
)
from conversations.services import (
    conversation_delete,
    conversation_groups_delete,
    conversation_update,
    membership_create_by_operator,
    membership_delete,
    messages_delete,
)
from memsvc.admin_tools import (
    DELETED_ONE_AT_A_TIME_MAX,
    DeletedByService,
    EmbeddedFilter,
    LargeTableAdmin,
    MetadataChecked,
    ShownValues,
    as_uuid,
    asking_to_confirm,
    merged_deletions,
    operator,
    said_before_deleting,
)
from memsvc.api.errors import InvalidInput
from memsvc.api.principals import principal_for_sharing
from memsvc.db import words_query
from memsvc.validators import one_line


def _admin_link(obj, label=None):
    if obj is None:
        return "-"
    url = reverse(f"admin:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    return format_html('<a href="{}">{}</a>', url, label or obj)


OWNER_STAYS = "an owner's membership stays as it is: ownership moves by a transfer"


class MembershipForm(forms.ModelForm):
    """A membership as the services allow it: the one owner's stays, no second owner is
    made (the database refuses both, as a 500 without this); a member is never moved to
    another principal or group (a member removed, but not as ``membership_delete`` removes
    one: an offer of ownership to them would stand). A new one is added as sharing adds it
    (``save_membership``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            for name in ("principal_id", "group"):
                if name in self.fields:
                    self.fields[name].disabled = True

    def clean_principal_id(self):
        """A new member as the API's sharing takes one (``principal_for_sharing``): a user id
        no user can have (a control character, ``agent:`` of no agent) is refused, an
        agent's id is stored in its one form."""
        principal_id = self.cleaned_data["principal_id"]
        if self.instance.pk:
            return principal_id
        try:
            return principal_for_sharing(principal_id, field="principal_id")
        except InvalidInput as refusal:
            raise ValidationError(refusal.details["principal_id"]) from None

    def clean(self):
        data = super().clean()
        # The row as it is now, locked until the save (the admin's change is one
        # transaction): an owner made meanwhile, a transfer accepted, is one whatever the page
        # showed (``has_changed`` compares with the page, and a save of an unchanged page
        # wrote "reader" over the new owner; code review).
        # (Read only for a row that may be written or is the owner's: the group page's
        # unchanged rows are not saved, and a query each was a query per member.)
        may_write = self.has_changed() or self.instance.access_level == AccessLevel.OWNER
        now = (
            Membership.objects.select_for_update()
            .filter(pk=self.instance.pk)
            .values_list("access_level", flat=True)
            .first()
            if self.instance.pk and may_write
            else None
        )
        if now == AccessLevel.OWNER:
            if data.get("access_level") != AccessLevel.OWNER:
                raise ValidationError(OWNER_STAYS)
        elif data.get("access_level") == AccessLevel.OWNER:
            raise ValidationError({"access_level": OWNER_STAYS})
        return data


def save_membership(request, membership: Membership) -> None:
    """A membership of the admin's form saved: a new one added as sharing adds it
    (``membership_create_by_operator``: the member held against their erase first); a
    change (its level) saved as it is."""
    if not membership._state.adding:
        membership.save(update_fields=["access_level"])  # (what the form may change)
        return
    created = membership_create_by_operator(
        operator(request),
        group_id=membership.group_id,
        principal_id=membership.principal_id,
        access_level=membership.access_level,
    )
    membership.pk, membership._state.adding = created.pk, False


class MembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        super().clean()
        for form in self.deleted_forms:
            if form.instance.access_level == AccessLevel.OWNER:
                raise ValidationError(OWNER_STAYS)


class MembershipInline(ShownValues, admin.TabularInline):
    model = Membership
    form = MembershipForm
    formset = MembershipFormSet
    extra = 0
    fields = ("principal_id", "access_level", "created_at")
    readonly_fields = ("created_at",)


class TransferInline(admin.TabularInline):
    model = OwnershipTransfer
    extra = 0
    fields = ("from_principal", "to_principal", "status", "created_at", "resolved_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(ConversationGroup)
class ConversationGroupAdmin(LargeTableAdmin):
    list_display = ("id", "created_at")
    search_fields = ("memberships__principal_id__exact",)
    readonly_fields = ("id", "created_at", "conversation_tree")
    inlines = (MembershipInline, TransferInline)

    def get_search_results(self, request, queryset, search_term):
        """A group by its id or a member's (a user's id may be a UUID too: code review)."""
        group_id = as_uuid(search_term)
        if group_id is None:
            return super().get_search_results(request, queryset, search_term)
        by_member = queryset.filter(memberships__principal_id=search_term.strip()).values("id")
        return queryset.filter(Q(id=group_id) | Q(id__in=by_member)), False

    def has_add_permission(self, request):
        return False  # a group is made with its first conversation, by the services

    # The owner's membership is never deleted alone (MembershipAdmin), but it goes with its
    # group.
    goes_along = (Membership,)

    # Members removed as the API removes them: an offer of ownership to them ends.
    def save_formset(self, request, form, formset, change):
        if formset.model is not Membership:
            super().save_formset(request, form, formset, change)
            return
        memberships = formset.save(commit=False)  # (deletes nothing itself)
        for membership in formset.deleted_objects:
            membership_delete(operator(request), membership=membership, by_operator=True)
        for membership in memberships:
            save_membership(request, membership)

    def save_model(self, request, obj, form, change):
        pass  # nothing of a group is edited here, and its row is not locked before its members'

    # Deleted as the API deletes.
    def delete_model(self, request, obj):
        conversation_groups_delete(operator(request), group_ids=[obj.pk])

    def delete_queryset(self, request, queryset):
        conversation_groups_delete(
            operator(request), group_ids=list(queryset.values_list("pk", flat=True))
        )

    @admin.display(description="conversations")
    def conversation_tree(self, group):
        conversations = group.conversations.order_by("created_at").select_related(
            "forked_at_message"
        )
        return format_html_join(
            "",
            "<div>{} {}</div>",
            (
                (
                    _admin_link(c),
                    f"(fork at message #{c.forked_at_message.seq})"
                    if c.forked_at_message
                    else ("(fork at the start)" if c.forked_at_conversation_id else "(root)"),
                )
                for c in conversations
            ),
        )


class ConversationForm(forms.ModelForm):
    def clean_title(self):
        """A new title is one line, as the APIs take one (``TitleField``; the admin saved
        "a\u2028b": review); one kept as an import restored it is not checked again."""
        title = self.cleaned_data["title"]
        if "title" in self.changed_data:
            one_line(title)
        return title


@admin.register(Conversation)
class ConversationAdmin(MetadataChecked, LargeTableAdmin):
    form = ConversationForm
    list_display = ("__str__", "id", "group_link", "parent_link", "created_at", "updated_at")
    list_select_related = ("group", "forked_at_conversation")
    search_fields = ("title",)
    # Where a conversation sits (its group, its fork point) is made by the services and
    # never moved: a conversation moved to another group would take its messages out of
    # their members' sight, a fork point moved would change what the fork holds.
    readonly_fields = (
        "id",
        "group",
        "forked_at_conversation",
        "forked_at_message",
        "created_at",
        "updated_at",
        "seen_at",
        "vectorized_at",
        "fork_lineage",
        "messages_link",
    )
    date_hierarchy = None
    ordering = ("-updated_at",)

    def save_model(self, request, obj, form, change):
        """Only what the form changed (its title, its metadata), as the API changes it
        (``conversation_update``): the rest, as read when the page was posted, would undo
        an append's times landing meanwhile."""
        changed = {name: form.cleaned_data[name] for name in form.changed_data}
        if changed:
            conversation_update(operator(request), conversation=obj, as_member=False, **changed)

    def has_add_permission(self, request):
        return False

    # Deleted as the API deletes: with the forks below it that share its messages, a root
    # with its whole group (its confirmation says which forks stay: ``get_deleted_objects``). So a
    # root's deletion is the group's: it needs the group's permission and lists what the
    # group's would.
    def has_delete_permission(self, request, obj=None):
        if obj is not None and obj.forked_at_conversation_id is None:
            return self.admin_site.get_model_admin(ConversationGroup).has_delete_permission(
                request, obj.group
            )
        return super().has_delete_permission(request, obj)

    def get_deleted_objects(self, objs, request):
        """What goes (a root's group; a fork and the forks below it that share its
        messages), and said on the confirmation, the delete page's or the delete action's
        (review: the action's did not say it), which forks below stay (``selectors.
        deletion``), though Django's list names every fork below (it said they went; code
        review)."""
        roots = [c.group for c in objs if c.forked_at_conversation_id is None]
        forks = [c for c in objs if c.forked_at_conversation_id is not None]
        parts = []
        if roots:
            group_admin = self.admin_site.get_model_admin(ConversationGroup)
            parts.append(group_admin.get_deleted_objects(roots, request))
        if forks:
            parts.append(super().get_deleted_objects(forks, request))
        # (The forks of a group whose root is chosen too go with it.)
        going = {c.group_id for c in objs if c.forked_at_conversation_id is None}
        forks_left = [fork for fork in forks if fork.group_id not in going]
        if forks_left and asking_to_confirm(request):
            chosen = {c.pk for c in objs}
            moved = {pk for fork in forks_left for pk in selectors.deletion(fork)[1]} - chosen
            if moved:
                said_before_deleting(
                    self,
                    request,
                    f"{len(moved)} fork(s) below share none of the messages deleted: they "
                    "stay, moved up to where their fork point is, with what was made from "
                    "them, though listed below.",
                )
        return merged_deletions(parts)

    def delete_model(self, request, obj):
        conversation_delete(operator(request), conversation=obj, need=None)

    deleted_at_once_max = DELETED_ONE_AT_A_TIME_MAX  # (one at a time, as DeletedByService)

    def delete_queryset(self, request, queryset):
        for conversation in queryset.order_by("created_at"):
            # An earlier one's deletion may have taken this one along (a fork, a group).
            if type(conversation).objects.filter(pk=conversation.pk).exists():
                conversation_delete(operator(request), conversation=conversation, need=None)

    def get_search_results(self, request, queryset, search_term):
        conversation_id = as_uuid(search_term)
        if conversation_id is not None:
            return queryset.filter(id=conversation_id), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="group")
    def group_link(self, conversation):
        return _admin_link(conversation.group)

    @admin.display(description="forked from")
    def parent_link(self, conversation):
        return _admin_link(conversation.forked_at_conversation)

    @admin.display(description="fork lineage (root first)")
    def fork_lineage(self, conversation):
        # (A query per ancestor walked it: 306 for a chain of 300 forks; review.)
        return format_html_join(
            " &rarr; ",
            "{}",
            ((_admin_link(c),) for c in selectors.conversation_ancestry(conversation)),
        )

    @admin.display(description="messages")
    def messages_link(self, conversation):
        url = reverse("admin:conversations_message_changelist")
        return format_html(
            '<a href="{}?conversation__id__exact={}">own messages</a>', url, conversation.id
        )


@admin.register(Message)
class MessageAdmin(LargeTableAdmin):
    list_display = (
        "seq",
        "short_content",
        "conversation_link",
        "channel",
        "role",
        "visibility",
        "author_name",
        "embedding_info",
        "created_at",
    )
    list_filter = ("channel", "role", "visibility", EmbeddedFilter)
    list_select_related = ("conversation",)
    # Searched through the full-text index; see get_search_results.
    search_fields = ("content",)
    search_help_text = "Words of the message or its speaker (full-text), or a message id."
    raw_id_fields = ("conversation", "parent_message")
    exclude = ("embedding",)
    readonly_fields = (
        "id",
        "seq",
        "embedding_info",
        "embedding_model",
        "embedded_at",
        "fork_lineage",
    )
    ordering = ("-seq",)

    # Messages are written through the APIs (their place and vector follow from the
    # services): here they are read, and deleted.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, _protected = super().get_deleted_objects(objs, request)
        # What protects a message is a fork made at it (``forked_at_message``), and that fork
        # stays: it starts at the history message before instead (``messages_delete``).
        return deleted, counts, perms_needed, []

    # Deleted as an erase deletes a user's messages: their words counted out of the keyword
    # statistics, forks made at one of them moved to the message before.
    def delete_model(self, request, obj):
        messages_delete(operator(request), messages=Message.objects.filter(pk=obj.pk))

    def delete_queryset(self, request, queryset):
        messages_delete(operator(request), messages=queryset)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        message_id = as_uuid(term)
        if message_id is not None:
            return queryset.filter(id=message_id), False
        return queryset.filter(search_vector=words_query(term)), False

    @admin.display(description="content")
    def short_content(self, message):
        return Truncator(message.content).chars(80)

    @admin.display(description="conversation")
    def conversation_link(self, message):
        return _admin_link(message.conversation)

    @admin.display(description="embedding")
    def embedding_info(self, message):
        if message.embedding is None:
            return "pending"
        return f"{message.embedding_model} ({message.embedding_dimension} dims)"

    @admin.display(description="conversation lineage")
    def fork_lineage(self, message):
        return ConversationAdmin.fork_lineage(self, message.conversation)


@admin.register(Membership)
class MembershipAdmin(DeletedByService, LargeTableAdmin):
    form = MembershipForm
    list_display = ("principal_id", "access_level", "group", "created_at")
    list_filter = ("access_level",)
    search_fields = ("principal_id__exact",)
    raw_id_fields = ("group",)

    # (It goes with its group: ``ConversationGroupAdmin.goes_along``.)
    deletion_refusal = (
        Q(access_level=AccessLevel.OWNER),
        "it is the owner's: ownership moves by a transfer",
    )

    def save_model(self, request, obj, form, change):
        if not change or "access_level" in form.changed_data:  # (else the page's, stale)
            save_membership(request, obj)

    # Removed as the API removes a member: an offer of ownership to them ends.
    def delete_one(self, request, obj):
        membership_delete(operator(request), membership=obj, by_operator=True)


@admin.register(OwnershipTransfer)
class OwnershipTransferAdmin(LargeTableAdmin):
    list_display = ("id", "group", "from_principal", "to_principal", "status", "created_at")
    list_filter = ("status",)
    search_fields = ("from_principal__exact", "to_principal__exact")
    raw_id_fields = ("group",)

    # Offered by an owner and answered by the one offered, through the APIs: an offer made
    # or edited here, from anyone to anyone, handed a conversation over once accepted.
    # Deleting a pending one withdraws it.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

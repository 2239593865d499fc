from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from agents_api.models import Agent, ApiKey, MemoryBlock, MemoryBlockRevision, Scope
from agents_api.services import api_key_create, api_key_revoke
from memsvc.admin_tools import LargeTableAdmin


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("name", "id", "owner_principal", "created_at")
    search_fields = ("name", "=owner_principal")
    readonly_fields = ("id", "principal_id", "created_at")


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
class MemoryBlockAdmin(LargeTableAdmin):
    list_display = ("label", "agent", "user_id", "size", "limit", "read_only", "updated_at")
    list_filter = ("read_only",)
    list_select_related = ("agent",)
    search_fields = ("label", "=user_id", "agent__name")
    raw_id_fields = ("agent",)
    readonly_fields = ("created_at", "updated_at")
    inlines = (RevisionInline,)

    @admin.display(description="chars")
    def size(self, block):
        return len(block.value)


@admin.register(MemoryBlockRevision)
class MemoryBlockRevisionAdmin(LargeTableAdmin):
    list_display = ("block", "actor_principal", "created_at")
    list_select_related = ("block",)
    raw_id_fields = ("block",)
    search_fields = ("=actor_principal",)


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
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are made here through the same service as ``memsvc apikey create``; the secret is
    shown once, in the confirmation message, and never stored."""

    list_display = ("prefix", "agent", "name", "scope_list", "created_at", "last_used_at", "state")
    list_select_related = ("agent",)
    list_filter = (("revoked_at", admin.EmptyFieldListFilter),)
    search_fields = ("=public_id", "agent__name", "name")
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

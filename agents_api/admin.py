from django.contrib import admin

from agents_api.models import Agent, MemoryBlock, MemoryBlockRevision
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

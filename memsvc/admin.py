"""Django's own admins of logins and groups, with an action's selection checked as every
admin of memsvc's checks it (``SelectionChecked``)."""

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from memsvc.admin_tools import SelectionChecked


class CheckedUserAdmin(SelectionChecked, UserAdmin):
    def get_readonly_fields(self, request, obj=None):
        # A rename would move the login to another principal and leave what was kept under
        # the old name to whoever takes it next (review): the name is given once.
        fields = super().get_readonly_fields(request, obj)
        return fields if obj is None else (*fields, "username")

    def delete_view(self, request, object_id, extra_context=None):
        """Said on the confirmation: the login goes, what is kept under its name stays, and
        a login made later with that name reaches it (an operator who deleted one and made
        another of the name gave the new person the old one's conversations; review)."""
        user = self.get_object(request, object_id)
        if request.method == "GET" and user is not None:
            self.message_user(
                request,
                f"Deleting the login {user.get_username()!r} leaves what is kept for that "
                "user id (conversations, memberships, memories, blocks): a login made later "
                "with the same name reaches all of it. To remove it, the user erases it "
                "first (POST /v1/user/erase).",
                messages.WARNING,
            )
        return super().delete_view(request, object_id, extra_context)


class CheckedGroupAdmin(SelectionChecked, GroupAdmin):
    pass


for model, model_admin in ((get_user_model(), CheckedUserAdmin), (Group, CheckedGroupAdmin)):
    admin.site.unregister(model)
    admin.site.register(model, model_admin)

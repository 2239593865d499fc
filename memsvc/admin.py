"""Django's own admins of logins and groups, with an action's selection and a list's query
checked as every admin of memsvc's checks them (``Checked``)."""

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from memsvc.admin_tools import Checked, said_before_deleting


class CheckedUserAdmin(Checked, UserAdmin):
    def get_readonly_fields(self, request, obj=None):
        # A rename would move the login to another principal and leave what was kept under
        # the old name to whoever takes it next (review): the name is given once.
        fields = super().get_readonly_fields(request, obj)
        return fields if obj is None else (*fields, "username")

    def get_deleted_objects(self, objs, request):
        """Said on the confirmation (the delete page's and the delete action's: review): the
        login goes, what is kept under its name stays, and a login made later with that name
        reaches it (an operator who deleted one and made another of the name gave the new
        person the old one's conversations; review)."""
        names = [repr(user.get_username()) for user in objs]
        logins = f"the login {names[0]}" if len(names) == 1 else f"the logins {', '.join(names)}"
        said_before_deleting(
            self,
            request,
            f"Deleting {logins} leaves what is kept for each user id (conversations, "
            "memberships, memories, blocks): a login made later with the same name reaches "
            "all of it. To remove it, the user erases it first (POST /v1/user/erase).",
        )
        return super().get_deleted_objects(objs, request)


class CheckedGroupAdmin(Checked, GroupAdmin):
    pass


for model, model_admin in ((get_user_model(), CheckedUserAdmin), (Group, CheckedGroupAdmin)):
    admin.site.unregister(model)
    admin.site.register(model, model_admin)

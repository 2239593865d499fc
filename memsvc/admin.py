"""Django's own admins of logins and groups, with an action's selection checked as every
admin of memsvc's checks it (``SelectionChecked``)."""

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group

from memsvc.admin_tools import SelectionChecked


class CheckedUserAdmin(SelectionChecked, UserAdmin):
    pass


class CheckedGroupAdmin(SelectionChecked, GroupAdmin):
    pass


for model, model_admin in ((get_user_model(), CheckedUserAdmin), (Group, CheckedGroupAdmin)):
    admin.site.unregister(model)
    admin.site.register(model, model_admin)

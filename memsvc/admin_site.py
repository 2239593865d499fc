"""memsvc's admin site: Django's, with a password login that refuses an address locked out
by failed logins (``memsvc.pages.forms``) as the APIs do. It is ``admin.site``
(``memsvc.apps.AdminConfig``)."""

from functools import wraps

from django.contrib import admin

from memsvc.admin_tools import delete_selected
from memsvc.api.ratelimit import auth_check_ended
from memsvc.pages.forms import AdminLoginForm, refused_as_locked_out


class AdminSite(admin.AdminSite):
    login_form = AdminLoginForm

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Every list's delete action, for any number of rows (``admin_tools.delete_selected``).
        self._actions["delete_selected"] = self._global_actions["delete_selected"] = delete_selected

    def login(self, request, extra_context=None):
        return refused_as_locked_out(super().login(request, extra_context))

    def admin_view(self, view, cacheable=False):
        """Django's, ending the count of a credential header's check first
        (``auth_check_ended``): the admin's credential is its session or its password, and
        a header nothing checks held back the address's other requests for the whole view."""
        inner = super().admin_view(view, cacheable)

        @wraps(inner)
        def checked(request, *args, **kwargs):
            auth_check_ended(request)
            return inner(request, *args, **kwargs)

        return checked

"""memsvc's admin site: Django's, with a password login that refuses an address locked out
by failed logins (``memsvc.pages.forms``) as the APIs do. It is ``admin.site``
(``memsvc.apps.AdminConfig``)."""

from django.contrib import admin

from memsvc.pages.forms import AdminLoginForm, refused_as_locked_out


class AdminSite(admin.AdminSite):
    login_form = AdminLoginForm

    def login(self, request, extra_context=None):
        return refused_as_locked_out(super().login(request, extra_context))

from django.apps import AppConfig


class MemsvcConfig(AppConfig):
    name = "memsvc"
    verbose_name = "memsvc"

    def ready(self):
        from django.contrib import admin

        from memsvc import checks  # noqa: F401 (registers them)
        from memsvc.pages.forms import AdminLoginForm

        # The admin's login says when the address is locked out by failed logins.
        admin.site.login_form = AdminLoginForm

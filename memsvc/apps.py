from django.apps import AppConfig


class MemsvcConfig(AppConfig):
    name = "memsvc"
    verbose_name = "memsvc"

    def ready(self):
        from django.contrib import admin
        from django.contrib.auth.signals import user_login_failed

        from memsvc import checks  # noqa: F401 (registers them)
        from memsvc.api.ratelimit import count_login_failure
        from memsvc.pages.forms import AdminLoginForm

        user_login_failed.connect(count_login_failure, dispatch_uid="memsvc.count_login_failure")
        # The admin's login says when the address is locked out by failed logins.
        admin.site.login_form = AdminLoginForm

from django.apps import AppConfig


class MemsvcConfig(AppConfig):
    name = "memsvc"
    verbose_name = "memsvc"

    def ready(self):
        from django.contrib.auth.signals import user_login_failed

        from memsvc.api.ratelimit import count_login_failure

        user_login_failed.connect(count_login_failure, dispatch_uid="memsvc.count_login_failure")

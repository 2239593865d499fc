from django.apps import AppConfig


class MemsvcConfig(AppConfig):
    name = "memsvc"
    verbose_name = "memsvc"

from django.apps import AppConfig


class PagesConfig(AppConfig):
    """The web pages for people (``/app/``): templates in the top-level ``templates/pages``."""

    name = "memsvc.pages"
    label = "pages"

from django.apps import AppConfig


class AgentsApiConfig(AppConfig):
    name = "agents_api"
    verbose_name = "agents"

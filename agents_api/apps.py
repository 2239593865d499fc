from django.apps import AppConfig


class AgentsApiConfig(AppConfig):
    name = "agents_api"
    verbose_name = "agents"

    def ready(self) -> None:
        from agents_api.models import Agent
        from memsvc.api.principals import register_agent_lookup

        register_agent_lookup(lambda agent_id: Agent.objects.filter(id=agent_id).exists())

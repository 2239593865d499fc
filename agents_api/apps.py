from django.apps import AppConfig


class AgentsApiConfig(AppConfig):
    name = "agents_api"
    verbose_name = "agents"

    def ready(self) -> None:
        from agents_api.models import Agent
        from agents_api.selectors import memories_citing
        from memsvc.api.principals import register_agent_lookup
        from memsvc.db import held_keys
        from search.selectors import register_citing

        register_agent_lookup(
            lambda agent_id: Agent.objects.filter(id=agent_id).exists(),
            lambda agent_ids: held_keys(Agent, agent_ids),
        )
        register_citing(memories_citing)

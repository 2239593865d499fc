from dataclasses import dataclass

import pytest

from agents_api.models import Agent
from agents_api.services import agent_get_or_create, api_key_create


@dataclass
class AgentCredential:
    agent: Agent
    key: str
    on_behalf_of: str | None = None

    def auth_headers(self) -> dict[str, str]:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.key}"}
        if self.on_behalf_of:
            headers["HTTP_X_ON_BEHALF_OF"] = self.on_behalf_of
        return headers

    def acting_for(self, user_id: str) -> "AgentCredential":
        return AgentCredential(self.agent, self.key, on_behalf_of=user_id)


def make_agent(name: str, scopes=("read", "write")) -> AgentCredential:
    agent, _ = agent_get_or_create(owner_principal="ops", name=name)
    _, key = api_key_create(agent=agent, scopes=list(scopes))
    return AgentCredential(agent, key)


@pytest.fixture
def helper(db):
    """An agent whose key may read, write and act for users."""
    return make_agent("helper", scopes=("read", "write", "impersonate"))


@pytest.fixture
def rival(db):
    return make_agent("rival")

"""temper.agents: the user's own agents as a rollout source.

`programs.py` (the agent kinds: an async function given an `openai` client, or
a command given ``OPENAI_BASE_URL``), `rollouts.py` (`AgentRollouts`: one
gateway session per episode, limits, failures, rewards). The gateway that
records token-exact trajectories from the agent's calls is
`temper.serve.gateway`; docs/agents.md has the whole story.
"""

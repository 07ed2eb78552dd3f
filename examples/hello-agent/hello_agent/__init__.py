"""hello-agent: a minimal Harbor agent for benchseal (the class is ``hello_agent.agent:HelloAgent``)."""

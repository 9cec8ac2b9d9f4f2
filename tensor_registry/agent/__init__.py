"""The node agent (`tensor-registry agent`): keeps this node's cache warm for the refs it watches.

It follows the registry's event stream and, when a watched ref moves (or a variant of it becomes
ready), pre-pulls the variant this node would load into the node cache, so the next `load`,
`pull` or vLLM start reads local bytes. tensor_registry/agent/agent.py has the loop; docs/events.md
the behaviour and the choices.
"""

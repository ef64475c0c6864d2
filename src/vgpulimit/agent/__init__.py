"""The node agent (docs/agent.md): it suspends containers by the rules the
setters wrote (guarantees, priorities, idle limits) when an allocation that
is owed memory waits, and resumes them when the memory is free again, or
when a container it suspended calls CUDA.  rules.py decides, watch.py looks,
serve.py acts, journal.py writes down; command.py is `vgpulimit agent`."""

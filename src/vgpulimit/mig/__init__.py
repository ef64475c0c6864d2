"""`vgpulimit mig plan`: a MIG layout for a set of requests, and the flags
that cap each request on its instance.  It never changes MIG.

One module per concern: profiles (the profile tables, profiles.json, which
simgpu's MIG mode reads too), plan (the planner's model: requests in, a legal
layout out; pure), node (the node's GPUs, through NVML), render (a plan
written out: text, JSON, mig-parted's config; only the CLI reaches it)."""

"""`vgpulimit oci-hook`: puts the shim into a container that asks for limits,
with images unchanged.

A runtime runs the hook with the container's state (OCI runtime spec,
"State") on stdin: at createRuntime (or prestart, on runtimes older than
createRuntime) it installs, at poststop it removes what it installed.  The
stage is read from the state's status, so one hooks.d entry serves them all.

A container asks with limit variables in ``process.env`` (VGPULIMIT_MEMORY[_i],
VGPULIMIT_CORES[_i], or HAMi's CUDA_DEVICE_MEMORY_LIMIT[_i] and
CUDA_DEVICE_SM_LIMIT[_i]) or with the annotations vgpulimit.io/memory and
vgpulimit.io/cores (and vgpulimit.io/cores-policy, as VGPULIMIT_CORES_POLICY;
vgpulimit.io/priority, as VGPULIMIT_PRIORITY).  An annotation may tighten the variables of its
kind, never loosen them, and so may a variable the variables it hides: a CDI device's variables
stand beside the pod spec's, and annotations are the pod author's to write.  A
container whose environment names its region (VGPULIMIT_REGION, or
CUDA_DEVICE_MEMORY_SHARED_CACHE as HAMi's device plugin sets it) is left to
whoever named it -- a device plugin that mounts the shim itself -- so that
the two can share a node.

Installed, in the rootfs:  /.vgpulimit/libvgpulimit.so (a copy of the shim,
unless a mount -- the CDI spec's -- puts it there), a line for it in
/etc/ld.so.preload, and /.vgpulimit/region, onto which the hook mounts the
container's region.  The region itself lives on the node, in
<node dir>/<container id>/region, where `vgpulimit status --all` finds it;
it carries the limits, so that limits given as annotations reach the shim
although a hook cannot change the container's environment.

Every path in the rootfs is walked one component at a time without following
symbolic links (a link planted by the image, /etc -> /host/etc, is refused,
never followed out), and checked to lie on the rootfs's own mount as the
container will see it (a runtime mount would hide what we write).  Whenever a
container asked for limits and they cannot be enforced, the hook fails with
one line, and the runtime does not start the container.

One module per concern, in the order the hook uses them: state (the OCI state
and the bundle's config), request (the limits the container asks for), owner
(who owns its region, through the user namespace), rootfs (the no-follow
walker), mounts (the system calls Python does not wrap), elf (can the rootfs
load the shim), preload (the ld.so.preload line), manifest (what was made, to
be undone), install (install and remove), hook (the command), hooks_d (the
podman/CRI-O entry).  This module holds the names they share.
"""

from vgpulimit._paths import container_board, container_region
from vgpulimit.board import NODE_BOARD_DIR
from vgpulimit.errors import VgpulimitError
from vgpulimit.kinds import kind

# Where things go in the container: the region where the shim looks for it
# (paths.h), the shim beside it.
CONTAINER_REGION = container_region()
CONTAINER_DIR, REGION_NAME = CONTAINER_REGION.strip("/").split("/")
SHIM_NAME = "libvgpulimit.so"
SHIM_PATH = f"/{CONTAINER_DIR}/{SHIM_NAME}"
PRELOAD = ("etc", "ld.so.preload")

# The node view: one directory per container holding its region.
NODE_DIR = "/run/vgpulimit/containers"
MANIFEST = "installed.json"

# The annotations are the limit kinds' (kinds.py, the shim's table).
MEMORY_ANNOTATION = kind("memory").annotation
CORES_ANNOTATION = kind("cores").annotation
CORES_POLICY_ANNOTATION = kind("cores_policy").annotation
PRIORITY_ANNOTATION = kind("priority").annotation
MEMORY_REQUEST_ANNOTATION = kind("memory_request").annotation
MEMORY_WAIT_ANNOTATION = kind("memory_wait").annotation
# The node agent may suspend the container once idle this long (docs/agent.md); with limits only.
SUSPEND_IDLE_ANNOTATION = "vgpulimit.io/suspend-idle"

# Priorities: the node's board and the containers' beacons, in a directory of
# the node directory (whose name no container id takes), mounted read-only
# into each container that has a priority, its own beacon writable on top.
BOARD_DIR = NODE_BOARD_DIR
CONTAINER_BOARD_DIR = container_board().rsplit("/", 1)[0]


class HookError(VgpulimitError, RuntimeError):
    """The hook cannot do its job; the message is the one line the runtime shows."""

"""The kinds of engine an arm can be served by, one module each, registered by name (like GuideLLM's
Backend.register): `registry.kind_of(config)` answers every question the rest of specdrill asks about an engine
config. Importing the package registers the built-in kinds, in the order of the campaign's `engine:` union."""

from serve_apps.engine_kinds import simulated  # noqa: I001 (registration order is the union's order)
from serve_apps.engine_kinds import vllm
from serve_apps.engine_kinds import endpoint
from serve_apps.engine_kinds import sglang
from serve_apps.engine_kinds import trtllm

BUILTIN = (simulated.KIND, vllm.KIND, endpoint.KIND, sglang.KIND, trtllm.KIND)

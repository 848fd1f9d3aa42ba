"""VGF delegates executed as the seed's Linux runner executes them: by Arm's ML SDK stack on the host."""

from .container import VgfContainer, parse_vgf
from .engine import VgfEngine
from .stack import VgfStack, find_stack, missing

__all__ = ["VgfContainer", "VgfEngine", "VgfStack", "find_stack", "missing", "parse_vgf"]

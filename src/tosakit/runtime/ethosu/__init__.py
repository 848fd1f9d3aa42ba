"""The Ethos-U delegate on the host: its command stream decoded (``commands``) from the register tables
(``registers``)."""

from ...lazy import lazy_exports

_COMMANDS = ["AcceleratorConfig", "Command", "CommandStream", "decode", "disassemble"]
_REGISTERS = ["Field", "Register", "register_map"]
__all__ = [*_COMMANDS, *_REGISTERS]
__getattr__, __dir__ = lazy_exports(__name__, {**{n: ".commands" for n in _COMMANDS},
                                               **{n: ".registers" for n in _REGISTERS}})

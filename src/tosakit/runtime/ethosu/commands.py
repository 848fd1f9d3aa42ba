"""Decode an Ethos-U delegate's ``cmd_data`` (driver header, then the register command stream) into commands,
and print them the way regor's ``--verbose-register-command-stream`` listing does.

``cmd_data`` comes from untrusted .pte files: every length is checked against the bytes present, and every
fault is a TosakitError naming its byte offset."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...errors import TosakitError
from ...targets import ETHOSU_TARGETS, Target
from .registers import Field, Register, register_map

FOURCC = b"COP1"
# Driver actions: the low byte of a tag word (see Vela's driver_actions.py and the Ethos-U core driver).
DA_CONFIG, DA_CMD_STREAM, DA_NOP = 0x01, 0x02, 0x05
PRODUCTS = {0: "ethos-u55", 1: "ethos-u65", 2: "ethos-u85"}
_FIX = "the command stream is damaged or was not written by Vela: compile the model again"


class NotSimulatedError(TosakitError):
    """A well-formed stream (or command) the simulator does not run yet: an Ethos-U85 stream, an operation
    mode not implemented. Unlike damage, running the delegate's TOSA instead is a way out."""


def _bits(word: int, lsb: int, width: int) -> int:
    return (word >> lsb) & ((1 << width) - 1)


@dataclass(frozen=True)
class AcceleratorConfig:
    """What the driver header's config and id words say the stream was compiled for."""

    product: str  # "ethos-u55", "ethos-u65" or "ethos-u85"
    macs_per_cycle: int
    shram_kib: int | None  # None on the U85, which has no SHRAM
    cmd_stream_version: int
    custom_dma: bool
    arch_version: tuple[int, int, int]  # major, minor, patch of the NPU architecture

    @property
    def accelerator(self) -> str:
        """The target name, e.g. "ethos-u55-128"."""
        return f"{self.product}-{self.macs_per_cycle}"

    @property
    def target(self) -> Target:
        """The target record of the NPU the header names."""
        return ETHOSU_TARGETS[self.accelerator]

    @classmethod
    def of(cls, config: int, ident: int, where: str) -> "AcceleratorConfig":
        product = PRODUCTS.get(_bits(config, 28, 4))
        if product is None:
            raise TosakitError(f"{where}: the config word {config:#010x} names unknown NPU product "
                               f"{_bits(config, 28, 4)}", _FIX)
        # Bits 8..15 hold the SHRAM size on U55/U65; the U85 has no SHRAM (they hold AXI and core counts).
        shram = None if product == "ethos-u85" else _bits(config, 8, 8)
        found = cls(product, 1 << _bits(config, 0, 4), shram, _bits(config, 4, 4),
                    bool(_bits(config, 27, 1)), (_bits(ident, 28, 4), _bits(ident, 20, 8), _bits(ident, 16, 4)))
        if found.accelerator not in ETHOSU_TARGETS:
            raise TosakitError(f"{where}: the config word {config:#010x} names {product} with "
                               f"{found.macs_per_cycle} MACs per cycle, which no Ethos-U has", _FIX)
        return found


@dataclass(frozen=True)
class Command:
    """One command of the register command stream."""

    offset: int  # byte offset in the register command stream (0 = the first command word)
    register: Register
    param: int  # 16 bits
    data: int | None  # the 32-bit data word of a cmd1

    @property
    def value(self) -> int:
        """The bits fields count in: the parameter (cmd0), or ``(param << 32) | data`` (cmd1)."""
        return self.param if self.data is None else (self.param << 32) | self.data

    def field(self, name: str) -> int:
        """The value of field ``name``."""
        for f in self.register.fields:
            if f.name == name:
                return _bits(self.value, f.lsb, f.width)
        known = ", ".join(f.name for f in self.register.fields) or "none"
        raise KeyError(f"{self.register.name} has no field {name!r} (fields: {known})")

    @property
    def fields(self) -> dict[str, int]:
        """Every field's value, in listing order."""
        return {f.name: _bits(self.value, f.lsb, f.width) for f in self.register.fields}


@dataclass
class CommandStream:
    """A decoded ``cmd_data``: the accelerator it was compiled for and its commands."""

    accelerator_config: AcceleratorConfig
    commands: list[Command]


def _stream_error(offset: int, start: int, message: str) -> TosakitError:
    return TosakitError(f"Ethos-U command stream offset {offset:#08x} (byte {start + offset:#x} of cmd_data): "
                        f"{message}", _FIX)


def _commands(words: tuple[int, ...], start: int, registers: dict[int, Register]) -> list[Command]:
    """Decode the register command stream ``words``, which begins at byte ``start`` of cmd_data."""
    commands, i = [], 0
    while i < len(words):
        offset, code, param = 4 * i, words[i] & 0xFFFF, words[i] >> 16
        register = registers.get(code)
        if register is None:
            raise _stream_error(offset, start, f"unknown command code {code:#06x} (word {words[i]:#010x})")
        data = None
        if register.has_payload:
            if i + 1 >= len(words):
                raise _stream_error(offset, start, f"{register.name} lacks its data word: the stream ends")
            data = words[i + 1]
        command = Command(offset, register, param, data)
        for f in register.fields:
            value = command.field(f.name)
            if f.enum is not None and value not in f.enum:
                raise _stream_error(offset, start, f"{register.name} field {f.name} = {value} is none of "
                                                   f"{', '.join(f.enum.values())}")
        commands.append(command)
        i += 2 if data is not None else 1
    return commands


def decode(cmd_data: bytes, accelerator: str | None = None) -> CommandStream:
    """Decode a delegate payload's ``cmd_data`` block: the COP1 driver header, then the command stream.
    ``accelerator`` ("ethos-u55-128", ...), if given, must be the one the header names."""
    cmd_data = bytes(cmd_data)
    if len(cmd_data) % 4:
        raise TosakitError(f"Ethos-U cmd_data is {len(cmd_data)} bytes, not a whole number of 32-bit words", _FIX)
    if cmd_data[:4] != FOURCC:
        raise TosakitError(f"Ethos-U cmd_data byte 0x0: fourcc {cmd_data[:4]!r}, expected {FOURCC!r}",
                           "only Vela's COP1 driver payload is supported: " + _FIX)
    words = struct.unpack(f"<{len(cmd_data) // 4}I", cmd_data)
    config, stream, i = None, None, 1
    while i < len(words):
        at = f"Ethos-U cmd_data byte {4 * i:#x}"
        action, high, low = _bits(words[i], 0, 8), _bits(words[i], 8, 8), words[i] >> 16
        if action == DA_CONFIG:
            if i + 3 > len(words):
                raise TosakitError(f"{at}: the config action lacks its config and id words: cmd_data ends", _FIX)
            config = AcceleratorConfig.of(words[i + 1], words[i + 2], at)
            i += 3
        elif action == DA_NOP:
            i += 1
        elif action == DA_CMD_STREAM:
            length = (high << 16) | low
            if stream is not None:
                raise TosakitError(f"{at}: a second command stream; Vela writes one", _FIX)
            if i + 1 + length > len(words):
                raise TosakitError(f"{at}: the header gives the command stream {length} words, cmd_data holds "
                                   f"{len(words) - i - 1} after it", _FIX)
            stream = (i + 1, words[i + 1: i + 1 + length])
            i += 1 + length
        else:
            raise TosakitError(f"{at}: driver action {action} (word {words[i]:#010x}); the Ethos-U driver runs "
                               f"only config ({DA_CONFIG}), command stream ({DA_CMD_STREAM}) and NOP ({DA_NOP})", _FIX)
    if config is None or stream is None:
        raise TosakitError(f"Ethos-U cmd_data has no {'config action' if config is None else 'command stream'}",
                           _FIX)
    registers = register_map(accelerator or config.accelerator)
    if accelerator is not None and accelerator.strip().lower() != config.accelerator:
        raise TosakitError(f"the command stream was compiled for {config.accelerator}, not {accelerator}",
                           f"run it as {config.accelerator}, or compile the model for {accelerator}")
    first, body = stream
    return CommandStream(config, _commands(body, 4 * first, registers))


def _shown(f: Field, value: int) -> str:
    """A field value as regor prints it: an enum name, an address in hex, anything else in decimal (a signed
    field with its sign; a negative 32-bit one, e.g. U85's OP_SCALAR, one below its unsigned bit pattern, as
    regor's listing prints it)."""
    if f.enum is not None:
        return f.enum[value]
    if f.name == "addr":
        return f"{value:#x}"
    if f.signed and value >> (f.width - 1):
        return str(value - 1) if f.width == 32 else str(value - (1 << f.width))
    return str(value)


def disassemble(stream: CommandStream) -> list[str]:
    """One line per command, as regor's register command stream listing prints it."""
    lines = []
    for c in stream.commands:
        payload = " " * 8 if c.data is None else f"{c.data:08x}"
        head = f"{c.offset:#08x}: {payload} {c.param:04x} {c.register.code:04x} - {c.register.name:<30} {c.param:5}"
        value = c.value
        lines.append(head + "".join(f", {f.name} = {_shown(f, _bits(value, f.lsb, f.width))}"
                                    for f in c.register.fields))
    return lines

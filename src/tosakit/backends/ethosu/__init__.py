"""EthosUBackend: TOSA compiled by Vela into the Ethos-U delegate payload (``payload`` imports no torch)."""

from ...lazy import lazy_exports

__all__ = ["EthosUPartitioner", "EthosUPayload", "VelaReport", "VelaResult", "compile_tosa", "fastest_form",
           "pack_payload", "parse_payload", "raw_npz"]
__getattr__, __dir__ = lazy_exports(__name__, {**{n: ".backend" for n in __all__}, "EthosUPayload": ".payload",
                                               "pack_payload": ".payload", "parse_payload": ".payload"})

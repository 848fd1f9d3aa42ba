"""Lowering rules by op family; importing this package fills the rule table."""

from . import conv, elementwise, pool, quant, shape  # noqa: F401

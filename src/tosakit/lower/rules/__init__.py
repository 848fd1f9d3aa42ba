"""Lowering rules by op family; importing this package fills the rule table."""

from . import attention, compare, conv, elementwise, norm, pool, quant, reduce, shape  # noqa: F401

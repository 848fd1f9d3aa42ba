"""The op tables (cases as data) that tests/lower/test_ops.py runs four ways and the sweeps beyond it reuse."""

from support.op_tables import a16w8, elementwise, layers, ops, shape

INT8_TABLES = (ops.TABLE, elementwise.TABLE, layers.TABLE, shape.TABLE)
TABLES = (*INT8_TABLES, a16w8.TABLE)

"""Number formats used in training, and exactly what each one does to a value.

Every conversion here is a real cast: numpy for fp64, fp32, fp16 and the integer formats,
ml_dtypes for bf16, the fp8s, fp4 and e8m0 (the same library JAX uses; it rounds from fp64
in one step, to nearest, ties to even). The one format modelled by hand is TF32, which is
not a storage type at all (see :func:`to_tf32`).

Integer formats are shown *quantized*: round half to even, then saturate to [min, max], with
an overflow flag. That is what a quantizer does; a plain C or numpy cast of an out-of-range
value wraps or is undefined, which is never what you want to teach.

This module imports numpy and ml_dtypes but never torch or textual: the dashboard shows it too.
"""

from ampscope.core.formats.catalog import (
    DEFAULT_KEYS,
    FLOAT_KEYS,
    FORMATS,
    Format,
    bit_code,
    bit_fields,
    convert,
    crosscheck,
    get_format,
    keys_from,
    shortest_repr,
    to_tf32,
)
from ampscope.core.formats.demos import DEMOS, DemoResult, run_demo
from ampscope.core.formats.describe import (
    Description,
    Stored,
    describe,
    exact_decimal,
    facts_table,
    store,
)
from ampscope.core.formats.expression import ExpressionError, echo, evaluate, to_fp64

__all__ = [
    "DEFAULT_KEYS",
    "DEMOS",
    "FLOAT_KEYS",
    "FORMATS",
    "DemoResult",
    "Description",
    "ExpressionError",
    "Format",
    "Stored",
    "bit_code",
    "bit_fields",
    "convert",
    "crosscheck",
    "describe",
    "echo",
    "evaluate",
    "exact_decimal",
    "facts_table",
    "get_format",
    "keys_from",
    "run_demo",
    "shortest_repr",
    "store",
    "to_fp64",
    "to_tf32",
]

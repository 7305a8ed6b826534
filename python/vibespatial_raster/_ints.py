# SPDX-License-Identifier: Apache-2.0
"""The package's rule for integer arguments (private): what int() would truncate (a float) or
parse (a str) is refused, and so are bools, which would pass as 0 or 1."""

from __future__ import annotations

from typing import Any

import numpy as np


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer argument: it has ``__index__`` (Python and NumPy integers,
    and any other integer type) and is not a bool (Python's or NumPy's)."""
    return hasattr(value, "__index__") and not isinstance(value, (bool, np.bool_))


def integer(name: str, value: Any) -> int:
    """``value`` as an int when it is an integer argument (:func:`is_integer`); TypeError naming
    ``name`` otherwise (a bool, float, str or any other type)."""
    if not is_integer(value):
        raise TypeError(f"{name} must be an integer, not {value!r} ({type(value).__name__})")
    return int(value.__index__())

# SPDX-License-Identifier: Apache-2.0
"""For the judges that compare with gdal_calc.py: run under a Python that has numpy and GDAL's
bindings (osgeo, osgeo_utils.gdal_calc), or skip.

A judge calls ensure_gdal_calc_python(__file__) before importing numpy and osgeo. When this
Python lacks them, the script is started again under the interpreter of gdal_calc.py's "#!" line
(Debian's /usr/bin/python3 for gdal-bin), once; when that cannot be done either, it exits with
77, the test harness's skip status, saying why.
"""

import os
import shutil
import sys

SKIP = 77
_AGAIN = "VSR_GDAL_CALC_PYTHON_AGAIN"


def ensure_gdal_calc_python(script):
    try:
        import numpy  # noqa: F401
        from osgeo import gdal  # noqa: F401
        from osgeo_utils import gdal_calc  # noqa: F401

        return
    except ImportError as e:
        missing = str(e)
    calc = shutil.which("gdal_calc.py")
    if calc is None:
        print("SKIP: gdal_calc.py not found (Debian: apt-get install gdal-bin python3-gdal)")
        sys.exit(SKIP)
    if not os.environ.get(_AGAIN):
        with open(calc, "rb") as f:
            first = f.readline().decode("utf-8", "replace").strip()
        if first.startswith("#!"):
            interpreter = first[2:].split()
            if interpreter and os.path.exists(interpreter[0]):
                os.environ[_AGAIN] = "1"
                os.execv(interpreter[0], interpreter + [os.path.abspath(script)] + sys.argv[1:])
    print(f"SKIP: no Python with numpy and osgeo for gdal_calc.py ({missing})")
    sys.exit(SKIP)

"""Run a Python program as if OpenTelemetry were not installed: ``without_otel.py <program>
<args>...`` (the tracing tests' ``runqueue`` without the ``otel`` extra).

Its ``import opentelemetry`` (of any submodule too) raises ImportError, as on a machine without
the package; the program then runs as ``__main__`` with its own arguments.
"""

import runpy
import sys

sys.modules["opentelemetry"] = None  # type: ignore[assignment]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")

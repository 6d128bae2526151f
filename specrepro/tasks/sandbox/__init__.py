"""Run untrusted, model-written Python in a throw-away sandbox, and judge it by its tests in a separate,
trusted judge process. docs/sandbox.md describes the layers, what each holds and what it does not.

Modules: ``containment`` (which layers this machine offers, the command line, warnings and strict mode),
``cgroup`` (each run's memory and process cap), ``process`` (uids, limits, output, killing), ``cleanup``
(scratch directories and their removal), ``verdict`` (results and the judge), ``run`` (the two entry
points), and ``inside`` (the code that runs in the sandbox and in the judge).
"""

from specrepro.tasks.sandbox.containment import SandboxInfo, SandboxWarning, sandbox_info
from specrepro.tasks.sandbox.run import run_tests, run_untrusted
from specrepro.tasks.sandbox.verdict import SandboxResult

__all__ = ["SandboxInfo", "SandboxResult", "SandboxWarning", "run_tests", "run_untrusted", "sandbox_info"]

# Put on PYTHONPATH by tests/conftest.py: in a process a test starts (`python -c "from orchestrator.cli import main;
# main()" ...`, the venv's `specdrill` script, a Ray job's entrypoint, a driver calling main() for several cases),
# every call of the CLI group's main appends its arguments and the test that started the process to the session's
# log, so that tests/test_docs.py can tell which documented command forms the suite really ran. It waits for
# orchestrator.cli to be imported (an import hook): other processes (Ray workers, vLLM) only read one variable.
import os
import sys

_LOG = os.environ.get("SPECDRILL_CLI_LOG")


def _record(args):
    import json

    line = json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "args": list(args), "cwd": os.getcwd()})
    try:
        with open(_LOG, "a", encoding="utf-8") as out:  # one short append per call: O_APPEND keeps lines whole
            out.write(line + "\n")
    except OSError:
        pass  # a process that cannot reach the log (another mount namespace) is just not counted


def _patch(module):
    group = getattr(module, "cli", None)
    original = getattr(group, "main", None)
    if original is None:
        return

    def main(args=None, *rest, **kwargs):
        _record(sys.argv[1:] if args is None else args)
        return original(args, *rest, **kwargs)

    group.main = main


class _Finder:
    """Finds orchestrator.cli with the other finders, and patches it once its code has run."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "orchestrator.cli":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


if _LOG:
    sys.meta_path.insert(0, _Finder())

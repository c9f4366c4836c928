# Put on PYTHONPATH by tests/conftest.py: a `specdrill` process a test starts (`python -c "from orchestrator.cli
# import main; main()" ...`, the venv's `specdrill` script, a Ray job's entrypoint) appends its arguments and the
# test that started it to the session's log, so that tests/test_docs.py can tell which documented command forms
# the suite really ran. Every other process only reads one environment variable.
import os
import sys

_LOG = os.environ.get("SPECDRILL_CLI_LOG")
if _LOG:
    _argv = list(getattr(sys, "orig_argv", ()))
    _args = None
    if "-c" in _argv[:-1] and "orchestrator.cli" in _argv[_argv.index("-c") + 1]:
        _args = _argv[_argv.index("-c") + 2 :]
    elif len(_argv) > 1 and os.path.basename(_argv[1]) == "specdrill":
        _args = _argv[2:]
    if _args is not None:
        import json

        _line = json.dumps({"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "args": _args, "cwd": os.getcwd()})
        try:
            with open(_LOG, "a", encoding="utf-8") as _out:  # one append per process: O_APPEND keeps lines whole
                _out.write(_line + "\n")
        except OSError:
            pass  # a process in another mount namespace (the pod bed) may not see the log: it just is not counted

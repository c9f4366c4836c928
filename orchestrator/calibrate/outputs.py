"""`specdrill calibrate`'s files: the fitted profile, or one per run where the runs' engines differ (one pooled
profile would speak for none of them), each said in a line as it is written."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from loadshapes.badfile import write_failed
from orchestrator.calibrate.writer import write_profile
from serve_apps.sim.profile import Profile


def write_profiles(profile: Profile, separate: Mapping[str, Profile], output: str, echo: Callable[[str], None]) -> None:
    """Write `profile` to `output`, or where `separate` has the runs' own profiles, each beside it as
    STEM.RUN_ID.SUFFIX and `output` not at all. A write that fails is one line naming the file (BadFileError)."""
    if separate:
        target = Path(output)
        for run_id, own in separate.items():
            path = str(target.with_name(f"{target.stem}.{run_id}{target.suffix}"))
            _write(own, path)
            echo(f"wrote {path} (run {run_id} alone)")
        echo(f"not written: {output} (the engines differ: one pooled profile would speak for none of them)")
        return
    _write(profile, output)
    echo(f"wrote {output}")


def _write(profile: Profile, path: str) -> None:
    try:
        write_profile(profile, path)
    except OSError as exc:
        raise write_failed(path, exc) from None

"""Every verb answers a failure in one line: a benchseal error with its exit code, and even a defect (an
exception benchseal did not mean to raise) as one escaped line, exit 1, never a traceback."""

from __future__ import annotations

import pytest
import typer

from pipeline.cli.app import run
from pipeline.core.errors import CheckFailed


def _app(error: BaseException) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        raise error

    return app


@pytest.mark.parametrize("error, code, line", [
    (CheckFailed("the gate held it back"), 1, "benchseal: error: the gate held it back"),
    (RuntimeError("boom\nsecond line"), 1, "benchseal: error: unexpected RuntimeError: boom (a benchseal defect: "
                                           "rerun with BENCHSEAL_TRACEBACK=1 and report it)"),
    (ValueError("\x1b[31mred\u202e"), 1, "benchseal: error: unexpected ValueError: \\x1b[31mred\\u202e (a benchseal "
                                         "defect: rerun with BENCHSEAL_TRACEBACK=1 and report it)"),
])
def test_one_line_and_the_exit_code(error: BaseException, code: int, line: str, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCHSEAL_TRACEBACK", raising=False)
    monkeypatch.setattr("sys.argv", ["benchseal"])
    with pytest.raises(SystemExit) as ended:
        run(_app(error))
    assert ended.value.code == code
    err = capsys.readouterr().err
    assert err.splitlines() == [line] and "Traceback" not in err


def test_a_defect_shows_its_traceback_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BENCHSEAL_TRACEBACK", "1")
    monkeypatch.setattr("sys.argv", ["benchseal"])
    with pytest.raises(KeyError):
        run(_app(KeyError("boom")))

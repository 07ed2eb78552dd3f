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


@pytest.mark.parametrize("argv, line", [
    (["release"], "benchseal: error: benchseal release: Missing argument 'tag'. (see benchseal release --help)"),
    (["release", "v1.0.0", "--nope"], "benchseal: error: benchseal release: No such option: --nope "
                                      "(see benchseal release --help)"),
    (["dataset", "import", "humaneval"], "benchseal: error: benchseal dataset import: Missing option '--out'. "
                                         "(see benchseal dataset import --help)"),
    (["worker", "--trial-batch", "0"], "benchseal: error: benchseal worker: Invalid value for '--trial-batch': Input "
                                       "should be greater than or equal to 1 (see benchseal worker --help)"),
])
def test_a_usage_error_is_one_line_naming_the_command_and_exit_2(argv: list[str], line: str,
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Click's own report is a usage block and a framed message over several lines; the installed app's is one."""
    from pipeline.cli.main import app

    monkeypatch.setattr("sys.argv", ["benchseal", *argv])
    with pytest.raises(SystemExit) as ended:
        run(app)
    assert ended.value.code == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [line] and captured.out == ""


def test_typer_exit_codes_and_success_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    app = typer.Typer()

    @app.command()
    def ends(code: int) -> None:
        if code:
            raise typer.Exit(code)

    for code in (0, 3):
        monkeypatch.setattr("sys.argv", ["benchseal", str(code)])
        with pytest.raises(SystemExit) as ended:
            run(app)
        assert ended.value.code == code  # 0: a verb that returns is a success


def test_a_bare_group_prints_its_help_and_exits_2(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.cli.main import app

    monkeypatch.setattr("sys.argv", ["benchseal", "dataset"])
    with pytest.raises(SystemExit) as ended:
        run(app)
    captured = capsys.readouterr()
    assert ended.value.code == 2 and "import" in captured.out and captured.err == ""

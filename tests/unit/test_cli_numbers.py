"""The command line's number flags (cli/arguments.py `_number`): a bad value is a one-line usage error
(exit 2) that says what was expected; a good one arrives as a number of the right type."""

from __future__ import annotations

import pytest

from trayapp.cli.arguments import build_parser


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ceiling", "--params", "x"], "argument --params: expected a number, got 'x'"),
        (["ceiling", "--params", "0"], "argument --params: must be positive, got 0"),
        (["ceiling", "--params", "-3"], "argument --params: must be positive, got -3"),
        (["ceiling", "--params", "nan"], "argument --params: must be positive, got nan"),  # was accepted
        (["ceiling", "--params", "8", "--context", "4096.5"], "argument --context: expected a number, got"),
        (["ceiling", "--params", "8", "--gpu-fraction", "1.5"], "must be between 0 and 1, got 1.5"),
        (
            ["ceiling", "--params", "8", "--gpu-fraction", "half"],
            "expected a number between 0 and 1, got 'half'",
        ),
        (
            ["agent", "--metrics-port", "70000"],
            "argument --metrics-port: must be 0-65535 (0: any free port), got 70000",
        ),
        (["agent", "--metrics-port", "-1"], "must be 0-65535 (0: any free port), got -1"),
        (["agent", "--metrics-port", "80.5"], "argument --metrics-port: expected a port number, got '80.5'"),
    ],
)
def test_a_bad_number_is_a_usage_error_saying_what_was_expected(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_good_numbers_arrive_typed() -> None:
    args = build_parser().parse_args(
        ["ceiling", "--params", "0.5", "--context", "8192", "--gpu-fraction", "0"]
    )
    assert (args.params, args.context, args.gpu_fraction) == (0.5, 8192, 0.0)
    assert isinstance(args.context, int)
    args = build_parser().parse_args(["agent", "--metrics-port", "0", "--duration", "2.5"])
    assert (args.metrics_port, args.duration) == (0, 2.5)
    assert build_parser().parse_args(["agent", "--metrics-port", "65535"]).metrics_port == 65535

"""``gridrpc sim`` refuses counts and shapes it cannot simulate with argparse's
usage error (exit 2) naming the option, instead of a traceback or a result
for an impossible tree."""
from __future__ import annotations

import pytest

from gridrpc.cli import main


@pytest.mark.parametrize("argv,words", [
    (["run", "--seds", "-3"], "--seds: must be 1 or more, not -3"),
    (["run", "--seds", "0"], "--seds: must be 1 or more, not 0"),
    (["run", "--seds", "ten"], "--seds: 'ten' is not a whole number"),
    (["run", "--seds", "10", "--users", "0"], "--users: must be 1 or more"),
    (["run", "--seds", "10", "--cores", "-1"], "--cores: must be 1 or more"),
    (["run", "--seds", "10", "--shape", "bogus"], "'bogus' is not a shape"),
    (["run", "--seds", "10", "--shape", "L0-3"], "'L0-3' is not a shape"),
    (["run", "--seds", "10", "--shape", "L2-"], "'L2-' is not a shape"),
    (["run", "--seds", "10", "--shape", "1,0"], "agents per level must be whole numbers >= 1"),
    (["scale", "--clients", "0"], "--clients: must be 1 or more"),
])
def test_bad_counts_and_shapes_are_usage_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["sim", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.parametrize("shape", ["flat", "L2-8", "l3-4", "1,8,64"])
def test_good_shapes_pass(shape):
    from gridrpc.sim.cli import shape_arg
    assert shape_arg(shape) == shape


def test_write_or_print_writes_the_file_or_prints(tmp_path, capsys):
    from gridrpc.cli.values import write_or_print
    write_or_print('{"a": 1}', None)
    assert capsys.readouterr().out == '{"a": 1}\n'
    out = tmp_path / "c.json"
    write_or_print('{"a": 1}', str(out))
    captured = capsys.readouterr()
    assert out.read_text() == '{"a": 1}\n' and captured.out == "" and f"wrote {out}" in captured.err

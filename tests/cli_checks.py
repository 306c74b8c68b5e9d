"""What every CLI error test asserts, in one place."""

from __future__ import annotations

from headscope.reports.cli.app import main


def cli_error(capsys, *argv) -> str:
    """Run the CLI; assert exit 2 and exactly one stderr line ``headscope: error: ...``
    with no traceback; return that line."""
    rc = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and err.startswith("headscope: error: ") and "Traceback" not in err, err
    return err.strip()

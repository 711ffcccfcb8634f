"""``gputopo verify``: the independent health check after an apply (or at any time).

Prints a PASS / WARN / FAIL table with the numbers (``--json``: the report as a stable object)
and exits 0 when all is clear, 1 on any FAIL (or any WARN with ``--strict``).
"""

from __future__ import annotations

import click

from gputopo.cli.connect import Connection, connection_options
from gputopo.cli.params import Finite
from gputopo.exitcodes import with_exit_codes


@click.command()
@click.option("--spec", "spec_file", required=True, type=click.Path(dir_okay=False), help="Spec file.")
@connection_options()
@click.option(
    "--timeout",
    "http_timeout",
    type=Finite(),
    default=None,
    help="Seconds for the inference probe (default: the spec's verify.timeout).",
)
@click.option("--strict", is_flag=True, help="A WARN fails too (exit 1).")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (gputopo schema verify).")
@click.option(
    "--start-vms",
    is_flag=True,
    help="Check every VM of vms.consumers from inside: start it if stopped, run nvidia-smi through its "
    "guest agent, compare its GPUs, stop it again.",
)
@with_exit_codes("verify")
def verify(
    spec_file: str, conn: Connection, http_timeout: float | None, strict: bool, as_json: bool, start_vms: bool
) -> None:
    """Check the host against the spec from fresh facts: converged, VM side, container side,
    memory balance, service, inference and platform.
    """
    from gputopo.errors import VerifyFailed
    from gputopo.usecases.verify import VerifyRequest, run

    report = run(VerifyRequest(conn, spec_file, http_timeout, strict, start_vms))
    if as_json:
        from gputopo.cli.output import print_json

        print_json(report.to_data())
        if not report.ok:
            raise VerifyFailed(report.summary_line())  # stdout holds the document: one line on stderr
        return
    from gputopo.cli.output import print_report

    print_report(report)
    if not report.ok:
        # the table ended with the summary line: exit 1 without saying it again
        click.get_current_context().exit(VerifyFailed.exit_code)

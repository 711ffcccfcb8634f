"""``gputopo verify``: the independent health check after an apply (or at any time).

Prints a PASS / WARN / FAIL table with the numbers (``--json``: the report as a stable object)
and exits 0 when all is clear, 1 on any FAIL (or any WARN with ``--strict``).
"""

from __future__ import annotations

import click

from gputopo.cli.connect import Connection, build_ports, connection_options, host_root, node_for, this_host
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
    from gputopo.cli.output import warn_unfinished
    from gputopo.errors import VerifyFailed
    from gputopo.plan.spec import load_spec
    from gputopo.verify import verify as run_verify

    spec = load_spec(spec_file)
    root = host_root(conn)
    warn_unfinished(root)
    ports = build_ports(conn, default_node=node_for(conn, spec, this_host(root)))
    try:
        report = run_verify(
            spec,
            ports,
            root=root,
            http_timeout=http_timeout,
            strict=strict,
            node=conn.node,
            start_vms=start_vms,
        )
    finally:
        ports.close()
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

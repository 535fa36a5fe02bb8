"""What a user gets wrong, the CLI answers with a sentence and a non-zero exit, never a
traceback (issue 44's table; the Service cases on real maps: tests/datapath/test_cli_maps.py)."""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from kproxy_ebpf.cli import main as cli


@pytest.mark.parametrize("args,code,says", [
    (["services"], 1, "no kproxy maps pinned under"),                  # off a node
    (["status"], 1, "no kproxy maps pinned under"),
    (["maps", "dump", "nope"], 1, "no kproxy maps pinned under"),
    (["ct", "list", "--service", "web"], 1, "no kproxy maps pinned under"),
    (["services", "-o", "wide2"], 2, "'wide2' is not one of"),
    (["stats", "-o", "wide"], 2, "'wide' is not one of"),
    (["service"], 2, 'Did you mean "services"?'),
    (["mpas", "list"], 2, 'Did you mean "maps"?'),
    (["services", "--service", "a/web", "-n", "b"], 2, "names namespace a, -n says b"),
])
def test_a_wrong_input_is_a_sentence_and_a_non_zero_exit(tmp_path, args, code, says):
    bpffs = [] if args[0] in ("service", "mpas") or "-o" in args else \
        ["--bpffs-dir", str(tmp_path)]
    out = CliRunner().invoke(cli.main, [*args, *bpffs])
    assert out.exit_code == code, out.output
    assert says in out.output and "Traceback" not in out.output

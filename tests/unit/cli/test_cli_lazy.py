"""`lab` and `bench` are mounted only where they are installed: a source checkout has both, the
agent's image neither (tests/chart/test_image.py checks the image itself)."""
from click.testing import CliRunner

from kproxy_ebpf.cli.main import main


def test_a_checkout_lists_and_runs_lab_and_bench():
    out = CliRunner().invoke(main, ["--help"])
    assert out.exit_code == 0 and "lab" in out.output and "bench" in out.output
    assert CliRunner().invoke(main, ["lab", "--help"]).exit_code == 0


def test_without_the_lab_package_it_is_not_listed_and_asking_says_why(monkeypatch):
    monkeypatch.setattr(type(main), "LAZY", {"lab": "kproxy_ebpf.no_lab_here.cli"})
    monkeypatch.delitem(main.commands, "lab", raising=False)
    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == 0 and " lab " not in listed.output
    asked = CliRunner().invoke(main, ["lab", "up"])
    assert asked.exit_code == 2
    assert "`lab` is not installed here: the agent's image holds the agent only" in asked.output
